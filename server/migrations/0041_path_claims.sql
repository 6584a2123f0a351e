-- Path claims: an agent says which paths of a repository it is changing. A repository is known by
-- its remote's key (`github.com/acme/api`), so clones on different machines meet. A claim is in
-- force until `until`, and while the session that made it lives (`session_hash` still the
-- endpoint's), unless it is kept (`session_hash` null): nothing runs to end a claim, every read
-- asks whether it still stands. Claims that no longer stand are deleted when their repository is
-- next claimed in, and by the retention round.

create table path_claims (
    id bigint generated always as identity primary key,
    endpoint_id bigint not null references endpoints (id) on delete cascade,
    account_id bigint not null references accounts (id) on delete cascade,
    session_hash bytea,
    repo text not null,
    paths text[] not null,
    exclusive boolean not null,
    reason text not null,
    since timestamptz not null default now(),
    until timestamptz not null
);

create index path_claims_by_repo on path_claims (repo);
create index path_claims_by_holder on path_claims (endpoint_id);
create index path_claims_by_account on path_claims (account_id);

-- Holders told that someone ran into their claim: once per claim and claimant in ten minutes, so
-- an agent claiming again and again cannot fill the holder's inbox.
create table path_claim_bumps (
    claim_id bigint not null references path_claims (id) on delete cascade,
    endpoint_id bigint not null references endpoints (id) on delete cascade,
    told_at timestamptz not null default now(),
    primary key (claim_id, endpoint_id)
);

create index path_claim_bumps_by_endpoint on path_claim_bumps (endpoint_id);
