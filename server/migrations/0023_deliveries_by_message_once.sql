-- no-transaction
-- Deliveries by message were indexed twice: by `deliveries_message` (migration 12) and by the
-- unique (message_id, recipient_id) of migration 1, which serves every lookup by message alone as
-- well. Each delivery written paid for both; the unique one stays.
drop index concurrently if exists deliveries_message;
