-- Trigger: keeps `endpoints.unread` for writers that do not count themselves (a statement typed by
-- hand). The server's writers set `relay.counted` and keep the counts in the same statement.
create or replace function relay_count_unread()
 returns trigger
 language plpgsql
as $function$
begin
    if tg_op = 'INSERT' then
        update endpoints e set unread = e.unread + n.c
        from (select recipient_id, count(*) as c from new_rows where state < relay_state('read') group by recipient_id) n
        where e.id = n.recipient_id;
    elsif tg_op = 'DELETE' then
        update endpoints e set unread = e.unread - o.c
        from (select recipient_id, count(*) as c from old_rows where state < relay_state('read') group by recipient_id) o
        where e.id = o.recipient_id;
    else
        update endpoints e set unread = e.unread + d.c
        from (select recipient_id, sum(c) as c
              from (select recipient_id, count(*) as c from new_rows where state < relay_state('read') group by recipient_id
                    union all
                    select recipient_id, -count(*) from old_rows where state < relay_state('read') group by recipient_id) x
              group by recipient_id having sum(c) <> 0) d
        where e.id = d.recipient_id;
    end if;
    return null;
end $function$;
