-- Trigger: something an account's console shows changed (a card, a hold, a permission request);
-- announced on `relay_account` with the account's id. Postgres folds repeats within a transaction.
create or replace function relay_account_changed()
 returns trigger
 language plpgsql
as $function$
declare
    account bigint;
begin
    if tg_op = 'DELETE' then
        account := old.account_id;
    else
        account := new.account_id;
    end if;
    perform pg_notify('relay_account', account::text);
    return null;
end $function$;
