-- Sends written as sets: a batch of sends costs a handful of statements, not a handful per send.
--
-- `relay_send_batch` (migrations 9 and 10) stays for the previous release. This release calls
-- `relay_write_sends`, which takes the batch as typed rows instead of jsonb and writes it whole:
-- one insert of its messages, one update of its inboxes' heads with one insert of their deliveries.
-- A batch that cannot be written whole (a contact dropped, an inbox full, any other error) is
-- written again one send at a time, each in a subtransaction, so one failing send leaves the
-- others stored with exactly the outcomes they would have had alone.

-- One send, resolved and allowed. `recipients`: the endpoints it is delivered to; `contacts`: the
-- other accounts it relies on; `read_by`: for a reply, the endpoint whose delivery of `reply_to`
-- becomes read.
create type relay_outgoing as (
    id            text,
    sender        bigint,
    account       bigint,
    client_id     text,
    thread        text,
    kind          smallint,
    body          text,
    reply_to      text,
    private       boolean,
    require_reply boolean,
    recipients    bigint[],
    contacts      bigint[],
    read_by       bigint
);

-- Whether a replica is alive, as in migration 9. As plpgsql its query is planned once per
-- session; as a SQL function with a subquery it could not be inlined and was parsed and planned
-- again in every statement that asked whether an endpoint is online.
create or replace function relay_replica_alive(replica bigint) returns boolean
language plpgsql stable as $$
begin
    return exists (select 1 from replicas r where r.id = replica and r.alive_until > now());
end $$;

-- Writes `sends` whole and answers the ids of the messages stored (a send whose client id its
-- sender used before stores nothing). Raises, leaving the caller to undo what it wrote, when a
-- contact a send relies on is gone (RLY01) or a send would take an inbox past `cap` unread
-- (RLY02, the inbox's id in the detail). The caller has locked every inbox the sends touch.
create function relay_write_send_set(sends relay_outgoing[], cap integer) returns text[]
language plpgsql as $$
declare
    stored text[];
    missing bigint;
    full_id bigint;
    reply record;
begin
    -- A retry is answered with the first result whatever has changed since, so client ids are
    -- looked at before anything can refuse the send.
    with written as (
        insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
        select s.id, s.sender, s.client_id, s.thread, s.kind, s.body, s.reply_to, s.private, s.require_reply
        from unnest(sends) with ordinality s
        order by s.ordinality
        on conflict (sender_id, client_id) do nothing
        returning id
    )
    select coalesce(array_agg(id), '{}') into stored from written;

    -- The contacts the stored sends rely on, held (`for key share`: only a drop conflicts) so
    -- none can be dropped until this commits.
    with needed as (
        select distinct least(s.account, c) as a, greatest(s.account, c) as b
        from unnest(sends) s, unnest(s.contacts) c
        where s.id in (select unnest(stored))
    )
    select (select count(*) from needed)
         - (select count(*) from (select 1 from contacts k join needed on k.account_a = needed.a and k.account_b = needed.b
                                  for key share of k) held)
    into missing;
    if missing > 0 then
        raise exception 'a contact this send relies on was dropped' using errcode = 'RLY01';
    end if;

    select e.id into full_id
    from endpoints e
    join (select r, count(*) as k
          from (select distinct s.ordinality, r from unnest(sends) with ordinality s, unnest(s.recipients) r
                where s.id in (select unnest(stored))) d
          group by r) w on w.r = e.id
    where e.unread + w.k > cap
    order by e.id
    limit 1;
    if found then
        raise exception 'inbox full' using errcode = 'RLY02', detail = full_id::text;
    end if;

    -- Each inbox's head moves once by its count of new deliveries, which take the seqs between
    -- in batch order: gapless and ordered per inbox.
    with wanted as (
        select distinct s.ordinality as n, s.id, r
        from unnest(sends) with ordinality s, unnest(s.recipients) r
        where s.id in (select unnest(stored))
    ), counts as (
        select r, count(*) as k from wanted group by r
    ), heads as (
        update endpoints e set head_seq = e.head_seq + c.k, unread = e.unread + c.k
        from counts c where e.id = c.r
        returning e.id, e.head_seq - c.k as base
    )
    insert into deliveries (recipient_id, seq, message_id)
    select w.r, h.base + row_number() over (partition by w.r order by w.n), w.id
    from wanted w join heads h on h.id = w.r;

    -- A reply reads the message it answers (one by one: replies are few, and each is one index
    -- lookup with a plan kept for the session).
    for reply in select s.reply_to, s.read_by from unnest(sends) s
                 where s.read_by is not null and s.id in (select unnest(stored)) loop
        update deliveries set state = 4, updated_at = now()
        where message_id = reply.reply_to and recipient_id = reply.read_by and state < 4;
        if found then
            update endpoints set unread = unread - 1 where id = reply.read_by;
        end if;
    end loop;

    return stored;
end $$;

-- A batch of sends, resolved and allowed, in one transaction: one row per send, in order, with
-- its outcome (`stored`, `duplicate` or `refused` with the SQLSTATE, message and detail) and, when
-- stored, its recipients that are not online with when they were last seen. A batch of one send
-- is not answered but raises when refused. One notification names every recipient woken, for
-- the other replicas (the writing one wakes its own waiters).
create function relay_write_sends(sends relay_outgoing[], cap integer, replica bigint)
returns table (n bigint, outcome text, code text, message text, detail text,
               offline bigint[], offline_seen timestamptz[])
language plpgsql
-- Every statement here finds its rows by key whatever the batch holds: planned once a session,
-- not again for each batch whose estimate happens to differ.
set plan_cache_mode = force_generic_plan
as $$
declare
    stored text[] := '{}';
    failed_n bigint[] := '{}';
    failed_code text[] := '{}';
    failed_message text[] := '{}';
    failed_detail text[] := '{}';
    err_code text;
    err_message text;
    err_detail text;
begin
    perform set_config('relay.counted', 'on', true);

    -- Every inbox the batch touches, locked in id order up front (inboxes before their
    -- deliveries, as everywhere): concurrent batches never deadlock. `no key update` is what the
    -- writes below need, and unlike `update` it lets another batch's foreign key check on a
    -- sender through: two batches sending each other's inboxes messages do not wait on each other.
    perform 1 from endpoints
    where id in (select r from unnest(sends) s, unnest(s.recipients) r
                 union select s.read_by from unnest(sends) s where s.read_by is not null)
    order by id for no key update;

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

    -- A payload holds under 8000 bytes: 300 ids at a time.
    perform pg_notify('relay_delivery', 'r' || replica || ':' || ids)
    from (select string_agg(r::text, ',') as ids
          from (select r, (row_number() over (order by r) - 1) / 300 as chunk
                from (select distinct r from unnest(sends) s, unnest(s.recipients) r
                      where s.id in (select unnest(stored))) d) numbered
          group by chunk) chunks;

    return query
    with sent as (
        select s.ordinality as n, s.recipients, st.id is not null as ok
        from unnest(sends) with ordinality s left join unnest(stored) st(id) on st.id = s.id
    ), away as (
        select e.id, e.last_seen_at
        from endpoints e join machines m on m.id = e.machine_id
        where e.id in (select r from sent, unnest(sent.recipients) r where sent.ok)
          -- a human's inbox ('me') is never away
          and m.name <> 'me' and not relay_endpoint_online(e)
    )
    select sent.n,
           case when sent.ok then 'stored' when f.code is null then 'duplicate' else 'refused' end,
           f.code, f.message, f.detail, o.ids, o.seen
    from sent
    left join unnest(failed_n, failed_code, failed_message, failed_detail) as f(n, code, message, detail)
        on f.n = sent.n
    left join lateral (select array_agg(a.id order by a.id) as ids, array_agg(a.last_seen_at order by a.id) as seen
                       from away a where sent.ok and a.id = any(sent.recipients)) o on true
    order by sent.n;
end $$;
