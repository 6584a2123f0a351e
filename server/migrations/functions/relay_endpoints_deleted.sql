-- Trigger: a deleted endpoint takes what it sent and what it was sent with it, as the foreign keys
-- did before migration 39. Relay never deletes endpoints (a machine is revoked instead); this keeps
-- a hand-made delete from leaving mail that names nobody. Revoke the machine before deleting its
-- endpoints: a send already under way from one of them is not waited for.
create or replace function relay_endpoints_deleted()
 returns trigger
 language plpgsql
as $function$
begin
    delete from messages m using old_rows o where m.sender_id = o.id;
    delete from deliveries d using old_rows o where d.recipient_id = o.id;
    return null;
end $function$;
