-- no-transaction
-- Peek records by age, for the purge of those past their retention.
create index concurrently if not exists peeks_at on peeks (at);
