-- no-transaction
-- Approvals by card: deleting a purged card removes its approvals without reading the whole table.
create index concurrently if not exists approvals_job on approvals (job_id);
