-- Writes a batch of sends, each in a subtransaction of its own so that one failing send leaves the
-- others stored gaplessly, and answers each recipient's seq and relation.
create or replace function relay_write_sends_numbered(sends relay_outgoing[], cap integer, replica bigint)
 returns table(n bigint, outcome text, code text, message text, detail text, offline bigint[], offline_seen timestamp with time zone[], seqs bigint[], relations text[], sent_at timestamp with time zone)
 language plpgsql
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    stored text[] := '{}';
    failed_n bigint[] := '{}';
    failed_code text[] := '{}';
    failed_message text[] := '{}';
    failed_detail text[] := '{}';
    err_code text;
    err_message text;
    err_detail text;
    inboxes bigint[];
begin
    perform set_config('relay.counted', 'on', true);

    -- Every inbox the batch touches, locked up front as every writer locks them
    -- (`relay_lock_inboxes`): concurrent batches never deadlock.
    inboxes := array(select r from unnest(sends) s, unnest(s.recipients) r
                     union select s.read_by from unnest(sends) s where s.read_by is not null);
    perform 1 from relay_lock_inboxes(inboxes);

    if cardinality(sends) = 1 then
        stored := relay_write_send_set(sends, cap);
    else
        begin
            stored := relay_write_send_set(sends, cap);
        exception when others then
            -- One send spoiled the set: each again on its own.
            stored := '{}';
            for i in 1 .. cardinality(sends) loop
                begin
                    stored := stored || relay_write_send_set(sends[i:i], cap);
                exception when others then
                    get stacked diagnostics err_code = returned_sqlstate, err_message = message_text,
                                            err_detail = pg_exception_detail;
                    failed_n := failed_n || i::bigint;
                    failed_code := failed_code || err_code;
                    failed_message := failed_message || err_message;
                    failed_detail := failed_detail || nullif(err_detail, '');
                end;
            end loop;
        end;
    end if;

    perform relay_announce_delivered(replica, array(select r from unnest(sends) s, unnest(s.recipients) r
                                                    where s.id = any(stored)));

    return query
    with sent as (
        select s.ordinality as n, s.sender, s.recipients, st.id is not null as ok
        from unnest(sends) with ordinality s left join unnest(stored) st(id) on st.id = s.id
    ), away as (
        select e.id, e.last_seen_at
        from endpoints e join machines m on m.id = e.machine_id
        where e.id in (select r from sent, unnest(sent.recipients) r where sent.ok)
          -- a human's inbox ('me') is never away
          and m.name <> 'me' and not relay_endpoint_online(e)
    ), numbered as materialized (
        -- Each stored delivery's seq, counted down from its inbox's head after the batch: the
        -- stored sends took the seqs below it in batch order (`relay_write_send_set`), so nothing is
        -- read back from deliveries, whose plan, kept from when the table was small, could scan it.
        -- Materialized: inlined into the lateral join below, it would be computed again per send.
        select p.n, p.i,
               e.head_seq - (row_number() over (partition by p.inbox order by p.n desc) - 1) as seq,
               case when e.parent_id = p.sender then 'parent'
                    when e.id = se.parent_id then 'child'
                    else '' end as relation
        from (select sent.n, sent.sender, rcp.inbox, rcp.i
              from sent, unnest(sent.recipients) with ordinality rcp(inbox, i) where sent.ok) p
        join endpoints e on e.id = p.inbox
        left join endpoints se on se.id = p.sender
    )
    select sent.n,
           case when sent.ok then 'stored' when f.code is null then 'duplicate' else 'refused' end,
           f.code, f.message, f.detail, o.ids, o.seen, q.seqs, q.relations, now()
    from sent
    left join unnest(failed_n, failed_code, failed_message, failed_detail) as f(n, code, message, detail)
        on f.n = sent.n
    left join lateral (select array_agg(a.id order by a.id) as ids, array_agg(a.last_seen_at order by a.id) as seen
                       from away a where sent.ok and a.id = any(sent.recipients)) o on true
    -- Each recipient's seq and how it stands to the sender, in the order of its send's recipients.
    left join lateral (select array_agg(nb.seq order by nb.i) as seqs, array_agg(nb.relation order by nb.i) as relations
                       from numbered nb where nb.n = sent.n) q on true
    order by sent.n;
end $function$;
