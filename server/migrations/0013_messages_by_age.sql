-- no-transaction
-- Messages by age, for the purge of those past their retention (oldest first, in batches).
create index concurrently if not exists messages_created on messages (created_at);
