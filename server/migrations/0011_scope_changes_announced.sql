-- Every replica hears at once of a change to what decides who may message whom, whichever release
-- or tool made it: replicas keep sends' resolved and allowed recipients in memory and forget them
-- all on `scope`. One notification per statement (and Postgres folds repeats within a transaction).
--
-- What a send's allowing reads: endpoints' names, parents and rules; caps; groups and their members;
-- contacts and their private-data setting; machines' revocation (announced already as `machine:`);
-- accounts' hold classes. A new endpoint changes nothing already allowed, so inserts of endpoints are
-- not announced.
create function relay_scope_changed() returns trigger language plpgsql as $$
begin
    perform pg_notify('relay_control', 'scope');
    return null;
end $$;

create trigger endpoints_scope after update of handle, machine_id, parent_id, rules_in, rules_out or delete
    on endpoints for each statement execute function relay_scope_changed();
create trigger caps_scope after insert or update or delete on caps
    for each statement execute function relay_scope_changed();
create trigger groups_scope after insert or update or delete on groups
    for each statement execute function relay_scope_changed();
create trigger group_members_scope after insert or update or delete on group_members
    for each statement execute function relay_scope_changed();
create trigger contacts_scope after insert or update or delete on contacts
    for each statement execute function relay_scope_changed();
create trigger accounts_scope after update of name, hold_classes or delete on accounts
    for each statement execute function relay_scope_changed();

-- A change of an account's operator is announced for the endpoints it names, old and new, as a
-- change of those endpoints: replicas holding their push streams tell their bridges the new role.
create function relay_operator_changed() returns trigger language plpgsql as $$
begin
    perform pg_notify('relay_control', 'endpoint:' || ea.id)
    from endpoint_addresses ea
    where ea.account_id = new.id
      and ea.machine || '/' || ea.handle in (coalesce(old.operator, ''), coalesce(new.operator, ''));
    return null;
end $$;

create trigger accounts_operator after update of operator on accounts
    for each row when (old.operator is distinct from new.operator)
    execute function relay_operator_changed();
