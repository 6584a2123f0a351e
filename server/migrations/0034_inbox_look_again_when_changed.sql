-- A look that finds its inbox as the last look found it is answered by the replica from memory.
--
-- `relay_look` is `relay_take_unread` (migration 33) with the inbox's version first: its head seq
-- and unread count, read before the page. Every change that alters a look's answer moves one of
-- the two: a delivery raises the head; a delivery read, withdrawn or purged while unread lowers
-- the count, which only a new delivery (raising the head) raises again, so no version comes back.
-- Moves to pushed and surfaced change neither, nor the answer, which does not show them. One
-- change does not: retention purging a message whose reply is still unread sets that reply's
-- `reply_to` to null, which a page held since goes on naming until its inbox next changes.
--
-- Given the version of a page the caller holds (`seen_head`, `seen_unread`) and the page's last
-- message (`seen_last`), a look that finds the same, with that message still the newest shown
-- (`last_shown`, which `reply last` answers to, and which a look of another size or a new session
-- moves), answers one row with `unchanged` and reads nothing else; otherwise it answers the page as
-- `relay_take_unread` does, which moves `last_shown` back to it, each row with the version read
-- before it. A change between the two reads only makes the kept version older than its page: the
-- next look then reads again.
--
-- An empty page answers no row, and no version: a look at an empty inbox is one index probe, as
-- before. The previous release still calls `relay_take_unread`, unchanged.

create function relay_look(recipient bigint, lim bigint, target smallint,
                           seen_head bigint, seen_unread integer, seen_last text)
returns table (seq bigint, id text, sender text, thread text, kind smallint, body text, reply_to text,
               created_at timestamptz, require_reply boolean, private boolean, relation text,
               left_unread integer, head bigint, unread integer, unchanged boolean)
language plpgsql
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
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
end $$;
