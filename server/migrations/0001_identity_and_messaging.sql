-- Accounts, machines and the endpoints (agent sessions) they run.
create table accounts (
    id         bigint generated always as identity primary key,
    name       text not null unique,
    created_at timestamptz not null default now()
);

create table machines (
    id         bigint generated always as identity primary key,
    account_id bigint not null references accounts (id) on delete cascade,
    name       text not null,
    -- sha-256 of the machine token; the token itself is shown once and never stored
    token_hash bytea not null unique,
    created_at timestamptz not null default now(),
    revoked_at timestamptz,
    unique (account_id, name)
);

-- A mutual contact between two accounts, stored once with the smaller id first.
create table contacts (
    account_a  bigint not null references accounts (id) on delete cascade,
    account_b  bigint not null references accounts (id) on delete cascade,
    created_at timestamptz not null default now(),
    primary key (account_a, account_b),
    check (account_a < account_b)
);

create table endpoints (
    id           bigint generated always as identity primary key,
    machine_id   bigint not null references machines (id) on delete cascade,
    handle       text not null,
    harness      text not null default 'other',
    -- sha-256 of the current session token; null once the session ended
    session_hash bytea unique,
    status       text not null default 'idle',
    note         text not null default '',
    now_text     text not null default '',
    title        text not null default '',
    -- presence: online while a push stream refreshes this, plus a short grace after it closes
    online_until timestamptz,
    last_seen_at timestamptz,
    ended_at     timestamptz,
    -- newest per-recipient sequence number handed out; the row lock on it keeps seqs gapless
    head_seq     bigint not null default 0,
    -- newest message this endpoint was shown, for `relay_reply last`
    last_shown   text,
    created_at   timestamptz not null default now(),
    unique (machine_id, handle)
);

create view endpoint_addresses as
select e.id,
       e.machine_id,
       m.account_id,
       a.name || '/' || m.name || '/' || e.handle as address,
       a.name as account,
       m.name as machine,
       e.handle
from endpoints e
join machines m on m.id = e.machine_id
join accounts a on a.id = m.account_id;

create table messages (
    id         text primary key,
    sender_id  bigint not null references endpoints (id) on delete cascade,
    -- the sender's idempotency key: a retried send finds its first result here
    client_id  text,
    thread     text not null,
    kind       smallint not null,
    body       text not null,
    reply_to   text references messages (id) on delete set null,
    created_at timestamptz not null default now(),
    unique (sender_id, client_id)
);

create index messages_reply_to on messages (reply_to) where reply_to is not null;

-- One row per recipient of a message; seq is gapless per recipient.
create table deliveries (
    recipient_id bigint not null references endpoints (id) on delete cascade,
    seq          bigint not null,
    message_id   text not null references messages (id) on delete cascade,
    -- 1 queued, 2 pushed, 3 surfaced, 4 read; only ever moves forward
    state        smallint not null default 1 check (state between 1 and 4),
    updated_at   timestamptz not null default now(),
    primary key (recipient_id, seq),
    unique (message_id, recipient_id)
);

create index deliveries_unread on deliveries (recipient_id, seq) where state < 4;
