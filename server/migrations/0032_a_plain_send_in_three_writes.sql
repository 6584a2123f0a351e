-- A plain send, the commonest (one inbox, relying on no contact, reading no message it answers),
-- is written by three short statements instead of one statement of many parts.
--
-- `relay_write_send_numbered` (migration 30) writes every lone send with one statement of seven
-- parts, most of them empty for a plain send: a contact check, a reply's read, grouping over the
-- recipients. Postgres starts and ends each part on every call whether it finds rows or not. For a
-- plain send that made its execution 0.38-0.45 ms against 0.21-0.26 ms for the bare writes (message,
-- head, delivery, notification) in one statement; `relay_write_send_plain` takes 0.26-0.31 ms
-- (pgbench, one client, interleaved).
--
-- Its answers are `relay_write_send_numbered`'s, so the server reads both alike. A send that is not
-- plain still goes to `relay_write_send_numbered`, which is unchanged, and so is the previous
-- release, which never calls this.
--
-- Locks: the message is inserted first (a retry racing its first attempt waits on its key, as
-- before), then the inbox row is updated, which locks it; no inbox is locked ahead, as migration 30
-- explains for a send to one inbox. The foreign-key checks of the message (its sender, the message
-- it answers) now run before the inbox is locked rather than after: they take `key share` locks,
-- which a writer holding an inbox (`no key update`) never waits on.
create function relay_write_send_plain(s relay_outgoing, cap integer, replica bigint,
                                       out outcome text, out offline bigint[], out offline_seen timestamptz[],
                                       out seqs bigint[], out relations text[], out sent_at timestamptz)
language plpgsql
-- As the other writers (migrations 27 and 31): one plan a connection, by index whatever the
-- statistics said when it was made.
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
declare
    inbox bigint := s.recipients[1];
    seq bigint;
    unread integer;
    online boolean;
    seen timestamptz;
    revoked boolean;
    human boolean;
    relation text;
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

    -- The inbox's next seq, and what the answer needs of it, asked of the row in hand.
    update endpoints e set head_seq = e.head_seq + 1, unread = e.unread + 1
    from machines ma
    where e.id = inbox and ma.id = e.machine_id
    returning e.head_seq, e.unread, relay_endpoint_online(e), e.last_seen_at, ma.revoked_at is not null,
              ma.name = 'me',
              case when e.parent_id = s.sender then 'parent'
                   when e.id = (select se.parent_id from endpoints se where se.id = s.sender) then 'child'
                   else '' end
    into seq, unread, online, seen, revoked, human, relation;
    -- Raising undoes what was written: the caller's transaction is this call alone. An inbox that
    -- no longer exists is refused as a revoked machine's is: nobody there to reach.
    if not found or revoked then
        raise exception 'the machine of a recipient was revoked' using errcode = 'RLY03', detail = inbox::text;
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
end $$;
