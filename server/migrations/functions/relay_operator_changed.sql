-- Trigger: an account's operator changed; announced on `relay_control`.
create or replace function relay_operator_changed()
 returns trigger
 language plpgsql
as $function$
begin
    perform pg_notify('relay_control', 'endpoint:' || ea.id)
    from endpoint_addresses ea
    where ea.account_id = new.id
      and ea.machine || '/' || ea.handle in (coalesce(old.operator, ''), coalesce(new.operator, ''));
    return null;
end $function$;
