-- no-transaction
-- Holds by message: deleting a purged message removes its holds without reading the whole table.
create index concurrently if not exists holds_message on holds (message_id);
