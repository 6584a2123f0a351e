-- A delivery's state with its inbox's pushed mark applied: a queued delivery at or below the mark
-- was pushed.
create or replace function relay_delivery_state(d deliveries)
 returns smallint
 language sql
 stable
as $function$
    select case when d.state = relay_state('queued') and exists (select 1 from inbox_pushed p
                                             where p.endpoint_id = d.recipient_id and p.through_seq >= d.seq)
                then relay_state('pushed')::smallint
                else d.state end
$function$;
