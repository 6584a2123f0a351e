-- The account's human inbox is the endpoint `me` on the reserved machine `me`; it reads as `account/me`.
create or replace view endpoint_addresses as
select e.id,
       e.machine_id,
       m.account_id,
       case when m.name = 'me' and e.handle = 'me' then a.name || '/me'
            else a.name || '/' || m.name || '/' || e.handle end as address,
       a.name as account,
       m.name as machine,
       e.handle
from endpoints e
join machines m on m.id = e.machine_id
join accounts a on a.id = m.account_id;

alter table messages
    add column private       boolean not null default false,
    add column require_reply boolean not null default false;

-- Whether private data may cross this contact.
alter table contacts add column private_ok boolean not null default false;

-- Classes of messages the account's human must release: private-outbound, contact.
alter table accounts add column hold_classes text[] not null default '{}';

-- A message held for the human: stored, delivered to nobody until released.
create table holds (
    id          text primary key,
    account_id  bigint not null references accounts (id) on delete cascade,
    message_id  text not null references messages (id) on delete cascade,
    class       text not null,
    recipients  bigint[] not null,
    state       text not null default 'pending' check (state in ('pending', 'released', 'rejected')),
    reason      text,
    created_at  timestamptz not null default now(),
    decided_at  timestamptz,
    decided_by  text
);

create index holds_pending on holds (account_id, created_at) where state = 'pending';

-- Peek: an agent's last turns, kept only while it allows peeking, and who looked.
alter table endpoints add column peek_on boolean not null default false;

create table peek_turns (
    endpoint_id bigint primary key references endpoints (id) on delete cascade,
    turns       jsonb not null,
    updated_at  timestamptz not null default now()
);

create table peeks (
    id        bigint generated always as identity primary key,
    target_id bigint not null references endpoints (id) on delete cascade,
    peeker    text not null,
    turns     integer not null,
    at        timestamptz not null default now()
);

create index peeks_target on peeks (target_id, at);
