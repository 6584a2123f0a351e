-- The writers also answer what the recipients' streams on the writing replica push: each
-- recipient's seq and how it stands to the sender (parent, child or neither), and when the message
-- was stored. With those the writing replica pushes a message to its own streams without reading it
-- back; a stream that missed a wake, or whose next seq is not the one handed over, still reads the
-- database as before.
--
-- New functions beside the old (their answers differ, so the old keep their signatures for the
-- previous release, which calls them unchanged): `relay_write_sends_numbered` is migration 26's
-- `relay_write_sends` and `relay_write_send_numbered` its `relay_write_send`, each with `seqs` and
-- `relations` in the order of a send's recipients and `sent_at`. Drop the old two in a later release.
--
-- A send to one inbox of its sender's own account, the commonest, also writes less than in
-- `relay_write_send`:
--   * it takes no lock ahead of its write: with one inbox there is no order to keep, and the update
--     of the head locks it. Locking it first wrote the row's lock to the WAL and took 0.05 ms;
--   * whether its recipients are online is asked in the same statement, of the inbox rows it
--     updates, not by a query after;
--   * its notification is named straight away, not built by `relay_announce_delivered`'s grouping
--     (kept for the batches and for sends past 300 recipients);
--   * the contact check runs only for a send that relies on a contact.
-- Measured on its own with pgbench, one send's execution goes from 0.44 to 0.31 ms.

create function relay_write_send_numbered(s relay_outgoing, cap integer, replica bigint,
                                          out outcome text, out offline bigint[], out offline_seen timestamptz[],
                                          out seqs bigint[], out relations text[], out sent_at timestamptz)
language plpgsql
-- Its statements find their rows by key: a plan made once a session serves every send. Otherwise the
-- planner, seeing a cheaper estimate for each send's own arrays, plans every statement again per call.
set plan_cache_mode = force_generic_plan
as $$
declare
    stored boolean;
    held bigint;
    full_id bigint;
    gone_id bigint;
begin
    perform set_config('relay.counted', 'on', true);

    -- Several inboxes are locked first, in id order, as every writer locks them (see migration 10).
    -- A send to one inbox of its own account takes no lock ahead: the update of the head locks its
    -- only inbox, and nothing it takes before that is what a writer holding an inbox waits for (a
    -- reply's delivery or a contact would be: a send with either still locks first). Only a retry
    -- racing its own first attempt, written by another writer, waits on the message's key; should
    -- that writer wait for this inbox, Postgres refuses one of the two and the client retries.
    if cardinality(s.recipients) <> 1 or s.read_by is not null or cardinality(s.contacts) > 0 then
        perform 1 from endpoints e where e.id = any(s.recipients || s.read_by) order by e.id for no key update;
    end if;

    -- The message first: a retry is answered with the first result whatever has changed since, so a
    -- duplicate writes nothing else and is not refused. Everything after it is conditioned on it.
    with m as (
        insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
        values (s.id, s.sender, s.client_id, s.thread, s.kind, s.body, s.reply_to, s.private, s.require_reply)
        on conflict (sender_id, client_id) do nothing
        returning messages.id
    ), kept as (
        -- The contacts it relies on, held until commit (`for key share`: only a drop conflicts).
        select 1 from contacts k
        where (k.account_a, k.account_b) in (select least(s.account, c), greatest(s.account, c)
                                             from unnest(s.contacts) c)
          and exists (select 1 from m)
        for key share of k
    ), read as (
        update deliveries d set state = 4, updated_at = now()
        where d.message_id = s.reply_to and d.recipient_id = s.read_by and d.state < 4
          and exists (select 1 from m)
        returning d.recipient_id
    ), heads as (
        -- One update per inbox row: a reply's sender may also be one of its recipients.
        update endpoints e
        set head_seq = e.head_seq + (e.id = any(s.recipients))::int,
            unread = e.unread + (e.id = any(s.recipients))::int
                     - (exists (select 1 from read r where r.recipient_id = e.id))::int
        where e.id = any(s.recipients || s.read_by)
          and (e.id = any(s.recipients) or exists (select 1 from read r where r.recipient_id = e.id))
          and exists (select 1 from m)
        -- Whether each is online is asked here, of the row in hand, rather than in a query after.
        returning e.id, e.head_seq, e.unread, e.machine_id, e.parent_id, e.last_seen_at, relay_endpoint_online(e) as online
    ), delivered as (
        insert into deliveries (recipient_id, seq, message_id)
        select h.id, h.head_seq, m.id from heads h, m where h.id = any(s.recipients)
    )
    -- Refused past the cap (RLY02) or for a revoked machine (RLY03); away: not online, where a
    -- human's inbox ('me') never is.
    select exists (select 1 from m), (select count(*) from kept), g.full_id, g.gone_id, g.away, g.away_seen,
           n.seqs, n.relations
    from (select min(h.id) filter (where h.unread > cap) as full_id,
                 min(h.id) filter (where ma.revoked_at is not null) as gone_id,
                 array_agg(h.id order by h.id) filter (where ma.name <> 'me' and not h.online) as away,
                 array_agg(h.last_seen_at order by h.id) filter (where ma.name <> 'me' and not h.online) as away_seen
          from heads h join machines ma on ma.id = h.machine_id
          where h.id = any(s.recipients)) g,
         -- Each recipient's seq and how it stands to the sender, in the order of `s.recipients`.
         (select array_agg(h.head_seq order by r.i) as seqs,
                 array_agg(case when h.parent_id = s.sender then 'parent'
                                when h.id = (select se.parent_id from endpoints se where se.id = s.sender) then 'child'
                                else '' end order by r.i) as relations
          from unnest(s.recipients) with ordinality r(id, i) join heads h on h.id = r.id) n
    into stored, held, full_id, gone_id, offline, offline_seen, seqs, relations;

    if not stored then
        outcome := 'duplicate';
        return;
    end if;
    -- Raising undoes what the statement wrote: the caller's transaction is this call alone.
    -- (Asked only of a send across accounts: the nested `if` spares the others a query.)
    if cardinality(s.contacts) > 0 then
        if held < (select count(distinct c) from unnest(s.contacts) c) then
            raise exception 'a contact this send relies on was dropped' using errcode = 'RLY01';
        end if;
    end if;
    if gone_id is not null then
        raise exception 'the machine of a recipient was revoked' using errcode = 'RLY03', detail = gone_id::text;
    end if;
    if full_id is not null then
        raise exception 'inbox full' using errcode = 'RLY02', detail = full_id::text;
    end if;

    -- Its recipients are distinct: up to 300 fit one notification, named straight away.
    if cardinality(s.recipients) <= 300 then
        perform pg_notify('relay_delivery', 'r' || replica || ':' || array_to_string(s.recipients, ','));
    else
        perform relay_announce_delivered(replica, s.recipients);
    end if;
    sent_at := now();
    outcome := 'stored';
end $$;

create function relay_write_sends_numbered(sends relay_outgoing[], cap integer, replica bigint)
returns table (n bigint, outcome text, code text, message text, detail text,
               offline bigint[], offline_seen timestamptz[], seqs bigint[], relations text[], sent_at timestamptz)
language plpgsql
-- Every statement here finds its rows by key whatever the batch holds: planned once a session,
-- not again for each batch whose estimate happens to differ.
set plan_cache_mode = force_generic_plan
as $$
declare
    stored text[] := '{}';
    failed_n bigint[] := '{}';
    failed_code text[] := '{}';
    failed_message text[] := '{}';
    failed_detail text[] := '{}';
    err_code text;
    err_message text;
    err_detail text;
    inboxes bigint[];
begin
    perform set_config('relay.counted', 'on', true);

    -- Every inbox the batch touches, locked in id order up front (inboxes before their
    -- deliveries, as everywhere): concurrent batches never deadlock. `no key update` is what the
    -- writes below need, and unlike `update` it lets another batch's foreign key check on a
    -- sender through: two batches sending each other's inboxes messages do not wait on each other.
    inboxes := array(select r from unnest(sends) s, unnest(s.recipients) r
                     union select s.read_by from unnest(sends) s where s.read_by is not null);
    perform 1 from endpoints where id = any(inboxes) order by id for no key update;

    if cardinality(sends) = 1 then
        stored := relay_write_send_set(sends, cap);
    else
        begin
            stored := relay_write_send_set(sends, cap);
        exception when others then
            -- One send spoiled the set: each again on its own.
            stored := '{}';
            for i in 1 .. cardinality(sends) loop
                begin
                    stored := stored || relay_write_send_set(sends[i:i], cap);
                exception when others then
                    get stacked diagnostics err_code = returned_sqlstate, err_message = message_text,
                                            err_detail = pg_exception_detail;
                    failed_n := failed_n || i::bigint;
                    failed_code := failed_code || err_code;
                    failed_message := failed_message || err_message;
                    failed_detail := failed_detail || nullif(err_detail, '');
                end;
            end loop;
        end;
    end if;

    perform relay_announce_delivered(replica, array(select r from unnest(sends) s, unnest(s.recipients) r
                                                    where s.id = any(stored)));

    return query
    with sent as (
        select s.ordinality as n, s.sender, s.recipients, st.id is not null as ok
        from unnest(sends) with ordinality s left join unnest(stored) st(id) on st.id = s.id
    ), away as (
        select e.id, e.last_seen_at
        from endpoints e join machines m on m.id = e.machine_id
        where e.id in (select r from sent, unnest(sent.recipients) r where sent.ok)
          -- a human's inbox ('me') is never away
          and m.name <> 'me' and not relay_endpoint_online(e)
    ), numbered as materialized (
        -- Each stored delivery's seq, counted down from its inbox's head after the batch: the
        -- stored sends took the seqs below it in batch order (`relay_write_send_set`), so nothing is
        -- read back from deliveries, whose plan, kept from when the table was small, could scan it.
        -- Materialized: inlined into the lateral join below, it would be computed again per send.
        select p.n, p.i,
               e.head_seq - (row_number() over (partition by p.inbox order by p.n desc) - 1) as seq,
               case when e.parent_id = p.sender then 'parent'
                    when e.id = se.parent_id then 'child'
                    else '' end as relation
        from (select sent.n, sent.sender, rcp.inbox, rcp.i
              from sent, unnest(sent.recipients) with ordinality rcp(inbox, i) where sent.ok) p
        join endpoints e on e.id = p.inbox
        left join endpoints se on se.id = p.sender
    )
    select sent.n,
           case when sent.ok then 'stored' when f.code is null then 'duplicate' else 'refused' end,
           f.code, f.message, f.detail, o.ids, o.seen, q.seqs, q.relations, now()
    from sent
    left join unnest(failed_n, failed_code, failed_message, failed_detail) as f(n, code, message, detail)
        on f.n = sent.n
    left join lateral (select array_agg(a.id order by a.id) as ids, array_agg(a.last_seen_at order by a.id) as seen
                       from away a where sent.ok and a.id = any(sent.recipients)) o on true
    -- Each recipient's seq and how it stands to the sender, in the order of its send's recipients.
    left join lateral (select array_agg(nb.seq order by nb.i) as seqs, array_agg(nb.relation order by nb.i) as relations
                       from numbered nb where nb.n = sent.n) q on true
    order by sent.n;
end $$;
