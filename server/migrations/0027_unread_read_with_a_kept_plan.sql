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

-- As in migration 24, with its plans kept, and the newest shown message taken from the read that
-- decided whether anything moves instead of being looked up again.
create or replace function relay_advance(recipient bigint, seqs bigint[], target smallint,
                                         out moved integer, out left_unread integer)
language plpgsql
set plan_cache_mode = force_generic_plan
as $$
declare
    lowest bigint;
    highest bigint;
    shown text;
    newest text;
begin
    if target not between 2 and 4 then
        raise exception 'relay_advance: target % is not pushed, surfaced or read', target;
    end if;
    -- The range bounds the index scan whatever the planner believes of this inbox's size: an inbox
    -- that grew faster than the statistics would otherwise be read whole for a few seqs.
    select min(x), max(x) into lowest, highest from unnest(seqs) x;
    if target > 2 then
        select e.unread, e.last_shown into left_unread, shown from endpoints e where e.id = recipient;
        select d.message_id into newest from deliveries d where d.recipient_id = recipient and d.seq = highest;
        if (newest is null or newest = shown)
           and not exists (select 1 from deliveries d
                           where d.recipient_id = recipient and d.seq between lowest and highest
                             and d.seq = any(seqs) and d.state < target) then
            moved := 0;
            return;
        end if;
    end if;
    perform set_config('relay.counted', 'on', true);
    if target = 2 then
        -- A pushed mark lost in a crash only means the message is pushed again on reconnect, which
        -- the bridge recognises by its seq: not worth a disk flush of its own.
        perform set_config('synchronous_commit', 'off', true);
    else
        perform 1 from endpoints where id = recipient for update;
    end if;
    update deliveries set state = target, updated_at = now()
    where recipient_id = recipient and seq between lowest and highest and seq = any(seqs) and state < target;
    get diagnostics moved = row_count;
    if target > 2 then
        update endpoints
        set unread = unread - case when target = 4 then moved else 0 end,
            last_shown = coalesce(newest, last_shown)
        where id = recipient
        returning unread into left_unread;
    end if;
end $$;
