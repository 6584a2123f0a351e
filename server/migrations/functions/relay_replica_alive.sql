-- Whether a replica is alive (its row renewed within its lease). plpgsql, so its plan is kept for
-- the session.
create or replace function relay_replica_alive(replica bigint)
 returns boolean
 language plpgsql
 stable
as $function$
begin
    return exists (select 1 from replicas r where r.id = replica and r.alive_until > now());
end $function$;
