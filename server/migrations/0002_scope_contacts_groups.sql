-- Spawn trees and per-endpoint rules (null rule = open).
alter table endpoints
    add column parent_id        bigint references endpoints (id) on delete set null,
    add column rules_in         text[],
    add column rules_out        text[],
    -- sha-256 of the one-time grant a spawned worker's bridge claims its endpoint with
    add column spawn_grant_hash bytea unique;

create index endpoints_parent on endpoints (parent_id) where parent_id is not null;

-- Narrowing set by an ancestor on an endpoint; it binds that endpoint and all its descendants.
create table caps (
    id          bigint generated always as identity primary key,
    endpoint_id bigint not null references endpoints (id) on delete cascade,
    dir         text not null check (dir in ('in', 'out')),
    selectors   text[] not null,
    set_by      bigint not null references endpoints (id) on delete cascade,
    created_at  timestamptz not null default now()
);

create index caps_endpoint on caps (endpoint_id);

-- Groups of one account's endpoints; their rules are caps on every member.
create table groups (
    id         bigint generated always as identity primary key,
    account_id bigint not null references accounts (id) on delete cascade,
    name       text not null,
    owner_id   bigint not null references endpoints (id) on delete cascade,
    rules_in   text[],
    rules_out  text[],
    created_at timestamptz not null default now(),
    unique (account_id, name)
);

create table group_members (
    group_id    bigint not null references groups (id) on delete cascade,
    endpoint_id bigint not null references endpoints (id) on delete cascade,
    primary key (group_id, endpoint_id)
);

create index group_members_endpoint on group_members (endpoint_id);

-- The people behind an account: they manage contacts with an account-level credential.
create table humans (
    id         bigint generated always as identity primary key,
    account_id bigint not null references accounts (id) on delete cascade,
    name       text not null,
    token_hash bytea not null unique,
    created_at timestamptz not null default now(),
    revoked_at timestamptz,
    unique (account_id, name)
);

-- A contact one account asked for and the other has not accepted yet.
create table contact_requests (
    from_account bigint not null references accounts (id) on delete cascade,
    to_account   bigint not null references accounts (id) on delete cascade,
    created_at   timestamptz not null default now(),
    primary key (from_account, to_account)
);

-- 5 withdrawn: never delivered (e.g. the contact was dropped first); reason says why.
alter table deliveries add column reason text;
alter table deliveries drop constraint deliveries_state_check;
alter table deliveries add constraint deliveries_state_check check (state between 1 and 5);
