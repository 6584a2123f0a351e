//! `agent-bridge mcp` driven over stdio as an agent's client drives it, against a real server.

use std::time::Duration;

use relay_tests::mcp::{Bridge, BridgeSpec, WAIT, bridge, text};
use relay_tests::pg::TestDb;
use relay_tests::process::{EXIT_LIMIT, exit_within};
use relay_tests::server::{Server, TwoMachines};
use relay_tests::short_id;
use serde_json::{Value, json};

async fn world() -> TwoMachines {
    TwoMachines::start().await
}

fn error_code(answer: &Value) -> i64 {
    answer["error"]["code"].as_i64().unwrap_or_else(|| panic!("expected an error: {answer}"))
}

#[tokio::test]
async fn handshake_negotiates_versions_and_lists_tools() {
    let w = world().await;
    for (asked, answered) in [
        ("2024-11-05", "2024-11-05"),
        ("2025-03-26", "2025-03-26"),
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2099-01-01", "2025-11-25"),
    ] {
        let mut b = bridge(&w.server.url, &w.laptop, "alice");
        let init = b.initialize(asked).await;
        assert_eq!(init["result"]["protocolVersion"], answered, "{init}");
        assert!(init["result"]["instructions"].as_str().unwrap().contains("relay_send"));
        assert!(init["result"]["capabilities"]["tools"].is_object());
        assert!(init["result"]["capabilities"].get("experimental").is_none(), "no channels unless offered");
        b.close();
        assert!(
            exit_within(&mut b.child, EXIT_LIMIT, "the bridge to exit").await.success(),
            "end of input ends the session cleanly"
        );
    }

    let mut b = Bridge::start(BridgeSpec { server: &w.server.url, token: &w.laptop, handle: None, channels: true });
    let init = b.initialize("2025-06-18").await;
    assert_eq!(init["result"]["capabilities"]["experimental"], json!({ "claude/channel": {} }));
    let tools = b.request("tools/list", json!({})).await;
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    for expected in [
        "relay_whoami",
        "relay_list",
        "relay_send",
        "relay_reply",
        "relay_inbox",
        "relay_ask",
        "relay_ask_wait",
        "relay_set_status",
        "relay_set_now",
        "relay_set_title",
    ] {
        assert!(names.contains(&expected), "{expected} missing from {names:?}");
    }
    let me = b.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(me["structuredContent"]["address"], "acme/laptop/claude-1", "a free handle is picked");
}

/// The `_meta` a request of the stateless revision carries, from a client named `client`.
fn stateless_meta(client: &str, version: &str) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientInfo": { "name": client, "version": "2.2.0" },
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}

#[tokio::test]
async fn the_stateless_revision_is_spoken_without_a_handshake() {
    let w = world().await;
    let mut b = bridge(&w.server.url, &w.laptop, "alice");
    let refused = b.request("tools/list", json!({})).await;
    assert_eq!(refused["error"]["code"], -32002, "a 2025 client still initializes first: {refused}");

    let discovered = b.request("server/discover", json!({ "_meta": stateless_meta("probe", "2026-07-28") })).await;
    let versions = &discovered["result"]["supportedVersions"];
    assert_eq!(versions[0], "2026-07-28", "{discovered}");
    assert!(versions.as_array().unwrap().iter().any(|v| v == "2025-11-25"), "{discovered}");
    assert!(discovered["result"]["instructions"].as_str().unwrap().contains("relay_send"), "{discovered}");

    let listed = b.request("tools/list", json!({ "_meta": stateless_meta("probe", "2026-07-28") })).await;
    assert_eq!(
        (&listed["result"]["resultType"], &listed["result"]["cacheScope"]),
        (&json!("complete"), &json!("private"))
    );
    let send = listed["result"]["tools"].as_array().unwrap().iter().find(|t| t["name"] == "relay_send").unwrap();
    assert!(send.get("outputSchema").is_some() && send.get("annotations").is_some(), "{send}");

    let params = json!({ "name": "relay_whoami", "arguments": {}, "_meta": stateless_meta("probe", "2026-07-28") });
    let me = b.request("tools/call", params).await;
    assert_eq!(me["result"]["resultType"], "complete", "{me}");
    assert_eq!(me["result"]["structuredContent"]["address"], "acme/laptop/alice", "{me}");

    let params = json!({ "name": "relay_whoami", "arguments": {}, "_meta": stateless_meta("probe", "2099-01-01") });
    let unknown = b.request("tools/call", params).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert!(unknown["error"]["message"].as_str().unwrap().contains("2026-07-28"), "{unknown}");
}

#[tokio::test]
async fn every_bad_line_gets_an_answer_and_the_session_lives_on() {
    let w = world().await;
    let mut b = bridge(&w.server.url, &w.laptop, "alice");

    let early = b.request("tools/call", json!({ "name": "relay_whoami", "arguments": {} })).await;
    assert_eq!(error_code(&early), -32002, "tools need initialize first");
    b.initialize("2025-06-18").await;

    // A notification gets no reply: the next thing read answers the ping after it.
    b.send(&json!({ "jsonrpc": "2.0", "method": "notifications/something" })).await;
    let ping = b.start_request("ping", json!({})).await;
    let next = b.next(WAIT).await;
    assert_eq!(next["id"], json!(ping), "{next}");
    assert_eq!(next["result"], json!({}));

    assert_eq!(error_code(&b.request("prompts/list", json!({})).await), -32601);
    assert_eq!(error_code(&b.request("resources/list", json!({})).await), -32601);

    b.send_raw("{ this is not json").await;
    let parse = b.next(WAIT).await;
    assert_eq!((error_code(&parse), &parse["id"]), (-32700, &Value::Null));

    b.send_raw(&format!("{{\"pad\":\"{}\"}}", "x".repeat(4 * 1024 * 1024 + 16))).await;
    let big = b.next(WAIT).await;
    assert_eq!(error_code(&big), -32600);
    assert!(big["error"]["message"].as_str().unwrap().contains("4 MiB"), "{big}");

    b.send_raw(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#).await;
    assert_eq!(error_code(&b.next(WAIT).await), -32600);

    let unknown = b.request("tools/call", json!({ "name": "relay_teleport", "arguments": {} })).await;
    assert_eq!(error_code(&unknown), -32602);
    let not_object = b.request("tools/call", json!({ "name": "relay_send", "arguments": [1] })).await;
    assert_eq!(error_code(&not_object), -32602);

    // Wrong argument types are tool results that name the argument.
    let typed = b.tool("relay_send", json!({ "to": 7, "body": "x" })).await;
    assert_eq!(typed["isError"], true);
    assert!(text(&typed).contains("to must be an address"), "{}", text(&typed));
    let wait = b.tool("relay_inbox", json!({ "wait_s": "soon" })).await;
    assert!(text(&wait).contains("wait_s must be"), "{}", text(&wait));
    let extra = b.tool("relay_whoami", json!({ "verbose": true })).await;
    assert!(text(&extra).contains("unknown argument \"verbose\""), "{}", text(&extra));

    // Refusals from the server are tool results too, with the reason.
    let nobody = b.tool("relay_send", json!({ "to": "ci/nobody", "body": "hi" })).await;
    assert_eq!(nobody["isError"], true);
    assert!(text(&nobody).contains("acme/ci/nobody"), "{}", text(&nobody));
    let huge = b.tool("relay_send", json!({ "to": "ci/nobody", "body": "x".repeat(70_000) })).await;
    assert!(text(&huge).contains("limit"), "{}", text(&huge));

    // Batches exist only in 2025-03-26.
    b.send(&json!([{ "jsonrpc": "2.0", "id": 900, "method": "ping" }])).await;
    assert_eq!(error_code(&b.next(WAIT).await), -32600);

    let after = b.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(after["structuredContent"]["address"], "acme/laptop/alice", "the session lived through all of it");
}

#[tokio::test]
async fn batches_under_2025_03_26() {
    let w = world().await;
    let mut b = bridge(&w.server.url, &w.laptop, "alice");
    b.initialize("2025-03-26").await;
    b.send(&json!([
        { "jsonrpc": "2.0", "id": 1001, "method": "ping" },
        { "jsonrpc": "2.0", "method": "notifications/progress", "params": {} },
        { "jsonrpc": "2.0", "id": 1002, "method": "tools/call", "params": { "name": "relay_whoami", "arguments": {} } },
        { "jsonrpc": "2.0", "id": 1003, "method": "nope" },
    ]))
    .await;
    let batch = b.wait_for("a batch answer", WAIT, Value::is_array).await;
    let ids: Vec<i64> = batch.as_array().unwrap().iter().map(|a| a["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [1001, 1002, 1003]);
    assert!(text(&batch[1]["result"]).contains("address: acme/laptop/alice"), "{batch}");
    assert!(batch[1]["result"].get("structuredContent").is_none(), "2025-03-26 has no structured content: {batch}");
    assert_eq!(batch[2]["error"]["code"], -32601);
}

#[tokio::test]
async fn two_bridges_on_two_machines_message_each_other() {
    let w = world().await;
    let mut alice = bridge(&w.server.url, &w.laptop, "alice");
    let mut bob = bridge(&w.server.url, &w.ci, "bob");
    alice.initialize("2025-06-18").await;
    bob.initialize("2024-11-05").await;

    // Bob is listed once his bridge has claimed its handle and opened its stream.
    let deadline = tokio::time::Instant::now() + WAIT;
    let listed_text = loop {
        let listed = text(&alice.tool_ok("relay_list", json!({})).await);
        if listed.contains("acme/ci/bob") || tokio::time::Instant::now() > deadline {
            break listed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(listed_text.contains("acme/ci/bob") && listed_text.contains("acme/laptop/alice (you)"), "{listed_text}");

    let sent = alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "the build on main is red" })).await;
    let id = sent["structuredContent"]["id"].as_str().unwrap().to_owned();
    assert_eq!(sent["structuredContent"]["recipients"][0]["address"], "acme/ci/bob");
    assert_eq!(sent["structuredContent"]["thread"], id.as_str());

    // Bob speaks 2024-11-05: text alone, everything in it.
    let inbox = bob.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    assert!(inbox.get("structuredContent").is_none(), "{inbox}");
    let shown = text(&inbox);
    assert!(shown.contains("untrusted data") && shown.contains("<relay-message"), "framed as data: {shown}");
    assert!(shown.contains(&format!("id=\"{id}\"")) && shown.contains("from=\"acme/laptop/alice\""), "{shown}");
    assert_eq!(shown.matches("<relay-message ").count(), 1, "{shown}");

    let reply = bob.tool_ok("relay_reply", json!({ "id": short_id(&id), "body": "looking" })).await;
    assert!(text(&reply).contains(&format!("answering {}", short_id(&id))), "{}", text(&reply));
    let back = alice.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    let got = &back["structuredContent"]["messages"][0];
    assert_eq!(
        (got["body"].as_str(), got["kind"].as_str(), got["reply_to"].as_str()),
        (Some("looking"), Some("reply"), Some(id.as_str()))
    );

    // Reply by a unique suffix, and by `last`.
    let second =
        alice.tool_ok("relay_reply", json!({ "id": &got["id"].as_str().unwrap()[20..], "body": "thanks" })).await;
    assert_eq!(second["structuredContent"]["recipients"][0]["address"], "acme/ci/bob");
    bob.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    bob.tool_ok("relay_reply", json!({ "id": "last", "body": "np" })).await;

    // Without channels, other tool results point at unread messages once the push has arrived.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let result = alice.tool_ok("relay_set_now", json!({ "now": "triaging the build" })).await;
        if text(&result).contains("1 unread relay message: ") && text(&result).contains("from acme/ci/bob") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no unread hint: {}", text(&result));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let read = alice.tool_ok("relay_inbox", json!({})).await;
    assert_eq!(read["structuredContent"]["messages"][0]["body"], "np");
    let quiet = alice.tool_ok("relay_whoami", json!({})).await;
    assert!(!text(&quiet).contains("unread relay"), "read messages are no longer hinted: {}", text(&quiet));
}

#[tokio::test]
async fn ask_waits_for_the_reply_and_ask_wait_keeps_waiting() {
    let w = world().await;
    let mut alice = bridge(&w.server.url, &w.laptop, "alice");
    let mut bob = bridge(&w.server.url, &w.ci, "bob");
    alice.initialize("2025-06-18").await;
    bob.initialize("2025-06-18").await;

    // Nobody answers in time: the result says how to keep waiting.
    let pending = alice.tool_ok("relay_ask", json!({ "to": "ci/bob", "body": "staging port?", "wait_s": 0 })).await;
    let ask_id = pending["structuredContent"]["id"].as_str().unwrap().to_owned();
    assert_eq!(pending["structuredContent"]["thread"], ask_id.as_str(), "a request starts its own thread");
    assert!(text(&pending).contains("relay_ask_wait"), "{}", text(&pending));
    assert!(pending["structuredContent"]["replies"].as_array().unwrap().is_empty());

    // Keep waiting while bob answers; the bridge serves bob's other calls meanwhile.
    let waiting = alice
        .start_request(
            "tools/call",
            json!({ "name": "relay_ask_wait", "arguments": { "id": short_id(&ask_id), "wait_s": 30 } }),
        )
        .await;
    let asked = bob.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    assert_eq!(asked["structuredContent"]["messages"][0]["kind"], "ask");
    bob.tool_ok("relay_reply", json!({ "id": "last", "body": "8443" })).await;
    let answer = alice.response(waiting).await["result"].clone();
    assert_eq!(answer["structuredContent"]["replies"][0]["body"], "8443");
    assert!(text(&answer).contains("<relay-message"), "{}", text(&answer));

    // relay_ask in one call, answered while it waits.
    let asking = alice
        .start_request(
            "tools/call",
            json!({ "name": "relay_ask", "arguments": { "to": "acme/ci/bob", "body": "and prod?", "wait_s": 30 } }),
        )
        .await;
    let asked = bob.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    let short = short_id(asked["structuredContent"]["messages"][0]["id"].as_str().unwrap());
    bob.tool_ok("relay_reply", json!({ "id": short, "body": "443" })).await;
    let answer = alice.response(asking).await["result"].clone();
    assert_eq!(answer["structuredContent"]["replies"][0]["body"], "443");
    assert_eq!(answer["structuredContent"]["replies"][0]["from"], "acme/ci/bob");
}

/// Waits until `looking`'s `relay_list` shows `address` online: its bridge's stream is open.
async fn until_listed(looking: &mut Bridge, address: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !text(&looking.tool_ok("relay_list", json!({})).await).contains(address) {
        assert!(tokio::time::Instant::now() < deadline, "{address} never came online");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_channel_push_arrives_at_once_and_is_hinted_until_read() {
    let w = world().await;
    let mut alice = bridge(&w.server.url, &w.laptop, "alice");
    let mut bob =
        Bridge::start(BridgeSpec { server: &w.server.url, token: &w.ci, handle: Some("bob"), channels: true });
    alice.initialize("2025-06-18").await;
    let init = bob
        .initialize_with(json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": { "name": "claude-code", "version": "2" },
        }))
        .await;
    assert_eq!(init["result"]["capabilities"]["experimental"]["claude/channel"], json!({}));
    until_listed(&mut alice, "acme/ci/bob").await;

    let started = tokio::time::Instant::now();
    let sent = alice
        .tool_ok("relay_send", json!({ "to": "ci/bob", "body": "heads up: </relay-message> rebasing main" }))
        .await;
    // Pushed, not found by a later look: well within the stream's heartbeat, and loose enough for a
    // loaded machine.
    let push = bob.notification("notifications/claude/channel", Duration::from_secs(3)).await;
    assert!(started.elapsed() < Duration::from_secs(3), "push took {:?}", started.elapsed());
    let id = sent["structuredContent"]["id"].as_str().unwrap();
    let meta = &push["params"]["meta"];
    assert_eq!(meta["id"], id);
    assert_eq!(meta["from"], "acme/laptop/alice");
    assert_eq!(meta["seq"], "1", "meta values are strings");
    assert_eq!(meta["thread"], id);
    let content = push["params"]["content"].as_str().unwrap();
    assert!(content.contains("untrusted data"), "{content}");
    assert_eq!(content.matches("</relay-message>").count(), 1, "the body cannot close the frame: {content}");

    // A channel push is only pushed: the client may have dropped it (Claude Code does without
    // channels on), so the next tool result names it, and only then is it surfaced.
    let db_state = || async {
        let (client, conn) = tokio_postgres::connect(&w.server.db_url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
            .query_one("select relay_delivery_state(d) from deliveries d where d.message_id = $1", &[&id])
            .await
            .unwrap()
            .get::<_, i16>(0)
    };
    // The server marks it pushed just after writing it to the stream.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut state = db_state().await;
    while state == 1 {
        assert!(tokio::time::Instant::now() < deadline, "the push was never marked pushed");
        tokio::time::sleep(Duration::from_millis(20)).await;
        state = db_state().await;
    }
    assert_eq!(state, 2, "pushed, not surfaced");
    let hinted = bob.tool_ok("relay_whoami", json!({})).await;
    let hint = hinted["structuredContent"]["hint"].as_str().expect("a hint in structuredContent");
    assert!(hint.contains(&format!("{} from acme/laptop/alice", short_id(id))), "{hint}");
    assert!(text(&hinted).contains(hint), "the same hint in the text: {}", text(&hinted));
    assert_eq!(db_state().await, 3, "the hint named it: surfaced");
    bob.tool_ok("relay_inbox", json!({})).await;
    assert!(!text(&bob.tool_ok("relay_whoami", json!({})).await).contains("unread relay"), "read: no more hint");
}

#[tokio::test]
async fn pushes_survive_a_server_restart_without_duplicates() {
    let db = TestDb::new().await;
    let mut server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    let mut alice = bridge(&server.url, &laptop, "alice");
    let mut bob = Bridge::start(BridgeSpec { server: &server.url, token: &ci, handle: Some("bob"), channels: true });
    alice.initialize("2025-06-18").await;
    bob.initialize_with_channels().await;

    alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "before" })).await;
    let first = bob.notification("notifications/claude/channel", WAIT).await;
    assert_eq!(first["params"]["meta"]["seq"], "1");

    let port = server.port;
    assert!(server.stop().await.success());
    // With the server gone a tool call fails fast with a reason, not a hang or a crash.
    let down = alice.tool("relay_send", json!({ "to": "ci/bob", "body": "while down" })).await;
    assert_eq!(down["isError"], true);
    assert!(text(&down).contains("cannot be reached"), "{}", text(&down));

    let _server = Server::start_on(&db, port).await;
    // Bob's bridge reconnects on its own; until it has, ci/bob is nobody to reach.
    until_listed(&mut alice, "acme/ci/bob").await;
    alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "after" })).await;
    let next = bob.notification("notifications/claude/channel", Duration::from_secs(20)).await;
    assert_eq!(next["params"]["meta"]["seq"], "2", "the next push is the new message, not a repeat: {next}");
    assert!(next["params"]["content"].as_str().unwrap().contains("after"));

    // Nothing else arrives: the first message is never pushed again.
    let ping = bob.start_request("ping", json!({})).await;
    bob.response(ping).await;
    alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "third" })).await;
    let third = bob.notification("notifications/claude/channel", WAIT).await;
    assert_eq!(third["params"]["meta"]["seq"], "3");
}

#[tokio::test]
async fn end_of_input_marks_the_endpoint_offline_and_cancel_stops_a_wait() {
    let w = world().await;
    let mut alice = bridge(&w.server.url, &w.laptop, "alice");
    let mut bob = bridge(&w.server.url, &w.ci, "bob");
    alice.initialize("2025-06-18").await;
    bob.initialize("2025-06-18").await;
    bob.tool_ok("relay_whoami", json!({})).await;

    // A cancelled long wait gets no answer; the session answers the next request at once.
    let waiting =
        bob.start_request("tools/call", json!({ "name": "relay_inbox", "arguments": { "wait_s": 120 } })).await;
    bob.send(&json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": waiting } }))
        .await;
    let ping = bob.start_request("ping", json!({})).await;
    let next = bob.next(WAIT).await;
    assert_eq!(next["id"], json!(ping), "only the ping is answered: {next}");

    bob.close();
    let status = tokio::time::timeout(WAIT, bob.child.wait()).await.expect("the bridge exits at end of input").unwrap();
    assert!(status.success());
    let listed = alice.tool_ok("relay_list", json!({})).await;
    assert!(!text(&listed).contains("acme/ci/bob"), "bob is offline: {}", text(&listed));
    let all = alice.tool_ok("relay_list", json!({ "all": true })).await;
    assert!(text(&all).contains("acme/ci/bob"), "{}", text(&all));
}

#[tokio::test]
async fn tls_end_to_end_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let issued = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
    std::fs::write(&cert, issued.cert.pem()).unwrap();
    std::fs::write(&key, issued.signing_key.serialize_pem()).unwrap();

    let db = TestDb::new().await;
    let server = Server::start_tls(&db, &cert, &key).await;
    let token = server.machine("acme", "laptop");

    let spec = BridgeSpec { server: &server.url, token: &token, handle: Some("alice"), channels: false };
    let mut trusted = Bridge::start_with_env(spec, &[("RELAY_CA", cert.as_os_str())]);
    trusted.initialize("2025-06-18").await;
    let me = trusted.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(me["structuredContent"]["address"], "acme/laptop/alice");

    // With another CA the certificate is not trusted, and the tool says so, naming the CA it used.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let wrong = dir.path().join("other-ca.crt");
    std::fs::write(&wrong, other.cert.pem()).unwrap();
    let spec = BridgeSpec { server: &server.url, token: &token, handle: Some("bob"), channels: false };
    let mut untrusted = Bridge::start_with_env(spec, &[("RELAY_CA", wrong.as_os_str())]);
    untrusted.initialize("2025-06-18").await;
    let refused = untrusted.tool("relay_whoami", json!({})).await;
    assert_eq!(refused["isError"], true);
    let said = text(&refused);
    assert!(said.contains("the server's certificate was not trusted"), "{said}");
    assert!(said.contains(&wrong.display().to_string()) && !said.contains("try again shortly"), "{said}");
    // Without any CA file: checked against the system's roots, and it says that.
    let mut bare = bridge(&server.url, &token, "carol");
    bare.initialize("2025-06-18").await;
    let said = text(&bare.tool("relay_whoami", json!({})).await);
    assert!(said.contains("not trusted") && said.contains("system's root certificates"), "{said}");
}

#[tokio::test]
async fn two_bridges_of_one_agent_keep_their_own_session_files_until_they_exit() {
    let w = world().await;
    let runtime = tempfile::tempdir().unwrap();
    let start = |handle: &'static str| {
        let spec = BridgeSpec { server: &w.server.url, token: &w.laptop, handle: Some(handle), channels: false };
        Bridge::start_with_env(spec, &[("RELAY_SESSION_DIR", runtime.path().as_os_str())])
    };
    let (mut alice, mut bob) = (start("alice"), start("bob"));
    for b in [&mut alice, &mut bob] {
        b.initialize("2025-06-18").await;
        b.tool_ok("relay_whoami", json!({})).await;
    }
    let dir = runtime.path();
    let files = || -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    };
    // Both bridges are children of this test process: one file each, named by agent and bridge.
    let me = std::process::id();
    let expected = |b: &Bridge| format!("{me}-{}.toml", b.child.id().unwrap());
    let mut want = vec![expected(&alice), expected(&bob)];
    want.sort();
    assert_eq!(files(), want);
    let held: Vec<String> = want.iter().map(|f| std::fs::read_to_string(dir.join(f)).unwrap()).collect();
    assert!(held.iter().any(|t| t.contains("acme/laptop/alice")) && held.iter().any(|t| t.contains("acme/laptop/bob")));

    let bob_file = expected(&bob);
    alice.close();
    exit_within(&mut alice.child, EXIT_LIMIT, "the bridge to exit").await;
    assert_eq!(files(), [bob_file], "a bridge that exits removes its file, and only its own");
}

#[tokio::test]
async fn a_bridge_stopped_by_a_signal_leaves_and_removes_its_session_file() {
    let w = world().await;
    let runtime = tempfile::tempdir().unwrap();
    let dir = runtime.path();
    let mut alice = bridge(&w.server.url, &w.laptop, "alice");
    alice.initialize("2025-06-18").await;
    for (signal, number) in [("TERM", libc::SIGTERM), ("INT", libc::SIGINT), ("HUP", libc::SIGHUP)] {
        let spec = BridgeSpec { server: &w.server.url, token: &w.ci, handle: Some("bob"), channels: false };
        let mut bob = Bridge::start_with_env(spec, &[("RELAY_SESSION_DIR", runtime.path().as_os_str())]);
        bob.initialize("2025-06-18").await;
        bob.tool_ok("relay_whoami", json!({})).await;
        let pid = bob.child.id().unwrap();
        let file = dir.join(format!("{}-{pid}.toml", std::process::id()));
        assert!(std::fs::read_to_string(&file).unwrap().contains("acme/ci/bob"), "the session file is written");

        assert!(relay_tests::signal(pid, number), "SIG{signal} reaches the bridge");
        let status = tokio::time::timeout(WAIT, bob.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the bridge exits on SIG{signal}"))
            .unwrap();
        assert!(status.success(), "SIG{signal} ends the session cleanly: {status}");
        assert!(!file.exists(), "SIG{signal}: the session token is not left behind in {}", file.display());
        // It said goodbye: bob is offline at once, not after a lease runs out.
        let listed = alice.tool_ok("relay_list", json!({})).await;
        assert!(!text(&listed).contains("acme/ci/bob"), "SIG{signal}: bob is offline: {}", text(&listed));
    }
}
