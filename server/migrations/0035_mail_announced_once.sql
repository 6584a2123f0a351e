-- Mail announced to an agent's model once: the hooks that wake an idle agent or hold the end of its
-- turn name what it has not been shown.
--
-- `relay_announce` finds the first `lim` deliveries of inbox `recipient` that its model has not
-- been shown (queued, or pushed: the pushed mark is kept apart, migration 29) and moves them to
-- surfaced, answering those it moved with their senders, kinds and the inbox's unread count. Only
-- the rows this call moved are answered, and the inbox is locked before they move, so two callers
-- at once (a wake hook and an end-of-turn hook) never both announce a message. Finding nothing is
-- one index probe and writes nothing, so a hook that looks at an inbox with nothing new costs a
-- read. As `relay_advance` does for what a hint names, the newest announced becomes the newest
-- shown (`reply last`). Nothing of the previous release calls it.

create function relay_announce(recipient bigint, lim bigint)
returns table (seq bigint, id text, sender text, kind smallint, require_reply boolean, unread integer)
language plpgsql
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
declare
    seqs bigint[];
    moved bigint[];
    message_ids text[];
    left_unread integer;
begin
    select array_agg(u.seq order by u.seq) into seqs
    from (select u.seq from deliveries u
          -- `state < 4` (not read) spells the predicate of the partial index deliveries_unread.
          where u.recipient_id = recipient and u.state < 4 and u.state < 3
          order by u.seq limit lim) u;
    if seqs is null then
        return;
    end if;
    perform set_config('relay.counted', 'on', true);
    -- `no key update`, as the writers take it.
    perform 1 from endpoints e where e.id = recipient for no key update;
    with shown as (
        update deliveries d set state = 3, updated_at = now()
        where d.recipient_id = recipient and d.seq between seqs[1] and seqs[cardinality(seqs)]
          and d.seq = any(seqs) and d.state < 3
        returning d.seq, d.message_id
    )
    select array_agg(s.seq order by s.seq), array_agg(s.message_id order by s.seq) into moved, message_ids
    from shown s;
    if moved is null then
        return;
    end if;
    update endpoints e set last_shown = message_ids[cardinality(message_ids)]
    where e.id = recipient
    returning e.unread into left_unread;
    return query
    select p.seq, m.id,
           (select ea.address from endpoint_addresses ea where ea.id = m.sender_id),
           m.kind, m.require_reply, left_unread
    from unnest(moved, message_ids) as p (seq, message_id)
         cross join lateral (select * from messages mm where mm.id = p.message_id offset 0) m
    order by p.seq;
end $$;
