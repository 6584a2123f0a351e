-- no-transaction
-- Finished cards by when they were closed, for the purge of those past their retention.
create index concurrently if not exists jobs_closed on jobs (closed_at) where state = 'done';
