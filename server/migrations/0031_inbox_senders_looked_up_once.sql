-- An inbox's page looks up each sender once, not once per message, and its plan cannot turn to
-- reading the whole inbox.
--
-- `relay_unread` (migration 27) found each message's sender address (three lookups) and parent (one)
-- row by row: for a page of 50 from one sender that was 200 lookups of the same rows, two thirds of
-- the read (0.8 ms of 1.2 at 100,000 unread). Here the page's deliveries and messages are taken
-- first, as before, then each distinct sender is looked up once and joined back. Same signature,
-- same answers in the same order; the previous release calls it unchanged.
--
-- Its plan is kept for the connection, made on the statistics of the moment. Made while the tables
-- were nearly empty (a new deployment, or tables analyzed before a burst), it read every delivery
-- of the inbox and sorted them, and found each message by reading the whole table: 400 ms a look
-- at 100,000 unread, until the next analyze. Sequential and bitmap scans are therefore switched off
-- for this function (the planner then takes them only where no index serves); and JIT, which the
-- huge cost the planner puts on the switched-off paths would otherwise set off (half a second
-- compiling each call).
create or replace function relay_unread(recipient bigint, after bigint, lim bigint)
returns table (seq bigint, id text, sender text, thread text, kind smallint, body text, reply_to text,
               created_at timestamptz, require_reply boolean, private boolean, relation text)
language plpgsql stable
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
begin
    return query
    with page as materialized (
        select d.seq, m.id, m.sender_id, m.thread, m.kind, m.body, m.reply_to, m.created_at,
               m.require_reply, m.private
        from (select u.seq, u.message_id from deliveries u
              -- `state < 4` (not read) spells the predicate of the partial index deliveries_unread.
              where u.recipient_id = recipient and u.seq > after and u.state < 4
              order by u.seq limit lim) d
             -- `offset 0` keeps the lookup a lookup: the planner cannot turn it into a join.
             cross join lateral (select * from messages mm where mm.id = d.message_id offset 0) m
    ), senders as materialized (
        select s.sender_id,
               (select ea.address from endpoint_addresses ea where ea.id = s.sender_id) as address,
               (select se.parent_id from endpoints se where se.id = s.sender_id) as parent_id
        from (select distinct p.sender_id from page p) s
    )
    select p.seq, p.id, s.address, p.thread, p.kind, p.body, p.reply_to, p.created_at, p.require_reply,
           p.private,
           -- The inbox's own parent is looked up once, not per row.
           case when (select re.parent_id from endpoints re where re.id = recipient) = p.sender_id then 'parent'
                when s.parent_id = recipient then 'child'
                else '' end
    from page p join senders s on s.sender_id = p.sender_id
    order by p.seq;
end $$;

-- The same holds for every function a send, a push or a look at the inbox runs, whose plans are
-- kept as well: made on nearly empty tables, `relay_advance` found a page's newest delivery and
-- checked what moves by reading every delivery, 20 ms a look at 100,000 unread. Their bodies are
-- unchanged; the previous release calls them as before and gets the same plans.
alter function relay_advance(bigint, bigint[], smallint)
    set enable_seqscan = off set enable_bitmapscan = off set jit = off;
alter function relay_write_send_numbered(relay_outgoing, integer, bigint)
    set enable_seqscan = off set enable_bitmapscan = off set jit = off;
alter function relay_write_sends_numbered(relay_outgoing[], integer, bigint)
    set enable_seqscan = off set enable_bitmapscan = off set jit = off;
alter function relay_write_send(relay_outgoing, integer, bigint)
    set enable_seqscan = off set enable_bitmapscan = off set jit = off;
alter function relay_write_sends(relay_outgoing[], integer, bigint)
    set enable_seqscan = off set enable_bitmapscan = off set jit = off;
alter function relay_write_send_set(relay_outgoing[], integer)
    set enable_seqscan = off set enable_bitmapscan = off set jit = off;

-- Pushes recorded together: each inbox's mark moved to the seq given beside it, if that is further,
-- for all of them in one statement (a replica gathers the marks its streams left meanwhile). Given in
-- inbox order, so two callers lock the same inboxes in one order. A mark lost in a crash only shows a
-- pushed message as queued until it is surfaced: not worth a disk flush. An inbox that no longer
-- exists is skipped. Answers how many marks moved.
create function relay_mark_pushed(inboxes bigint[], through bigint[]) returns integer
language plpgsql
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
declare
    moved integer;
begin
    perform set_config('synchronous_commit', 'off', true);
    insert into inbox_pushed as p (endpoint_id, through_seq)
    select m.inbox, m.seq
    from unnest(inboxes, through) as m (inbox, seq)
    where exists (select 1 from endpoints e where e.id = m.inbox)
    order by m.inbox
    on conflict (endpoint_id) do update set through_seq = excluded.through_seq
        where p.through_seq < excluded.through_seq;
    get diagnostics moved = row_count;
    return moved;
end $$;
