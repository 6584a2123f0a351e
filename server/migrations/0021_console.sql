-- The web console's sessions: a person signs in with the account's human token and the browser
-- holds a random session id in a cookie, of which only the hash is kept here. Kept in the database,
-- not a replica's memory, so a session outlives the replica that opened it. Every request joins
-- the human row, so a revoked human token ends its sessions at once; deleting the human deletes them.
create table console_sessions (
    id_hash    bytea primary key,
    human_id   bigint not null references humans (id) on delete cascade,
    created_at timestamptz not null default now(),
    expires_at timestamptz not null
);

create index console_sessions_by_human on console_sessions (human_id);
create index console_sessions_by_expiry on console_sessions (expires_at);

-- Something an account's console shows changed: a card, a hold, a permission request. Every
-- replica hears it on `relay_account` (payload: the account's id) and wakes that account's open
-- consoles, whichever release, replica or tool made the change. Postgres folds repeats within a
-- transaction, so a statement touching many cards of one account notifies once.
create function relay_account_changed() returns trigger language plpgsql as $$
declare
    account bigint;
begin
    if tg_op = 'DELETE' then
        account := old.account_id;
    else
        account := new.account_id;
    end if;
    perform pg_notify('relay_account', account::text);
    return null;
end $$;

create trigger jobs_shown after insert or delete on jobs
    for each row execute function relay_account_changed();
-- A renewed lease alone changes nothing a person sees: only changes to what the board shows count.
create trigger jobs_shown_changed after update on jobs
    for each row when (
        (old.state, old.title, old.detail, old.repo_id, old.agent, old.requires_pr, old.schedule, old.time_zone,
         old.next_run_at, old.run_count, old.last_skip_reason, old.attempts, old.last_error, old.branch,
         old.agent_state, old.pr_url, old.summary, old.edited_at, old.closed_at)
        is distinct from
        (new.state, new.title, new.detail, new.repo_id, new.agent, new.requires_pr, new.schedule, new.time_zone,
         new.next_run_at, new.run_count, new.last_skip_reason, new.attempts, new.last_error, new.branch,
         new.agent_state, new.pr_url, new.summary, new.edited_at, new.closed_at))
    execute function relay_account_changed();
create trigger holds_shown after insert or update or delete on holds
    for each row execute function relay_account_changed();
create trigger approvals_shown after insert or update or delete on approvals
    for each row execute function relay_account_changed();
