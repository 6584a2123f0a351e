-- Presence and the inbox, at no cost while idle.
--
-- Replicas: each running server keeps one liveness row. An endpoint whose newest push stream is open
-- is online while the replica holding that stream is alive, so open streams cost one write per
-- replica every few seconds instead of one per stream. A release that knows nothing of this keeps
-- renewing online_until per stream, which still counts.
create table replicas (
    id          bigint generated always as identity primary key,
    started_at  timestamptz not null default now(),
    alive_until timestamptz not null
);

-- The replica holding the endpoint's newest push stream; null when a release without replica
-- presence opened it (then online_until alone is its lease).
alter table endpoints
    add column stream_replica bigint,
    -- deliveries not yet read, kept by the triggers below so no read counts an inbox
    add column unread integer not null default 0;

create function relay_count_unread() returns trigger language plpgsql as $$
begin
    if tg_op = 'INSERT' then
        update endpoints e set unread = e.unread + n.c
        from (select recipient_id, count(*) as c from new_rows where state < 4 group by recipient_id) n
        where e.id = n.recipient_id;
    elsif tg_op = 'DELETE' then
        update endpoints e set unread = e.unread - o.c
        from (select recipient_id, count(*) as c from old_rows where state < 4 group by recipient_id) o
        where e.id = o.recipient_id;
    else
        update endpoints e set unread = e.unread + d.c
        from (select recipient_id, sum(c) as c
              from (select recipient_id, count(*) as c from new_rows where state < 4 group by recipient_id
                    union all
                    select recipient_id, -count(*) from old_rows where state < 4 group by recipient_id) x
              group by recipient_id having sum(c) <> 0) d
        where e.id = d.recipient_id;
    end if;
    return null;
end $$;

create trigger deliveries_unread_insert after insert on deliveries
    referencing new table as new_rows for each statement execute function relay_count_unread();
create trigger deliveries_unread_update after update on deliveries
    referencing old table as old_rows new table as new_rows for each statement execute function relay_count_unread();
create trigger deliveries_unread_delete after delete on deliveries
    referencing old table as old_rows for each statement execute function relay_count_unread();

-- Counted once here, with the triggers already in place: writers wait for this transaction.
update endpoints e set unread = c.n
from (select recipient_id, count(*) as n from deliveries where state < 4 group by recipient_id) c
where e.id = c.recipient_id;

-- Every replica hears at once of a session that ends or changes hands, a stream that opens, and a
-- machine revoked, whichever release or tool made the change: replicas keep sessions in memory and
-- end superseded streams on these.
create function relay_endpoint_changed() returns trigger language plpgsql as $$
begin
    perform pg_notify('relay_control', 'endpoint:' || new.id);
    return null;
end $$;

create trigger endpoints_control after update of session_hash, ended_at, stream_gen on endpoints
    for each row
    when (old.session_hash is distinct from new.session_hash
          or old.ended_at is distinct from new.ended_at
          or old.stream_gen is distinct from new.stream_gen)
    execute function relay_endpoint_changed();

create function relay_machine_changed() returns trigger language plpgsql as $$
begin
    perform pg_notify('relay_control', 'machine:' || case when tg_op = 'DELETE' then old.id else new.id end);
    return null;
end $$;

create trigger machines_control after update of revoked_at on machines
    for each row when (old.revoked_at is distinct from new.revoked_at)
    execute function relay_machine_changed();
create trigger machines_control_delete after delete on machines
    for each row execute function relay_machine_changed();

-- Whether the replica holding a stream is alive; a replica row gone counts as dead.
create function relay_replica_alive(replica bigint) returns boolean language sql stable as $$
    select exists (select 1 from replicas r where r.id = replica and r.alive_until > now())
$$;

-- Whether an endpoint's presence lease holds: the replica holding its open push stream is alive, or
-- its own lease (from the claim, the stream's opening or the reconnect grace) has not lapsed.
create function relay_endpoint_lease(e endpoints) returns boolean language sql stable as $$
    select coalesce(e.online_until > now(), false)
        or (e.stream_gen > e.stream_closed_gen and relay_replica_alive(e.stream_replica))
$$;

-- Whether an endpoint is online: its session lives, its lease holds, and its newest stream is open
-- or it showed a sign of life within the grace.
create function relay_endpoint_online(e endpoints) returns boolean language sql stable as $$
    select e.ended_at is null
       and relay_endpoint_lease(e)
       and (e.stream_gen > e.stream_closed_gen or coalesce(e.last_seen_at > now() - interval '5 seconds', false))
$$;

-- A batch of sends, already resolved and allowed, written in one transaction: the common send
-- costs one round trip and shares its commit with the sends that arrived beside it.
--
-- Each element: {id, sender, client_id, thread, kind, body, reply_to, private, require_reply,
-- account: the sender's account id, to: [endpoint ids], contacts: [other account ids the send
-- relies on], read: endpoint id whose delivery
-- of reply_to becomes read (a reply)}. Each send runs in its own subtransaction, so one that fails
-- leaves its batch-mates untouched; the answer holds, per send in order, {ok, offline: [{id,
-- last_seen_ms}]}, {duplicate}, or {error: sqlstate, message, detail}. One notification names every
-- recipient of the batch, for the other replicas (the sending one wakes its own waiters).
create function relay_send_batch(batch jsonb, cap integer, replica bigint) returns jsonb
language plpgsql as $$
declare
    s jsonb;
    answers jsonb := '[]';
    recipients bigint[];
    contacts bigint[];
    woken bigint[] := '{}';
    full_id bigint;
    offline jsonb;
    n integer;
begin
    -- Every inbox head the batch touches, locked in id order up front: concurrent batches never
    -- deadlock, and seqs stay gapless whichever sends fail.
    perform 1 from endpoints
    where id in (select x::bigint from jsonb_array_elements(batch) b, jsonb_array_elements_text(b->'to') x
                 union select (b->>'read')::bigint from jsonb_array_elements(batch) b where b ? 'read')
    order by id for update;

    for s in select value from jsonb_array_elements(batch) loop
        begin
            recipients := array(select x::bigint from jsonb_array_elements_text(s->'to') x);
            contacts := array(select x::bigint from jsonb_array_elements_text(s->'contacts') x);

            -- A contact dropped since the send was allowed lets nothing through; the ones it relies
            -- on cannot be dropped until this commits.
            if cardinality(contacts) > 0 then
                select count(*) into n from (
                    select 1 from contacts c
                    where (c.account_a = (s->>'account')::bigint and c.account_b = any(contacts))
                       or (c.account_b = (s->>'account')::bigint and c.account_a = any(contacts))
                    for key share) held;
                if n < cardinality(contacts) then
                    raise exception 'a contact this send relies on was dropped' using errcode = 'RLY01';
                end if;
            end if;

            select id into full_id from endpoints where id = any(recipients) and unread >= cap limit 1;
            if found then
                raise exception 'inbox full' using errcode = 'RLY02', detail = full_id::text;
            end if;

            insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
            values (s->>'id', (s->>'sender')::bigint, s->>'client_id', s->>'thread', (s->>'kind')::smallint,
                    s->>'body', s->>'reply_to', (s->>'private')::boolean, (s->>'require_reply')::boolean)
            on conflict (sender_id, client_id) do nothing;
            get diagnostics n = row_count;
            if n = 0 then
                answers := answers || jsonb_build_array(jsonb_build_object('duplicate', true));
                continue;
            end if;

            with heads as (
                update endpoints set head_seq = head_seq + 1 where id = any(recipients) returning id, head_seq
            )
            insert into deliveries (recipient_id, seq, message_id) select id, head_seq, s->>'id' from heads;

            if s ? 'read' then
                update deliveries set state = 4, updated_at = now()
                where message_id = s->>'reply_to' and recipient_id = (s->>'read')::bigint and state < 4;
            end if;

            select coalesce(jsonb_agg(jsonb_build_object('id', e.id, 'last_seen_ms', (extract(epoch from e.last_seen_at) * 1000)::bigint)), '[]')
            into offline
            from endpoints e join machines m on m.id = e.machine_id
            -- a human's inbox ('me') is never away
            where e.id = any(recipients) and not relay_endpoint_online(e) and m.name <> 'me';

            answers := answers || jsonb_build_array(jsonb_build_object('ok', true, 'offline', offline));
            woken := woken || recipients;
        exception when others then
            declare
                err_state text;
                err_message text;
                err_detail text;
            begin
                get stacked diagnostics err_state = returned_sqlstate, err_message = message_text,
                                        err_detail = pg_exception_detail;
                answers := answers || jsonb_build_array(
                    jsonb_build_object('error', err_state, 'message', err_message, 'detail', err_detail));
            end;
        end;
    end loop;

    -- A payload holds under 8000 bytes: 300 ids at a time.
    perform pg_notify('relay_delivery', 'r' || replica || ':' || ids)
    from (select string_agg(r::text, ',') as ids
          from (select r, (row_number() over (order by r) - 1) / 300 as chunk
                from (select distinct unnest(woken) as r) d) numbered
          group by chunk) chunks;
    return answers;
end $$;
