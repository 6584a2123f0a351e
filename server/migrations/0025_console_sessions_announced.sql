-- A console session that ends wakes the pages it has open, so a page need not ask every few
-- seconds whether its session still stands. Signing out (the session deleted) and revoking or
-- removing the account's human notify `relay_account` like any change the console shows; a page
-- woken that way reads its session once. Expiry needs no notice: a page knows when its session
-- expires.
create function relay_console_session_ended() returns trigger language plpgsql as $$
declare
    account bigint;
begin
    select h.account_id into account from humans h where h.id = old.human_id;
    -- A human deleted with its sessions announces itself (below).
    if account is not null then
        perform pg_notify('relay_account', account::text);
    end if;
    return null;
end $$;

create trigger console_sessions_ended after delete on console_sessions
    for each row execute function relay_console_session_ended();
create trigger humans_shown after update of revoked_at, token_hash or delete on humans
    for each row execute function relay_account_changed();
