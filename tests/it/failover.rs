//! Several replicas in `RELAY_SERVER`: the bridge, the worker and the person's commands move to the
//! next when one fails, and carry on there as the same endpoint, with the same inbox and lease.

use std::process::Stdio;
use std::time::Duration;

use relay_proto::v1::RegisterRepoRequest;
use relay_proto::v1::worker_client::WorkerClient;
use relay_tests::agent::StandIn;
use relay_tests::client::{Bearer, channel};
use relay_tests::mcp::{Bridge, BridgeSpec, WAIT, bridge, text};
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithin, RunWithinAsync};
use relay_tests::server::{Server, human};
use relay_tests::{bin, eventually, free_port};
use serde_json::json;

#[tokio::test]
async fn a_bridge_moves_to_the_next_replica_with_its_handle_and_inbox() {
    let db = TestDb::new().await;
    let (mut a, b) = tokio::join!(Server::start(&db), Server::start(&db));
    let laptop = a.machine("acme", "laptop");
    let ci = a.machine("acme", "ci");
    let mut alice = bridge(&b.url, &laptop, "alice");
    let session_dir = tempfile::tempdir().unwrap();
    let session_file = session_dir.path().join("bob.toml");
    // Whitespace around the comma, and a replica named twice, are taken in stride.
    let replicas = format!(" {} , {},{}", a.url, b.url, a.url);
    let spec = BridgeSpec { server: &replicas, token: &ci, handle: Some("bob"), channels: true };
    let mut bob = Bridge::start_with_env(spec, &[("RELAY_SESSION_FILE", session_file.as_os_str())]);
    alice.initialize("2025-06-18").await;
    bob.initialize_with_channels().await;

    // Bob's bridge is on the first replica: its session and push stream are there.
    alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "before" })).await;
    let first = bob.notification("notifications/claude/channel", WAIT).await;
    assert_eq!(first["params"]["meta"]["seq"], "1");
    let held = std::fs::read_to_string(&session_file).unwrap();
    assert!(held.contains(&format!("server = \"{},{}\"", a.url, b.url)), "{held}");

    a.crash();

    // A message sent now reaches bob through the other replica, pushed once, after the first.
    alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "after" })).await;
    let next = bob.notification("notifications/claude/channel", Duration::from_secs(20)).await;
    assert_eq!(next["params"]["meta"]["seq"], "2", "the next push is the new message, not a repeat: {next}");
    assert!(next["params"]["content"].as_str().unwrap().contains("after"), "{next}");

    // The same endpoint, resumed there: its handle, its inbox, its session.
    let me = bob.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(me["structuredContent"]["address"], "acme/ci/bob", "{}", text(&me));
    let inbox = bob.tool_ok("relay_inbox", json!({})).await;
    let bodies: Vec<&str> = inbox["structuredContent"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["before", "after"], "{}", text(&inbox));
    bob.tool_ok("relay_send", json!({ "to": "laptop/alice", "body": "through b" })).await;
    let got = alice.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    assert_eq!(got["structuredContent"]["messages"][0]["body"], "through b", "{}", text(&got));
    assert_eq!(got["structuredContent"]["messages"][0]["from"], "acme/ci/bob");

    // Programs the agent starts (spawn, hooks) now begin at the replica that answers.
    let resumed_there = format!("server = \"{},{}\"", b.url, a.url);
    eventually(WAIT, "the session file to name the second replica first", || {
        let found = std::fs::read_to_string(&session_file).unwrap_or_default().contains(&resumed_there);
        async move { found.then_some(()) }
    })
    .await;

    // Nothing is pushed twice: the next push is the next message.
    alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "third" })).await;
    let third = bob.notification("notifications/claude/channel", WAIT).await;
    assert_eq!(third["params"]["meta"]["seq"], "3", "{third}");
}

#[tokio::test]
async fn a_replica_down_from_the_start_is_passed_over_and_a_bad_url_refused() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let down = format!("http://127.0.0.1:{}", free_port());
    let replicas = format!("{down},{}", server.url);

    // A bad URL anywhere in the list is named, and the bridge does not start.
    let refused = tokio::process::Command::new(bin("agent-bridge"))
        .args(["mcp", "--handle", "alice"])
        .env("RELAY_SERVER", format!("{replicas}, ftp://relay.example:7447"))
        .env("RELAY_TOKEN", &laptop)
        .env("RELAY_CONFIG", "/nonexistent/bridge.toml")
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(said.contains("\"ftp://relay.example:7447\"") && said.contains("use http:// or https://"), "{said}");
    assert!(refused.stdout.is_empty(), "nothing but MCP on stdout");

    // The first replica never answers: the bridge claims its handle on the second.
    let mut alice = bridge(&replicas, &laptop, "alice");
    alice.initialize("2025-06-18").await;
    let me = alice.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(me["structuredContent"]["address"], "acme/laptop/alice");

    // `login` checks the token where it can and keeps the list, each replica once.
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("bridge.toml");
    let login = tokio::process::Command::new(bin("agent-bridge"))
        .args(["login", "--server", &format!("{down} , {}", server.url), "--token", &laptop])
        .env("RELAY_CONFIG", &config)
        .env_remove("RELAY_SERVER")
        .env_remove("RELAY_TOKEN")
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .await
        .unwrap();
    assert!(login.status.success(), "{}", String::from_utf8_lossy(&login.stderr));
    let stored = std::fs::read_to_string(&config).unwrap();
    assert!(stored.contains(&format!("server = \"{replicas}\"")), "{stored}");
    // A bridge configured by that file reaches the server too.
    let mut configured = Bridge::start_configured(&config, "carol");
    configured.initialize("2025-06-18").await;
    let me = configured.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(me["structuredContent"]["address"], "acme/laptop/carol");

    // A person's commands as well.
    let token = server.admin_ok(&["human", "add", "acme"]);
    let (ok, out) = human(&replicas, &token, &["contact", "list"]).await;
    assert!(ok, "{out}");
    let (ok, out) = human(&format!("{replicas},http://"), &token, &["contact", "list"]).await;
    assert!(!ok && out.contains("\"http://\"") && out.contains("no host"), "{out}");
}

#[tokio::test]
async fn a_worker_keeps_its_card_and_lease_when_its_replica_stops() {
    let db = TestDb::new().await;
    let (mut a, b) = tokio::join!(Server::start(&db), Server::start(&db));
    let laptop = a.machine("acme", "laptop");
    let ci = a.machine("acme", "ci");
    a.admin_ok(&["operator", "acme", "laptop/alice"]);
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("app");
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(&repo)
            .status_within(COMMAND_LIMIT)
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    std::fs::create_dir_all(&repo).unwrap();
    git(&["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README"), "app\n").unwrap();
    git(&["add", "README"]);
    git(&["-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "initial"]);
    let mut register = WorkerClient::with_interceptor(channel(&b.url).await, Bearer::new(&ci));
    register.register_repo(RegisterRepoRequest { path: repo.display().to_string() }).await.unwrap();
    // Waits for the test's go-ahead; its bridge gets the worker's replicas.
    let agent = StandIn { gated: true, ..StandIn::default() }.write(dir.path(), "stand-in.sh");
    let go = dir.path().join("go");

    let mut alice = bridge(&b.url, &laptop, "alice");
    alice.initialize("2025-06-18").await;
    let posted =
        alice.tool_ok("post_job", json!({ "title": "Write result.txt", "repo": "app", "requires_pr": false })).await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();

    let worker = tokio::process::Command::new(bin("agent-bridge"))
        .arg("worker")
        .arg("--worktrees")
        .arg(dir.path().join("worktrees"))
        .arg("--agent")
        .arg(format!("claude={} {{prompt}}", agent.display()))
        .args(["--poll-ms", "100", "--once"])
        .env("BRIDGE", bin("agent-bridge"))
        .env("GO", &go)
        .env("RELAY_SERVER", format!("{},{}", a.url, b.url))
        .env("RELAY_TOKEN", &ci)
        .env("RELAY_CONFIG", "/nonexistent/bridge.toml")
        .env_remove("RELAY_LOG")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    // The worker claims the card through the first replica; then that replica stops.
    let sql = db.sql().await;
    let card_state = |id: String| {
        let sql = &sql;
        async move {
            let row = sql.query_one("select state, agent_state from jobs where id = $1", &[&id]).await.unwrap();
            (row.get::<_, String>(0), row.get::<_, Option<String>>(1).unwrap_or_default())
        }
    };
    eventually(Duration::from_secs(30), "the worker to start the card's agent", || {
        let id = id.clone();
        async move {
            let (state, agent_state) = card_state(id).await;
            (state == "in_progress" && agent_state == "starting").then_some(())
        }
    })
    .await;
    assert!(a.stop().await.success());

    // Its next lease renewal goes to the second replica: the card stays the worker's.
    eventually(Duration::from_secs(30), "a lease renewal through the second replica", || {
        let id = id.clone();
        async move {
            let (state, agent_state) = card_state(id).await;
            assert_eq!(state, "in_progress", "the lease held");
            agent_state.starts_with("running (pid").then_some(())
        }
    })
    .await;

    // The agent finishes through its own bridge, and the worker releases the card, both there.
    std::fs::write(&go, "").unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), worker.wait_with_output())
        .await
        .expect("the worker runs one card")
        .unwrap();
    let logged = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "worker: {logged}");
    assert!(
        logged.contains("moved to the next") && logged.contains(&format!("to={}", b.url)),
        "the move is logged, naming the replica: {logged}"
    );
    let read = alice.tool_ok("read_job", json!({ "id": id })).await;
    let s = &read["structuredContent"];
    assert_eq!(s["state"], "review", "{s}");
    assert_eq!(s["agent_state"], "exited with code 0", "{s}");
    assert_eq!(s["attempts"], 1, "one attempt, never lost: {s}");
    assert_eq!(s["summary"], format!("committed result.txt on relay/{id}"), "{s}");
}
