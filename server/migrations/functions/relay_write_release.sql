-- Delivers a message written earlier and held for a human to `recipients`, now released: each
-- inbox's next seq, counted as the other writers count, and every replica told. The message is
-- queued for search again, so that its new readers find it.
create or replace function relay_write_release(message text, recipients bigint[], replica bigint)
 returns void
 language plpgsql
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
begin
    if cardinality(recipients) = 0 then
        return;
    end if;
    perform 1 from relay_lock_inboxes(recipients);
    perform set_config('relay.counted', 'on', true);
    with heads as (
        update endpoints e set head_seq = e.head_seq + 1, unread = e.unread + 1
        where e.id = any(recipients)
        returning e.id, e.head_seq
    )
    insert into deliveries (recipient_id, seq, message_id)
    select h.id, h.head_seq, message from heads h;
    perform relay_search_readers_change();
    insert into search_queue (message_id) values (message) on conflict do nothing;
    perform relay_announce_delivered(replica, recipients);
end $function$;
