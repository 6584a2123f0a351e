-- A look at the inbox in one statement: the page of unread messages and its move to surfaced or
-- read, with the count left unread on every row.
create or replace function relay_take_unread(recipient bigint, lim bigint, target smallint)
 returns table(seq bigint, id text, sender text, thread text, kind smallint, body text, reply_to text, created_at timestamp with time zone, require_reply boolean, private boolean, relation text, left_unread integer)
 language plpgsql
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    seqs bigint[];
    message_ids text[];
    behind boolean;
    parent bigint;
    shown text;
    unread_left integer;
    moved integer;
begin
    if target not between relay_state('surfaced') and relay_state('read') then
        raise exception 'relay_take_unread: target % is not surfaced or read', target;
    end if;
    select array_agg(u.seq order by u.seq), array_agg(u.message_id order by u.seq), bool_or(u.state < target)
    into seqs, message_ids, behind
    from (select u.seq, u.message_id, u.state from deliveries u
          -- `state < relay_state('read')` is planned as `state < relay_state('read')`: the partial index deliveries_unread.
          where u.recipient_id = recipient and u.state < relay_state('read')
          order by u.seq limit lim) u;
    if seqs is null then
        return;
    end if;
    select e.parent_id, e.last_shown, e.unread into parent, shown, unread_left from endpoints e where e.id = recipient;
    if behind or shown is distinct from message_ids[cardinality(message_ids)] then
        perform set_config('relay.counted', 'on', true);
        -- `no key update`, as the writers take it (see above).
        perform 1 from endpoints e where e.id = recipient for no key update;
        -- The range bounds the index scan whatever the planner believes of this inbox's size.
        update deliveries d set state = target, updated_at = now()
        where d.recipient_id = recipient and d.seq between seqs[1] and seqs[cardinality(seqs)]
          and d.seq = any(seqs) and d.state < target;
        get diagnostics moved = row_count;
        update endpoints e
        set unread = e.unread - case when target = relay_state('read') then moved else 0 end,
            last_shown = message_ids[cardinality(message_ids)]
        where e.id = recipient
        returning e.unread into unread_left;
    end if;
    return query
    with page as materialized (
        select p.seq, m.id, m.sender_id, m.thread, m.kind, m.body, m.reply_to, m.created_at,
               m.require_reply, m.private
        from unnest(seqs, message_ids) as p (seq, message_id)
             -- `offset 0` keeps the lookup a lookup: the planner cannot turn it into a join.
             cross join lateral (select * from messages mm where mm.id = p.message_id offset 0) m
    ), senders as materialized (
        -- Each sender once: its address is three lookups.
        select s.sender_id,
               (select ea.address from endpoint_addresses ea where ea.id = s.sender_id) as address,
               (select se.parent_id from endpoints se where se.id = s.sender_id) as parent_id
        from (select distinct p.sender_id from page p) s
    )
    select p.seq, p.id, s.address, p.thread, p.kind, p.body, p.reply_to, p.created_at, p.require_reply,
           p.private,
           case when parent = p.sender_id then 'parent'
                when s.parent_id = recipient then 'child'
                else '' end,
           unread_left
    from page p join senders s on s.sender_id = p.sender_id
    order by p.seq;
end $function$;
