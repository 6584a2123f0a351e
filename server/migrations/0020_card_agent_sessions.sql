-- A card's agent holds a session opened with the job token of the card's attempt in progress
-- (never the machine's token): it acts as the card's endpoint, job-<card id> on the machine that
-- leased the card, and only while that attempt lasts. The column names the attempt; it is null for
-- every other session, which a release that knows nothing of it keeps writing.
alter table endpoints add column job_token_hash bytea;

-- However a card leaves its attempt (finished, released, lease expired, sent back, closed), and
-- whichever release or tool moves it, the attempt's session ends in the same transaction;
-- endpoints_control (migration 9) then tells every replica to forget it. The session hash stays,
-- so a late call is told why it ended; the next claim of the handle replaces it. The endpoint is
-- found by its handle, through the (machine_id, handle) index.
create function relay_attempt_ended() returns trigger language plpgsql as $$
begin
    update endpoints set ended_at = now(), online_until = null, last_seen_at = now()
    where machine_id = old.lease_machine and handle = 'job-' || old.id
      and job_token_hash = old.job_token_hash and ended_at is null;
    return null;
end $$;

create trigger jobs_attempt_ended after update of state, job_token_hash on jobs
    for each row
    when (old.job_token_hash is not null
          and (old.state is distinct from new.state or old.job_token_hash is distinct from new.job_token_hash))
    execute function relay_attempt_ended();
