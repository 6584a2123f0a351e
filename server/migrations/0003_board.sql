-- The account's operator endpoint (machine/handle): it reviews cards and adds repositories.
alter table accounts add column operator text;
-- When an `agent-bridge worker` last asked this machine's cards.
alter table machines add column worker_seen_at timestamptz;

create table repos (
    id         bigint generated always as identity primary key,
    account_id bigint not null references accounts (id) on delete cascade,
    machine_id bigint not null references machines (id) on delete cascade,
    path       text not null,
    name       text not null,
    added_by   text not null,
    created_at timestamptz not null default now(),
    unique (machine_id, path)
);

create table jobs (
    id               text primary key,
    account_id       bigint not null references accounts (id) on delete cascade,
    repo_id          bigint not null references repos (id) on delete cascade,
    -- a job runs once; a schedule posts a job each time it comes due
    kind             text not null check (kind in ('job', 'schedule')),
    state            text not null check (state in ('todo', 'in_progress', 'review', 'done')),
    title            text not null,
    detail           text not null default '',
    agent            text not null check (agent in ('claude', 'codex')),
    requires_pr      boolean not null,
    schedule         text,
    time_zone        text,
    next_run_at      timestamptz,
    run_count        integer not null default 0,
    last_run_at      timestamptz,
    last_skip_reason text,
    schedule_id      text references jobs (id) on delete set null,
    posted_by        text not null,
    posted_at        timestamptz not null default now(),
    edited_by        text,
    edited_at        timestamptz,
    attempts         integer not null default 0,
    last_error       text,
    lease_machine    bigint references machines (id) on delete set null,
    lease_until      timestamptz,
    -- sha-256 of the current attempt's token: only that attempt's agent can finish the card
    job_token_hash   bytea unique,
    branch           text,
    worktree         text,
    agent_state      text,
    pr_url           text,
    summary          text,
    started_at       timestamptz,
    finished_at      timestamptz,
    closed_at        timestamptz,
    worktree_removed boolean not null default false
);

create index jobs_todo on jobs (posted_at) where state = 'todo' and kind = 'job';
create index jobs_due on jobs (next_run_at) where kind = 'schedule';
create index jobs_leases on jobs (lease_until) where state = 'in_progress';
create index jobs_runs on jobs (schedule_id, posted_at) where schedule_id is not null;
