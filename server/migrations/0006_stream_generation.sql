-- The newest push stream of an endpoint owns its presence: older streams neither renew nor release it.
alter table endpoints add column stream_gen bigint not null default 0;
