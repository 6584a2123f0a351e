-- Trigger: a deleted delivery takes its inbox's search entry with it, each looked up by its key.
create or replace function relay_deliveries_unsearched()
 returns trigger
 language plpgsql
as $function$
begin
    if not exists (select 1 from old_rows) then
        return null;
    end if;
    perform relay_search_readers_change();
    delete from search_entries e using old_rows o where e.reader = o.recipient_id and e.message_id = o.message_id;
    return null;
end $function$;
