-- Moving deliveries forward writes only when something moves.
--
-- As in migration 10, with one change: showing an inbox whose messages were all shown before
-- (an agent looking again at what it has not read yet) changes nothing, and is now answered by
-- reads alone. Before, it locked the inbox and rewrote its row, which made every such look a
-- write transaction waiting for a disk flush. Same signature and answers: the previous release
-- calls it unchanged.
create or replace function relay_advance(recipient bigint, seqs bigint[], target smallint,
                                         out moved integer, out left_unread integer)
language plpgsql as $$
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
    if target > 2 then
        select e.unread, e.last_shown into left_unread, shown from endpoints e where e.id = recipient;
        select d.message_id into newest from deliveries d where d.recipient_id = recipient and d.seq = highest;
        if (newest is null or newest = shown)
           and not exists (select 1 from deliveries d
                           where d.recipient_id = recipient and d.seq between lowest and highest
                             and d.seq = any(seqs) and d.state < target) then
            moved := 0;
            return;
        end if;
    end if;
    perform set_config('relay.counted', 'on', true);
    if target = 2 then
        -- A pushed mark lost in a crash only means the message is pushed again on reconnect, which
        -- the bridge recognises by its seq: not worth a disk flush of its own.
        perform set_config('synchronous_commit', 'off', true);
    else
        perform 1 from endpoints where id = recipient for update;
    end if;
    update deliveries set state = target, updated_at = now()
    where recipient_id = recipient and seq between lowest and highest and seq = any(seqs) and state < target;
    get diagnostics moved = row_count;
    if target > 2 then
        update endpoints
        set unread = unread - case when target = 4 then moved else 0 end,
            last_shown = coalesce((select message_id from deliveries
                                   where recipient_id = recipient and seq = highest),
                                  last_shown)
        where id = recipient
        returning unread into left_unread;
    end if;
end $$;
