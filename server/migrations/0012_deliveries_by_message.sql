-- no-transaction
-- A message's deliveries by the message: a sender tracking it, a retry answered with its first
-- result, and a reply marking what it answers read each read them; without this they read the
-- recipient's whole history, or the whole table.
create index concurrently if not exists deliveries_message on deliveries (message_id);
