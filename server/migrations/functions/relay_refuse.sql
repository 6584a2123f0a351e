-- Raises a writer's refusal from inside a query (SQL cannot raise): `code` is one of the writers'
-- SQLSTATEs (`RLY01`…), `detail` the inbox at fault.
create or replace function relay_refuse(code text, message text, detail text)
 returns boolean
 language plpgsql
as $function$
begin
    raise exception using errcode = code, message = message, detail = detail;
end $function$;
