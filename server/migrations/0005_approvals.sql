-- A board agent's request to use a tool: the operator answers, else the account's human.
create table approvals (
    id           text primary key,
    account_id   bigint not null references accounts (id) on delete cascade,
    job_id       text not null references jobs (id) on delete cascade,
    requester_id bigint not null references endpoints (id) on delete cascade,
    tool         text not null,
    input        text not null,
    -- pending (operator), escalated (the human), allow, deny
    state        text not null default 'pending' check (state in ('pending', 'escalated', 'allow', 'deny')),
    reason       text,
    decided_by   text,
    created_at   timestamptz not null default now(),
    decided_at   timestamptz
);

create index approvals_open on approvals (account_id, created_at) where state in ('pending', 'escalated');
