-- Unread counters kept by the writers that change them, not by statement triggers on every write.
--
-- The statement triggers of migration 9 ran a function, two aggregates over transition tables and an
-- update for every statement on deliveries, including the many that cannot change a count (marking
-- a delivery pushed or surfaced). Writers of this release count for themselves and say so with the
-- transaction-local setting `relay.counted`; the triggers count only for a writer that did not (a
-- previous release during a rolling upgrade, or a statement typed by hand).
--
-- Lock order, everywhere: an inbox's endpoint row before its deliveries. A send's batch locks the
-- heads it writes (and the inbox of a reply's sender) first; showing or reading deliveries locks
-- the inbox first too, so a reply, a read and a confirmation of the same inbox never wait on each
-- other in opposite orders.

drop trigger deliveries_unread_insert on deliveries;
drop trigger deliveries_unread_update on deliveries;
drop trigger deliveries_unread_delete on deliveries;

-- The same counting as before (once per statement, so a bulk statement updates each inbox once),
-- skipped when the writer counted.
create trigger deliveries_unread_insert after insert on deliveries
    referencing new table as new_rows for each statement
    when (current_setting('relay.counted', true) is distinct from 'on')
    execute function relay_count_unread();
create trigger deliveries_unread_update after update on deliveries
    referencing old table as old_rows new table as new_rows for each statement
    when (current_setting('relay.counted', true) is distinct from 'on')
    execute function relay_count_unread();
create trigger deliveries_unread_delete after delete on deliveries
    referencing old table as old_rows for each statement
    when (current_setting('relay.counted', true) is distinct from 'on')
    execute function relay_count_unread();

-- Moves one inbox's deliveries forward to `target` (pushed 2, surfaced 3 or read 4) and answers how
-- many moved. Surfaced and read are what the agent was shown: the inbox is locked first and
-- remembers the newest of them (`last_shown`), reaching read lowers its unread count, and the
-- count left unread is answered too (null for pushed, which does not touch the inbox).
create function relay_advance(recipient bigint, seqs bigint[], target smallint,
                              out moved integer, out left_unread integer)
language plpgsql as $$
declare
    lowest bigint;
    highest bigint;
begin
    if target not between 2 and 4 then
        raise exception 'relay_advance: target % is not pushed, surfaced or read', target;
    end if;
    perform set_config('relay.counted', 'on', true);
    if target = 2 then
        -- A pushed mark lost in a crash only means the message is pushed again on reconnect, which
        -- the bridge recognises by its seq: not worth a disk flush of its own.
        perform set_config('synchronous_commit', 'off', true);
    else
        perform 1 from endpoints where id = recipient for update;
    end if;
    -- The range bounds the index scan whatever the planner believes of this inbox's size: an inbox
    -- that grew faster than the statistics would otherwise be read whole for a few seqs.
    select min(x), max(x) into lowest, highest from unnest(seqs) x;
    update deliveries set state = target, updated_at = now()
    where recipient_id = recipient and seq between lowest and highest and seq = any(seqs) and state < target;
    get diagnostics moved = row_count;
    if target > 2 then
        update endpoints
        set unread = unread - case when target = 4 then moved else 0 end,
            last_shown = coalesce((select message_id from deliveries
                                   where recipient_id = recipient and seq = highest),
                                  last_shown)
        where id = recipient
        returning unread into left_unread;
    end if;
end $$;

-- As in migration 9, with the counters kept here (a delivery adds one to its inbox in the same
-- update that takes its seq, and a reply's read subtracts one from its sender's inbox), and a retry
-- recognised before anything can refuse it: replicas that resolve a repeated send from memory do
-- not look for an earlier one first.
create or replace function relay_send_batch(batch jsonb, cap integer, replica bigint) returns jsonb
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
    perform set_config('relay.counted', 'on', true);

    -- Every inbox the batch touches, locked in id order up front: concurrent batches never
    -- deadlock, and seqs stay gapless whichever sends fail.
    perform 1 from endpoints
    where id in (select x::bigint from jsonb_array_elements(batch) b, jsonb_array_elements_text(b->'to') x
                 union select (b->>'read')::bigint from jsonb_array_elements(batch) b where b ? 'read')
    order by id for update;

    for s in select value from jsonb_array_elements(batch) loop
        begin
            recipients := array(select x::bigint from jsonb_array_elements_text(s->'to') x);
            contacts := array(select x::bigint from jsonb_array_elements_text(s->'contacts') x);

            -- A retry is answered with the first result whatever has changed since: its client id
            -- is looked at first. A refusal below takes the insert back with the rest of the send.
            insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
            values (s->>'id', (s->>'sender')::bigint, s->>'client_id', s->>'thread', (s->>'kind')::smallint,
                    s->>'body', s->>'reply_to', (s->>'private')::boolean, (s->>'require_reply')::boolean)
            on conflict (sender_id, client_id) do nothing;
            get diagnostics n = row_count;
            if n = 0 then
                answers := answers || jsonb_build_array(jsonb_build_object('duplicate', true));
                continue;
            end if;

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

            with heads as (
                update endpoints set head_seq = head_seq + 1, unread = unread + 1
                where id = any(recipients) returning id, head_seq
            )
            insert into deliveries (recipient_id, seq, message_id) select id, head_seq, s->>'id' from heads;

            if s ? 'read' then
                update deliveries set state = 4, updated_at = now()
                where message_id = s->>'reply_to' and recipient_id = (s->>'read')::bigint and state < 4;
                get diagnostics n = row_count;
                if n > 0 then
                    update endpoints set unread = unread - n where id = (s->>'read')::bigint;
                end if;
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
