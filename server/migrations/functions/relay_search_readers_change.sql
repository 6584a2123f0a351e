-- Waits for the indexing rounds under way, and keeps new ones waiting until this transaction ends:
-- taken by whatever changes who may find a message (a release, a withdrawal, a deletion) before it
-- queues the message or deletes entries. A round holds the same lock shared from before its
-- statement reads the queue (store/search.rs), so it never writes entries from a view of the
-- readers older than such a change, and the change's own statements see every entry written.
create or replace function relay_search_readers_change()
 returns void
 language sql
as $function$
    select pg_advisory_xact_lock(hashtextextended('relay_search_entries', 0))
$function$;
