//! The core under concurrency and across replicas: sends written together keep each their own
//! fate and every inbox gapless; sessions held in memory are dropped the moment they end anywhere;
//! presence follows the replica that holds the stream, and an idle stream writes nothing.

use std::time::{Duration, SystemTime};

use relay_proto::timing::HEARTBEAT_EVERY;
use relay_proto::v1::*;
use relay_tests::client::{Agent, caught_up, next_heartbeat, next_message};
use relay_tests::eventually;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(10);

async fn agents(url: &str, token: &str, prefix: &str, n: usize) -> Vec<Agent> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(Agent::hello(url, token, &format!("{prefix}{i}")).await.unwrap());
    }
    out
}

fn seqs(inbox: &InboxResponse) -> Vec<u64> {
    inbox.messages.iter().map(|m| m.seq).collect()
}

#[tokio::test]
async fn sends_arriving_together_each_keep_their_own_fate_and_inboxes_stay_gapless() {
    let db = TestDb::new().await;
    let server = Server::start_with_env(&db, relay_tests::free_port(), &[("RELAY_MAX_UNREAD", "10")]).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    let mut full = Agent::hello(&server.url, &ci, "full").await.unwrap();
    let mut roomy = Agent::hello(&server.url, &ci, "roomy").await.unwrap();
    let mut stream = roomy.subscribe(0).await;
    let senders = agents(&server.url, &laptop, "s", 24).await;

    // 16 sends into an inbox that holds 10, and 8 into one with room, all at once.
    let mut sends = tokio::task::JoinSet::new();
    for (i, s) in senders.iter().enumerate() {
        let mut rpc = s.rpc.clone();
        let to = if i < 16 { "ci/full" } else { "ci/roomy" };
        sends.spawn(async move {
            let request = SendRequest {
                to: vec![to.into()],
                body: format!("message {i}"),
                client_id: format!("c{i}"),
                ..Default::default()
            };
            (i, rpc.send(request).await)
        });
    }
    let outcomes = sends.join_all().await;
    let (mut stored, mut refused) = (0, 0);
    for (i, outcome) in &outcomes {
        match outcome {
            Ok(_) => stored += 1,
            Err(status) => {
                assert!(*i < 16, "a send with room was refused: {status:?}");
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains("acme/ci/full has 10 unread messages"), "{status:?}");
                refused += 1;
            }
        }
    }
    assert_eq!((stored, refused), (18, 6), "10 into the full inbox and 8 into the other; the rest refused");

    // Refused sends left no gap: each inbox numbers what it got from 1.
    assert_eq!(seqs(&full.inbox(0, false).await.unwrap()), (1..=10).collect::<Vec<_>>());
    assert_eq!(seqs(&roomy.inbox(0, false).await.unwrap()), (1..=8).collect::<Vec<_>>());
    let mut pushed: Vec<u64> = Vec::new();
    while pushed.len() < 8 {
        pushed.push(next_message(&mut stream, WAIT).await.seq);
    }
    assert_eq!(pushed, (1..=8).collect::<Vec<_>>(), "pushed in order, each once");

    // A retry of a stored send is answered with the first result and stores nothing.
    let (i, first) = outcomes.iter().find(|(i, o)| *i >= 16 && o.is_ok()).unwrap();
    let first = first.as_ref().unwrap().get_ref();
    let retry = SendRequest {
        to: vec!["ci/roomy".into()],
        body: format!("message {i}"),
        client_id: format!("c{i}"),
        ..Default::default()
    };
    let again = senders[*i].rpc.clone().send(retry).await.unwrap().into_inner();
    assert!(again.duplicate);
    assert_eq!(again.id, first.id);
    assert_eq!(roomy.rpc.who_am_i(WhoAmIRequest {}).await.unwrap().into_inner().unread, 8);
}

/// Every inbox's unread count, as kept in the database, beside the deliveries it counts.
async fn unread_counts(db: &TestDb) -> Vec<(String, i32, i64)> {
    let client = db.sql().await;
    let rows = client
        .query(
            "select ea.address, e.unread,
                    (select count(*) from deliveries d where d.recipient_id = e.id and d.state < 4)
             from endpoints e join endpoint_addresses ea on ea.id = e.id order by ea.address",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
}

/// A server with two accounts in contact: acme's machine `laptop` and globex's `box`, and their
/// machine tokens.
async fn acme_and_globex_in_contact() -> (TestDb, Server, String, String) {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let globex = server.machine("globex", "box");
    server.admin_ok(&["contact", "add", "acme", "globex"]);
    (db, server, laptop, globex)
}

#[tokio::test]
async fn unread_counts_stay_exact_and_a_reply_never_deadlocks_with_its_senders_reading() {
    let (db, server, laptop, globex) = acme_and_globex_in_contact().await;
    let mut asker = Agent::hello(&server.url, &laptop, "asker").await.unwrap();
    let mut other = Agent::hello(&server.url, &laptop, "other").await.unwrap();
    let mut answerer = Agent::hello(&server.url, &globex, "answerer").await.unwrap();

    // Questions to the answerer, and mail across the accounts both ways.
    for i in 0..12 {
        asker.send(&["globex/box/answerer"], &format!("question {i}")).await.unwrap();
        other.send(&["laptop/asker"], &format!("note {i}")).await.unwrap();
        answerer.send(&["acme/laptop/other"], &format!("news {i}")).await.unwrap();
    }

    // The answerer replies to each question while reading its inbox: each reply marks its question
    // read and locks the answerer's inbox, as the reading does. Neither may fail the other.
    let questions = answerer.inbox(0, false).await.unwrap().messages;
    assert_eq!(questions.len(), 12);
    let mut work = tokio::task::JoinSet::new();
    for (i, q) in questions.iter().enumerate() {
        let mut rpc = answerer.rpc.clone();
        let id = q.id.clone();
        work.spawn(async move {
            let reply = ReplyRequest { id, body: format!("answer {i}"), ..Default::default() };
            rpc.reply(reply).await.map(|_| ())
        });
        let mut rpc = answerer.rpc.clone();
        let seq = q.seq;
        work.spawn(async move {
            let confirm = ConfirmRequest { seqs: vec![seq], state: DeliveryState::Read as i32 };
            rpc.confirm(confirm).await.map(|_| ())
        });
    }
    for outcome in work.join_all().await {
        outcome.expect("a reply and a read of the same inbox both succeed");
    }
    assert_eq!(answerer.rpc.who_am_i(WhoAmIRequest {}).await.unwrap().into_inner().unread, 0);

    // Surfaced stays unread, acknowledged does not; a dropped contact withdraws what is unseen.
    other.inbox(0, false).await.unwrap();
    asker.inbox(0, true).await.unwrap();
    for i in 0..3 {
        answerer.send(&["acme/laptop/asker"], &format!("late {i}")).await.unwrap();
    }
    server.admin_ok(&["contact", "drop", "acme", "globex"]);

    let counts = unread_counts(&db).await;
    for (address, kept, counted) in &counts {
        assert_eq!(i64::from(*kept), *counted, "{address}: the kept unread count drifted from its deliveries");
    }
    let of = |a: &str| counts.iter().find(|c| c.0 == a).map(|c| c.1).unwrap();
    assert_eq!(of("acme/laptop/other"), 12, "news surfaced but not read, the rest withdrawn or read");
    assert_eq!(of("acme/laptop/asker"), 0, "answers read with the inbox; late mail withdrawn by the drop");
}

/// Dropping a contact locks the inboxes holding what it withdraws, but does not wait for a send in
/// progress whose sender owns one of them (the send's foreign key holds a `key share` of that
/// row): were it to wait, a send that then reached for an inbox the drop holds would deadlock.
#[tokio::test]
async fn a_contact_drop_does_not_wait_for_a_send_from_an_inbox_it_locks() {
    let (db, server, laptop, globex) = acme_and_globex_in_contact().await;
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut gus = Agent::hello(&server.url, &globex, "gus").await.unwrap();
    gus.send(&["acme/laptop/alice"], "unseen").await.unwrap();

    // A send of alice's in progress: its message's foreign key holds a key share of her row.
    let sql = db.sql().await;
    let alice_id: i64 =
        sql.query_one("select id from endpoint_addresses where address = $1", &[&alice.address]).await.unwrap().get(0);
    sql.batch_execute("begin").await.unwrap();
    sql.execute("select 1 from endpoints where id = $1 for key share", &[&alice_id]).await.unwrap();

    let url = db.url.clone();
    let dropping =
        tokio::task::spawn_blocking(move || relay_tests::server::admin(&url, &["contact", "drop", "acme", "globex"]));
    let out = tokio::time::timeout(WAIT, dropping).await.expect("the drop does not wait for the send").unwrap();
    assert!(out.status.success(), "contact drop: {}", String::from_utf8_lossy(&out.stderr));
    sql.batch_execute("rollback").await.unwrap();
    let inbox = alice.inbox(0, false).await.unwrap();
    assert!(inbox.messages.is_empty(), "what alice had not seen was withdrawn: {:?}", inbox.messages);
}

/// A send may deliver between the two accounts into an inbox the drop has not locked while the
/// drop waits for those it has. Withdrawing that delivery then waits for its inbox, held by a next
/// send that waits for the contact the drop holds: Postgres ends the drop, which is made again and
/// withdraws what both inboxes hold.
#[tokio::test]
async fn a_contact_drop_ended_by_a_deadlock_with_a_send_is_made_again() {
    let (db, server, laptop, globex) = acme_and_globex_in_contact().await;
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut carol = Agent::hello(&server.url, &laptop, "carol").await.unwrap();
    let mut gus = Agent::hello(&server.url, &globex, "gus").await.unwrap();
    gus.send(&["acme/laptop/alice"], "unseen").await.unwrap();

    let (writer, next_send, watch) = (db.sql().await, db.sql().await, db.sql().await);
    let id_of = |address: String| {
        let watch = &watch;
        async move {
            let row = watch.query_one("select id from endpoint_addresses where address = $1", &[&address]).await;
            row.unwrap().get::<_, i64>(0)
        }
    };
    let (alice_id, carol_id) = (id_of(alice.address.clone()).await, id_of(carol.address.clone()).await);
    let drop_waits_on = |statement: &'static str| {
        let watch = &watch;
        async move {
            let waiting: i64 = watch
                .query_one(
                    "select count(*) from pg_stat_activity
                     where datname = current_database() and wait_event_type = 'Lock' and starts_with(query, $1)",
                    &[&statement],
                )
                .await
                .unwrap()
                .get(0);
            (waiting > 0).then_some(())
        }
    };

    // A writer holds alice's inbox: the drop, having chosen the inboxes it locks, waits for it.
    writer.batch_execute("begin").await.unwrap();
    writer.execute("select 1 from endpoints where id = $1 for no key update", &[&alice_id]).await.unwrap();
    let url = db.url.clone();
    let dropping =
        tokio::task::spawn_blocking(move || relay_tests::server::admin(&url, &["contact", "drop", "acme", "globex"]));
    eventually(WAIT, "the drop waiting for alice's inbox", || drop_waits_on("select 1 from endpoints e")).await;

    // Meanwhile gus reaches carol, whose inbox the drop did not choose, and a next send holds it.
    gus.send(&["acme/laptop/carol"], "unseen too").await.unwrap();
    next_send.batch_execute("begin").await.unwrap();
    next_send.execute("select 1 from endpoints where id = $1 for no key update", &[&carol_id]).await.unwrap();
    writer.batch_execute("rollback").await.unwrap();
    eventually(WAIT, "the drop withdrawing from carol's inbox", || drop_waits_on("with withdrawn as")).await;

    // The next send reaches for the contact the drop holds: one of the two is ended.
    let contact = next_send.execute(
        "select 1 from contacts k join accounts a on a.id in (k.account_a, k.account_b)
         where a.name = 'globex' for key share of k",
        &[],
    );
    let _ = tokio::time::timeout(WAIT, contact).await.expect("the deadlock is broken");
    next_send.batch_execute("rollback").await.unwrap();

    let out = tokio::time::timeout(WAIT, dropping).await.expect("the drop finishes").unwrap();
    assert!(out.status.success(), "contact drop: {}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("2 undelivered messages withdrawn"), "both withdrawn: {said}");
    for agent in [&mut alice, &mut carol] {
        let inbox = agent.inbox(0, false).await.unwrap();
        assert!(inbox.messages.is_empty(), "{} holds what the drop withdrew: {:?}", agent.address, inbox.messages);
    }
}

#[tokio::test]
async fn a_session_ended_or_revoked_anywhere_is_refused_on_every_replica() {
    let db = TestDb::new().await;
    let one = Server::start(&db).await;
    let two = Server::start(&db).await;
    let laptop = one.machine("acme", "laptop");
    let ci = one.machine("acme", "ci");

    // Sessions made on one replica, used on the other until it knows them by heart.
    let leaving = Agent::hello(&one.url, &laptop, "leaving").await.unwrap();
    let revoked = Agent::hello(&one.url, &ci, "revoked").await.unwrap();
    let on_two = |agent: &Agent| {
        relay_tests::client::client(
            tonic::transport::Channel::from_shared(two.url.clone()).unwrap().connect_lazy(),
            &agent.session_token,
        )
    };
    let (mut leaving_two, mut revoked_two) = (on_two(&leaving), on_two(&revoked));
    for _ in 0..2 {
        leaving_two.who_am_i(WhoAmIRequest {}).await.unwrap();
        revoked_two.who_am_i(WhoAmIRequest {}).await.unwrap();
    }

    leaving.rpc.clone().goodbye(GoodbyeRequest {}).await.unwrap();
    eventually(Duration::from_secs(5), "the ended session refused on the other replica", || {
        let mut rpc = leaving_two.clone();
        async move { (rpc.who_am_i(WhoAmIRequest {}).await.err()?.code() == Code::Unauthenticated).then_some(()) }
    })
    .await;

    one.admin_ok(&["machine", "revoke", "acme/ci"]);
    eventually(Duration::from_secs(5), "the revoked machine's session refused on the other replica", || {
        let mut rpc = revoked_two.clone();
        async move { (rpc.who_am_i(WhoAmIRequest {}).await.err()?.code() == Code::Unauthenticated).then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn a_send_allowed_from_memory_is_refused_once_scope_changes_anywhere() {
    let (db, one, laptop, globex) = acme_and_globex_in_contact().await;
    let two = Server::start(&db).await;
    let mut sender = Agent::hello(&two.url, &laptop, "sender").await.unwrap();
    let mut guarded = Agent::hello(&one.url, &laptop, "guarded").await.unwrap();
    let _outside = Agent::hello(&one.url, &globex, "outside").await.unwrap();

    // Sent again and again: after the first, the second replica allows these from memory.
    for i in 0..3 {
        sender.send(&["laptop/guarded"], &format!("hi {i}")).await.unwrap();
        sender.send(&["globex/box/outside"], &format!("hi {i}")).await.unwrap();
    }

    // A rule set through the first replica is obeyed by the second.
    guarded
        .rpc
        .set_rules(SetRulesRequest {
            rules_in: Some(Selectors { selectors: vec!["handle:nobody".into()] }),
            ..Default::default()
        })
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "a send the new rule forbids refused on the other replica", || {
        let mut rpc = sender.rpc.clone();
        async move {
            let request = SendRequest { to: vec!["laptop/guarded".into()], body: "again".into(), ..Default::default() };
            (rpc.send(request).await.err()?.code() == Code::PermissionDenied).then_some(())
        }
    })
    .await;

    // A contact dropped by an operator's command is obeyed too: the other account is out of reach.
    one.admin_ok(&["contact", "drop", "acme", "globex"]);
    eventually(Duration::from_secs(5), "a send to a dropped contact refused on the other replica", || {
        let mut rpc = sender.rpc.clone();
        async move {
            let request =
                SendRequest { to: vec!["globex/box/outside".into()], body: "again".into(), ..Default::default() };
            (rpc.send(request).await.err()?.code() == Code::NotFound).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_look_at_an_unchanged_inbox_answers_as_before_and_a_change_made_anywhere_shows_at_once() {
    let (db, one, laptop, globex) = acme_and_globex_in_contact().await;
    let two = Server::start(&db).await;
    let bob = Agent::hello(&one.url, &laptop, "bob").await.unwrap();
    let mut alice = Agent::hello(&two.url, &laptop, "alice").await.unwrap();
    let mut gina = Agent::hello(&two.url, &globex, "gina").await.unwrap();
    // Bob's session, through the other replica.
    let mut bob_on_two = relay_tests::client::client(relay_tests::client::channel(&two.url).await, &bob.session_token);
    // A look of one message on the first replica, which holds its last page.
    let look = || {
        let mut rpc = bob.rpc.clone();
        async move {
            let page = rpc.inbox(InboxRequest { wait_s: 0, ack: false, limit: 1 }).await.unwrap().into_inner();
            (page.messages.iter().map(|m| m.body.clone()).collect::<Vec<_>>(), page.remaining)
        }
    };

    alice.send(&["laptop/bob"], "a1").await.unwrap();
    gina.send(&["acme/laptop/bob"], "g1").await.unwrap();
    assert_eq!(look().await, (vec!["a1".to_owned()], 2));
    assert_eq!(look().await, (vec!["a1".to_owned()], 2), "unchanged, the same answer");

    // Gina's message, beyond the page and not yet seen, is withdrawn as the contact is dropped.
    two.admin_ok(&["contact", "drop", "acme", "globex"]);
    assert_eq!(look().await, (vec!["a1".to_owned()], 1));

    // Read through the other replica: gone from the next look here.
    let seq =
        bob.rpc.clone().inbox(InboxRequest { wait_s: 0, ack: false, limit: 1 }).await.unwrap().into_inner().messages[0]
            .seq;
    let read = ConfirmRequest { seqs: vec![seq], state: DeliveryState::Read as i32 };
    assert_eq!(bob_on_two.confirm(read).await.unwrap().into_inner().updated, 1);
    assert_eq!(look().await, (Vec::<String>::new(), 0));

    // A new delivery, written by the other replica.
    alice.send(&["laptop/bob"], "a2").await.unwrap();
    assert_eq!(look().await, (vec!["a2".to_owned()], 1));
    alice.send(&["laptop/bob"], "a3").await.unwrap();
    assert_eq!(look().await, (vec!["a2".to_owned()], 2), "the page is the same, what is left is not");

    // A wider look shows a3 last; a look of one again shows a2 last, which `reply last` answers.
    let wider = bob.rpc.clone().inbox(InboxRequest { wait_s: 0, ack: false, limit: 2 }).await.unwrap().into_inner();
    assert_eq!(wider.messages.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["a2", "a3"]);
    assert_eq!(look().await, (vec!["a2".to_owned()], 2));
    let reply = ReplyRequest { id: "last".into(), body: "re".into(), client_id: String::new() };
    let replied = bob.rpc.clone().reply(reply).await.unwrap().into_inner();
    assert_eq!(replied.reply_to, wider.messages[0].id, "the reply answers what the last look showed");
}

#[tokio::test]
async fn a_stream_opened_on_another_replica_ends_the_first_and_carries_the_mail() {
    let db = TestDb::new().await;
    let one = Server::start(&db).await;
    let two = Server::start(&db).await;
    let laptop = one.machine("acme", "laptop");
    let ci = one.machine("acme", "ci");
    let mut alice = Agent::hello(&one.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&one.url, &ci, "bob").await.unwrap();
    let mut first = bob.subscribe(0).await;
    first.message().await.unwrap().expect("the first heartbeat");

    let mut bob_two = relay_tests::client::client(relay_tests::client::channel(&two.url).await, &bob.session_token);
    let mut second = bob_two.subscribe(SubscribeRequest { after_seq: 0 }).await.unwrap().into_inner();
    second.message().await.unwrap().expect("the first heartbeat");
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match first.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("the older stream ends");
    assert_eq!(ended.map(|s| s.code()), Some(Code::Unauthenticated));

    // Sent through the first replica, pushed by the second.
    alice.send(&["ci/bob"], "found you").await.unwrap();
    assert_eq!(next_message(&mut second, WAIT).await.body, "found you");
}

#[tokio::test]
async fn a_crashed_replicas_streams_go_offline_and_free_their_handles() {
    let db = TestDb::new().await;
    let mut one = Server::start(&db).await;
    let two = Server::start(&db).await;
    let laptop = one.machine("acme", "laptop");
    let mut watcher = Agent::hello(&two.url, &laptop, "watcher").await.unwrap();
    let mut bob = Agent::hello(&one.url, &laptop, "bob").await.unwrap();
    let mut stream = bob.subscribe(0).await;
    stream.message().await.unwrap().expect("the first heartbeat");
    let online = |watcher: &Agent| {
        let mut rpc = watcher.rpc.clone();
        async move {
            let list = rpc.list(ListRequest { all: true, contacts: false }).await.unwrap().into_inner();
            list.endpoints.iter().find(|e| e.address == "acme/laptop/bob").map(|e| e.online)
        }
    };
    assert_eq!(online(&watcher).await, Some(true));
    // The other replica still shows bob online and keeps the handle taken.
    let taken = Agent::hello(&two.url, &laptop, "bob").await.err().expect("bob's handle is held");
    assert_eq!(taken.code(), Code::AlreadyExists);

    one.crash();
    eventually(Duration::from_secs(25), "bob offline once the crashed replica's liveness lapsed", || {
        let watcher = &watcher;
        async move { (online(watcher).await == Some(false)).then_some(()) }
    })
    .await;
    let mut again = Agent::hello(&two.url, &laptop, "bob").await.expect("the handle is free again");
    assert_eq!(again.address, "acme/laptop/bob");
    watcher.send(&["bob"], "welcome back").await.unwrap();
    assert_eq!(again.inbox(0, false).await.unwrap().messages.len(), 1);
}

/// Presence is the replica's to keep: an idle push stream writes nothing. Over a full heartbeat
/// period of every stream (when a stream keeping its own presence would have written it), no
/// endpoint's or machine's row is written, while the replica renews its own liveness and every
/// agent still shows online.
#[tokio::test]
async fn idle_push_streams_write_nothing_while_their_replica_keeps_them_online() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let ci = server.machine("acme", "ci");
    let mut idle = agents(&server.url, &ci, "idle", 5).await;
    let mut streams = Vec::new();
    for agent in &mut idle {
        let mut stream = agent.subscribe(0).await;
        caught_up(&mut stream, WAIT).await;
        streams.push(stream);
    }
    let sql = db.sql().await;
    let rows = || async {
        sql.query(
            "select 'endpoint ' || id || ' ' || xmin::text from endpoints
             union all select 'machine ' || id || ' ' || xmin::text from machines order by 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
    };
    let alive =
        || async { sql.query_one("select max(alive_until) from replicas", &[]).await.unwrap().get::<_, SystemTime>(0) };
    let (before, renewed_from) = (rows().await, alive().await);

    // Each stream's next heartbeat comes a full period after its opening ones.
    for stream in &mut streams {
        next_heartbeat(stream, HEARTBEAT_EVERY * 3).await;
    }
    eventually(WAIT, "the replica to renew its own liveness", || async {
        (alive().await > renewed_from).then_some(())
    })
    .await;

    assert_eq!(rows().await, before, "an idle stream rewrites no endpoint or machine");
    let online: bool = sql
        .query_one(
            "select bool_and(relay_endpoint_online(e)) from endpoints e join machines m on m.id = e.machine_id
             where m.name = 'ci'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(online, "every idle agent is online on its replica's liveness");
}
