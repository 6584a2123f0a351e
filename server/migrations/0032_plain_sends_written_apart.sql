-- Plain sends, the commonest (each to one inbox, relying on no contact, not a reply: a reply reads
-- the message it answers), are written by functions that do only that.
--
-- `relay_write_send_numbered` (migration 30) writes every lone send with one statement of seven
-- parts, most of them empty for a plain send: a contact check, a reply's read, grouping over the
-- recipients. Postgres starts and ends each part on every call whether it finds rows or not. For a
-- plain send that made its execution 0.38-0.45 ms against 0.21-0.26 ms for the bare writes (message,
-- head, delivery, notification) in one statement; `relay_write_send_plain` writes it with three
-- short statements in 0.26-0.31 ms (pgbench, one client, interleaved).
--
-- `relay_write_sends_numbered` writes a batch inside a subtransaction, so that a send refused
-- midway can be sorted from the rest, and looks for contacts, replies and revoked machines in
-- statements of their own. `relay_write_sends_plain` checks the batch's inboxes once they are
-- locked (none full, none of a revoked machine, none gone), after which none of its checks refuses a
-- plain send, and writes the batch as sets with no subtransaction: a batch of 8 from 1.4-2.0 to
-- 1.0-1.3 ms (same measure). A batch an inbox would refuse is handed whole to
-- `relay_write_sends_numbered` before anything is written; the server hands it a set that breaks a
-- constraint anyway, or meets a deadlock.
--
-- Their answers are those of the numbered writers for every inbox that exists, so the server reads
-- all alike. An inbox that no longer exists (nothing deletes one today) is refused by the lone writer
-- as nobody to reach (RLY03), where the numbered writers store the message undelivered; a batch
-- holding one goes to the numbered writer. Sends that are not plain still go to the numbered
-- writers, which are unchanged, and so is the previous release, which never calls these.
--
-- Locks: a lone plain send inserts its message first (a retry racing its first attempt waits on its
-- key, as before), then updates the inbox row, which locks it; no inbox is locked ahead, as
-- migration 30 explains for a send to one inbox. The foreign-key check of its sender now runs before
-- the inbox is locked rather than after. It takes a `key share` lock, which a writer holding an
-- inbox (`no key update`) never waits on; only `for update` does. A contact's drop locks that way the
-- inboxes holding deliveries between the two accounts, in id order: it can meet a lone plain send
-- whose sender is one of them in a deadlock (the numbered writer met it in the mirror case), which
-- Postgres ends by refusing one, and the caller tries again. A batch locks its inboxes in id order
-- first, as every batch does.
create function relay_write_send_plain(s relay_outgoing, cap integer, replica bigint,
                                       out outcome text, out offline bigint[], out offline_seen timestamptz[],
                                       out seqs bigint[], out relations text[], out sent_at timestamptz)
language plpgsql
-- As the other writers (migrations 27 and 31): one plan a connection, by index whatever the
-- statistics said when it was made.
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
declare
    inbox bigint := s.recipients[1];
    seq bigint;
    unread integer;
    online boolean;
    seen timestamptz;
    revoked boolean;
    human boolean;
    relation text;
begin
    if cardinality(s.recipients) <> 1 or s.read_by is not null or cardinality(s.contacts) > 0 then
        raise exception 'not a plain send: one recipient, no contact, nothing read' using errcode = '22023';
    end if;
    -- The head and unread count are kept here; the deliveries' counting triggers stand aside.
    perform set_config('relay.counted', 'on', true);

    -- A retry is answered with the first result whatever has changed since: a duplicate writes
    -- nothing else and is not refused.
    insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
    values (s.id, s.sender, s.client_id, s.thread, s.kind, s.body, s.reply_to, s.private, s.require_reply)
    on conflict (sender_id, client_id) do nothing;
    if not found then
        outcome := 'duplicate';
        return;
    end if;

    -- The inbox's next seq, and what the answer needs of it, asked of the row in hand.
    update endpoints e set head_seq = e.head_seq + 1, unread = e.unread + 1
    from machines ma
    where e.id = inbox and ma.id = e.machine_id
    returning e.head_seq, e.unread, relay_endpoint_online(e), e.last_seen_at, ma.revoked_at is not null,
              ma.name = 'me',
              case when e.parent_id = s.sender then 'parent'
                   when e.id = (select se.parent_id from endpoints se where se.id = s.sender) then 'child'
                   else '' end
    into seq, unread, online, seen, revoked, human, relation;
    -- Raising undoes what was written: the caller's transaction is this call alone. An inbox that
    -- no longer exists is refused as a revoked machine's is: nobody there to reach.
    if not found or revoked then
        raise exception 'the machine of a recipient was revoked' using errcode = 'RLY03', detail = inbox::text;
    end if;
    if unread > cap then
        raise exception 'inbox full' using errcode = 'RLY02', detail = inbox::text;
    end if;

    insert into deliveries (recipient_id, seq, message_id) values (inbox, seq, s.id);

    -- Away: not online, where a human's inbox ('me') never is.
    if not human and not online then
        offline := array[inbox];
        offline_seen := array[seen];
    end if;
    seqs := array[seq];
    relations := array[relation];
    perform pg_notify('relay_delivery', 'r' || replica || ':' || inbox);
    sent_at := now();
    outcome := 'stored';
end $$;

create function relay_write_sends_plain(sends relay_outgoing[], cap integer, replica bigint)
returns table (n bigint, outcome text, code text, message text, detail text,
               offline bigint[], offline_seen timestamptz[], seqs bigint[], relations text[], sent_at timestamptz)
language plpgsql
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
declare
    inboxes bigint[];
begin
    if exists (select 1 from unnest(sends) s
               where cardinality(s.recipients) <> 1 or s.read_by is not null or cardinality(s.contacts) > 0) then
        raise exception 'not a set of plain sends: one recipient each, no contact, nothing read' using errcode = '22023';
    end if;

    -- Every inbox, locked in id order as every writer locks them (see migration 10).
    inboxes := array(select distinct s.recipients[1] from unnest(sends) s order by 1);
    perform 1 from endpoints where id = any(inboxes) order by id for no key update;

    -- Counted as if no send were a duplicate, so that no check refuses one once written. An inbox
    -- that would refuse (full, its machine revoked, gone) sends the batch to the writer that sorts
    -- the refused sends from the rest, before anything is written here.
    if exists (select 1
               from (select s.recipients[1] as inbox, count(*) as k from unnest(sends) s group by 1) w
               left join endpoints e on e.id = w.inbox
               left join machines ma on ma.id = e.machine_id
               where e.id is null or ma.revoked_at is not null or e.unread + w.k > cap) then
        return query select * from relay_write_sends_numbered(sends, cap, replica);
        return;
    end if;

    -- The heads and unread counts are kept here; the deliveries' counting triggers stand aside.
    perform set_config('relay.counted', 'on', true);
    return query
    with written as (
        -- A retry is answered with the first result whatever has changed since.
        insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
        select s.id, s.sender, s.client_id, s.thread, s.kind, s.body, s.reply_to, s.private, s.require_reply
        from unnest(sends) with ordinality s
        order by s.ordinality
        on conflict (sender_id, client_id) do nothing
        returning id
    ), wanted as (
        select s.ordinality as n, s.id, s.recipients[1] as inbox
        from unnest(sends) with ordinality s
        where s.id in (select w.id from written w)
    ), heads as (
        -- Each inbox's head moves once by its count of new deliveries.
        update endpoints e set head_seq = e.head_seq + c.k, unread = e.unread + c.k
        from (select w.inbox, count(*) as k from wanted w group by w.inbox) c
        where e.id = c.inbox
        returning e.id, e.head_seq - c.k as base, e.parent_id, e.machine_id, e.last_seen_at,
                  relay_endpoint_online(e) as online
    ), numbered as (
        -- The new deliveries take the seqs above the old head in batch order: gapless and ordered.
        select w.n, w.id, w.inbox, h.base + row_number() over (partition by w.inbox order by w.n) as seq,
               h.parent_id, h.machine_id, h.last_seen_at, h.online
        from wanted w join heads h on h.id = w.inbox
    ), delivered as (
        insert into deliveries (recipient_id, seq, message_id)
        select nb.inbox, nb.seq, nb.id from numbered nb
    ), answered as (
        select s.ordinality as n, s.sender, nb.inbox, nb.seq, nb.parent_id, nb.last_seen_at,
               -- away: not online, where a human's inbox ('me') never is
               nb.inbox is not null and ma.name <> 'me' and not nb.online as away
        from unnest(sends) with ordinality s
        left join numbered nb on nb.n = s.ordinality
        left join machines ma on ma.id = nb.machine_id
    )
    select a.n, case when a.inbox is null then 'duplicate' else 'stored' end, null::text, null::text, null::text,
           case when a.away then array[a.inbox] end,
           case when a.away then array[a.last_seen_at] end,
           case when a.inbox is not null then array[a.seq] end,
           case when a.inbox is not null
                then array[case when a.parent_id = a.sender then 'parent'
                                when a.inbox = (select se.parent_id from endpoints se where se.id = a.sender) then 'child'
                                else '' end] end,
           now()
    from answered a
    order by a.n;

    -- One notification names every inbox, for the other replicas (a batch holds at most 64 sends,
    -- well within a payload). A duplicate's inbox is named too: a wake that finds nothing new costs
    -- a read, and duplicates are retries.
    perform pg_notify('relay_delivery', 'r' || replica || ':' || array_to_string(inboxes, ','));
end $$;
