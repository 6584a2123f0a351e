-- Trigger: an endpoint's session changed (re-keyed, ended, a new stream); announced on
-- `relay_control` so replicas drop what they hold for it.
create or replace function relay_endpoint_changed()
 returns trigger
 language plpgsql
as $function$
begin
    perform pg_notify('relay_control', 'endpoint:' || new.id);
    return null;
end $function$;
