-- A page of an inbox's unread messages after `after`, each sender looked up once.
create or replace function relay_unread(recipient bigint, after bigint, lim bigint)
 returns table(seq bigint, id text, sender text, thread text, kind smallint, body text, reply_to text, created_at timestamp with time zone, require_reply boolean, private boolean, relation text)
 language plpgsql
 stable
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
begin
    return query
    with page as materialized (
        select d.seq, m.id, m.sender_id, m.thread, m.kind, m.body, m.reply_to, m.created_at,
               m.require_reply, m.private
        from (select u.seq, u.message_id from deliveries u
              -- `state < relay_state('read')` is planned as `state < relay_state('read')`: the partial index deliveries_unread.
              where u.recipient_id = recipient and u.seq > after and u.state < relay_state('read')
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
end $function$;
