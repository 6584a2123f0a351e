-- Trigger: a console session ended (signed out, purged) or its human was revoked, re-keyed or
-- removed; announced on `relay_console` with the account's id, so open pages read their session.
create or replace function relay_console_sessions_ended()
 returns trigger
 language plpgsql
as $function$
declare
    account bigint;
begin
    if tg_table_name = 'console_sessions' then
        -- A human deleted with its sessions announces itself (below).
        select h.account_id into account from humans h where h.id = old.human_id;
    else
        account := case when tg_op = 'DELETE' then old.account_id else new.account_id end;
    end if;
    if account is not null then
        perform pg_notify('relay_console', account::text);
    end if;
    return null;
end $function$;
