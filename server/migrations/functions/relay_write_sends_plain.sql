-- Writes a batch of plain sends without subtransactions; falls back to the numbered writer when
-- an inbox would refuse one.
create or replace function relay_write_sends_plain(sends relay_outgoing[], cap integer, replica bigint)
 returns table(n bigint, outcome text, code text, message text, detail text, offline bigint[], offline_seen timestamp with time zone[], seqs bigint[], relations text[], sent_at timestamp with time zone)
 language plpgsql
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    inboxes bigint[];
begin
    if exists (select 1 from unnest(sends) s
               where cardinality(s.recipients) <> 1 or s.read_by is not null or cardinality(s.contacts) > 0) then
        raise exception 'not a set of plain sends: one recipient each, no contact, nothing read' using errcode = '22023';
    end if;

    -- Every inbox, locked as every writer locks them (`relay_lock_inboxes`).
    inboxes := array(select distinct s.recipients[1] from unnest(sends) s order by 1);
    perform 1 from relay_lock_inboxes(inboxes);

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
        select s.ordinality as n, s.id, s.recipients[1] as inbox, s.sender, s.account
        from unnest(sends) with ordinality s
        where s.id in (select w.id from written w)
    ), heads as (
        -- Each inbox's head moves once by its count of new deliveries. The loop guard's streak
        -- (migration 44) is the last sender's to each inbox in the batch: an agent answering the one
        -- who last wrote to it, within the window, goes on that streak; past the bound the batch is
        -- refused (RLY04) and written send by send, which sorts the send out.
        update endpoints e set head_seq = e.head_seq + c.k, unread = e.unread + c.k,
            (loop_peer, loop_turns, loop_since) = (
                select case when l.person then null else c.sender end,
                       case when l.answer then l.turns + 1 else 1 end,
                       case when l.answer then l.since else now() end
                from (select rm.name = 'me' as person, se.loop_turns as turns, se.loop_since as since,
                             rm.name <> 'me' and se.loop_peer = e.id and se.id <> e.id
                             -- and the last to write to the recipient was the sender: a person between them ends it
                             and coalesce(e.loop_peer, c.sender) = c.sender
                             and se.loop_since > now() - make_interval(secs => ac.loop_window_s) as answer
                      from machines rm, endpoints se, accounts ac
                      where rm.id = e.machine_id and se.id = c.sender and ac.id = c.account) l)
        from (select w.inbox, count(*) as k, (array_agg(w.sender order by w.n desc))[1] as sender,
                     (array_agg(w.account order by w.n desc))[1] as account
              from wanted w group by w.inbox) c
        where e.id = c.inbox
        returning e.id, e.head_seq - c.k as base, e.parent_id, e.machine_id, e.last_seen_at,
                  relay_endpoint_online(e) as online,
                  e.loop_turns > (select ac.loop_max_messages from accounts ac where ac.id = c.account) as looping
    ), numbered as (
        -- The new deliveries take the seqs above the old head in batch order: gapless and ordered.
        select w.n, w.id, w.inbox, h.base + row_number() over (partition by w.inbox order by w.n) as seq,
               h.parent_id, h.machine_id, h.last_seen_at, h.online, h.looping
        from wanted w join heads h on h.id = w.inbox
    ), delivered as (
        insert into deliveries (recipient_id, seq, message_id)
        select nb.inbox, nb.seq, nb.id from numbered nb
    ), answered as (
        select s.ordinality as n, s.sender, nb.inbox, nb.seq, nb.parent_id, nb.last_seen_at,
               -- away: not online, where a human's inbox ('me') never is
               nb.inbox is not null and ma.name <> 'me' and not nb.online as away,
               coalesce(nb.looping, false) as looping
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
    -- Raising undoes the whole statement: the caller's transaction is this call alone.
    where case when a.looping then relay_refuse('RLY04', 'agents answering each other past the loop guard', a.inbox::text)
               else true end
    order by a.n;

    -- One notification names every inbox, for the other replicas (a batch holds at most 64 sends,
    -- well within a payload). A duplicate's inbox is named too: a wake that finds nothing new costs
    -- a read, and duplicates are retries.
    perform pg_notify('relay_delivery', 'r' || replica || ':' || array_to_string(inboxes, ','));
end $function$;
