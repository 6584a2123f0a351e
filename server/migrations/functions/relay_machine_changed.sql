-- Trigger: a machine revoked or removed; announced on `relay_control` so replicas end its sessions.
create or replace function relay_machine_changed()
 returns trigger
 language plpgsql
as $function$
begin
    perform pg_notify('relay_control', 'machine:' || case when tg_op = 'DELETE' then old.id else new.id end);
    return null;
end $function$;
