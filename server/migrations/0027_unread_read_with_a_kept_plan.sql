-- An inbox's unread messages are read by `relay_unread`, planned once a connection.
--
-- The read was one statement joining deliveries, messages and three endpoint lookups, and the plan
-- cache planned it again on every call: for each call's own values a fresh plan always looked
-- cheaper than a kept one. At 100,000 unread that was 1.4 ms of planning for 0.8 ms of execution per
-- look at the inbox, and a kept plan made while the tables were small could join the wrong way.
-- Here the plan is kept, and its shape leaves the planner no way to read more than it answers,
-- whatever its statistics say: the deliveries are taken first (by the partial index of unread ones,
-- limited), each message is found by its key, and the sender's address and parent are looked up row
-- by row.
--
-- `relay_advance` keeps its plans as well (same signature and answers). The previous release calls it
-- unchanged and never calls `relay_unread`.

create function relay_unread(recipient bigint, after bigint, lim bigint)
returns table (seq bigint, id text, sender text, thread text, kind smallint, body text, reply_to text,
               created_at timestamptz, require_reply boolean, private boolean, relation text)
language plpgsql stable
set plan_cache_mode = force_generic_plan
as $$
begin
    return query
    select d.seq, m.id,
           (select ea.address from endpoint_addresses ea where ea.id = m.sender_id),
           m.thread, m.kind, m.body, m.reply_to, m.created_at, m.require_reply, m.private,
           -- The inbox's own parent is looked up once, not per row.
           case when (select re.parent_id from endpoints re where re.id = recipient) = m.sender_id then 'parent'
                when (select se.parent_id from endpoints se where se.id = m.sender_id) = d.recipient_id then 'child'
                else '' end
    from (select u.seq, u.message_id, u.recipient_id from deliveries u
          -- `state < 4` (not read) spells the predicate of the partial index deliveries_unread.
          where u.recipient_id = recipient and u.seq > after and u.state < 4
          order by u.seq limit lim) d
         -- `offset 0` keeps the lookup a lookup: the planner cannot turn it into a join.
         cross join lateral (select * from messages mm where mm.id = d.message_id offset 0) m
    order by d.seq;
end $$;

alter function relay_advance(bigint, bigint[], smallint) set plan_cache_mode = force_generic_plan;
