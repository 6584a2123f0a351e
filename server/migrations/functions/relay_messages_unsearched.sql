-- Trigger: a deleted message (the retention purge, a deleted endpoint) takes the sender's search
-- entry and its place in the search queue with it; its inboxes' entries go with its deliveries
-- (relay_deliveries_unsearched).
create or replace function relay_messages_unsearched()
 returns trigger
 language plpgsql
as $function$
begin
    if not exists (select 1 from old_rows) then
        return null;
    end if;
    perform relay_search_readers_change();
    delete from search_entries e using old_rows o where e.reader = o.sender_id and e.message_id = o.id;
    delete from search_queue q using old_rows o where q.message_id = o.id;
    return null;
end $function$;
