-- Writes one message that has no batch-mates in one statement (message, inbox heads, deliveries,
-- reply mark) and answers each recipient's seq and relation and when it was stored. Also the
-- writer of what is written inside a larger transaction: a message held for a human (written with
-- no recipients; the hold names them) and what the system sends.
create or replace function relay_write_send_numbered(s relay_outgoing, cap integer, replica bigint, out outcome text, out offline bigint[], out offline_seen timestamp with time zone[], out seqs bigint[], out relations text[], out sent_at timestamp with time zone)
 returns record
 language plpgsql
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    stored boolean;
    held bigint;
    full_id bigint;
    gone_id bigint;
    loop_id bigint;
begin
    perform set_config('relay.counted', 'on', true);

    -- Several inboxes are locked first, as every writer locks them (`relay_lock_inboxes`).
    -- A send to one inbox of its own account takes no lock ahead: the update of the head locks its
    -- only inbox, and nothing it takes before that is what a writer holding an inbox waits for (a
    -- reply's delivery or a contact would be: a send with either still locks first). Only a retry
    -- racing its own first attempt, written by another writer, waits on the message's key; should
    -- that writer wait for this inbox, Postgres refuses one of the two and the client retries.
    if cardinality(s.recipients) <> 1 or s.read_by is not null or cardinality(s.contacts) > 0 then
        perform 1 from relay_lock_inboxes(s.recipients || s.read_by);
    end if;

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
        update deliveries d set state = relay_state('read'), updated_at = now()
        where d.message_id = s.reply_to and d.recipient_id = s.read_by and d.state < relay_state('read')
          and exists (select 1 from m)
        returning d.recipient_id
    ), heads as (
        -- One update per inbox row: a reply's sender may also be one of its recipients. A recipient
        -- keeps the loop guard's streak (migration 44): an agent answering the one who last wrote to
        -- it, within the window, goes on that streak.
        update endpoints e
        set head_seq = e.head_seq + (e.id = any(s.recipients))::int,
            unread = e.unread + (e.id = any(s.recipients))::int
                     - (exists (select 1 from read r where r.recipient_id = e.id))::int,
            (loop_peer, loop_turns, loop_since) = (
                -- (a reply's sender, whose original becomes read, keeps its own)
                select case when not l.recipient then e.loop_peer when l.person then null else s.sender end,
                       case when not l.recipient then e.loop_turns when l.answer then l.turns + 1 else 1 end,
                       case when not l.recipient then e.loop_since when l.answer then l.since else now() end
                from (select e.id = any(s.recipients) as recipient, rm.name = 'me' as person,
                             se.loop_turns as turns, se.loop_since as since,
                             rm.name <> 'me' and se.loop_peer = e.id and se.id <> e.id
                             -- and the last to write to the recipient was the sender: a person between them ends it
                             and coalesce(e.loop_peer, s.sender) = s.sender
                             and se.loop_since > now() - make_interval(secs => ac.loop_window_s) as answer
                      from machines rm, endpoints se, accounts ac
                      where rm.id = e.machine_id and se.id = s.sender and ac.id = s.account) l)
        where e.id = any(s.recipients || s.read_by)
          and (e.id = any(s.recipients) or exists (select 1 from read r where r.recipient_id = e.id))
          and exists (select 1 from m)
        -- Whether each is online is asked here, of the row in hand, rather than in a query after.
        returning e.id, e.head_seq, e.unread, e.machine_id, e.parent_id, e.last_seen_at, relay_endpoint_online(e) as online,
                  e.id = any(s.recipients)
                  and e.loop_turns > (select ac.loop_max_messages from accounts ac where ac.id = s.account) as looping
    ), delivered as (
        insert into deliveries (recipient_id, seq, message_id)
        select h.id, h.head_seq, m.id from heads h, m where h.id = any(s.recipients)
    )
    -- Refused past the cap (RLY02), for a revoked machine (RLY03) or past the loop guard (RLY04);
    -- away: not online, where a human's inbox ('me') never is.
    select exists (select 1 from m), (select count(*) from kept), g.full_id, g.gone_id, g.loop_id, g.away, g.away_seen,
           n.seqs, n.relations
    from (select min(h.id) filter (where h.unread > cap) as full_id,
                 min(h.id) filter (where ma.revoked_at is not null) as gone_id,
                 min(h.id) filter (where h.looping) as loop_id,
                 array_agg(h.id order by h.id) filter (where ma.name <> 'me' and not h.online) as away,
                 array_agg(h.last_seen_at order by h.id) filter (where ma.name <> 'me' and not h.online) as away_seen
          from heads h join machines ma on ma.id = h.machine_id
          where h.id = any(s.recipients)) g,
         -- Each recipient's seq and how it stands to the sender, in the order of `s.recipients`.
         (select array_agg(h.head_seq order by r.i) as seqs,
                 array_agg(case when h.parent_id = s.sender then 'parent'
                                when h.id = (select se.parent_id from endpoints se where se.id = s.sender) then 'child'
                                else '' end order by r.i) as relations
          from unnest(s.recipients) with ordinality r(id, i) join heads h on h.id = r.id) n
    into stored, held, full_id, gone_id, loop_id, offline, offline_seen, seqs, relations;

    if not stored then
        outcome := 'duplicate';
        return;
    end if;
    -- Raising undoes what the statement wrote: the caller's transaction is this call alone.
    -- (Asked only of a send across accounts: the nested `if` spares the others a query.)
    if cardinality(s.contacts) > 0 then
        if held < (select count(distinct c) from unnest(s.contacts) c) then
            raise exception 'a contact this send relies on was dropped' using errcode = 'RLY01';
        end if;
    end if;
    if gone_id is not null then
        raise exception 'the machine of a recipient was revoked' using errcode = 'RLY03', detail = gone_id::text;
    end if;
    if loop_id is not null then
        raise exception 'agents answering each other past the loop guard' using errcode = 'RLY04', detail = loop_id::text;
    end if;
    if full_id is not null then
        raise exception 'inbox full' using errcode = 'RLY02', detail = full_id::text;
    end if;

    -- Its recipients are distinct: up to 300 fit one notification, named straight away. A message
    -- held for a human has none yet: `relay_write_release` delivers it.
    if cardinality(s.recipients) = 0 then
        null;
    elsif cardinality(s.recipients) <= 300 then
        perform pg_notify('relay_delivery', 'r' || replica || ':' || array_to_string(s.recipients, ','));
    else
        perform relay_announce_delivered(replica, s.recipients);
    end if;
    sent_at := now();
    outcome := 'stored';
end $function$;
