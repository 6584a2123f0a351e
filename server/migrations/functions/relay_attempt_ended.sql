-- Trigger: a card that leaves its attempt (or whose job token changes) ends the session of its agent.
create or replace function relay_attempt_ended()
 returns trigger
 language plpgsql
as $function$
begin
    update endpoints set ended_at = now(), online_until = null, last_seen_at = now()
    where machine_id = old.lease_machine and handle = 'job-' || old.id
      and job_token_hash = old.job_token_hash and ended_at is null;
    return null;
end $function$;
