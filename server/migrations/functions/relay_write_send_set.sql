-- Writes a set of sends whose recipients and reply marks are known, inboxes locked in id order.
create or replace function relay_write_send_set(sends relay_outgoing[], cap integer)
 returns text[]
 language plpgsql
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    stored text[];
    kept relay_outgoing[];
    inboxes bigint[];
    need_a bigint[];
    need_b bigint[];
    held bigint;
    full_id bigint;
    gone_id bigint;
    loop_id bigint;
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
    -- in batch order: gapless and ordered per inbox. An inbox taken past `cap`, or a pair past the
    -- loop guard, undoes it all. The guard's streak (migration 44) is the last sender's to each
    -- inbox in the set: an agent answering the one who last wrote to it, within the window, goes on.
    with wanted as (
        select distinct s.ordinality as n, s.id, r, s.sender, s.account
        from unnest(kept) with ordinality s, unnest(s.recipients) r
    ), counts as (
        select r, count(*) as k, (array_agg(sender order by n desc))[1] as sender,
               (array_agg(account order by n desc))[1] as account
        from wanted group by r
    ), heads as (
        update endpoints e set head_seq = e.head_seq + c.k, unread = e.unread + c.k,
            (loop_peer, loop_turns, loop_since) = (
                select case when l.person then null else c.sender end,
                       case when l.answer then l.turns + 1 else 1 end,
                       case when l.answer then l.since else now() end
                from (select rm.name = 'me' as person, se.loop_turns as turns, se.loop_since as since,
                             rm.name <> 'me' and se.loop_peer = e.id and se.id <> e.id
                             -- and the last to write to the recipient was the sender: a person between them ends it
                             and coalesce(e.loop_peer, c.sender) = c.sender
                             and se.loop_since > now() - make_interval(secs => ac.loop_window_s) as answer
                      from machines rm, endpoints se, accounts ac
                      where rm.id = e.machine_id and se.id = c.sender and ac.id = c.account) l)
        from counts c where e.id = any(inboxes) and e.id = c.r
        returning e.id, e.head_seq - c.k as base, e.unread,
                  e.loop_turns > (select ac.loop_max_messages from accounts ac where ac.id = c.account) as looping
    ), delivered as (
        insert into deliveries (recipient_id, seq, message_id)
        select w.r, h.base + row_number() over (partition by w.r order by w.n), w.id
        from wanted w join heads h on h.id = w.r
    )
    select min(h.id) filter (where h.unread > cap), min(h.id) filter (where h.looping)
    into full_id, loop_id from heads h;
    if loop_id is not null then
        raise exception 'agents answering each other past the loop guard' using errcode = 'RLY04', detail = loop_id::text;
    end if;
    if full_id is not null then
        raise exception 'inbox full' using errcode = 'RLY02', detail = full_id::text;
    end if;

    -- A reply reads the message it answers (one by one: replies are few, and each is one index
    -- lookup with a plan kept for the session).
    for reply in select s.reply_to, s.read_by from unnest(kept) s where s.read_by is not null loop
        update deliveries set state = relay_state('read'), updated_at = now()
        where message_id = reply.reply_to and recipient_id = reply.read_by and state < relay_state('read');
        if found then
            update endpoints set unread = unread - 1 where id = reply.read_by;
        end if;
    end loop;

    return stored;
end $function$;
