-- The one order every writer locks inboxes in: their endpoint rows, by id, before any of their
-- deliveries, so two writers never wait on each other in opposite orders. `no key update` is what
-- the writes need, and unlike `update` it lets another writer's foreign key check on a sender
-- through. Answers each inbox locked and whether its machine was revoked.
create or replace function relay_lock_inboxes(inboxes bigint[])
 returns table(id bigint, revoked boolean)
 language plpgsql
as $function$
begin
    return query
    select e.id, ma.revoked_at is not null
    from endpoints e join machines ma on ma.id = e.machine_id
    where e.id = any(inboxes)
    order by e.id
    for no key update of e;
end $function$;
