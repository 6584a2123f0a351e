-- A board card may name the paths its work changes; the worker that runs it claims them for the
-- card's agent. Such a claim is kept by the card's attempt (`job_token_hash`), not by a session:
-- it stands while that attempt's card is in progress (or until its time runs out).

alter table jobs add column paths text[] not null default '{}';

alter table path_claims add column job_token_hash bytea;
