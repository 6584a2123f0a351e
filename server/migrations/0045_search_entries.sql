-- Messages found by their words (`relay_search`). A search reads one reader's matches only: an
-- entry per reader and message (the sender, and each inbox it was delivered to), its words in the
-- `simple` text-search configuration (as written, unstemmed, so identifiers and any language match
-- as typed), each word prefixed with the reader's id (`functions/relay_search_words.sql`), so the
-- words index keeps a posting list per reader and word. A words index over all messages instead
-- checks every match in the relay against the reader (hundreds of milliseconds for a common word
-- at a million messages), and one on (reader, words) still reads a common word's whole posting
-- list (docs/benchmarks-record.md).
--
-- Entries are written off the send path: a statement trigger queues each new message's id, and
-- the scheduler's round on any replica takes queued ids (`skip locked`) and writes their entries in
-- batches. A release queues its message again. A withdrawal deletes its reader's entry; a deleted
-- message takes the sender's and its queued id (a trigger), and its deliveries, deleted with it,
-- take the inboxes' (another), which also covers a deleted endpoint's mail.
create table search_entries (
    reader     bigint not null,
    message_id text not null,
    sender     bigint not null,
    thread     text not null,
    created_at timestamptz not null,
    words      tsvector not null,
    primary key (reader, message_id)
);

create index search_entries_words on search_entries using gin (words);

create table search_queue (
    message_id text primary key
);
-- Every message passes through it: vacuumed after a thousand deletions rather than a fifth of its
-- size, so that the rounds' probe of it never walks a long run of dead rows.
alter table search_queue set (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- The trigger functions are created here once, for their triggers; their files hold the bodies.
create or replace function relay_search_queued()
 returns trigger
 language plpgsql
as $function$
begin
    insert into search_queue (message_id) select id from new_rows on conflict do nothing;
    return null;
end $function$;

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

create trigger messages_search_queued after insert on messages
    referencing new table as new_rows for each statement execute function relay_search_queued();
create trigger messages_search_deleted after delete on messages
    referencing old table as old_rows for each statement execute function relay_messages_unsearched();
create trigger deliveries_search_deleted after delete on deliveries
    referencing old table as old_rows for each statement execute function relay_deliveries_unsearched();

-- What was written before is found too, once the rounds have indexed it.
insert into search_queue (message_id) select id from messages on conflict do nothing;
