-- A look at the inbox that moves nothing to read: the inbox's version first, then either one row
-- saying it is the version the caller holds, or `relay_take_unread`'s answer with the version.
create or replace function relay_look(recipient bigint, lim bigint, target smallint, seen_head bigint, seen_unread integer, seen_last text)
 returns table(seq bigint, id text, sender text, thread text, kind smallint, body text, reply_to text, created_at timestamp with time zone, require_reply boolean, private boolean, relation text, left_unread integer, head bigint, unread integer, unchanged boolean)
 language plpgsql
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    h bigint;
    u integer;
    shown text;
begin
    select e.head_seq, e.unread, e.last_shown into h, u, shown from endpoints e where e.id = recipient;
    if h = seen_head and u = seen_unread and shown = seen_last then
        return query select null::bigint, null::text, null::text, null::text, null::smallint, null::text,
                            null::text, null::timestamptz, null::boolean, null::boolean, null::text,
                            null::integer, h, u, true;
        return;
    end if;
    return query
    select t.seq, t.id, t.sender, t.thread, t.kind, t.body, t.reply_to, t.created_at, t.require_reply,
           t.private, t.relation, t.left_unread, h, u, false
    from relay_take_unread(recipient, lim, target) t;
end $function$;
