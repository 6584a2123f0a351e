-- The loop guard: agents answering each other past their account's bounds, with no person in
-- between, have their further messages held for a person. The bounds are the account's (the sender's
-- account's apply). A conversation is weighed by its thread: `loop_threads` keeps when a person last
-- let a thread go on (released a message the guard held in it: its turns count afresh). A pair the
-- guard tripped on is kept in `loop_pairs` (a < b) until a person clears it: its sends are then held
-- whatever their thread, decided where a send's recipients are allowed, so every replica hears of a
-- trip or a clearing as of any change to who may message whom (`relay_scope_changed`), and a trip's
-- notices go out once.

alter table accounts
    add column loop_max_messages integer not null default 30,
    add column loop_window_s integer not null default 60,
    add column loop_max_depth integer not null default 40;

create table loop_threads (
    thread text primary key,
    cleared_at timestamptz not null
);

create table loop_pairs (
    a bigint not null references endpoints (id) on delete cascade,
    b bigint not null references endpoints (id) on delete cascade,
    cleared_at timestamptz,
    tripped_at timestamptz,
    primary key (a, b),
    check (a < b)
);

create index loop_pairs_by_b on loop_pairs (b);

create trigger loop_pairs_scope after insert or update or delete on loop_pairs
    for each statement execute function relay_scope_changed();
