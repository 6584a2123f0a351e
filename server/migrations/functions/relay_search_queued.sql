-- Trigger: each new message waits in `search_queue` until a scheduler round writes its search
-- entries (store/search.rs), so the send pays one small insert and no words.
create or replace function relay_search_queued()
 returns trigger
 language plpgsql
as $function$
begin
    insert into search_queue (message_id) select id from new_rows on conflict do nothing;
    return null;
end $function$;
