-- Whether an endpoint holds its handle: a lease still running, or an open stream on a live replica.
create or replace function relay_endpoint_lease(e endpoints)
 returns boolean
 language sql
 stable
as $function$
    select coalesce(e.online_until > now(), false)
        or (e.stream_gen > e.stream_closed_gen and relay_replica_alive(e.stream_replica))
$function$;
