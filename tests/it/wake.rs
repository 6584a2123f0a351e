//! How an agent learns of mail it was not shown, without a real agent CLI: the server's `Announce`
//! (each message named once, whoever asks; a wait that reads nothing until mail comes, through
//! any replica), the hooks run as an agent's client runs them (`hook wake`, the end-of-turn hooks),
//! and the bridge's own end (quick whatever the relay does, its handle freed when it goes silent).

use std::process::Stdio;
use std::time::Duration;

use relay_proto::v1::{AnnounceRequest, Announcement, ConfirmRequest, DeliveryState, announce_event};
use relay_tests::client::Agent;
use relay_tests::mcp::WAIT;
use relay_tests::pg::TestDb;
use relay_tests::process::{EXIT_LIMIT, exit_within};
use relay_tests::server::{Server, TwoMachines};
use relay_tests::{bin, eventually, short_id, signal};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// One announcement, asked without waiting.
async fn announce_now(agent: &mut Agent) -> Announcement {
    let mut stream = agent.rpc.announce(AnnounceRequest { wait: false }).await.unwrap().into_inner();
    match stream.message().await.unwrap().and_then(|e| e.event) {
        Some(announce_event::Event::Announcement(a)) => a,
        other => panic!("expected an announcement, got {other:?}"),
    }
}

fn ids(a: &Announcement) -> Vec<String> {
    a.messages.iter().map(|m| m.id.clone()).collect()
}

#[tokio::test]
async fn each_message_is_announced_once_whoever_asks_and_only_what_was_not_shown() {
    let w = TwoMachines::start().await;
    let mut alice = Agent::hello(&w.server.url, &w.laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&w.server.url, &w.ci, "bob").await.unwrap();
    let mut sent = Vec::new();
    for body in ["one", "two", "three"] {
        sent.push(bob.send(&["laptop/alice"], body).await.unwrap().id);
    }
    // The third was already shown to the model (a hint named it): it is not announced again.
    alice.rpc.confirm(ConfirmRequest { seqs: vec![3], state: DeliveryState::Surfaced as i32 }).await.unwrap();

    // Two hooks asking at once (a wake hook and an end-of-turn hook) share the mail between them.
    let mut twin =
        Agent { rpc: alice.rpc.clone(), session_token: alice.session_token.clone(), address: alice.address.clone() };
    let (a, b) = tokio::join!(announce_now(&mut alice), announce_now(&mut twin));
    let mut named = [ids(&a), ids(&b)].concat();
    named.sort();
    let mut expected = sent[..2].to_vec();
    expected.sort();
    assert_eq!(named, expected, "each unseen message once: {a:?} {b:?}");
    let with_mail = if a.messages.is_empty() { &b } else { &a };
    assert_eq!(with_mail.unread, 3, "the count of all unread comes with it");
    assert_eq!(with_mail.messages[0].from, "acme/ci/bob");
    assert!(announce_now(&mut alice).await.messages.is_empty(), "nothing is announced twice");

    // Announced is surfaced, not read: the inbox still has all three.
    let inbox = alice.inbox(0, false).await.unwrap();
    assert_eq!(inbox.messages.len(), 3);
}

/// Makes Postgres count calls of PL/pgSQL functions in this test's database.
async fn count_function_calls(db: &TestDb) {
    db.sql().await.batch_execute(&format!("alter database {} set track_functions = 'pl'", db.name)).await.unwrap();
}

/// How many times `relay_announce` ran, as Postgres counts it.
async fn announce_calls(db: &TestDb) -> i64 {
    let row = db
        .sql()
        .await
        .query_opt("select calls from pg_stat_user_functions where funcname = 'relay_announce'", &[])
        .await
        .unwrap();
    row.map_or(0, |r| r.get(0))
}

#[tokio::test]
async fn a_waiting_announcement_reads_nothing_until_mail_comes_through_another_replica() {
    let db = TestDb::new().await;
    count_function_calls(&db).await;
    let one = Server::start(&db).await;
    let two = Server::start(&db).await;
    let laptop = one.machine("acme", "laptop");
    let ci = one.machine("acme", "ci");
    let mut alice = Agent::hello(&one.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&two.url, &ci, "bob").await.unwrap();

    let mut stream = alice.rpc.announce(AnnounceRequest { wait: true }).await.unwrap().into_inner();
    // It opens saying it waits, then says so every 10 s; between, nothing is read.
    let mut waited = 0;
    while waited < 3 {
        let event = tokio::time::timeout(Duration::from_secs(15), stream.message()).await.unwrap().unwrap();
        match event.and_then(|e| e.event) {
            Some(announce_event::Event::Waiting(_)) => waited += 1,
            other => panic!("expected the wait to go on, got {other:?}"),
        }
    }
    let looked = eventually(WAIT, "the first look counted", || async {
        let n = announce_calls(&db).await;
        (n > 0).then_some(n)
    })
    .await;
    assert_eq!(looked, 1, "one look at the start, none while waiting 20 s");

    let id = bob.send(&["laptop/alice"], "done on the other replica").await.unwrap().id;
    let announced = loop {
        let event = tokio::time::timeout(Duration::from_secs(15), stream.message()).await.unwrap().unwrap();
        match event.and_then(|e| e.event) {
            Some(announce_event::Event::Announcement(a)) => break a,
            Some(announce_event::Event::Waiting(_)) => {}
            None => panic!("the stream ended without an announcement"),
        }
    };
    assert_eq!(ids(&announced), [id]);
    assert!(stream.message().await.unwrap().is_none(), "one announcement, then the stream ends");
}

#[tokio::test]
async fn a_waiting_announcement_ends_with_its_session() {
    let w = TwoMachines::start().await;
    let mut alice = Agent::hello(&w.server.url, &w.laptop, "alice").await.unwrap();
    let mut stream = alice.rpc.announce(AnnounceRequest { wait: true }).await.unwrap().into_inner();
    assert!(matches!(stream.message().await.unwrap().and_then(|e| e.event), Some(announce_event::Event::Waiting(_))));
    alice.rpc.goodbye(relay_proto::v1::GoodbyeRequest {}).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(25), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("the wait outlived its session");
    assert_eq!(ended.map(|s| s.code()), Some(tonic::Code::Unauthenticated));
}

/// An agent as its client runs it: a shell (the agent process) with its bridge as a child, which
/// runs hooks as a client does, each with its output and exit status kept in files.
struct StandIn {
    _shell: tokio::process::Child,
    /// The shell's pid, which leads its process group.
    pid: u32,
    stdin: tokio::process::ChildStdin,
    dir: tempfile::TempDir,
    hooks: usize,
}

/// One hook the stand-in ran.
struct HookRun {
    out: std::path::PathBuf,
    err: std::path::PathBuf,
    rc: std::path::PathBuf,
}

impl StandIn {
    async fn start(url: &str, token: &str, handle: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut shell = tokio::process::Command::new("/bin/sh")
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", dir.path())
            // Session files of its own: a hook then finds only this agent's bridge, never one that
            // another test's process started (all of `cargo test`'s tests share one process).
            .env("RELAY_SESSION_DIR", dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = shell.stdin.take().unwrap();
        let pid = shell.id().unwrap();
        let mut agent = Self { _shell: shell, pid, stdin, dir, hooks: 0 };
        // The agent's MCP server: a bridge whose input never ends.
        agent
            .run(&format!(
                "sleep 100000 | RELAY_SERVER={url} RELAY_TOKEN={token} RELAY_CONFIG=/nonexistent {} mcp --handle {handle} --harness claude > /dev/null &",
                bin("agent-bridge").display()
            ))
            .await;
        agent.session_written().await;
        agent
    }

    /// Waits until the bridge has written its session file, which its hooks find it by: it writes
    /// it once the relay took its Hello, a moment after the relay shows the agent online.
    async fn session_written(&self) {
        let sessions = self.dir.path();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let written = std::fs::read_dir(sessions)
                .map(|entries| entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == "toml")))
                .unwrap_or(false);
            if written {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "the bridge wrote no session file within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn run(&mut self, line: &str) {
        self.stdin.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Starts `agent-bridge hook ARGS` with `env` (`NAME=value …`) in the background and `event` on
    /// its stdin, as a client runs a hook.
    async fn hook(&mut self, args: &str, env: &str, event: &str) -> HookRun {
        self.hooks += 1;
        let base = self.dir.path().join(format!("hook-{}", self.hooks));
        let run =
            HookRun { out: base.with_extension("out"), err: base.with_extension("err"), rc: base.with_extension("rc") };
        let input = base.with_extension("in");
        std::fs::write(&input, event).unwrap();
        self.run(&format!(
            "({env} {} hook {args} < {} > {} 2> {}; echo $? > {}.tmp; mv {}.tmp {}) &",
            bin("agent-bridge").display(),
            input.display(),
            run.out.display(),
            run.err.display(),
            run.rc.display(),
            run.rc.display(),
            run.rc.display()
        ))
        .await;
        run
    }

    /// The agent process ends (its bridge and hooks live on, as after a client crashed).
    fn end(&mut self) {
        signal(self.pid, libc::SIGKILL);
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        // SAFETY: a negative pid names the process group the shell led: its bridge, its hooks and
        // what they started go with it.
        unsafe { libc::kill(-(self.pid as libc::pid_t), libc::SIGKILL) };
    }
}

impl HookRun {
    /// Its exit status, stdout and stderr once it ended.
    async fn finished(&self, limit: Duration) -> (i32, String, String) {
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
        let deadline = tokio::time::Instant::now() + limit;
        let rc = loop {
            if let Ok(rc) = read(&self.rc).trim().parse::<i32>() {
                break rc;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the hook did not end within {limit:?}; its stderr:\n{}",
                read(&self.err)
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        (rc, read(&self.out), read(&self.err))
    }

    /// Waits until the hook (a wake hook run as [`WAITER`]) says it waits for mail; fails with what
    /// it said if it ends first or says nothing in time.
    async fn waiting(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let said = std::fs::read_to_string(&self.err).unwrap_or_default();
            if said.contains("waiting for mail") {
                return;
            }
            assert!(!self.ended(), "the waiter ended before it waited; its stderr:\n{said}");
            assert!(
                tokio::time::Instant::now() < deadline,
                "the waiter did not wait within {WAIT:?}; its stderr:\n{said}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn ended(&self) -> bool {
        self.rc.exists()
    }
}

/// Waits until the endpoint at `address` is online, as `agent` lists its account.
async fn online(agent: &mut Agent, address: &str) {
    eventually(WAIT, &format!("{address} to be online"), || {
        let mut rpc = agent.rpc.clone();
        async move {
            let listed =
                rpc.list(relay_proto::v1::ListRequest { all: false, contacts: false }).await.ok()?.into_inner();
            listed.endpoints.iter().any(|e| e.address == address && e.online).then_some(())
        }
    })
    .await
}

/// An interactive session's wake hook, which says in its log when it holds the agent's lock and
/// waits.
const WAITER: &str = "CLAUDE_CODE_ENTRYPOINT=cli RELAY_LOG=agent_bridge::hook=debug";

/// What Claude Code hands a Stop hook on its stdin.
const STOP_EVENT: &str = r#"{"session_id":"s","hook_event_name":"Stop","stop_hook_active":false}"#;

#[tokio::test]
async fn the_wake_hook_tells_an_idle_interactive_agent_of_its_mail_once_and_ends_with_it() {
    let w = TwoMachines::start().await;
    let mut bob = Agent::hello(&w.server.url, &w.ci, "bob").await.unwrap();
    let mut agent = StandIn::start(&w.server.url, &w.laptop, "alice").await;
    online(&mut bob, "acme/laptop/alice").await;
    let early = bob.send(&["laptop/alice"], "sent before anyone waits").await.unwrap().id;

    // Print mode (and the SDKs): the hook ends at once and claims nothing.
    let print = agent.hook("wake", "CLAUDE_CODE_ENTRYPOINT=sdk-cli", STOP_EVENT).await;
    assert_eq!(print.finished(WAIT).await, (0, String::new(), String::new()));
    let tracked = bob.rpc.track(relay_proto::v1::TrackRequest { id: early.clone() }).await.unwrap().into_inner();
    assert_ne!(tracked.recipients[0].state(), DeliveryState::Surfaced, "nothing shown, nothing claimed");

    // Interactive: mail the model was not shown is named at once, on stderr, with exit 2.
    let woken = agent.hook("wake", "CLAUDE_CODE_ENTRYPOINT=cli", STOP_EVENT).await;
    let (rc, out, notice) = woken.finished(WAIT).await;
    assert_eq!((rc, out.as_str()), (2, ""), "{notice}");
    assert!(notice.contains(short_id(&early)) && notice.contains("from acme/ci/bob"), "{notice}");
    assert!(!notice.contains("sent before anyone waits"), "never the body: {notice}");

    // The next stop arms a waiter that waits; a stop while it waits adds none.
    let waiter = agent.hook("wake", WAITER, STOP_EVENT).await;
    waiter.waiting().await;
    let second = agent.hook("wake", "CLAUDE_CODE_ENTRYPOINT=cli", STOP_EVENT).await;
    assert_eq!(second.finished(WAIT).await.0, 0, "one waiter per agent");
    assert!(!waiter.ended(), "the first waiter still waits: nothing new to announce");
    let later = bob.send(&["laptop/alice"], "sent while it waits").await.unwrap().id;
    let (rc, _, notice) = waiter.finished(WAIT).await;
    assert_eq!(rc, 2, "{notice}");
    assert!(notice.contains(short_id(&later)) && !notice.contains(short_id(&early)), "each message once: {notice}");

    // A waiter ends when its agent does.
    let orphan = agent.hook("wake", WAITER, STOP_EVENT).await;
    orphan.waiting().await;
    agent.end();
    assert_eq!(orphan.finished(WAIT).await.0, 0, "ended with its agent");
}

#[tokio::test]
async fn a_waiter_outlives_a_restart_of_the_relay() {
    let db = TestDb::new().await;
    let port = relay_tests::free_port();
    let mut server = Server::start_on(&db, port).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    let mut agent = StandIn::start(&server.url, &laptop, "alice").await;
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    online(&mut bob, "acme/laptop/alice").await;
    let waiter = agent.hook("wake", WAITER, STOP_EVENT).await;
    waiter.waiting().await;

    server.stop().await;
    let _server = Server::start_on(&db, port).await;
    // bob's session lives in the database: its client reconnects to the new process.
    online(&mut bob, "acme/laptop/alice").await;
    let id = bob.send(&["laptop/alice"], "after the restart").await.unwrap().id;
    let (rc, _, notice) = waiter.finished(Duration::from_secs(30)).await;
    assert_eq!(rc, 2, "{notice}");
    assert!(notice.contains(short_id(&id)), "{notice}");
}

#[tokio::test]
async fn a_waiter_ends_when_the_relay_refuses_its_session() {
    let w = TwoMachines::start().await;
    let mut bob = Agent::hello(&w.server.url, &w.ci, "bob").await.unwrap();
    let mut agent = StandIn::start(&w.server.url, &w.laptop, "alice").await;
    online(&mut bob, "acme/laptop/alice").await;
    let waiter = agent.hook("wake", WAITER, STOP_EVENT).await;
    waiter.waiting().await;
    // The machine is revoked: its sessions end, the bridge's too, and it cannot claim another.
    w.server.admin_ok(&["machine", "revoke", "acme/laptop"]);
    let (rc, _, log) = waiter.finished(Duration::from_secs(30)).await;
    assert_eq!(rc, 0, "{log}");
    assert!(log.contains("the relay refused the session"), "{log}");
}

#[tokio::test]
async fn end_of_turn_hooks_hand_unseen_mail_over_once_in_each_clients_words() {
    let w = TwoMachines::start().await;
    let mut bob = Agent::hello(&w.server.url, &w.ci, "bob").await.unwrap();
    let mut agent = StandIn::start(&w.server.url, &w.laptop, "alice").await;
    online(&mut bob, "acme/laptop/alice").await;

    for (hook, key, tool) in [
        ("codex-stop", "reason", "the relay_inbox tool of mcp__relay"),
        ("gemini-after-agent", "reason", "mcp_relay_relay_inbox"),
        ("cursor-stop", "followup_message", "relay_inbox"),
    ] {
        let id = bob.send(&["laptop/alice"], "for the end of the turn").await.unwrap().id;
        let (rc, out, err) = agent.hook(hook, "", "{}").await.finished(WAIT).await;
        assert_eq!(rc, 0, "{hook}: {err}");
        let answer: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{hook} printed {out:?}: {e}"));
        let notice = answer[key].as_str().unwrap_or_default();
        assert!(
            notice.contains(short_id(&id)) && notice.contains(&format!("Read them with {tool}.")),
            "{hook}: {answer}"
        );
        if hook != "cursor-stop" {
            assert!(answer["decision"] == "block" || answer["decision"] == "deny", "{hook}: {answer}");
        }
        // The next end of the turn finds nothing new and lets the turn end.
        let (rc, out, _) = agent.hook(hook, "", "{}").await.finished(WAIT).await;
        assert_eq!((rc, out.as_str()), (0, ""), "{hook} holds a turn once per message");
    }
}

/// A bridge of `handle` whose session is up.
async fn connected(w: &TwoMachines, handle: &str) -> relay_tests::mcp::Bridge {
    let mut b = relay_tests::mcp::bridge(&w.server.url, &w.laptop, handle);
    b.initialize("2025-06-18").await;
    b.tool_ok("relay_whoami", serde_json::json!({})).await;
    b
}

/// Waits until a new bridge can claim `handle`: the one that held it let go (or the server let go
/// for it).
async fn claimable(w: &TwoMachines, handle: &str, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let mut b = relay_tests::mcp::bridge(&w.server.url, &w.laptop, handle);
        b.initialize("2025-06-18").await;
        let me = b.tool("relay_whoami", serde_json::json!({})).await;
        if me["structuredContent"]["address"] == format!("acme/laptop/{handle}") {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{handle} was not free again within {limit:?}: {me}");
        b.close();
        exit_within(&mut b.child, EXIT_LIMIT, "the bridge to exit").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_bridge_ends_within_two_seconds_of_a_signal_or_its_input_closing_even_with_the_relay_frozen() {
    let w = TwoMachines::start().await;
    let mut bridges = Vec::new();
    for handle in ["term", "int", "input"] {
        bridges.push((handle, connected(&w, handle).await));
    }
    {
        let _frozen = relay_tests::Frozen::new(w.server.pid());
        for (handle, b) in &mut bridges {
            let asked = tokio::time::Instant::now();
            match *handle {
                "term" => assert!(signal(b.child.id().unwrap(), libc::SIGTERM)),
                "int" => assert!(signal(b.child.id().unwrap(), libc::SIGINT)),
                _ => b.close(),
            }
            let status = tokio::time::timeout(Duration::from_secs(10), b.child.wait())
                .await
                .unwrap_or_else(|_| panic!("{handle}: the bridge did not end"))
                .unwrap();
            let took = asked.elapsed();
            assert!(status.success(), "{handle}: {status}");
            assert!(took < Duration::from_secs(2), "{handle}: the bridge took {took:?} to end");
        }
    }
    // The relay, back, sees the connections gone and frees the handles within seconds.
    for (handle, _) in &bridges {
        claimable(&w, handle, Duration::from_secs(20)).await;
    }
}

#[tokio::test]
async fn the_handle_of_a_bridge_gone_silent_is_freed_within_seconds() {
    let w = TwoMachines::start().await;
    let silent = connected(&w, "alice").await;
    let _frozen = relay_tests::Frozen::new(silent.child.id().unwrap());
    // Nothing more comes from it, not even an answer to a ping: the server's keepalive (10 s, then
    // 5 s for the answer) closes its connection, its stream with it.
    claimable(&w, "alice", Duration::from_secs(30)).await;
}
