-- A look at the inbox that finds messages is one statement: the page and its move to surfaced or read.
--
-- It took two round trips: `relay_unread` read the page, then `relay_advance` moved it, reading the
-- inbox row, the page's newest delivery and the page's states a second time (0.15-0.20 ms of
-- execution at 100,000 unread, besides its round trip). `relay_take_unread` reads the page's
-- deliveries once, sees from them whether anything moves, and only then locks the inbox (before its
-- deliveries, as every writer does) and moves them: a look at a page already shown writes nothing
-- and waits for no disk flush, as before. An empty look reads one index and writes nothing.
--
-- Its answers are those of the two calls in a row: the page as it was read, in seq order, and on
-- every row the count the inbox has left unread after the move. The page's deliveries and its
-- messages are read by two statements: a message another look read and retention purged in
-- between is left out of the answer, where the two calls would have shown it. The previous release
-- calls `relay_unread` unchanged and `relay_advance` with the same answers (below), on the same rows;
-- this release still reads `relay_unread` for a push stream.
--
-- A look, and `relay_advance` (a confirmation, a reply's wait, the console's read), lock the inbox
-- `for no key update`, as the writers do, where `relay_advance` took `for update`: a send of the
-- inbox's own agent, whose message's foreign key takes a `key share` of the same row, no longer
-- waits for them. Both still wait for, and are waited for by, every writer of the inbox.

create function relay_take_unread(recipient bigint, lim bigint, target smallint)
returns table (seq bigint, id text, sender text, thread text, kind smallint, body text, reply_to text,
               created_at timestamptz, require_reply boolean, private boolean, relation text,
               left_unread integer)
language plpgsql
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
declare
    seqs bigint[];
    message_ids text[];
    behind boolean;
    parent bigint;
    shown text;
    unread_left integer;
    moved integer;
begin
    if target not between 3 and 4 then
        raise exception 'relay_take_unread: target % is not surfaced or read', target;
    end if;
    select array_agg(u.seq order by u.seq), array_agg(u.message_id order by u.seq), bool_or(u.state < target)
    into seqs, message_ids, behind
    from (select u.seq, u.message_id, u.state from deliveries u
          -- `state < 4` (not read) spells the predicate of the partial index deliveries_unread.
          where u.recipient_id = recipient and u.state < 4
          order by u.seq limit lim) u;
    if seqs is null then
        return;
    end if;
    select e.parent_id, e.last_shown, e.unread into parent, shown, unread_left from endpoints e where e.id = recipient;
    if behind or shown is distinct from message_ids[cardinality(message_ids)] then
        perform set_config('relay.counted', 'on', true);
        -- `no key update`, as the writers take it (see above).
        perform 1 from endpoints e where e.id = recipient for no key update;
        -- The range bounds the index scan whatever the planner believes of this inbox's size.
        update deliveries d set state = target, updated_at = now()
        where d.recipient_id = recipient and d.seq between seqs[1] and seqs[cardinality(seqs)]
          and d.seq = any(seqs) and d.state < target;
        get diagnostics moved = row_count;
        update endpoints e
        set unread = e.unread - case when target = 4 then moved else 0 end,
            last_shown = message_ids[cardinality(message_ids)]
        where e.id = recipient
        returning e.unread into unread_left;
    end if;
    return query
    with page as materialized (
        select p.seq, m.id, m.sender_id, m.thread, m.kind, m.body, m.reply_to, m.created_at,
               m.require_reply, m.private
        from unnest(seqs, message_ids) as p (seq, message_id)
             -- `offset 0` keeps the lookup a lookup: the planner cannot turn it into a join.
             cross join lateral (select * from messages mm where mm.id = p.message_id offset 0) m
    ), senders as materialized (
        -- Each sender once: its address is three lookups.
        select s.sender_id,
               (select ea.address from endpoint_addresses ea where ea.id = s.sender_id) as address,
               (select se.parent_id from endpoints se where se.id = s.sender_id) as parent_id
        from (select distinct p.sender_id from page p) s
    )
    select p.seq, p.id, s.address, p.thread, p.kind, p.body, p.reply_to, p.created_at, p.require_reply,
           p.private,
           case when parent = p.sender_id then 'parent'
                when s.parent_id = recipient then 'child'
                else '' end,
           unread_left
    from page p join senders s on s.sender_id = p.sender_id
    order by p.seq;
end $$;

-- As in migration 29 (with the settings of migration 31), but the inbox is locked `for no key update`.
create or replace function relay_advance(recipient bigint, seqs bigint[], target smallint,
                                         out moved integer, out left_unread integer)
language plpgsql
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
declare
    lowest bigint;
    highest bigint;
    shown text;
    newest text;
begin
    if target not between 2 and 4 then
        raise exception 'relay_advance: target % is not pushed, surfaced or read', target;
    end if;
    -- The range bounds the index scan whatever the planner believes of this inbox's size.
    select min(x), max(x) into lowest, highest from unnest(seqs) x;
    if target = 2 then
        moved := 0;
        if highest is not null then
            -- A lost mark only means the message is pushed again: not worth a disk flush.
            perform set_config('synchronous_commit', 'off', true);
            insert into inbox_pushed as p (endpoint_id, through_seq) values (recipient, highest)
            on conflict (endpoint_id) do update set through_seq = excluded.through_seq
                where p.through_seq < excluded.through_seq;
            if found then
                moved := cardinality(seqs);
            end if;
        end if;
        return;
    end if;
    select e.unread, e.last_shown into left_unread, shown from endpoints e where e.id = recipient;
    select d.message_id into newest from deliveries d where d.recipient_id = recipient and d.seq = highest;
    if (newest is null or newest = shown)
       and not exists (select 1 from deliveries d
                       where d.recipient_id = recipient and d.seq between lowest and highest
                         and d.seq = any(seqs) and d.state < target) then
        moved := 0;
        return;
    end if;
    perform set_config('relay.counted', 'on', true);
    perform 1 from endpoints where id = recipient for no key update;
    update deliveries set state = target, updated_at = now()
    where recipient_id = recipient and seq between lowest and highest and seq = any(seqs) and state < target;
    get diagnostics moved = row_count;
    update endpoints
    set unread = unread - case when target = 4 then moved else 0 end,
        last_shown = coalesce(newest, last_shown)
    where id = recipient
    returning unread into left_unread;
end $$;
