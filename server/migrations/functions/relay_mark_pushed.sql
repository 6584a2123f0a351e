-- Records pushes as a mark per inbox (the highest seq pushed), many inboxes a statement; the mark
-- only moves forward.
create or replace function relay_mark_pushed(inboxes bigint[], through bigint[])
 returns integer
 language plpgsql
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    moved integer;
begin
    perform set_config('synchronous_commit', 'off', true);
    insert into inbox_pushed as p (endpoint_id, through_seq)
    select m.inbox, m.seq
    from unnest(inboxes, through) as m (inbox, seq)
    where exists (select 1 from endpoints e where e.id = m.inbox)
    order by m.inbox
    on conflict (endpoint_id) do update set through_seq = excluded.through_seq
        where p.through_seq < excluded.through_seq;
    get diagnostics moved = row_count;
    return moved;
end $function$;
