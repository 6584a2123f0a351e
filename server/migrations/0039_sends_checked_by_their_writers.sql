-- Each send inserted a message and a delivery, and Postgres checked three foreign keys for them, row
-- by row: the sender, the inbox and the message. The checks were over half of a batch's time in
-- the database (EXPLAIN ANALYZE of relay_write_sends_plain: 74 of 128 us a send), and they proved
-- what the writers already hold: the sender is the authenticated session's endpoint, every inbox
-- is locked (for no key update) before its deliveries are written, and a delivery's message is
-- written in the same transaction. Relay never deletes endpoints; a message is deleted by the
-- retention purge only. The cascades the keys made are kept by statement triggers.
alter table deliveries drop constraint deliveries_message_id_fkey;
alter table deliveries drop constraint deliveries_recipient_id_fkey;
alter table messages drop constraint messages_sender_id_fkey;

-- The trigger functions are created here once, for their triggers; their files hold the bodies.
create or replace function relay_messages_deleted()
 returns trigger
 language plpgsql
as $function$
begin
    delete from deliveries d using old_rows o where d.message_id = o.id;
    return null;
end $function$;

create or replace function relay_endpoints_deleted()
 returns trigger
 language plpgsql
as $function$
begin
    delete from messages m using old_rows o where m.sender_id = o.id;
    delete from deliveries d using old_rows o where d.recipient_id = o.id;
    return null;
end $function$;

create trigger messages_deliveries_deleted after delete on messages
    referencing old table as old_rows for each statement execute function relay_messages_deleted();
create trigger endpoints_mail_deleted after delete on endpoints
    referencing old table as old_rows for each statement execute function relay_endpoints_deleted();
