-- A console session's end is announced on a channel of its own, `relay_console` (the payload is the
-- account's id): signing out, and the account's human revoked, re-keyed or removed. An open page then
-- reads its session only when one of its account's sessions ended, not on every change to what it
-- shows (migration 25 announced both alike on `relay_account`, so a page read its session each time
-- a card, hold or permission request of its account changed).
--
-- Migration 25's notifications on `relay_account` stay: the previous release's pages learn of a
-- sign-out from them. Drop them in a later release.
create function relay_console_sessions_ended() returns trigger language plpgsql as $$
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
end $$;

create trigger console_sessions_ended_apart after delete on console_sessions
    for each row execute function relay_console_sessions_ended();
create trigger humans_sessions_ended after update of revoked_at, token_hash or delete on humans
    for each row execute function relay_console_sessions_ended();
