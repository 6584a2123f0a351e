-- A delivery state's number, by name: the one place SQL spells the numbers (the server's own
-- mapping is `domain::delivery::State`; a test checks that the two agree). Immutable, so a call with
-- a literal is folded when the statement is planned: `state < relay_state('read')` is planned as
-- `state < 4`, the predicate of the partial index deliveries_unread.
create or replace function relay_state(name text)
 returns integer
 language plpgsql
 immutable strict parallel safe
as $function$
begin
    case name
        when 'queued' then return 1;
        when 'pushed' then return 2;
        when 'surfaced' then return 3;
        when 'read' then return 4;
        when 'withdrawn' then return 5;
        else raise exception 'relay_state: no delivery state is called %', name;
    end case;
end $function$;
