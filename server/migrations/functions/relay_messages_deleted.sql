-- Trigger: a deleted message takes its deliveries with it, as the foreign key did before migration
-- 39. The writers insert a message and its deliveries in one transaction, so no delivery can name
-- a message that is not there.
create or replace function relay_messages_deleted()
 returns trigger
 language plpgsql
as $function$
begin
    delete from deliveries d using old_rows o where d.message_id = o.id;
    return null;
end $function$;
