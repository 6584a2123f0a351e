-- The wake-up of an idle agent: its next unshown messages (up to `lim`) moved to surfaced once,
-- with their senders, so each is announced to the agent exactly once.
create or replace function relay_announce(recipient bigint, lim bigint)
 returns table(seq bigint, id text, sender text, kind smallint, require_reply boolean, unread integer)
 language plpgsql
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    seqs bigint[];
    moved bigint[];
    message_ids text[];
    left_unread integer;
begin
    select array_agg(u.seq order by u.seq) into seqs
    from (select u.seq from deliveries u
          -- `state < relay_state('read')` is planned as `state < relay_state('read')`: the partial index deliveries_unread.
          where u.recipient_id = recipient and u.state < relay_state('read') and u.state < relay_state('surfaced')
          order by u.seq limit lim) u;
    if seqs is null then
        return;
    end if;
    perform set_config('relay.counted', 'on', true);
    -- `no key update`, as the writers take it.
    perform 1 from endpoints e where e.id = recipient for no key update;
    with shown as (
        update deliveries d set state = relay_state('surfaced'), updated_at = now()
        where d.recipient_id = recipient and d.seq between seqs[1] and seqs[cardinality(seqs)]
          and d.seq = any(seqs) and d.state < relay_state('surfaced')
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
end $function$;
