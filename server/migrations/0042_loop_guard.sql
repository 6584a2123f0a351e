-- The loop guard: agents answering each other past a bound, with no person in between, have their
-- further messages held for a person. The bounds are the account's (the sender's account's apply);
-- `loop_pairs` keeps, per pair of endpoints (a < b), when a person last cleared it (released a
-- message the guard held: the count starts over) and when the guard last tripped (its notices are
-- sent once per trip).

alter table accounts
    add column loop_max_messages integer not null default 30,
    add column loop_window_s integer not null default 60,
    add column loop_max_depth integer not null default 40;

create table loop_pairs (
    a bigint not null references endpoints (id) on delete cascade,
    b bigint not null references endpoints (id) on delete cascade,
    cleared_at timestamptz,
    tripped_at timestamptz,
    primary key (a, b),
    check (a < b)
);

create index loop_pairs_by_b on loop_pairs (b);
