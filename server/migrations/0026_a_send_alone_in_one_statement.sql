-- A send that has no batch-mates is written by `relay_write_send`: one statement writes its message,
-- inbox heads, deliveries and the read mark of what it replies to, where the set-based
-- `relay_write_sends` (migration 22) runs a handful, each paying for unnesting and grouping a batch.
-- Same outcomes and errors as a batch of one there (RLY01 a contact dropped, RLY02 an inbox full with
-- its id in the detail). `relay_write_sends` stays for batches.
--
-- Both now also refuse a recipient whose machine was revoked (RLY03, the endpoint's id in the
-- detail): a send resolved from memory in the moment between a revocation's commit and its
-- notification reaching the replica is refused here, as resolving it afresh would have been.
--
-- The batch functions are redefined (same signatures and answers, so the previous release calls them
-- unchanged) to find inboxes by key: they joined `endpoints` with the batch's unnested recipients,
-- which the planner estimates as a hundred rows whatever the batch holds, and past a few thousand
-- endpoints it read the whole table for every batch (4.6 ms at 20,000 endpoints, against 0.1). They
-- now name the inboxes as an array, which the primary key answers, and filter by the stored sends once.

-- Tells the other replicas that `recipients` have new deliveries, for the stream holding each (the
-- writing replica, named in the payload, wakes its own waiters). A payload holds under 8000 bytes:
-- 300 ids a notification, however many a send or batch reaches (a group send can reach hundreds).
-- (plpgsql, so that `perform` runs the query to its last row: a SQL function returning void would
-- stop at the first chunk.)
create function relay_announce_delivered(replica bigint, recipients bigint[]) returns void
language plpgsql as $$
begin
    perform pg_notify('relay_delivery', 'r' || replica || ':' || ids)
    from (select string_agg(r::text, ',') as ids
          from (select r, (row_number() over (order by r) - 1) / 300 as chunk
                from (select distinct r from unnest(recipients) r) d) numbered
          group by chunk) chunks;
end $$;

create function relay_write_send(s relay_outgoing, cap integer, replica bigint,
                                 out outcome text, out offline bigint[], out offline_seen timestamptz[])
language plpgsql
-- Its statements find their rows by key: a plan made once a session serves every send. Otherwise the
-- planner, seeing a cheaper estimate for each send's own arrays, plans every statement again per call.
set plan_cache_mode = force_generic_plan
as $$
declare
    stored boolean;
    held bigint;
    full_id bigint;
    gone_id bigint;
begin
    perform set_config('relay.counted', 'on', true);

    -- The inboxes first, in id order, as every writer locks them (see migration 10).
    perform 1 from endpoints e where e.id = any(s.recipients || s.read_by) order by e.id for no key update;

    -- The message first: a retry is answered with the first result whatever has changed since, so a
    -- duplicate writes nothing else and is not refused. Everything after it is conditioned on it.
    with m as (
        insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
        values (s.id, s.sender, s.client_id, s.thread, s.kind, s.body, s.reply_to, s.private, s.require_reply)
        on conflict (sender_id, client_id) do nothing
        returning messages.id
    ), kept as (
        -- The contacts it relies on, held until commit (`for key share`: only a drop conflicts).
        select 1 from contacts k
        where (k.account_a, k.account_b) in (select least(s.account, c), greatest(s.account, c)
                                             from unnest(s.contacts) c)
          and exists (select 1 from m)
        for key share of k
    ), read as (
        update deliveries d set state = 4, updated_at = now()
        where d.message_id = s.reply_to and d.recipient_id = s.read_by and d.state < 4
          and exists (select 1 from m)
        returning d.recipient_id
    ), heads as (
        -- One update per inbox row: a reply's sender may also be one of its recipients.
        update endpoints e
        set head_seq = e.head_seq + (e.id = any(s.recipients))::int,
            unread = e.unread + (e.id = any(s.recipients))::int
                     - (exists (select 1 from read r where r.recipient_id = e.id))::int
        where e.id = any(s.recipients || s.read_by)
          and (e.id = any(s.recipients) or exists (select 1 from read r where r.recipient_id = e.id))
          and exists (select 1 from m)
        returning e.id, e.head_seq, e.unread
    ), delivered as (
        insert into deliveries (recipient_id, seq, message_id)
        select h.id, h.head_seq, m.id from heads h, m where h.id = any(s.recipients)
    )
    select exists (select 1 from m), (select count(*) from kept),
           (select min(h.id) from heads h where h.id = any(s.recipients) and h.unread > cap),
           (select min(e.id) from endpoints e join machines ma on ma.id = e.machine_id
            where e.id = any(s.recipients) and ma.revoked_at is not null)
    into stored, held, full_id, gone_id;

    if not stored then
        outcome := 'duplicate';
        return;
    end if;
    -- Raising undoes what the statement wrote: the caller's transaction is this call alone.
    if held < (select count(distinct c) from unnest(s.contacts) c) then
        raise exception 'a contact this send relies on was dropped' using errcode = 'RLY01';
    end if;
    if gone_id is not null then
        raise exception 'the machine of a recipient was revoked' using errcode = 'RLY03', detail = gone_id::text;
    end if;
    if full_id is not null then
        raise exception 'inbox full' using errcode = 'RLY02', detail = full_id::text;
    end if;

    -- Its recipients that are away (a human's inbox, 'me', never is).
    select array_agg(e.id order by e.id), array_agg(e.last_seen_at order by e.id)
    into offline, offline_seen
    from endpoints e join machines ma on ma.id = e.machine_id
    where e.id = any(s.recipients) and ma.name <> 'me' and not relay_endpoint_online(e);
    perform relay_announce_delivered(replica, s.recipients);
    outcome := 'stored';
end $$;

create or replace function relay_write_send_set(sends relay_outgoing[], cap integer) returns text[]
language plpgsql as $$
declare
    stored text[];
    kept relay_outgoing[];
    inboxes bigint[];
    need_a bigint[];
    need_b bigint[];
    held bigint;
    full_id bigint;
    gone_id bigint;
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

    -- The sends stored, in batch order: a duplicate writes nothing more.
    kept := array(select sends[i] from generate_subscripts(sends, 1) i where sends[i].id = any(stored) order by i);
    inboxes := array(select distinct r from unnest(kept) s, unnest(s.recipients) r);
    select min(e.id) into gone_id
    from endpoints e join machines ma on ma.id = e.machine_id
    where e.id = any(inboxes) and ma.revoked_at is not null;
    if gone_id is not null then
        raise exception 'the machine of a recipient was revoked' using errcode = 'RLY03', detail = gone_id::text;
    end if;

    -- The contacts the stored sends rely on, held (`for key share`: only a drop conflicts) so
    -- none can be dropped until this commits.
    select array_agg(a), array_agg(b) into need_a, need_b
    from (select distinct least(s.account, c) as a, greatest(s.account, c) as b
          from unnest(kept) s, unnest(s.contacts) c) pairs;
    if need_a is not null then
        select count(*) into held
        from (select 1 from contacts k
              where k.account_a = any(need_a)
                and (k.account_a, k.account_b) in (select * from unnest(need_a, need_b))
              for key share of k) h;
        if held < cardinality(need_a) then
            raise exception 'a contact this send relies on was dropped' using errcode = 'RLY01';
        end if;
    end if;

    -- Each inbox's head moves once by its count of new deliveries, which take the seqs between
    -- in batch order: gapless and ordered per inbox. An inbox taken past `cap` undoes it all.
    with wanted as (
        select distinct s.ordinality as n, s.id, r
        from unnest(kept) with ordinality s, unnest(s.recipients) r
    ), counts as (
        select r, count(*) as k from wanted group by r
    ), heads as (
        update endpoints e set head_seq = e.head_seq + c.k, unread = e.unread + c.k
        from counts c where e.id = any(inboxes) and e.id = c.r
        returning e.id, e.head_seq - c.k as base, e.unread
    ), delivered as (
        insert into deliveries (recipient_id, seq, message_id)
        select w.r, h.base + row_number() over (partition by w.r order by w.n), w.id
        from wanted w join heads h on h.id = w.r
    )
    select min(h.id) into full_id from heads h where h.unread > cap;
    if full_id is not null then
        raise exception 'inbox full' using errcode = 'RLY02', detail = full_id::text;
    end if;

    -- A reply reads the message it answers (one by one: replies are few, and each is one index
    -- lookup with a plan kept for the session).
    for reply in select s.reply_to, s.read_by from unnest(kept) s where s.read_by is not null loop
        update deliveries set state = 4, updated_at = now()
        where message_id = reply.reply_to and recipient_id = reply.read_by and state < 4;
        if found then
            update endpoints set unread = unread - 1 where id = reply.read_by;
        end if;
    end loop;

    return stored;
end $$;

create or replace function relay_write_sends(sends relay_outgoing[], cap integer, replica bigint)
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
    inboxes bigint[];
begin
    perform set_config('relay.counted', 'on', true);

    -- Every inbox the batch touches, locked in id order up front (inboxes before their
    -- deliveries, as everywhere): concurrent batches never deadlock. `no key update` is what the
    -- writes below need, and unlike `update` it lets another batch's foreign key check on a
    -- sender through: two batches sending each other's inboxes messages do not wait on each other.
    inboxes := array(select r from unnest(sends) s, unnest(s.recipients) r
                     union select s.read_by from unnest(sends) s where s.read_by is not null);
    perform 1 from endpoints where id = any(inboxes) order by id for no key update;

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
