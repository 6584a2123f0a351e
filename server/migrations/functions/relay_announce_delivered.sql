-- Announces the recipients a replica wrote to on `relay_delivery`, 300 to a notification.
create or replace function relay_announce_delivered(replica bigint, recipients bigint[])
 returns void
 language plpgsql
as $function$
begin
    perform pg_notify('relay_delivery', 'r' || replica || ':' || ids)
    from (select string_agg(r::text, ',') as ids
          from (select r, (row_number() over (order by r) - 1) / 300 as chunk
                from (select distinct r from unnest(recipients) r) d) numbered
          group by chunk) chunks;
end $function$;
