//! Edges agents run into: mail for agents that are away, handles of crashed agents, the operator
//! flag, the board's notices, and arguments a model gets wrong.

use std::time::Duration;

use relay_proto::v1::*;
use relay_tests::client::Agent;
use relay_tests::mcp::{Bridge, BridgeSpec, WAIT, text};
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use relay_tests::{eventually, free_port};
use serde_json::json;
use tokio::time::Instant;
use tonic::Code;

/// acme with machines laptop and ci; returns their tokens.
async fn acme(env: &[(&str, &str)]) -> (TestDb, Server, String, String) {
    let db = TestDb::new().await;
    let server = Server::start_with_env(&db, free_port(), env).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    (db, server, laptop, ci)
}

/// An RFC 3339 instant in UTC to the second, as the server writes it.
fn is_utc_second(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 20 && b[4] == b'-' && b[10] == b'T' && b[19] == b'Z'
}

/// The offline reason the sender is shown, checked for its form.
fn offline_since(state: &RecipientState) -> String {
    assert_eq!(state.state(), DeliveryState::Queued, "{state:?}");
    let since = state.reason.strip_prefix("offline since ").unwrap_or_else(|| panic!("{state:?}"));
    assert!(is_utc_second(since), "{state:?}");
    since.to_owned()
}

// ---- 1. offline agents get their mail --------------------------------------------------------

#[tokio::test]
async fn mail_for_an_agent_that_left_waits_for_its_return() {
    let (_db, server, laptop, ci) = acme(&[]).await;
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();

    // Bob reads one message, asks alice something, then ends his session.
    alice.send(&["ci/bob"], "zero").await.unwrap();
    assert_eq!(bob.inbox(5, true).await.unwrap().messages[0].seq, 1);
    let ask = bob
        .rpc
        .send(SendRequest {
            to: vec!["laptop/alice".into()],
            body: "which port does staging use?".into(),
            kind: MessageKind::Ask as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    bob.rpc.goodbye(GoodbyeRequest {}).await.unwrap();

    // A message to the ended session is queued, and the sender hears that bob is away and since when.
    let first = alice.send(&["ci/bob"], "first").await.unwrap();
    assert_eq!(first.recipients[0].address, "acme/ci/bob");
    let since = offline_since(&first.recipients[0]);
    // The reply to the asker who left waits for it likewise.
    let reply = alice
        .rpc
        .reply(ReplyRequest { id: ask.id.clone(), body: "8443".into(), client_id: String::new() })
        .await
        .expect("a reply to an asker that left is kept for it")
        .into_inner();
    assert_eq!(offline_since(&reply.recipients[0]), since);
    let third = alice.send(&["acme/ci/bob"], "third").await.unwrap();
    offline_since(&third.recipients[0]);
    // Track says the same while it waits.
    let tracked = alice.rpc.track(TrackRequest { id: first.id.clone() }).await.unwrap().into_inner();
    assert_eq!(offline_since(&tracked.recipients[0]), since);

    // The same handle comes back: a new session takes over the inbox, and its seqs go on.
    let mut back = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    assert_eq!(back.address, "acme/ci/bob");
    let inbox = back.inbox(5, true).await.unwrap();
    let got: Vec<(u64, &str, &str)> =
        inbox.messages.iter().map(|m| (m.seq, m.body.as_str(), m.from.as_str())).collect();
    assert_eq!(
        got,
        [(2, "first", "acme/laptop/alice"), (3, "8443", "acme/laptop/alice"), (4, "third", "acme/laptop/alice")]
    );
    assert_eq!(inbox.messages[1].reply_to, ask.id);
    assert_eq!(inbox.messages[1].kind(), MessageKind::Reply);
    let tracked = alice.rpc.track(TrackRequest { id: first.id }).await.unwrap().into_inner();
    assert_eq!((tracked.recipients[0].state(), tracked.recipients[0].reason.as_str()), (DeliveryState::Read, ""));

    // An online recipient gets no reason.
    let _stream = back.subscribe(4).await;
    eventually(WAIT, "bob's stream to count as online", || {
        let mut alice = alice.rpc.clone();
        async move {
            let listed = alice.list(ListRequest::default()).await.ok()?.into_inner().endpoints;
            listed.iter().any(|e| e.address == "acme/ci/bob" && e.online).then_some(())
        }
    })
    .await;
    let online = alice.send(&["ci/bob"], "welcome back").await.unwrap();
    assert_eq!(online.recipients[0].reason, "");
}

#[tokio::test]
async fn a_closed_bridge_gets_its_mail_when_the_handle_returns() {
    let (_db, server, laptop, ci) = acme(&[]).await;
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let spec = || BridgeSpec { server: &server.url, token: &ci, handle: Some("carol"), channels: false };
    let mut carol = Bridge::start(spec());
    carol.initialize("2025-06-18").await;
    carol.tool_ok("relay_whoami", json!({})).await;
    carol.close();
    let status = tokio::time::timeout(WAIT, carol.child.wait()).await.expect("the bridge exits").unwrap();
    assert!(status.success());

    let sent = alice.send(&["ci/carol"], "the build is green").await.unwrap();
    offline_since(&sent.recipients[0]);

    let mut again = Bridge::start(spec());
    again.initialize("2025-06-18").await;
    let inbox = again.tool_ok("relay_inbox", json!({})).await;
    let messages = inbox["structuredContent"]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{inbox}");
    assert_eq!(messages[0]["id"], sent.id);
    assert!(text(&inbox).contains("the build is green"), "{}", text(&inbox));
}

#[tokio::test]
async fn a_full_inbox_refuses_more_until_it_is_read() {
    let (_db, server, laptop, ci) = acme(&[("RELAY_MAX_UNREAD", "3")]).await;
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    for i in 0..3 {
        alice.send(&["ci/bob"], &format!("message {i}")).await.unwrap();
    }
    let refused = alice.send(&["ci/bob"], "one too many").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "acme/ci/bob has 3 unread messages, the most an inbox holds: nothing was sent; try again after it reads its inbox"
    );
    // Nothing of the refused send was stored, for bob or anyone else named with him.
    let mut carol = Agent::hello(&server.url, &laptop, "carol").await.unwrap();
    assert_eq!(alice.send(&["ci/bob", "carol"], "both").await.unwrap_err().code(), Code::ResourceExhausted);
    assert!(carol.inbox(0, true).await.unwrap().messages.is_empty());
    // Replies count too.
    let asked = bob.send(&["laptop/alice"], "ping").await.unwrap();
    let reply = alice.rpc.reply(ReplyRequest { id: asked.id, body: "pong".into(), client_id: String::new() }).await;
    assert_eq!(reply.unwrap_err().code(), Code::ResourceExhausted);

    // Surfaced is still unread; read makes room.
    assert_eq!(bob.inbox(0, false).await.unwrap().messages.len(), 3);
    assert_eq!(alice.send(&["ci/bob"], "still full").await.unwrap_err().code(), Code::ResourceExhausted);
    assert_eq!(bob.inbox(0, true).await.unwrap().messages.len(), 3);
    alice.send(&["ci/bob"], "room again").await.unwrap();
}

// ---- 2. a crashed agent's handle comes back ---------------------------------------------------

/// Whether `address` is listed online, as `observer` sees it.
async fn listed_online(observer: &Agent, address: &str) -> bool {
    let listed = observer.rpc.clone().list(ListRequest::default()).await.unwrap().into_inner().endpoints;
    listed.iter().any(|e| e.address == address && e.online)
}

/// A bridge holding `handle`, initialized, shown online to `observer`, and with its push stream open:
/// a message from `observer` has reached it (that message is in its inbox, unread).
async fn live_bridge(server: &Server, token: &str, handle: &str, observer: &mut Agent) -> Bridge {
    let mut bridge = Bridge::start(BridgeSpec { server: &server.url, token, handle: Some(handle), channels: false });
    bridge.initialize("2025-06-18").await;
    let address = format!("acme/laptop/{handle}");
    eventually(WAIT, "the bridge to show online", || async { listed_online(observer, &address).await.then_some(()) })
        .await;
    let probe = observer.send(&[&address], "are you there?").await.unwrap().id;
    eventually(WAIT, "a push to reach the bridge", || {
        let (mut rpc, id) = (observer.rpc.clone(), probe.clone());
        async move {
            let tracked = rpc.track(TrackRequest { id }).await.ok()?.into_inner();
            (tracked.recipients[0].state() == DeliveryState::Pushed).then_some(())
        }
    })
    .await;
    bridge
}

#[tokio::test]
async fn a_killed_bridge_frees_its_handle_within_two_seconds() {
    let (_db, server, laptop, ci) = acme(&[]).await;
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let mut alice = live_bridge(&server, &laptop, "alice", &mut bob).await;
    let before = bob.send(&["laptop/alice"], "sent before the crash").await.unwrap();

    alice.child.start_kill().unwrap();
    let killed = Instant::now();
    // Each probe is timed from when it was made, not from when it was answered.
    let limit = Duration::from_millis(2500);
    let (freed_at, mut back) = eventually(limit + Duration::from_secs(3), "alice's handle to be free again", || {
        let (url, token) = (server.url.clone(), laptop.clone());
        async move {
            let at = killed.elapsed();
            Agent::hello(&url, &token, "alice").await.ok().map(|agent| (at, agent))
        }
    })
    .await;
    assert!(freed_at < limit, "alice's handle was free only {freed_at:?} after the kill");
    exit_within(&mut alice.child, EXIT_LIMIT, "the bridge to exit").await;

    // The same endpoint: its inbox came along.
    assert_eq!(back.address, "acme/laptop/alice");
    let inbox = back.inbox(0, true).await.unwrap();
    let bodies: Vec<&str> = inbox.messages.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies, ["are you there?", "sent before the crash"]);
    assert_eq!(inbox.messages[1].id, before.id);

    // A crashed holder nobody replaces is not listed online for longer than the reconnect grace.
    let mut dave = live_bridge(&server, &laptop, "dave", &mut bob).await;
    dave.child.start_kill().unwrap();
    let killed = Instant::now();
    eventually(Duration::from_secs(7), "dave to be listed offline", || async {
        (!listed_online(&bob, "acme/laptop/dave").await).then_some(())
    })
    .await;
    assert!(killed.elapsed() < Duration::from_secs(7));
}

#[tokio::test]
async fn a_bridge_killed_right_after_initialize_frees_its_handle_within_two_seconds() {
    let (_db, server, laptop, ci) = acme(&[]).await;
    let bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let mut alice =
        Bridge::start(BridgeSpec { server: &server.url, token: &laptop, handle: Some("alice"), channels: false });
    // The client dies as soon as initialize is answered: no tool call, no initialized notification.
    alice.request("initialize", json!({ "protocolVersion": "2025-06-18", "capabilities": {} })).await;
    // (The bridge claims its handle as it starts: the kill finds it held.)
    eventually(WAIT, "the bridge to claim alice", || async {
        let all = ListRequest { all: true, ..Default::default() };
        let listed = bob.rpc.clone().list(all).await.unwrap().into_inner().endpoints;
        listed.iter().any(|e| e.address == "acme/laptop/alice" && !e.ended).then_some(())
    })
    .await;
    alice.child.start_kill().unwrap();
    let killed = Instant::now();
    // The promise is about the server: a claim made 2 s after the kill succeeds. Each probe is a
    // Hello of the same machine, timed from when it was made, not from when it was answered.
    let limit = Duration::from_secs(2);
    let (claimed_at, _holder) = eventually(limit + Duration::from_secs(3), "the same machine to claim alice", || {
        let (url, token) = (server.url.clone(), laptop.clone());
        async move {
            let at = killed.elapsed();
            Agent::hello(&url, &token, "alice").await.ok().map(|agent| (at, agent))
        }
    })
    .await;
    assert!(claimed_at < limit, "alice was claimed again only {claimed_at:?} after the kill");
    exit_within(&mut alice.child, EXIT_LIMIT, "the bridge to exit").await;
}

#[tokio::test]
async fn a_live_holder_keeps_its_handle_and_a_refused_claim_says_who_holds_it() {
    let (db, server, laptop, ci) = acme(&[]).await;
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let _alice = live_bridge(&server, &laptop, "alice", &mut bob).await;
    // However long ago its last heartbeat, an open stream holds the handle.
    let sql = db.sql().await;
    sql.execute("update endpoints set last_seen_at = now() - interval '20 seconds' where handle = 'alice'", &[])
        .await
        .unwrap();

    let refused = Agent::hello(&server.url, &laptop, "alice").await.err().expect("a live handle is held");
    assert_eq!(refused.code(), Code::AlreadyExists);
    let message = refused.message();
    let rest = message
        .strip_prefix("handle alice on acme/laptop is held by a claude session connected since ")
        .unwrap_or_else(|| panic!("{message}"));
    let (since, next) = rest.split_at(20);
    assert!(is_utc_second(since), "{message}");
    assert_eq!(
        next,
        " with its push stream open: choose another handle (--handle or RELAY_HANDLE), or wait for that session to end"
    );
}

#[tokio::test]
async fn a_session_that_never_subscribes_frees_its_handle() {
    let (_db, server, laptop, _ci) = acme(&[]).await;
    let first = Agent::hello(&server.url, &laptop, "erin").await.unwrap();
    let claimed = Instant::now();
    let early = Agent::hello(&server.url, &laptop, "erin").await.err().expect("held for a moment");
    assert_eq!(early.code(), Code::AlreadyExists);
    assert!(early.message().contains("that has not opened its push stream"), "{}", early.message());
    assert!(early.message().contains("claim it again in 1 s"), "{}", early.message());

    let limit = Duration::from_millis(2500);
    let second = eventually(limit, "erin's handle to be free", || async {
        Agent::hello(&server.url, &laptop, "erin").await.ok()
    })
    .await;
    assert!(claimed.elapsed() < limit, "took {:?}", claimed.elapsed());
    assert_eq!(second.address, "acme/laptop/erin");
    let old = first.rpc.clone().who_am_i(WhoAmIRequest {}).await.unwrap_err();
    assert_eq!(old.code(), Code::Unauthenticated, "the first session was taken over");
}

// ---- 3. the operator flag ---------------------------------------------------------------------

#[tokio::test]
async fn hello_and_whoami_say_whether_the_endpoint_is_the_operator() {
    let (_db, server, laptop, _ci) = acme(&[]).await;
    server.admin_ok(&["operator", "acme", "laptop/alice"]);
    let ch = relay_tests::client::channel(&server.url).await;
    let hello = |handle: &str| {
        let request = HelloRequest { handle: handle.into(), harness: "claude".into(), ..Default::default() };
        let mut machine = relay_tests::client::client(ch.clone(), &laptop);
        async move { machine.hello(request).await.unwrap().into_inner() }
    };
    let (alice, bob) = (hello("alice").await, hello("bob").await);
    assert!(alice.endpoint.as_ref().unwrap().operator, "hello carries the flag");
    assert!(!bob.endpoint.as_ref().unwrap().operator);
    for (session, operator) in [(&alice.session_token, true), (&bob.session_token, false)] {
        let mut rpc = relay_tests::client::client(ch.clone(), session);
        let me = rpc.who_am_i(WhoAmIRequest {}).await.unwrap().into_inner().endpoint.unwrap();
        assert_eq!(me.operator, operator, "{}", me.address);
    }
    // Another machine's alice is not the operator.
    let ci = server.machine("acme", "ci2");
    let other = Agent::hello(&server.url, &ci, "alice").await.unwrap();
    let me = other.rpc.clone().who_am_i(WhoAmIRequest {}).await.unwrap().into_inner().endpoint.unwrap();
    assert!(!me.operator);
}

// ---- 4. the board's notices ------------------------------------------------------------------

type Worker = relay_proto::v1::worker_client::WorkerClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, relay_tests::client::Bearer>,
>;
use relay_proto::v1::worker_client::WorkerClient;
use relay_tests::process::{EXIT_LIMIT, exit_within};

/// The worker API of a machine, as `agent-bridge worker` uses it, with a repository registered.
async fn worker_with_repo(server: &Server, token: &str) -> (Worker, tempfile::TempDir) {
    let ch = relay_tests::client::channel(&server.url).await;
    let mut w: Worker = WorkerClient::with_interceptor(ch, relay_tests::client::Bearer::new(token));
    let repo = tempfile::tempdir().unwrap();
    w.register_repo(RegisterRepoRequest { path: repo.path().display().to_string() }).await.unwrap();
    (w, repo)
}

/// The one message now unread in `agent`'s inbox (read as it is returned).
async fn only_notice(agent: &mut Agent) -> Message {
    let mut inbox = agent.inbox(10, true).await.unwrap();
    assert_eq!(inbox.messages.len(), 1, "{} has {:?}", agent.address, inbox.messages);
    let notice = inbox.messages.remove(0);
    assert_eq!(notice.from, "acme/me/board");
    notice
}

#[tokio::test]
async fn the_board_tells_the_operator_and_the_poster_what_happened() {
    let (_db, server, laptop, ci) = acme(&[]).await;
    server.admin_ok(&["operator", "acme", "laptop/alice"]);
    let (mut w, repo) = worker_with_repo(&server, &ci).await;
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut carol = Agent::hello(&server.url, &laptop, "carol").await.unwrap();
    let posted = PostJobRequest {
        title: "Fix the \"login\" test".into(),
        detail: "It fails one run in ten.".into(),
        repo: repo.path().display().to_string(),
        ..Default::default()
    };
    let id = carol.rpc.post_job(posted).await.unwrap().into_inner().id;

    // The card's agent finishes it: the operator reads that it is in Review and how to close it.
    let token = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.unwrap().job_token;
    let mut card_agent = Agent::hello(&server.url, &ci, "card-agent").await.unwrap();
    let pr = "https://forge.example/acme/app/pull/12";
    let finish = FinishJobRequest { job_token: token, pr_url: pr.into(), summary: String::new() };
    card_agent.rpc.finish_job(finish).await.unwrap();
    let review = only_notice(&mut alice).await;
    assert_eq!(
        review.body,
        format!(
            "Card {id} \"Fix the \\\"login\\\" test\" is in Review: {pr}. Accept it with close_job {{id: \"{id}\", accept: true}} or send it back with accept: false and a note."
        )
    );
    assert_eq!(review.thread, format!("card:{id}"));
    let told = only_notice(&mut carol).await.body;
    assert!(told.contains("is in Review") && told.contains("The operator acme/laptop/alice accepts it"), "{told}");
    assert!(card_agent.inbox(0, true).await.unwrap().messages.is_empty(), "the agent that finished is not told");

    // Nobody can answer the board, claim it, or register its machine.
    let reply = ReplyRequest { id: review.id.clone(), body: "thanks".into(), client_id: String::new() };
    let refused = alice.rpc.reply(reply).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().starts_with("acme/me/board sends the board's notices and reads no messages"));
    let refused = alice.send(&["me/board"], "hello?").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().contains("act on the card with read_job, list_jobs or close_job"), "{refused:?}");
    assert!(!server.admin(&["machine", "add", "acme/me"]).status.success());

    // Sent back: the poster hears why; the operator, who did it, is not told.
    let back = CloseJobRequest { id: id.clone(), accept: false, note: "also update the docs".into() };
    alice.rpc.close_job(back).await.unwrap();
    let told = only_notice(&mut carol).await.body;
    assert!(
        told.starts_with(&format!(
            "Card {id} \"Fix the \\\"login\\\" test\" went back to To do: acme/laptop/alice sent it back with the note \"also update the docs\"."
        )),
        "{told}"
    );
    assert!(alice.inbox(0, true).await.unwrap().messages.is_empty());

    // The next attempt fails: both hear it, with the worker's error quoted.
    let token = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.unwrap().job_token;
    let failed = ReleaseRequest { job_token: token, exit_code: 1, error: "tests fail".into() };
    w.release(failed).await.unwrap();
    for reader in [&mut alice, &mut carol] {
        let told = only_notice(reader).await.body;
        assert!(
            told.contains("went back to To do after attempt 1 of 3: its agent exited with code 1: \"tests fail\""),
            "{told}"
        );
    }

    // Accepted: the poster hears it is done.
    let token = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.unwrap().job_token;
    let finish = FinishJobRequest { job_token: token, pr_url: pr.into(), summary: String::new() };
    card_agent.rpc.finish_job(finish).await.unwrap();
    only_notice(&mut alice).await;
    only_notice(&mut carol).await;
    alice.rpc.close_job(CloseJobRequest { id: id.clone(), accept: true, note: String::new() }).await.unwrap();
    let told = only_notice(&mut carol).await.body;
    assert!(told.ends_with("is Done: acme/laptop/alice accepted it. Nothing more to do."), "{told}");
    assert!(alice.inbox(0, true).await.unwrap().messages.is_empty());
}

#[tokio::test]
async fn schedules_tell_when_they_fire_hold_off_and_lose_a_run() {
    let env = [("RELAY_SCHEDULER_TICK_MS", "50"), ("RELAY_LEASE_S", "1")];
    let (db, server, laptop, ci) = acme(&env).await;
    server.admin_ok(&["operator", "acme", "laptop/alice"]);
    let (mut w, repo) = worker_with_repo(&server, &ci).await;
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut carol = Agent::hello(&server.url, &laptop, "carol").await.unwrap();
    let posted = PostJobRequest {
        title: "Weekly dependency report".into(),
        repo: repo.path().display().to_string(),
        schedule: "@hourly".into(),
        ..Default::default()
    };
    let schedule = carol.rpc.post_job(posted).await.unwrap().into_inner().id;
    let sql = db.sql().await;
    let due_now = || async {
        sql.execute("update jobs set next_run_at = now() - interval '1 minute' where id = $1", &[&schedule])
            .await
            .unwrap();
    };
    let round_done = || async {
        let row = sql.query_one("select next_run_at > now() from jobs where id = $1", &[&schedule]).await.unwrap();
        row.get::<_, bool>(0).then_some(())
    };

    due_now().await;
    for reader in [&mut alice, &mut carol] {
        let told = only_notice(reader).await.body;
        assert!(told.starts_with(&format!("Schedule {schedule} \"Weekly dependency report\" came due")), "{told}");
    }
    // Due again while its run waits: held off, told once, not at every slot after.
    due_now().await;
    for reader in [&mut alice, &mut carol] {
        let told = only_notice(reader).await.body;
        assert!(told.contains("held off its run: its last run is still in progress"), "{told}");
    }
    due_now().await;
    eventually(WAIT, "the next scheduler round", round_done).await;
    assert!(alice.inbox(0, true).await.unwrap().messages.is_empty(), "the same hold-off is told once");

    // The run's worker goes quiet: the schedule's poster and the operator hear the card came back.
    w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.expect("the run card");
    for reader in [&mut alice, &mut carol] {
        let told = only_notice(reader).await.body;
        assert!(told.contains("went back to To do after attempt 1 of 3: the worker on ci stopped renewing"), "{told}");
    }
}

// ---- 5. arguments a model gets wrong ---------------------------------------------------------

#[tokio::test]
async fn wrong_arguments_are_refused_with_what_is_right() {
    let (_db, server, laptop, ci) = acme(&[]).await;
    let (_w, repo) = worker_with_repo(&server, &ci).await;
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &laptop, "bob").await.unwrap();
    let globex = server.machine("globex", "box");
    let _gina = Agent::hello(&server.url, &globex, "gina").await.unwrap();

    // A column spelled the database's way is not a column.
    for state in ["in_progress", "doing"] {
        let request = ListJobsRequest { state: state.into(), ..Default::default() };
        let refused = alice.rpc.list_jobs(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{state}");
        assert!(
            refused.message().starts_with(&format!("invalid state {state:?}: use todo, in-progress, review or done")),
            "{}",
            refused.message()
        );
    }
    let request = ListJobsRequest { state: "in-progress".into(), ..Default::default() };
    alice.rpc.list_jobs(request).await.expect("the right spelling");

    // A thread the caller never took part in.
    let send = |thread: &str| SendRequest {
        to: vec!["bob".into()],
        body: "more on that".into(),
        thread: thread.into(),
        ..Default::default()
    };
    let refused = alice.rpc.send(send("nope")).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound);
    assert_eq!(
        refused.message(),
        "no thread \"nope\" among your messages: leave thread out to start one, or use a thread id from a message you sent or received"
    );
    let bobs = bob.send(&["alice"], "a thread of bob's").await.unwrap().thread;
    alice.rpc.send(send(&bobs)).await.expect("a thread alice received a message in");
    let mut carol = Agent::hello(&server.url, &laptop, "carol").await.unwrap();
    let theirs = carol.send(&["bob"], "between carol and bob").await.unwrap().thread;
    assert_eq!(alice.rpc.send(send(&theirs)).await.unwrap_err().code(), Code::NotFound, "someone else's thread");

    // A bad schedule names the field, the value and the range.
    let post = PostJobRequest {
        title: "nightly".into(),
        repo: repo.path().display().to_string(),
        schedule: "0 25 * * *".into(),
        ..Default::default()
    };
    let refused = alice.rpc.post_job(post).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(refused.message(), "schedule \"0 25 * * *\": hour is 25, but hours run 0-23");

    // An address that resolves to nothing: the nearest one in reach, never a stranger's.
    let refused = alice.send(&["bbo"], "hi").await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound);
    assert_eq!(
        refused.message(),
        "no agent you can reach at acme/laptop/bbo: did you mean acme/laptop/bob? check the address with relay_list; nothing was sent"
    );
    let refused = alice.send(&["globex/box/gian"], "hi").await.unwrap_err();
    assert_eq!(
        refused.message(),
        "no agent you can reach at globex/box/gian: check the address with relay_list; nothing was sent",
        "globex is no contact of acme: its names are never offered"
    );
    server.admin_ok(&["contact", "add", "acme", "globex"]);
    let refused = alice.send(&["globex/box/gian"], "hi").await.unwrap_err();
    assert!(refused.message().contains("did you mean globex/box/gina?"), "{}", refused.message());
}

#[tokio::test]
async fn pending_replies_leave_out_requests_that_can_never_be_answered() {
    let (_db, server, laptop, ci) = acme(&[]).await;
    let old = server.machine("acme", "old");
    let globex = server.machine("globex", "box");
    server.admin_ok(&["contact", "add", "acme", "globex"]);
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let ask = |body: &str| SendRequest {
        to: vec!["acme/laptop/alice".into()],
        body: body.into(),
        kind: MessageKind::Ask as i32,
        require_reply: true,
        ..Default::default()
    };
    let mut askers = Vec::new();
    for (token, handle) in [(&ci, "bob"), (&old, "olga"), (&globex, "gina")] {
        let mut agent = Agent::hello(&server.url, token, handle).await.unwrap();
        let id = agent.rpc.send(ask(&format!("{handle} asks"))).await.unwrap().into_inner().id;
        askers.push((agent, id));
    }
    // Alice has seen them all (so dropping the contact withdraws nothing), then: bob ends his
    // session, olga's machine is revoked, and globex stops being a contact.
    assert_eq!(alice.inbox(0, false).await.unwrap().messages.len(), 3);
    askers[0].0.rpc.goodbye(GoodbyeRequest {}).await.unwrap();
    server.admin_ok(&["machine", "revoke", "acme/old"]);
    server.admin_ok(&["contact", "drop", "acme", "globex"]);

    let pending = alice.rpc.pending_replies(PendingRepliesRequest {}).await.unwrap().into_inner().requests;
    let from: Vec<&str> = pending.iter().map(|m| m.from.as_str()).collect();
    assert_eq!(from, ["acme/ci/bob"], "only the asker that can still get a reply");
    let reply = ReplyRequest { id: askers[0].1.clone(), body: "port 8443".into(), client_id: String::new() };
    alice.rpc.reply(reply).await.expect("an ended asker is answered");
    let pending = alice.rpc.pending_replies(PendingRepliesRequest {}).await.unwrap().into_inner().requests;
    assert!(pending.is_empty(), "{pending:?}");
}

#[tokio::test]
async fn a_second_stream_on_one_session_ends_the_first_at_once() {
    let (_db, server, laptop, ci) = acme(&[]).await;
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let mut first = bob.subscribe(0).await;
    // The first stream is open once its opening heartbeat arrives.
    first.message().await.unwrap().expect("an opening heartbeat");
    let mut second = bob.subscribe(0).await;
    second.message().await.unwrap().expect("an opening heartbeat");

    // Well before the next heartbeat (10 s), the first stream ends, and says why.
    let ended = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match first.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => break None,
                Err(status) => break Some(status),
            }
        }
    })
    .await
    .expect("the first stream ends within 3 s");
    let status = ended.expect("ended with a status");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("newer stream replaced this one"), "{}", status.message());

    // The newer stream carries the endpoint's messages.
    alice.send(&["ci/bob"], "to the newest stream").await.unwrap();
    let got = relay_tests::client::next_message(&mut second, WAIT).await;
    assert_eq!(got.body, "to the newest stream");
}

#[tokio::test]
async fn a_send_whose_answers_are_lost_is_tried_again_with_its_id_and_stored_once() {
    let (_db, server, laptop, ci) = acme(&[]).await;
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let proxy = relay_tests::proxy::LossyProxy::start(&server.url, Duration::from_secs(2)).await;
    let mut alice =
        Bridge::start(BridgeSpec { server: &proxy.url, token: &laptop, handle: Some("alice"), channels: false });
    alice.initialize("2025-06-18").await;
    alice.tool_ok("relay_whoami", json!({})).await;
    // From here, two connections in a row carry the send to the server and lose its answer.
    proxy.lose(2);
    let sent = alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "exactly once, please" })).await;
    assert_eq!(sent["structuredContent"]["recipients"][0]["address"], "acme/ci/bob", "{sent}");
    assert_eq!(proxy.lost.load(std::sync::atomic::Ordering::SeqCst), 2, "answers were lost on the way");
    let inbox = bob.inbox(0, true).await.unwrap();
    let copies = inbox.messages.iter().filter(|m| m.body == "exactly once, please").count();
    assert_eq!(copies, 1, "one copy, whatever the retries: {:?}", inbox.messages);
}
