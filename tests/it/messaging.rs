//! Messaging through the real server: delivery, order, idempotency, replies, limits.

use std::time::Duration;

use ::relay_server::domain::ids::SHORT_ID_LEN;
use relay_proto::v1::*;
use relay_tests::client::{Agent, caught_up, next_message};
use relay_tests::eventually;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use relay_tests::short_id;
use tonic::Code;

const PUSH_WAIT: Duration = Duration::from_secs(10);

/// One account with two machines, and an agent on each.
async fn two_machines() -> (TestDb, Server, Agent, Agent) {
    let (db, server, alice, bob, _ci) = two_machines_with_token().await;
    (db, server, alice, bob)
}

/// [`two_machines`], also returning the machine token of `acme/ci`.
async fn two_machines_with_token() -> (TestDb, Server, Agent, Agent, String) {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    let alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    (db, server, alice, bob, ci)
}

/// Waits until the server has seen `address`'s push stream end: nothing is pushed to it after.
async fn until_stream_closed(db: &TestDb, address: &str) {
    let sql = db.sql().await;
    eventually(PUSH_WAIT, "the push stream to close", || async {
        let open: bool = sql
            .query_one(
                "select e.stream_gen > e.stream_closed_gen
                 from endpoints e join endpoint_addresses ea on ea.id = e.id where ea.address = $1",
                &[&address],
            )
            .await
            .unwrap()
            .get(0);
        (!open).then_some(())
    })
    .await;
}

fn states(recipients: &[RecipientState]) -> Vec<(String, DeliveryState)> {
    recipients.iter().map(|r| (r.address.clone(), r.state())).collect()
}

#[tokio::test]
async fn two_machines_of_one_account_exchange_messages() {
    let (_db, _server, mut alice, mut bob) = two_machines().await;
    assert_eq!(alice.address, "acme/laptop/alice");

    let mut bob_stream = bob.subscribe(0).await;
    let sent = alice.send(&["ci/bob"], "can you review the parser?").await.unwrap();
    assert_eq!(states(&sent.recipients), vec![("acme/ci/bob".to_owned(), DeliveryState::Queued)]);
    assert_eq!(sent.thread, sent.id, "a first message starts its own thread");

    let pushed = next_message(&mut bob_stream, PUSH_WAIT).await;
    assert_eq!(pushed.id, sent.id);
    assert_eq!(pushed.from, "acme/laptop/alice", "the sender comes from the session");
    assert_eq!(pushed.body, "can you review the parser?");
    assert_eq!(pushed.seq, 1);

    // The sender sees the delivery progress per recipient. The stream marks a message pushed as it
    // hands it to the connection, so the mark may land just after the client has it.
    let rpc = alice.rpc.clone();
    eventually(PUSH_WAIT, "the delivery to be marked pushed", || {
        let (mut rpc, id) = (rpc.clone(), sent.id.clone());
        async move {
            let tracked = rpc.track(TrackRequest { id }).await.ok()?.into_inner();
            (tracked.recipients[0].state() == DeliveryState::Pushed).then_some(())
        }
    })
    .await;
    bob.rpc.confirm(ConfirmRequest { seqs: vec![pushed.seq], state: DeliveryState::Surfaced as i32 }).await.unwrap();
    let tracked = alice.rpc.track(TrackRequest { id: short_id(&sent.id).to_owned() }).await.unwrap().into_inner();
    assert_eq!(tracked.recipients[0].state(), DeliveryState::Surfaced);

    // Reply by short id: back to the sender, in the same thread; the original becomes read.
    let reply = bob
        .rpc
        .reply(ReplyRequest { id: short_id(&pushed.id).to_owned(), body: "on it".into(), client_id: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.thread, sent.thread);
    assert_eq!(reply.reply_to, sent.id);
    assert_eq!(states(&reply.recipients), vec![("acme/laptop/alice".to_owned(), DeliveryState::Queued)]);
    let tracked = alice.rpc.track(TrackRequest { id: sent.id.clone() }).await.unwrap().into_inner();
    assert_eq!(tracked.recipients[0].state(), DeliveryState::Read);

    let inbox = alice.inbox(5, true).await.unwrap();
    assert_eq!(inbox.messages.len(), 1);
    let got = &inbox.messages[0];
    assert_eq!((got.from.as_str(), got.body.as_str(), got.kind()), ("acme/ci/bob", "on it", MessageKind::Reply));
    assert_eq!(got.reply_to, sent.id);
    assert_eq!(inbox.remaining, 0);
    assert_eq!(alice.inbox(0, true).await.unwrap().messages.len(), 0, "acknowledged messages are not shown again");
}

/// A short id is the clock part of a message id: two replicas make the same one only within one
/// microsecond. When two messages an agent received share it, a reference by it names neither and
/// the refusal shows both whole ids; each whole id still names its own message. The collision is
/// made in the database, since two replicas cannot be made to pick the same microsecond.
#[tokio::test]
async fn two_messages_sharing_a_short_id_are_told_apart_by_their_whole_ids() {
    let db = TestDb::new().await;
    let (one, two) = tokio::join!(Server::start(&db), Server::start(&db));
    let laptop = one.machine("acme", "laptop");
    let desk = one.machine("acme", "desk");
    let ci = one.machine("acme", "ci");
    let mut alice = Agent::hello(&one.url, &laptop, "alice").await.unwrap();
    let mut carol = Agent::hello(&two.url, &desk, "carol").await.unwrap();
    let mut bob = Agent::hello(&one.url, &ci, "bob").await.unwrap();

    let first = alice.send(&["ci/bob"], "from alice, through one replica").await.unwrap();
    let second = carol.send(&["ci/bob"], "from carol, through the other").await.unwrap();
    let short = short_id(&first.id);
    let collided = format!("{short}{}", &second.id[SHORT_ID_LEN..]);
    let sql = db.sql().await;
    assert_eq!(second.thread, second.id, "it starts its own thread, which takes its id");
    for statement in [
        "update messages set id = $1, thread = $1 where id = $2",
        "update deliveries set message_id = $1 where message_id = $2",
    ] {
        assert_eq!(sql.execute(statement, &[&collided, &second.id]).await.unwrap(), 1, "{statement}");
    }

    let refused = bob
        .rpc
        .reply(ReplyRequest { id: short.to_owned(), body: "which one?".into(), client_id: String::new() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains(&first.id) && refused.message().contains(&collided),
        "the refusal shows both whole ids, the short ones being alike: {}",
        refused.message()
    );
    assert_eq!(alice.inbox(0, false).await.unwrap().messages.len(), 0, "nothing was sent");
    assert_eq!(carol.inbox(0, false).await.unwrap().messages.len(), 0, "nothing was sent");

    // Each whole id names its own message: the reply goes to that one's sender.
    for (id, sender) in [(collided.as_str(), &mut carol), (first.id.as_str(), &mut alice)] {
        let reply = bob
            .rpc
            .reply(ReplyRequest { id: id.to_owned(), body: format!("re {id}"), client_id: String::new() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.reply_to, id);
        assert_eq!(states(&reply.recipients), vec![(sender.address.clone(), DeliveryState::Queued)]);
        let got = sender.inbox(5, true).await.unwrap().messages;
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].body.as_str(), got[0].reply_to.as_str()), (format!("re {id}").as_str(), id));
    }
    // A sender names what it sent among its own sends only: there the short id is unique.
    let tracked = alice.rpc.track(TrackRequest { id: short.to_owned() }).await.unwrap().into_inner();
    assert_eq!(tracked.id, first.id);
}

#[tokio::test]
async fn offline_recipient_gets_everything_in_order_on_reconnect() {
    let (db, server, mut alice, mut bob, ci) = two_machines_with_token().await;
    let ci2 = server.machine("acme", "ci2");
    // Bob connects once, then his stream goes away.
    let mut stream = bob.subscribe(0).await;
    caught_up(&mut stream, PUSH_WAIT).await;
    drop(stream);
    until_stream_closed(&db, &bob.address).await;

    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(alice.send(&["ci/bob"], &format!("message {i}")).await.unwrap().id);
    }
    let tracked = alice.rpc.track(TrackRequest { id: ids[4].clone() }).await.unwrap().into_inner();
    assert_eq!(tracked.recipients[0].state(), DeliveryState::Queued, "nobody was there to push to");

    // Bob's bridge comes back and resumes the same endpoint with its session token.
    let again = HelloRequest {
        handle: "bob".into(),
        harness: "codex".into(),
        resume: bob.session_token.clone(),
        ..Default::default()
    };
    let resumed = Agent::hello_with(&server.url, &ci, again.clone()).await.unwrap();
    assert_eq!(resumed.address, "acme/ci/bob");
    assert_eq!(resumed.session_token, bob.session_token);
    // A session token resumes nothing on another machine: there it is a fresh claim.
    let elsewhere = Agent::hello_with(&server.url, &ci2, again).await.unwrap();
    assert_eq!(elsewhere.address, "acme/ci2/bob");
    assert_ne!(elsewhere.session_token, bob.session_token);
    // Without a handle, a free one is picked.
    let picked = Agent::hello_with(&server.url, &ci, HelloRequest::default()).await.unwrap();
    assert_eq!(picked.address, "acme/ci/other-1");

    let mut stream = bob.subscribe(0).await;
    for (i, id) in ids.iter().enumerate() {
        let m = next_message(&mut stream, PUSH_WAIT).await;
        assert_eq!((&m.id, m.seq, m.body.clone()), (id, i as u64 + 1, format!("message {i}")));
    }
    // A bridge that already holds seq 3 asks only for what is above it.
    drop(stream);
    let mut stream = bob.subscribe(3).await;
    assert_eq!(next_message(&mut stream, PUSH_WAIT).await.seq, 4);
}

#[tokio::test]
async fn a_retried_send_makes_one_copy() {
    let (_db, _server, mut alice, mut bob) = two_machines().await;
    let request = SendRequest {
        to: vec!["ci/bob".into()],
        body: "deploy when green".into(),
        client_id: "retry-1".into(),
        ..Default::default()
    };
    let first = alice.rpc.send(request.clone()).await.unwrap().into_inner();
    let second = alice.rpc.send(request.clone()).await.unwrap().into_inner();
    assert!(!first.duplicate && second.duplicate);
    assert_eq!(first.id, second.id);
    assert_eq!(first.thread, second.thread);

    // Concurrent retries also collapse into the first.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut rpc = alice.rpc.clone();
        let req = SendRequest { client_id: "retry-2".into(), ..request.clone() };
        tasks.push(tokio::spawn(async move { rpc.send(req).await.unwrap().into_inner().id }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every concurrent retry returns the same message");

    let inbox = bob.inbox(0, true).await.unwrap();
    let bodies: Vec<_> = inbox.messages.iter().map(|m| (m.seq, m.id.clone())).collect();
    assert_eq!(bodies, vec![(1, first.id.clone()), (2, ids[0].clone())], "one copy each, gapless seqs");
}

#[tokio::test]
async fn ask_gets_its_reply() {
    let (_db, _server, mut alice, mut bob) = two_machines().await;
    let ask = alice
        .rpc
        .send(SendRequest {
            to: vec!["acme/ci/bob".into()],
            body: "which port does staging use?".into(),
            kind: MessageKind::Ask as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();

    let mut waiting = alice.rpc.clone();
    let ask_id = ask.id.clone();
    let waiter = tokio::spawn(async move { waiting.ask_wait(AskWaitRequest { id: ask_id, wait_s: 20 }).await });

    let inbox = bob.inbox(5, false).await.unwrap();
    assert_eq!(inbox.messages[0].kind(), MessageKind::Ask);
    bob.rpc.reply(ReplyRequest { id: "last".into(), body: "8443".into(), client_id: String::new() }).await.unwrap();

    let answer = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap().unwrap().into_inner();
    assert_eq!(answer.id, ask.id);
    assert_eq!(answer.replies.len(), 1);
    assert_eq!((answer.replies[0].body.as_str(), answer.replies[0].from.as_str()), ("8443", "acme/ci/bob"));
    assert_eq!(answer.recipients[0].state(), DeliveryState::Read, "replying marks the ask read");
    assert!(alice.inbox(0, true).await.unwrap().messages.is_empty(), "a reply collected by ask-wait is read");

    // Without a reply, ask-wait returns empty after its wait.
    let quiet = alice.send(&["ci/bob"], "anyone?").await.unwrap();
    let none = alice.rpc.ask_wait(AskWaitRequest { id: quiet.id, wait_s: 0 }).await.unwrap().into_inner();
    assert!(none.replies.is_empty());
}

#[tokio::test]
async fn inbox_long_poll_wakes_on_a_new_message() {
    let (_db, _server, mut alice, bob) = two_machines().await;
    let mut rpc = bob.rpc.clone();
    let mut poll = tokio::spawn(async move { rpc.inbox(InboxRequest { wait_s: 30, ack: true, limit: 0 }).await });
    // With nothing unread the poll waits instead of answering empty; the send is what ends it.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut poll).await.is_err(),
        "an empty inbox with wait_s answers only when something arrives"
    );
    alice.send(&["ci/bob"], "ping").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), poll).await.expect("long poll woke").unwrap().unwrap();
    assert_eq!(got.into_inner().messages[0].body, "ping");
}

#[tokio::test]
async fn bad_requests_are_refused_and_change_nothing() {
    let (_db, _server, mut alice, mut bob) = two_machines().await;

    let unknown = alice.send(&["ci/bob", "ci/nobody"], "hi").await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("acme/ci/nobody"), "{}", unknown.message());
    assert!(bob.inbox(0, true).await.unwrap().messages.is_empty(), "a send with one bad recipient delivers to nobody");

    let other_account = alice.send(&["globex/ci/bob"], "hi").await.unwrap_err();
    assert_eq!(other_account.code(), Code::NotFound);

    let malformed = alice.send(&["Not An Address"], "hi").await.unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);

    let oversized = alice.send(&["ci/bob"], &"x".repeat(64 * 1024 + 1)).await.unwrap_err();
    assert_eq!(oversized.code(), Code::InvalidArgument);
    assert!(oversized.message().contains("limit"), "{}", oversized.message());

    let too_many: Vec<String> = (0..33).map(|i| format!("h{i}")).collect();
    let refs: Vec<&str> = too_many.iter().map(String::as_str).collect();
    assert_eq!(alice.send(&refs, "hi").await.unwrap_err().code(), Code::InvalidArgument);

    assert_eq!(alice.send(&["laptop/alice"], "me").await.unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(alice.inbox(301, true).await.unwrap_err().code(), Code::InvalidArgument);
    let bad_status =
        alice.rpc.update_profile(UpdateProfileRequest { status: Some("asleep".into()), ..Default::default() });
    assert_eq!(bad_status.await.unwrap_err().code(), Code::InvalidArgument);
    let missing = alice.rpc.reply(ReplyRequest { id: "zzzzzzzz".into(), body: "x".into(), client_id: String::new() });
    assert_eq!(missing.await.unwrap_err().code(), Code::NotFound);

    assert!(bob.inbox(0, true).await.unwrap().messages.is_empty());
}

#[tokio::test]
async fn profiles_presence_and_handles() {
    let (_db, server, mut alice, mut bob) = two_machines().await;
    let laptop2 = server.admin_ok(&["machine", "add", "acme/laptop2"]);

    let taken = Agent::hello(&server.url, &laptop2, "carol").await.unwrap();
    let clash = Agent::hello(&server.url, &laptop2, "carol").await.err().expect("a live handle is taken");
    assert_eq!(clash.code(), Code::AlreadyExists);
    let bad = Agent::hello(&server.url, &laptop2, "Carol!").await.err().unwrap();
    assert_eq!(bad.code(), Code::InvalidArgument);

    let me = alice
        .rpc
        .update_profile(UpdateProfileRequest {
            status: Some("busy".into()),
            note: Some("refactoring the store".into()),
            now: Some("running tests".into()),
            title: Some("store refactor".into()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((me.status.as_str(), me.now.as_str(), me.title.as_str()), ("busy", "running tests", "store refactor"));

    let listed = bob.rpc.list(ListRequest::default()).await.unwrap().into_inner().endpoints;
    let names: Vec<_> = listed.iter().map(|e| e.address.as_str()).collect();
    assert_eq!(names, ["acme/ci/bob", "acme/laptop/alice", "acme/laptop2/carol"]);
    assert_eq!(listed[1].note, "refactoring the store");

    // Ending a session frees its handle and takes it off the default list.
    taken.rpc.clone().goodbye(GoodbyeRequest {}).await.unwrap();
    let after = bob.rpc.list(ListRequest::default()).await.unwrap().into_inner().endpoints;
    assert_eq!(after.len(), 2);
    let all = bob.rpc.list(ListRequest { all: true, contacts: false }).await.unwrap().into_inner().endpoints;
    assert!(all.iter().any(|e| e.address == "acme/laptop2/carol" && e.ended));
    // Mail for an ended session waits for the handle's return; the sender hears that it is away.
    let ended = bob.send(&["laptop2/carol"], "hi").await.unwrap();
    assert_eq!(ended.recipients[0].state(), DeliveryState::Queued);
    assert!(ended.recipients[0].reason.starts_with("offline since "), "{:?}", ended.recipients[0]);
    assert_eq!(taken.rpc.clone().who_am_i(WhoAmIRequest {}).await.unwrap_err().code(), Code::Unauthenticated);
    let mut carol = Agent::hello(&server.url, &laptop2, "carol").await.expect("an ended handle can be claimed again");
    assert_eq!(carol.inbox(0, true).await.unwrap().messages[0].body, "hi");

    let whoami = bob.rpc.who_am_i(WhoAmIRequest {}).await.unwrap().into_inner();
    assert_eq!(whoami.endpoint.unwrap().address, "acme/ci/bob");
}

#[tokio::test]
async fn contacts_open_other_accounts() {
    let (_db, server, mut alice, _bob) = two_machines().await;
    let globex = server.machine("globex", "box");
    let mut gina = Agent::hello(&server.url, &globex, "gina").await.unwrap();

    assert_eq!(alice.send(&["globex/box/gina"], "hello").await.unwrap_err().code(), Code::NotFound);
    let hidden = alice.rpc.list(ListRequest { all: true, contacts: true }).await.unwrap().into_inner();
    assert!(hidden.endpoints.is_empty(), "no contact, nothing listed");

    server.admin_ok(&["contact", "add", "acme", "globex"]);
    alice.send(&["globex/box/gina"], "hello").await.unwrap();
    let got = gina.inbox(5, true).await.unwrap();
    assert_eq!(got.messages[0].from, "acme/laptop/alice");
    let listed = alice.rpc.list(ListRequest { all: false, contacts: true }).await.unwrap().into_inner();
    assert_eq!(listed.endpoints.iter().map(|e| e.address.as_str()).collect::<Vec<_>>(), ["globex/box/gina"]);
}

#[tokio::test]
async fn a_picked_name_never_takes_over_an_offline_agent() {
    let (_db, server, _alice, _bob, ci) = two_machines_with_token().await;
    let mut first = Agent::hello_with(&server.url, &ci, HelloRequest::default()).await.unwrap();
    assert_eq!(first.address, "acme/ci/other-1");
    first.rpc.set_peek(SetPeekRequest { on: true }).await.unwrap();
    drop(first.subscribe(0).await);
    // Once it is offline (the reconnect grace has passed), a new session without a name gets its own.
    relay_tests::eventually(Duration::from_secs(20), "other-1 to go offline", || {
        let mut rpc = first.rpc.clone();
        async move {
            let listed = rpc.list(ListRequest::default()).await.ok()?.into_inner().endpoints;
            (!listed.iter().any(|e| e.address == "acme/ci/other-1")).then_some(())
        }
    })
    .await;
    let second = Agent::hello_with(&server.url, &ci, HelloRequest::default()).await.unwrap();
    assert_eq!(second.address, "acme/ci/other-2", "the offline agent keeps its name and inbox");

    // Claiming it by name is a restart of that agent: it gets the inbox, but not the old session's peek.
    let mut again =
        Agent::hello_with(&server.url, &ci, HelloRequest { handle: "other-1".into(), ..Default::default() })
            .await
            .unwrap();
    let me = again.rpc.who_am_i(WhoAmIRequest {}).await.unwrap().into_inner().endpoint.unwrap();
    assert_eq!(me.address, "acme/ci/other-1");
    assert!(!me.peek, "peeking is one session's choice");
    assert_eq!(first.rpc.who_am_i(WhoAmIRequest {}).await.unwrap_err().code(), Code::Unauthenticated);
}

/// Where the writer functions are called directly, as the server's batched writer calls them:
/// alice (acme/laptop) has a question from bob (acme/ci) to answer and has used the client id "once"
/// before; carol (acme/ci) holds `carol_unread` messages; the account "other" is no contact of acme.
struct WriterScene {
    sql: tokio_postgres::Client,
    question: String,
    alice: i64,
    bob: i64,
    carol: i64,
    acme: i64,
    other: i64,
    _server: Server,
    db: TestDb,
}

impl WriterScene {
    async fn new(carol_unread: usize) -> Self {
        let db = TestDb::new().await;
        let server = Server::start(&db).await;
        let laptop = server.machine("acme", "laptop");
        let ci = server.machine("acme", "ci");
        server.machine("other", "box");
        let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
        let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
        let carol = Agent::hello(&server.url, &ci, "carol").await.unwrap();
        for n in 0..carol_unread {
            alice.send(&["ci/carol"], &format!("message {n}")).await.unwrap();
        }
        let question = bob.send(&["laptop/alice"], "ready?").await.unwrap().id;
        let earlier = SendRequest {
            to: vec!["ci/bob".into()],
            body: "earlier".into(),
            client_id: "once".into(),
            ..Default::default()
        };
        alice.rpc.send(earlier).await.unwrap();

        let sql = db.sql().await;
        let one = async |query: &str, param: &str| -> i64 { sql.query_one(query, &[&param]).await.unwrap().get(0) };
        let endpoint = "select id from endpoint_addresses where address = $1";
        let account = "select id from accounts where name = $1";
        Self {
            alice: one(endpoint, &alice.address).await,
            bob: one(endpoint, &bob.address).await,
            carol: one(endpoint, &carol.address).await,
            acme: one(account, "acme").await,
            other: one(account, "other").await,
            sql,
            question,
            _server: server,
            db,
        }
    }

    /// One send of alice's as a `relay_outgoing`: its id (also its thread and body), client id,
    /// recipients, the accounts whose contact it relies on, and the message it replies to.
    fn outgoing(
        &self,
        id: &str,
        client_id: Option<&str>,
        to: &[i64],
        contacts: &[i64],
        reply_to: Option<&str>,
    ) -> String {
        let list = |ids: &[i64]| ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let quoted = |text: Option<&str>| text.map_or("null".into(), |t| format!("'{t}'"));
        let read_by = if reply_to.is_some() { self.alice.to_string() } else { "null".into() };
        format!(
            "row('{id}', {}, {}, {}, 't-{id}', 1, 'body of {id}', {}, false, false, array[{}]::bigint[], \
             array[{}]::bigint[], {read_by})::relay_outgoing",
            self.alice,
            self.acme,
            quoted(client_id),
            quoted(reply_to),
            list(to),
            list(contacts),
        )
    }

    async fn head(&self, endpoint: i64) -> i64 {
        self.sql.query_one("select head_seq from endpoints where id = $1", &[&endpoint]).await.unwrap().get(0)
    }

    /// The (seq, message id) of `endpoint`'s deliveries above `after`.
    async fn deliveries_after(&self, endpoint: i64, after: i64) -> Vec<(i64, String)> {
        let rows = self
            .sql
            .query(
                "select seq, message_id from deliveries where recipient_id = $1 and seq > $2 order by seq",
                &[&endpoint, &after],
            )
            .await
            .unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }

    async fn assert_left_nothing(&self, ids: &[&str]) {
        for id in ids {
            let n: i64 = self.sql.query_one("select count(*) from messages where id = $1", &[id]).await.unwrap().get(0);
            assert_eq!(n, 0, "{id} left nothing behind");
        }
    }

    async fn assert_question_read(&self) {
        let state: i16 = self
            .sql
            .query_one(
                "select state from deliveries where message_id = $1 and recipient_id = $2",
                &[&self.question, &self.alice],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(state, 4, "the reply marked the question read");
    }

    async fn assert_counters_agree(&self) {
        for id in [self.alice, self.bob, self.carol] {
            let r = self
                .sql
                .query_one(
                    "select e.unread, (select count(*) from deliveries d where d.recipient_id = e.id and d.state < 4)
                     from endpoints e where e.id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            assert_eq!(
                i64::from(r.get::<_, i32>(0)),
                r.get::<_, i64>(1),
                "endpoint {id}: its unread counter matches its deliveries"
            );
        }
    }
}

/// The batch writer as the server calls it: sends that arrive together are written by one call of
/// `relay_write_sends_numbered`. A batch that cannot be written whole is written again one send at a time,
/// so each send gets the outcome it would have had alone, and the stored ones keep their inboxes'
/// seqs gapless.
#[tokio::test]
async fn a_batch_with_failing_sends_stores_the_others_gaplessly() {
    // Carol's inbox is full at a cap of 3.
    let s = WriterScene::new(3).await;
    let (b, c) = (s.bob, s.carol);
    let bob_head = s.head(b).await;
    let batch = [
        s.outgoing("batch-1", None, &[b], &[], None),
        s.outgoing("batch-2", None, &[c], &[], None),
        s.outgoing("batch-3", Some("once"), &[b], &[], None),
        s.outgoing("batch-4", None, &[b], &[s.other], None),
        s.outgoing("batch-5", None, &[b], &[], Some(&s.question)),
    ];
    let rows = s
        .sql
        .query(
            &format!(
                "select n, outcome, code, detail, seqs from relay_write_sends_numbered(array[{}], 3, 0) order by n",
                batch.join(",")
            ),
            &[],
        )
        .await
        .unwrap();
    // n, outcome, SQLSTATE, detail, the recipients' seqs
    type Outcome = (i64, String, Option<String>, Option<String>, Option<Vec<i64>>);
    let outcomes: Vec<Outcome> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect();
    assert_eq!(
        outcomes,
        vec![
            (1, "stored".into(), None, None, Some(vec![bob_head + 1])),
            (2, "refused".into(), Some("RLY02".into()), Some(c.to_string()), None),
            (3, "duplicate".into(), None, None, None),
            (4, "refused".into(), Some("RLY01".into()), None, None),
            (5, "stored".into(), None, None, Some(vec![bob_head + 2])),
        ],
        "each send has the outcome it would have had alone, a stored one with its recipient's seq"
    );
    assert_eq!(
        s.deliveries_after(b, bob_head).await,
        vec![(bob_head + 1, "batch-1".into()), (bob_head + 2, "batch-5".into())],
        "the stored sends take the next seqs, in batch order, with no gap for the refused ones"
    );
    s.assert_left_nothing(&["batch-2", "batch-3", "batch-4"]).await;
    s.assert_question_read().await;
    s.assert_counters_agree().await;

    // A batch of one send is not answered but raises, with the reason in its SQLSTATE.
    let alone = s.outgoing("alone", None, &[c], &[], None);
    let err =
        s.sql.query(&format!("select * from relay_write_sends_numbered(array[{alone}], 3, 0)"), &[]).await.unwrap_err();
    let db_err = err.as_db_error().expect("a database error");
    assert_eq!(db_err.code().code(), "RLY02");
    assert_eq!(db_err.detail(), Some(c.to_string().as_str()));

    // A batch written whole: both sends stored, in order.
    let whole = [s.outgoing("whole-1", None, &[b], &[], None), s.outgoing("whole-2", None, &[b], &[], None)];
    let rows = s
        .sql
        .query(
            &format!("select outcome from relay_write_sends_numbered(array[{}], 100, 0) order by n", whole.join(",")),
            &[],
        )
        .await
        .unwrap();
    assert!(rows.iter().all(|r| r.get::<_, String>(0) == "stored"));
    assert_eq!(
        s.deliveries_after(b, bob_head + 2).await,
        vec![(bob_head + 3, "whole-1".into()), (bob_head + 4, "whole-2".into())]
    );

    // Sends to a recipient whose machine was revoked after they were resolved: each refused.
    s.sql.execute("update machines set revoked_at = now() where name = 'ci'", &[]).await.unwrap();
    let late = [s.outgoing("late-1", None, &[b], &[], None), s.outgoing("late-2", None, &[b], &[], None)];
    let rows = s
        .sql
        .query(
            &format!(
                "select code, detail from relay_write_sends_numbered(array[{}], 100, 0) order by n",
                late.join(",")
            ),
            &[],
        )
        .await
        .unwrap();
    let refusals: Vec<(Option<String>, Option<String>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(refusals, vec![(Some("RLY03".into()), Some(b.to_string())); 2]);
    s.assert_left_nothing(&["late-1", "late-2"]).await;
}

/// What `relay_write_send_numbered` answered: its outcome and the recipients away, or the SQLSTATE and detail
/// it raised.
type Answer = Result<(String, Option<Vec<i64>>), (String, Option<String>)>;

/// A send with no batch-mates is written by `relay_write_send_numbered`, one statement, with the outcome a
/// batch of one would have: stored, a duplicate answered without writing, an inbox full or a contact
/// dropped refused by SQLSTATE with nothing left behind, a reply that reads what it answers.
#[tokio::test]
async fn a_send_alone_has_the_outcomes_of_a_batch_of_one() {
    // Carol's inbox is full at a cap of 5.
    let s = WriterScene::new(5).await;
    let (a, b, c) = (s.alice, s.bob, s.carol);
    let (a_head, b_head, c_head) = (s.head(a).await, s.head(b).await, s.head(c).await);
    let outcome = async |send: String| -> Answer {
        match s
            .sql
            .query_one(&format!("select outcome, offline from relay_write_send_numbered({send}, 5, 0)"), &[])
            .await
        {
            Ok(row) => Ok((row.get(0), row.get(1))),
            Err(e) => {
                let db = e.as_db_error().expect("a database error");
                Err((db.code().code().to_owned(), db.detail().map(str::to_owned)))
            }
        }
    };
    // Who was away is checked once, below: whether a recipient seen a moment ago still counts as
    // present depends on how long the setup took.
    let just = |answer: Answer| answer.map(|(outcome, _)| outcome);
    let stored = || Ok("stored".to_owned());

    assert_eq!(just(outcome(s.outgoing("alone-1", None, &[b], &[], None)).await), stored());
    assert_eq!(
        just(outcome(s.outgoing("alone-2", None, &[c], &[], None)).await),
        Err(("RLY02".into(), Some(c.to_string())))
    );
    assert_eq!(just(outcome(s.outgoing("alone-3", Some("once"), &[b], &[], None)).await), Ok("duplicate".into()));
    assert_eq!(just(outcome(s.outgoing("alone-4", None, &[b], &[s.other], None)).await), Err(("RLY01".into(), None)));
    assert_eq!(just(outcome(s.outgoing("alone-5", None, &[b], &[], Some(&s.question))).await), stored());
    // Bob has no stream open and was last seen a minute ago: he is named as away.
    s.sql
        .execute("update endpoints set last_seen_at = now() - interval '1 minute' where id = $1", &[&b])
        .await
        .unwrap();
    assert_eq!(
        outcome(s.outgoing("alone-6", None, &[b], &[], None)).await,
        Ok(("stored".to_owned(), Some(vec![b]))),
        "a recipient with no stream, not seen lately, is named as away"
    );

    assert_eq!(
        s.deliveries_after(b, b_head).await,
        vec![(b_head + 1, "alone-1".into()), (b_head + 2, "alone-5".into()), (b_head + 3, "alone-6".into())],
        "stored sends take the next seqs, with no gap for the refused ones"
    );
    assert_eq!(s.deliveries_after(a, a_head).await, vec![], "alice sent them all");
    assert_eq!(s.deliveries_after(c, c_head).await, vec![], "a refused send leaves no delivery");
    s.assert_left_nothing(&["alone-2", "alone-3", "alone-4"]).await;
    s.assert_question_read().await;
    s.assert_counters_agree().await;

    // A stored send answers each recipient's seq (what its stream is handed), in recipient order.
    let send = s.outgoing("alone-8", None, &[b, a], &[], None);
    let row = s
        .sql
        .query_one(&format!("select seqs, relations from relay_write_send_numbered({send}, 100, 0)"), &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, Vec<i64>>(0), vec![b_head + 4, a_head + 1]);
    assert_eq!(row.get::<_, Vec<String>>(1), vec![String::new(), String::new()], "neither is the other's parent");

    // A recipient whose machine was revoked after the send was resolved: refused, nothing stored.
    s.sql.execute("update machines set revoked_at = now() where name = 'ci'", &[]).await.unwrap();
    assert_eq!(
        just(outcome(s.outgoing("alone-7", None, &[b], &[], None)).await),
        Err(("RLY03".into(), Some(b.to_string())))
    );
    s.assert_left_nothing(&["alone-7"]).await;
}

/// A plain send (one inbox, no contact relied on, nothing read) is written by `relay_write_send_plain`
/// with the answers `relay_write_send_numbered` gives it: stored with the inbox's next seq and how the
/// two stand, a duplicate answered without writing, a full inbox or a revoked machine refused by
/// SQLSTATE with nothing left behind. Asked to write what is not plain, it refuses.
#[tokio::test]
async fn a_plain_send_has_the_answers_of_a_send_alone() {
    // Carol's inbox is full at a cap of 5.
    let s = WriterScene::new(5).await;
    let (a, b, c) = (s.alice, s.bob, s.carol);
    let b_head = s.head(b).await;
    // Nobody has a stream open, and everyone was last seen a minute ago: every recipient is away.
    s.sql.execute("update endpoints set last_seen_at = now() - interval '1 minute'", &[]).await.unwrap();
    // (outcome, recipients away, seqs, relations), or the SQLSTATE and detail raised.
    type Plain = Result<(String, Option<Vec<i64>>, Option<Vec<i64>>, Option<Vec<String>>), (String, Option<String>)>;
    let write = async |send: String| -> Plain {
        match s
            .sql
            .query_one(
                &format!("select outcome, offline, seqs, relations from relay_write_send_plain({send}, 5, 0)"),
                &[],
            )
            .await
        {
            Ok(row) => Ok((row.get(0), row.get(1), row.get(2), row.get(3))),
            Err(e) => {
                let db = e.as_db_error().expect("a database error");
                Err((db.code().code().to_owned(), db.detail().map(str::to_owned)))
            }
        }
    };
    let stored =
        |seq: i64, relation: &str| Ok(("stored".into(), Some(vec![b]), Some(vec![seq]), Some(vec![relation.into()])));

    assert_eq!(write(s.outgoing("plain-1", None, &[b], &[], None)).await, stored(b_head + 1, ""));
    assert_eq!(write(s.outgoing("plain-2", None, &[c], &[], None)).await, Err(("RLY02".into(), Some(c.to_string()))));
    assert_eq!(
        write(s.outgoing("plain-3", Some("once"), &[b], &[], None)).await,
        Ok(("duplicate".into(), None, None, None)),
        "a client id used before is answered as a duplicate"
    );
    // How the two stand, as a push shows it: alice is bob's parent, then bob is alice's.
    s.sql.execute("update endpoints set parent_id = $1 where id = $2", &[&a, &b]).await.unwrap();
    assert_eq!(write(s.outgoing("plain-4", None, &[b], &[], None)).await, stored(b_head + 2, "parent"));
    s.sql.execute("update endpoints set parent_id = null where id = $1", &[&b]).await.unwrap();
    s.sql.execute("update endpoints set parent_id = $1 where id = $2", &[&b, &a]).await.unwrap();
    assert_eq!(write(s.outgoing("plain-5", None, &[b], &[], None)).await, stored(b_head + 3, "child"));

    // What is not plain goes to `relay_write_send_numbered`; written here it would lose its contact
    // check or its read.
    for send in [
        s.outgoing("plain-6", None, &[b, c], &[], None),
        s.outgoing("plain-7", None, &[b], &[s.other], None),
        s.outgoing("plain-8", None, &[b], &[], Some(&s.question)),
    ] {
        assert_eq!(write(send).await, Err(("22023".into(), None)));
    }
    // An inbox that does not exist is refused as nobody to reach, not stored undelivered.
    assert_eq!(
        write(s.outgoing("plain-9", None, &[i64::MAX], &[], None)).await,
        Err(("RLY03".into(), Some(i64::MAX.to_string())))
    );
    // A recipient whose machine was revoked after the send was resolved.
    s.sql.execute("update machines set revoked_at = now() where name = 'ci'", &[]).await.unwrap();
    assert_eq!(write(s.outgoing("plain-10", None, &[b], &[], None)).await, Err(("RLY03".into(), Some(b.to_string()))));

    assert_eq!(
        s.deliveries_after(b, b_head).await,
        vec![(b_head + 1, "plain-1".into()), (b_head + 2, "plain-4".into()), (b_head + 3, "plain-5".into())],
        "stored sends take the next seqs, with no gap for the refused ones"
    );
    s.assert_left_nothing(&["plain-2", "plain-3", "plain-6", "plain-7", "plain-8", "plain-9", "plain-10"]).await;
    s.assert_counters_agree().await;
}

/// A batch of plain sends is written by `relay_write_sends_plain` with the answers the numbered batch
/// writer gives: stored sends with their inboxes' next seqs in batch order, a duplicate answered
/// without writing. A batch that an inbox would refuse is handed whole to the numbered writer, which
/// refuses that send alone and stores the rest.
#[tokio::test]
async fn a_batch_of_plain_sends_has_the_answers_of_the_numbered_batch() {
    // Carol's inbox holds 4 at a cap of 5: one more fits, two do not.
    let s = WriterScene::new(4).await;
    let (a, b, c) = (s.alice, s.bob, s.carol);
    let (b_head, c_head) = (s.head(b).await, s.head(c).await);
    s.sql.execute("update endpoints set last_seen_at = now() - interval '1 minute'", &[]).await.unwrap();
    s.sql.execute("update endpoints set parent_id = $1 where id = $2", &[&a, &b]).await.unwrap();
    // (n, outcome, SQLSTATE, detail, recipients away, seqs, relations)
    type Row = (i64, String, Option<String>, Option<String>, Option<Vec<i64>>, Option<Vec<i64>>, Option<Vec<String>>);
    // Its answers, and whether it handed the batch to the numbered writer (function calls are
    // counted for this transaction alone).
    let write = async |sends: &[String]| -> (Vec<Row>, bool) {
        s.sql.batch_execute("begin; set local track_functions = 'pl'").await.unwrap();
        let rows = s
            .sql
            .query(
                &format!(
                    "select n, outcome, code, detail, offline, seqs, relations \
                     from relay_write_sends_plain(array[{}], 5, 0) order by n",
                    sends.join(",")
                ),
                &[],
            )
            .await
            .unwrap();
        let handed = s
            .sql
            .query_opt("select 1 from pg_stat_xact_user_functions where funcname = 'relay_write_sends_numbered'", &[])
            .await
            .unwrap()
            .is_some();
        s.sql.batch_execute("commit").await.unwrap();
        (rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6))).collect(), handed)
    };
    let stored = |n: i64, to: i64, seq: i64, relation: &str| {
        (n, "stored".to_owned(), None, None, Some(vec![to]), Some(vec![seq]), Some(vec![relation.to_owned()]))
    };
    let duplicate = |n: i64| (n, "duplicate".to_owned(), None, None, None, None, None);

    assert_eq!(
        write(&[
            s.outgoing("set-1", None, &[b], &[], None),
            s.outgoing("set-2", Some("once"), &[b], &[], None),
            s.outgoing("set-3", None, &[c], &[], None),
            s.outgoing("set-4", None, &[b], &[], None),
        ])
        .await,
        (
            vec![
                stored(1, b, b_head + 1, "parent"),
                duplicate(2),
                stored(3, c, c_head + 1, ""),
                stored(4, b, b_head + 2, "parent")
            ],
            false
        ),
        "written as a set: each stored send takes its inbox's next seq in batch order"
    );
    // Carol is full now: her send is refused and the others are stored, as the numbered writer
    // answers.
    assert_eq!(
        write(&[s.outgoing("set-5", None, &[b], &[], None), s.outgoing("set-6", None, &[c], &[], None)]).await,
        (
            vec![
                stored(1, b, b_head + 3, "parent"),
                (2, "refused".into(), Some("RLY02".into()), Some(c.to_string()), None, None, None)
            ],
            true
        ),
        "handed whole to the numbered writer"
    );
    assert_eq!(
        s.deliveries_after(b, b_head).await,
        vec![(b_head + 1, "set-1".into()), (b_head + 2, "set-4".into()), (b_head + 3, "set-5".into())]
    );
    assert_eq!(s.deliveries_after(c, c_head).await, vec![(c_head + 1, "set-3".into())]);
    s.assert_left_nothing(&["set-2", "set-6"]).await;
    s.assert_counters_agree().await;

    // A set that is not all plain is refused before anything is written.
    let err = s
        .sql
        .query(
            &format!(
                "select * from relay_write_sends_plain(array[{}, {}], 5, 0)",
                s.outgoing("set-7", None, &[b], &[], None),
                s.outgoing("set-8", None, &[b], &[s.other], None)
            ),
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.as_db_error().map(|db| db.code().code()), Some("22023"));
    s.assert_left_nothing(&["set-7", "set-8"]).await;
}

/// What a writer answered: its rows as JSON, or the SQLSTATE and detail it raised.
type Rows = Result<Vec<serde_json::Value>, (String, Option<String>)>;

impl WriterScene {
    /// Runs `first`, then `second`, from the same state: in one transaction (so `now()` is the same
    /// for both), each undone once it ran.
    async fn both_from_one_state<A, B>(
        &self,
        first: impl AsyncFnOnce() -> A,
        second: impl AsyncFnOnce() -> B,
    ) -> (A, B) {
        self.sql.batch_execute("begin; savepoint before").await.unwrap();
        let a = first().await;
        self.sql.batch_execute("rollback to savepoint before").await.unwrap();
        let b = second().await;
        self.sql.batch_execute("rollback").await.unwrap();
        (a, b)
    }

    /// What the numbered writer and the plain one answer to the same sends from the same state.
    /// `call` names the writer as `{writer}`.
    async fn numbered_and_plain(&self, call: &str) -> (Rows, Rows) {
        let answer = async |writer: &str| -> Rows {
            // In the order the writer answers: a batch's by send.
            let query = format!("select to_jsonb(w) from {} w", call.replace("{writer}", writer));
            match self.sql.query(&query, &[]).await {
                Ok(rows) => Ok(rows.iter().map(|r| r.get(0)).collect()),
                Err(e) => {
                    let db = e.as_db_error().expect("a database error");
                    Err((db.code().code().to_owned(), db.detail().map(str::to_owned)))
                }
            }
        };
        self.both_from_one_state(async || answer("numbered").await, async || answer("plain").await).await
    }
}

/// The plain writers answer every plain send as the numbered writers do, to the last field (who is
/// away and since when, seqs, relations, when it was stored), alone and in batches: stored, away or
/// not, a human's inbox never away, parent and child, a client id used before or twice in one
/// batch, a full inbox, a revoked machine.
#[tokio::test]
async fn the_plain_writers_answer_as_the_numbered_ones() {
    let s = WriterScene::new(5).await;
    let (a, b, c) = (s.alice, s.bob, s.carol);
    // A human's inbox, 'me', beside the agents; bob was last seen a minute ago, carol just now.
    let me: i64 = s
        .sql
        .query_one(
            "with m as (insert into machines (account_id, name, token_hash) values ($1, 'me', '\\x6d65') returning id)
             insert into endpoints (machine_id, handle) select id, 'ann' from m returning id",
            &[&s.acme],
        )
        .await
        .unwrap()
        .get(0);
    s.sql
        .execute("update endpoints set last_seen_at = now() - interval '1 minute' where id = $1", &[&b])
        .await
        .unwrap();
    s.sql.execute("update endpoints set last_seen_at = now() where id = $1", &[&c]).await.unwrap();
    let alone = |id: &str, client_id: Option<&str>, to: i64, cap: i32| {
        format!("relay_write_send_{{writer}}({}, {cap}, 0)", s.outgoing(id, client_id, &[to], &[], None))
    };
    let batch = |sends: &[(&str, Option<&str>, i64)], cap: i32| {
        let sends: Vec<String> =
            sends.iter().map(|(id, client_id, to)| s.outgoing(id, *client_id, &[*to], &[], None)).collect();
        format!("relay_write_sends_{{writer}}(array[{}], {cap}, 0)", sends.join(","))
    };
    // Both answer alike, and the case is the one meant: each send's outcome, or what was raised.
    let same = async |call: String, what: &str, expected: &str| {
        let (numbered, plain) = s.numbered_and_plain(&call).await;
        assert_eq!(plain, numbered, "{what}: the plain writer answers as the numbered one");
        let case = match &numbered {
            Ok(rows) => rows.iter().map(|r| r["outcome"].as_str().unwrap_or("?")).collect::<Vec<_>>().join(","),
            Err((code, _)) => code.clone(),
        };
        assert_eq!(case, expected, "{what}");
    };

    same(alone("one-1", None, b, 100), "to an agent away", "stored").await;
    same(alone("one-2", None, me, 100), "to a human's inbox", "stored").await;
    same(alone("one-3", None, c, 100), "to an agent seen just now", "stored").await;
    same(alone("one-4", None, c, 5), "to a full inbox", "RLY02").await;
    same(alone("one-5", Some("once"), b, 100), "with a client id used before", "duplicate").await;
    let mixed = [
        ("set-1", None, b),
        ("set-2", Some("once"), b),
        ("set-3", Some("twice"), c),
        ("set-4", Some("twice"), me),
        ("set-5", None, me),
        ("set-6", None, b),
    ];
    same(batch(&mixed, 100), "a batch", "stored,duplicate,stored,duplicate,stored,stored").await;
    // Carol's send refused, its client id free again for the next.
    same(batch(&mixed, 5), "a batch with a full inbox", "stored,duplicate,refused,stored,stored,stored").await;

    // alice is bob's parent, then bob is alice's.
    s.sql.execute("update endpoints set parent_id = $1 where id = $2", &[&a, &b]).await.unwrap();
    same(alone("rel-1", None, b, 100), "to a child", "stored").await;
    same(batch(&[("rel-2", None, b), ("rel-3", None, c)], 100), "a batch to a child", "stored,stored").await;
    s.sql.execute("update endpoints set parent_id = null where id = $1", &[&b]).await.unwrap();
    s.sql.execute("update endpoints set parent_id = $1 where id = $2", &[&b, &a]).await.unwrap();
    same(alone("rel-4", None, b, 100), "to a parent", "stored").await;
    same(batch(&[("rel-5", None, b), ("rel-6", None, me)], 100), "a batch to a parent", "stored,stored").await;

    s.sql.execute("update machines set revoked_at = now() where name = 'ci'", &[]).await.unwrap();
    same(alone("gone-1", None, b, 100), "to a revoked machine", "RLY03").await;
    same(batch(&[("gone-2", None, b), ("gone-3", None, me)], 100), "a batch with a revoked machine", "refused,stored")
        .await;
}

impl WriterScene {
    /// What a look at `inbox` answers and leaves, made by `relay_take_unread` (migration 33) and by
    /// the read and the move it replaces (`relay_unread`, then `relay_advance` when it found any),
    /// from the same state: the page (each message as JSON), the count left unread, and the inbox
    /// afterwards (its deliveries' states, unread counter and newest shown).
    async fn looks(&self, inbox: i64, limit: i64, target: i16) -> (Look, Look) {
        let afterwards = async || -> serde_json::Value {
            let inbox_now = "select jsonb_build_object(
                    'states', (select jsonb_agg(jsonb_build_array(d.seq, d.state) order by d.seq)
                               from deliveries d where d.recipient_id = e.id),
                    'unread', e.unread, 'last_shown', e.last_shown)
                from endpoints e where e.id = $1";
            self.sql.query_one(inbox_now, &[&inbox]).await.unwrap().get(0)
        };
        let take = async || -> Look {
            let rows = self
                .sql
                .query(
                    "select to_jsonb(t) - 'left_unread', t.left_unread from relay_take_unread($1, $2, $3) t",
                    &[&inbox, &limit, &target],
                )
                .await
                .unwrap();
            let left = rows.first().map_or(0, |r| r.get(1));
            (rows.iter().map(|r| r.get(0)).collect(), left, afterwards().await)
        };
        let read_and_move = async || -> Look {
            let rows = self
                .sql
                .query("select to_jsonb(u), u.seq from relay_unread($1, 0, $2) u", &[&inbox, &limit])
                .await
                .unwrap();
            let seqs: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
            let left = if seqs.is_empty() {
                0
            } else {
                let moved = "select left_unread from relay_advance($1, $2, $3)";
                self.sql.query_one(moved, &[&inbox, &seqs, &target]).await.unwrap().get(0)
            };
            (rows.iter().map(|r| r.get(0)).collect(), left, afterwards().await)
        };
        self.both_from_one_state(take, read_and_move).await
    }
}

/// A look's page (each message as JSON), the count it left unread, and its inbox afterwards.
type Look = (Vec<serde_json::Value>, i32, serde_json::Value);

/// One look at the inbox (migration 33) answers and leaves what the read and the move it replaces
/// did, to the last field: a first look, a look at a page already shown (which moves nothing), one
/// going a message further, reading a page, a withdrawn delivery skipped, a child's and a parent's
/// message, an empty inbox.
#[tokio::test]
async fn one_look_at_the_inbox_answers_as_the_read_and_the_move_it_replaces() {
    let s = WriterScene::new(5).await;
    let (a, b, c) = (s.alice, s.bob, s.carol);
    let same = async |inbox: i64, limit: i64, target: i16, what: &str, seqs: &[i64], left: i32| {
        let (one, two) = s.looks(inbox, limit, target).await;
        assert_eq!(one, two, "{what}: one look answers and leaves what the read and the move did");
        let page: Vec<i64> = one.0.iter().map(|m| m["seq"].as_i64().unwrap()).collect();
        assert_eq!((page.as_slice(), one.1), (seqs, left), "{what}");
        one.0
    };
    let for_real = async |inbox: i64, limit: i64, target: i16| {
        s.sql.query("select 1 from relay_take_unread($1, $2, $3)", &[&inbox, &limit, &target]).await.unwrap();
    };

    same(c, 3, 3, "a first look", &[1, 2, 3], 5).await;
    same(c, 10, 4, "a look that reads them all", &[1, 2, 3, 4, 5], 0).await;
    for_real(c, 3, 3).await;
    same(c, 3, 3, "a page already shown", &[1, 2, 3], 5).await;
    same(c, 4, 3, "a page going one further", &[1, 2, 3, 4], 5).await;
    same(c, 3, 4, "reading a page shown", &[1, 2, 3], 2).await;
    // A later message shown by a confirmation: the page moves nothing, but is the newest shown again.
    s.sql.execute("select relay_advance($1, '{4}', 3::smallint)", &[&c]).await.unwrap();
    same(c, 3, 3, "a page shown before a later one", &[1, 2, 3], 5).await;
    s.sql.execute("update deliveries set state = 5 where recipient_id = $1 and seq = 2", &[&c]).await.unwrap();
    same(c, 3, 3, "a withdrawn delivery skipped", &[1, 3, 4], 4).await;

    // alice holds bob's question: bob is alice's child, then her parent.
    s.sql.execute("update endpoints set parent_id = $1 where id = $2", &[&a, &b]).await.unwrap();
    let page = same(a, 50, 3, "a child's message", &[1], 1).await;
    assert_eq!(page[0]["relation"], "child");
    s.sql.execute("update endpoints set parent_id = null where id = $1", &[&b]).await.unwrap();
    s.sql.execute("update endpoints set parent_id = $1 where id = $2", &[&b, &a]).await.unwrap();
    let page = same(a, 50, 3, "a parent's message", &[1], 1).await;
    assert_eq!(page[0]["relation"], "parent");

    for_real(b, 50, 4).await;
    same(b, 50, 3, "an empty inbox", &[], 0).await;

    let refused = s.sql.query("select 1 from relay_take_unread($1, 50, 2::smallint)", &[&c]).await.unwrap_err();
    let refused = refused.as_db_error().expect("a database error").message().to_owned();
    assert!(refused.contains("is not surfaced or read"), "a push is not a look: {refused}");
    s.assert_counters_agree().await;
}

/// A send reaching more recipients than one notification can name (a group send can reach
/// hundreds) is stored, and every recipient is announced to the other replicas, 300 to a
/// notification.
#[tokio::test]
async fn a_send_to_many_recipients_announces_them_all() {
    let s = WriterScene::new(0).await;
    let (listener, mut conn) = tokio_postgres::connect(&s.db.url, tokio_postgres::NoTls).await.unwrap();
    let (heard, mut payloads) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = heard.send(n.payload().to_owned());
            }
        }
    });
    listener.batch_execute("listen relay_delivery").await.unwrap();

    // Bob and 1,200 ids with no endpoint behind them: long enough to pass 8,000 bytes named at once.
    let mut to: Vec<i64> = (1..=1200).map(|n| 1_000_000_000_000 + n).collect();
    to.push(s.bob);
    let send = s.outgoing("crowd", None, &to, &[], None);
    let outcome: String = s
        .sql
        .query_one(&format!("select outcome from relay_write_send_numbered({send}, 5, 7)"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(outcome, "stored");

    let mut announced = std::collections::BTreeSet::new();
    while announced.len() < to.len() {
        let payload = tokio::time::timeout(Duration::from_secs(10), payloads.recv())
            .await
            .expect("every recipient announced")
            .unwrap();
        let ids = payload.strip_prefix("r7:").unwrap_or_else(|| panic!("announced by the writing replica: {payload}"));
        assert!(ids.split(',').count() <= 300, "at most 300 to a notification");
        announced.extend(ids.split(',').map(|id| id.parse::<i64>().unwrap()));
    }
    assert_eq!(announced, to.iter().copied().collect());
}

/// Looking again at messages already shown changes nothing, and costs no write: the second look
/// takes no transaction id (so no commit waits for a disk flush) and answers as the first did.
#[tokio::test]
async fn looking_again_at_shown_messages_writes_nothing() {
    let (db, _server, mut alice, mut bob) = two_machines().await;
    for body in ["one", "two"] {
        alice.send(&["ci/bob"], body).await.unwrap();
    }
    let first = bob.inbox(0, false).await.unwrap();
    assert_eq!(first.messages.len(), 2);

    let sql = db.sql().await;
    let bob_id: i64 =
        sql.query_one("select id from endpoint_addresses where address = $1", &[&bob.address]).await.unwrap().get(0);
    // What a look answers, and whether its transaction took an id (wrote anything).
    let wrote = async |look: &str| -> (Vec<(i64, i32)>, bool) {
        sql.batch_execute("begin").await.unwrap();
        let rows = sql.query(look, &[&bob_id]).await.unwrap();
        let wrote = sql.query_one("select pg_current_xact_id_if_assigned() is not null", &[]).await.unwrap().get(0);
        sql.batch_execute("commit").await.unwrap();
        (rows.iter().map(|r| (r.get(0), r.get(1))).collect(), wrote)
    };
    // The look the server makes (migration 33).
    let (again, written) = wrote("select seq, left_unread from relay_take_unread($1, 50, 3::smallint)").await;
    assert_eq!(again, [(1, 2), (2, 2)], "the same two messages, both still unread");
    assert!(!written, "a second look wrote nothing");
    // The move the previous release makes after its read.
    let (again, written) =
        wrote("select moved::bigint, left_unread from relay_advance($1, '{1,2}', 3::smallint)").await;
    assert_eq!(again, [(0, 2)], "nothing moved; both still unread");
    assert!(!written, "a second move wrote nothing");

    // Through the server as well: the same two messages, still unread.
    let second = bob.inbox(0, false).await.unwrap();
    let seqs = |r: &InboxResponse| r.messages.iter().map(|m| m.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&second), seqs(&first));
    assert_eq!(second.remaining, 2);
}

/// A look or a read that moves messages locks its inbox as the writers do (`no key update`): a send
/// of the inbox's own agent, whose foreign key takes a `key share` of the same row, does not wait for
/// it.
#[tokio::test]
async fn a_send_does_not_wait_for_a_look_at_its_senders_inbox() {
    let (db, _server, mut alice, mut bob) = two_machines().await;
    let sql = db.sql().await;
    let bob_id: i64 =
        sql.query_one("select id from endpoint_addresses where address = $1", &[&bob.address]).await.unwrap().get(0);
    let all = "(select array_agg(seq) from deliveries where recipient_id = $1)";
    for (moving, what) in [
        ("select seq from relay_take_unread($1, 50, 3::smallint)".to_owned(), "a look (migration 33)"),
        (format!("select moved from relay_advance($1, {all}, 4::smallint)"), "a read (relay_advance)"),
    ] {
        alice.send(&["ci/bob"], what).await.unwrap();
        // The move made, its transaction still open.
        sql.batch_execute("begin").await.unwrap();
        sql.query(&moving, &[&bob_id]).await.unwrap();
        let wrote: bool =
            sql.query_one("select pg_current_xact_id_if_assigned() is not null", &[]).await.unwrap().get(0);
        assert!(wrote, "{what} moved a message, holding its inbox's lock");
        let sent = tokio::time::timeout(PUSH_WAIT, bob.send(&["laptop/alice"], "sent meanwhile")).await;
        sql.batch_execute("rollback").await.unwrap();
        sent.unwrap_or_else(|_| panic!("the send does not wait for {what}")).unwrap();
    }
    assert_eq!(alice.inbox(0, false).await.unwrap().messages.len(), 2);
}

/// A stream records what it pushed as its inbox's mark (migration 29): the sender sees each
/// delivery up to the mark as pushed and a later one as queued, the mark never moves back, and no
/// delivery's row is rewritten for a push.
#[tokio::test]
async fn a_push_moves_its_inboxs_mark_and_rewrites_no_delivery() {
    let (db, _server, mut alice, mut bob) = two_machines().await;
    let first = alice.send(&["ci/bob"], "one").await.unwrap().id;
    let second = alice.send(&["ci/bob"], "two").await.unwrap().id;
    let sql = db.sql().await;
    let versions = async || -> Vec<(String, i16)> {
        let rows = sql
            .query(
                "select xmin::text, state from deliveries where message_id = any($1) order by seq",
                &[&vec![first.clone(), second.clone()]],
            )
            .await
            .unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    let before = versions().await;

    let mut stream = bob.subscribe(0).await;
    assert_eq!(next_message(&mut stream, PUSH_WAIT).await.id, first);
    assert_eq!(next_message(&mut stream, PUSH_WAIT).await.id, second);
    let tracker = alice.rpc.clone();
    let state = async |id: &str| -> DeliveryState {
        let tracked = tracker.clone().track(TrackRequest { id: id.to_owned() }).await.unwrap().into_inner();
        tracked.recipients[0].state()
    };
    eventually(PUSH_WAIT, "both deliveries to show as pushed", || async {
        (state(&first).await == DeliveryState::Pushed && state(&second).await == DeliveryState::Pushed).then_some(())
    })
    .await;
    assert_eq!(versions().await, before, "the push rewrote no delivery");

    // With bob's stream gone, a third message waits, queued, above the mark.
    drop(stream);
    until_stream_closed(&db, &bob.address).await;
    let bob_id: i64 =
        sql.query_one("select id from endpoint_addresses where address = $1", &[&bob.address]).await.unwrap().get(0);
    let third = alice.send(&["ci/bob"], "three").await.unwrap().id;
    assert_eq!(state(&third).await, DeliveryState::Queued);

    // A late mark for an earlier seq leaves the mark where it stands.
    let late = sql
        .query_one("select moved from relay_advance($1, array[1]::bigint[], 2::smallint)", &[&bob_id])
        .await
        .unwrap();
    assert_eq!(late.get::<_, i32>(0), 0, "the mark does not move back");
    assert_eq!(state(&second).await, DeliveryState::Pushed);
    assert_eq!(state(&third).await, DeliveryState::Queued);
}

/// A message the writing replica hands its own streams is the message the inbox reads from the
/// database, field for field: sender, seq, thread, time, relation between parent and child, reply.
#[tokio::test]
async fn a_message_pushed_as_written_is_the_message_the_inbox_reads() {
    let (db, _server, mut alice, mut bob) = two_machines().await;
    // Bob is alice's child, as a spawned worker is.
    let sql = db.sql().await;
    sql.execute(
        "update endpoints set parent_id = (select id from endpoint_addresses where address = $1)
         where id = (select id from endpoint_addresses where address = $2)",
        &[&alice.address, &bob.address],
    )
    .await
    .unwrap();
    let mut bob_stream = bob.subscribe(0).await;
    let mut alice_stream = alice.subscribe(0).await;
    // Caught up, each stream is handed what the writer stores next (counted in
    // relay_pushes_handed_total, see the ops tests).
    caught_up(&mut bob_stream, PUSH_WAIT).await;
    caught_up(&mut alice_stream, PUSH_WAIT).await;

    let read_by = async |agent: &mut Agent, id: &str| {
        let inbox = agent.inbox(0, false).await.unwrap();
        inbox.messages.into_iter().find(|m| m.id == id).expect("in the inbox")
    };
    let question = alice.send(&["ci/bob"], "from your parent").await.unwrap();
    let pushed_to_bob = next_message(&mut bob_stream, PUSH_WAIT).await;
    assert_eq!(pushed_to_bob.relation, "parent");
    assert_eq!(pushed_to_bob, read_by(&mut bob, &question.id).await);

    // (Compared before the reply, which marks the question read.)
    let reply = ReplyRequest { id: question.id.clone(), body: "from your child".into(), ..Default::default() };
    let answer = bob.rpc.reply(reply).await.unwrap().into_inner();
    let pushed_to_alice = next_message(&mut alice_stream, PUSH_WAIT).await;
    assert_eq!(pushed_to_alice.id, answer.id);
    assert_eq!(pushed_to_alice.relation, "child");
    assert_eq!(pushed_to_alice.reply_to, question.id);
    assert_eq!(pushed_to_alice, read_by(&mut alice, &answer.id).await);
}

/// The functions an inbox look runs keep their plans for the connection. Planned while the tables
/// were nearly empty, they must still find a page of a full inbox by its indexes, not by reading
/// every delivery and message (migration 31).
#[tokio::test]
async fn an_inbox_planned_while_empty_reads_a_full_one_by_its_indexes() {
    let (db, _server, mut alice, bob) = two_machines().await;
    alice.send(&["ci/bob"], "first").await.unwrap();
    let sql = db.sql().await;
    let bob_id: i64 =
        sql.query_one("select id from endpoint_addresses where address = $1", &[&bob.address]).await.unwrap().get(0);
    // Statistics of nearly empty tables, and plans made on them on this connection.
    sql.batch_execute("analyze").await.unwrap();
    // The server's look (migration 33), undone; then the read a push stream makes and the move of a
    // confirmation (and of the previous release's look): each of them reads and writes a page.
    let look_both_ways = async |page: usize, moves: i32| {
        sql.batch_execute("savepoint taken").await.unwrap();
        let take = "select seq from relay_take_unread($1, 50, 3::smallint)";
        assert_eq!(sql.query(take, &[&bob_id]).await.unwrap().len(), page, "a page, moved to surfaced");
        sql.batch_execute("rollback to savepoint taken").await.unwrap();
        let look = "select seq from relay_unread($1, 0, 50)";
        let seqs: Vec<i64> = sql.query(look, &[&bob_id]).await.unwrap().iter().map(|r| r.get(0)).collect();
        assert_eq!(seqs.len(), page, "a page");
        let mark = "select moved from relay_advance($1, $2, 3::smallint)";
        let moved: i32 = sql.query_one(mark, &[&bob_id, &seqs]).await.unwrap().get(0);
        assert_eq!(moved, moves, "what the page held unseen moved to surfaced");
    };
    sql.batch_execute("begin").await.unwrap();
    look_both_ways(1, 1).await;
    sql.batch_execute("commit").await.unwrap();

    // The inbox fills, faster than anything analyzes it again.
    sql.batch_execute(&format!(
        "begin;
         insert into messages (id, sender_id, thread, kind, body)
           select 'full' || g, {bob_id}, 'full' || g, 1, 'waiting' from generate_series(1, 5000) g;
         insert into deliveries (recipient_id, seq, message_id)
           select {bob_id}, e.head_seq + g, 'full' || g from endpoints e, generate_series(1, 5000) g
           where e.id = {bob_id};
         update endpoints set head_seq = head_seq + 5000 where id = {bob_id};
         commit;"
    ))
    .await
    .unwrap();

    sql.batch_execute("begin").await.unwrap();
    // The first message, surfaced above and still unread, heads the page; the other 49 move.
    look_both_ways(50, 49).await;
    let scans = sql
        .query(
            "select relname::text, seq_scan from pg_stat_xact_user_tables
             where relname in ('deliveries', 'messages') order by relname",
            &[],
        )
        .await
        .unwrap();
    sql.batch_execute("commit").await.unwrap();
    let scans: Vec<(String, i64)> = scans.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(scans, [("deliveries".to_owned(), 0), ("messages".to_owned(), 0)], "no table read whole for a page");
}

/// A replica records the pushes its streams made meanwhile in one call (migration 31): each inbox's
/// mark moves forward, never back, and an inbox that no longer exists is skipped, not an error for the
/// rest.
#[tokio::test]
async fn pushes_recorded_together_move_each_inboxs_mark_forward_only() {
    let (db, _server, alice, bob) = two_machines().await;
    let sql = db.sql().await;
    let id = async |address: &str| -> i64 {
        sql.query_one("select id from endpoint_addresses where address = $1", &[&address]).await.unwrap().get(0)
    };
    let (alice_id, bob_id) = (id(&alice.address).await, id(&bob.address).await);
    let gone = bob_id + 1000;
    let mark = async |inboxes: Vec<i64>, through: Vec<i64>| -> i32 {
        sql.query_one("select relay_mark_pushed($1, $2)", &[&inboxes, &through]).await.unwrap().get(0)
    };
    let marks = async || -> Vec<(i64, i64)> {
        let rows =
            sql.query("select endpoint_id, through_seq from inbox_pushed order by endpoint_id", &[]).await.unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    };

    assert_eq!(mark(vec![alice_id, bob_id, gone], vec![3, 5, 9]).await, 2, "the removed inbox is skipped");
    assert_eq!(marks().await, [(alice_id, 3), (bob_id, 5)]);
    assert_eq!(mark(vec![alice_id, bob_id], vec![4, 2]).await, 1, "only alice's moves");
    assert_eq!(marks().await, [(alice_id, 4), (bob_id, 5)], "bob's mark did not move back");
}
