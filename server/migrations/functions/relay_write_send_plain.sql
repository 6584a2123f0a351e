-- Writes one plain send (one inbox, no contact relied on, not a reply) with the fewest statements;
-- refuses an inbox that no longer exists.
create or replace function relay_write_send_plain(s relay_outgoing, cap integer, replica bigint, out outcome text, out offline bigint[], out offline_seen timestamp with time zone[], out seqs bigint[], out relations text[], out sent_at timestamp with time zone)
 returns record
 language plpgsql
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
 set enable_bitmapscan to 'off'
 set jit to 'off'
as $function$
declare
    inbox bigint := s.recipients[1];
    seq bigint;
    unread integer;
    online boolean;
    seen timestamptz;
    revoked boolean;
    human boolean;
    relation text;
    looping boolean;
begin
    if cardinality(s.recipients) <> 1 or s.read_by is not null or cardinality(s.contacts) > 0 then
        raise exception 'not a plain send: one recipient, no contact, nothing read' using errcode = '22023';
    end if;
    -- The head and unread count are kept here; the deliveries' counting triggers stand aside.
    perform set_config('relay.counted', 'on', true);

    -- A retry is answered with the first result whatever has changed since: a duplicate writes
    -- nothing else and is not refused.
    insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
    values (s.id, s.sender, s.client_id, s.thread, s.kind, s.body, s.reply_to, s.private, s.require_reply)
    on conflict (sender_id, client_id) do nothing;
    if not found then
        outcome := 'duplicate';
        return;
    end if;

    -- The inbox's next seq, and what the answer needs of it, asked of the row in hand; the loop
    -- guard's streak (migration 44): an agent answering the one who last wrote to it, within the
    -- window, goes on that streak.
    update endpoints e set head_seq = e.head_seq + 1, unread = e.unread + 1,
        (loop_peer, loop_turns, loop_since) = (
            select case when l.person then null else s.sender end,
                   case when l.answer then l.turns + 1 else 1 end,
                   case when l.answer then l.since else now() end
            from (select ma.name = 'me' as person, se.loop_turns as turns, se.loop_since as since,
                         ma.name <> 'me' and se.loop_peer = e.id and se.id <> e.id
                         -- and the last to write to the recipient was the sender: a person between them ends it
                         and coalesce(e.loop_peer, s.sender) = s.sender
                         and se.loop_since > now() - make_interval(secs => ac.loop_window_s) as answer
                  from endpoints se, accounts ac where se.id = s.sender and ac.id = s.account) l)
    from machines ma
    where e.id = inbox and ma.id = e.machine_id
    returning e.head_seq, e.unread, relay_endpoint_online(e), e.last_seen_at, ma.revoked_at is not null,
              ma.name = 'me',
              case when e.parent_id = s.sender then 'parent'
                   when e.id = (select se.parent_id from endpoints se where se.id = s.sender) then 'child'
                   else '' end,
              e.loop_turns > (select ac.loop_max_messages from accounts ac where ac.id = s.account)
    into seq, unread, online, seen, revoked, human, relation, looping;
    -- Raising undoes what was written: the caller's transaction is this call alone. An inbox that
    -- no longer exists is refused as a revoked machine's is: nobody there to reach.
    if not found or revoked then
        raise exception 'the machine of a recipient was revoked' using errcode = 'RLY03', detail = inbox::text;
    end if;
    if looping then
        raise exception 'agents answering each other past the loop guard' using errcode = 'RLY04', detail = inbox::text;
    end if;
    if unread > cap then
        raise exception 'inbox full' using errcode = 'RLY02', detail = inbox::text;
    end if;

    insert into deliveries (recipient_id, seq, message_id) values (inbox, seq, s.id);

    -- Away: not online, where a human's inbox ('me') never is.
    if not human and not online then
        offline := array[inbox];
        offline_seen := array[seen];
    end if;
    seqs := array[seq];
    relations := array[relation];
    perform pg_notify('relay_delivery', 'r' || replica || ':' || inbox);
    sent_at := now();
    outcome := 'stored';
end $function$;
