-- Moves the deliveries `seqs` of an inbox forward to `target` (pushed, surfaced or read), keeping
-- the inbox's unread count; a push only moves the inbox's pushed mark. A look at what is already
-- shown writes nothing. Answers how many moved and how many are left unread.
create or replace function relay_advance(recipient bigint, seqs bigint[], target smallint, out moved integer, out left_unread integer)
 returns record
 language plpgsql
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    lowest bigint;
    highest bigint;
    shown text;
    newest text;
begin
    if target not between relay_state('pushed') and relay_state('read') then
        raise exception 'relay_advance: target % is not pushed, surfaced or read', target;
    end if;
    -- The range bounds the index scan whatever the planner believes of this inbox's size.
    select min(x), max(x) into lowest, highest from unnest(seqs) x;
    if target = relay_state('pushed') then
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
    set unread = unread - case when target = relay_state('read') then moved else 0 end,
        last_shown = coalesce(newest, last_shown)
    where id = recipient
    returning unread into left_unread;
end $function$;
