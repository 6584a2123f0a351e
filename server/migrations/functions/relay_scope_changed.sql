-- Trigger: something that decides who may reach whom changed (handles, caps, groups, contacts,
-- holds); announced on `scope` so replicas forget the recipients they allowed.
create or replace function relay_scope_changed()
 returns trigger
 language plpgsql
as $function$
begin
    perform pg_notify('relay_control', 'scope');
    return null;
end $function$;
