-- Whether an endpoint is online: not ended, holding its lease, and with an open stream or seen in
-- the last 5 s.
create or replace function relay_endpoint_online(e endpoints)
 returns boolean
 language sql
 stable
as $function$
    select e.ended_at is null
       and relay_endpoint_lease(e)
       and (e.stream_gen > e.stream_closed_gen or coalesce(e.last_seen_at > now() - interval '5 seconds', false))
$function$;
