-- A push is recorded by moving its inbox's mark, not by rewriting each delivery.
--
-- Marking deliveries pushed rewrote each one's row, and never as a HOT update: the partial index of
-- unread deliveries (`state < 4`) reads the column the mark changed, so every message every stream
-- pushed cost a new row version, three index entries and their WAL, about 0.11 ms a call. A stream
-- pushes an inbox's messages in seq order, and a bridge resuming after seq N has had everything up
-- to N, so one number per inbox says the same: every delivery up to it reached the bridge, unless it
-- went further (surfaced, read or withdrawn). `inbox_pushed` keeps that number, in a row of its own
-- so that moving it never waits for a send's lock on the inbox, with room on its page for the update
-- to stay HOT.
--
-- `relay_advance` (same signature) moves the mark for a push and still moves the deliveries for
-- surfaced and read; `relay_delivery_state` answers a delivery's state with the mark applied.
-- Deliveries marked pushed before keep their state 2. The previous release calls `relay_advance`
-- unchanged, but reads the state column itself: while it still serves, it reports a delivery pushed
-- after this migration as queued.

create table inbox_pushed (
    endpoint_id bigint primary key references endpoints (id) on delete cascade,
    -- every delivery of the inbox up to this seq was pushed to its bridge
    through_seq bigint not null
) with (fillfactor = 50);

-- A delivery's state (1 queued, 2 pushed, 3 surfaced, 4 read, 5 withdrawn), its inbox's mark applied.
create function relay_delivery_state(d deliveries) returns smallint language sql stable as $$
    select case when d.state = 1 and exists (select 1 from inbox_pushed p
                                             where p.endpoint_id = d.recipient_id and p.through_seq >= d.seq)
                then 2::smallint
                else d.state end
$$;

-- As in migration 27, but a push moves the inbox's mark. For a push, `moved` is how many seqs were
-- given when the mark moved (none when it already stood there or beyond).
create or replace function relay_advance(recipient bigint, seqs bigint[], target smallint,
                                         out moved integer, out left_unread integer)
language plpgsql
set plan_cache_mode = force_generic_plan
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
    -- The range bounds the index scan whatever the planner believes of this inbox's size: an inbox
    -- that grew faster than the statistics would otherwise be read whole for a few seqs.
    select min(x), max(x) into lowest, highest from unnest(seqs) x;
    if target = 2 then
        moved := 0;
        if highest is not null then
            -- A mark lost in a crash only means the message is pushed again on reconnect, which
            -- the bridge recognises by its seq: not worth a disk flush of its own.
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
    perform 1 from endpoints where id = recipient for update;
    update deliveries set state = target, updated_at = now()
    where recipient_id = recipient and seq between lowest and highest and seq = any(seqs) and state < target;
    get diagnostics moved = row_count;
    update endpoints
    set unread = unread - case when target = 4 then moved else 0 end,
        last_shown = coalesce(newest, last_shown)
    where id = recipient
    returning unread into left_unread;
end $$;
