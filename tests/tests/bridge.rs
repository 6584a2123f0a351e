//! `agent-bridge mcp` driven over stdio as an agent's client drives it, against a real server.

use std::time::Duration;

use relay_tests::mcp::{Bridge, BridgeSpec, WAIT, text};
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use serde_json::{Value, json};

struct World {
    _db: TestDb,
    server: Server,
    laptop: String,
    ci: String,
}

async fn world() -> World {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    World { _db: db, server, laptop, ci }
}

fn bridge(server: &str, token: &str, handle: &str) -> Bridge {
    Bridge::start(BridgeSpec { server, token, handle: Some(handle), channels: false })
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
        assert!(b.child.wait().await.unwrap().success(), "end of input ends the session cleanly");
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

    assert_eq!(error_code(&b.request("server/discover", json!({})).await), -32601);
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
    assert_eq!(batch[1]["result"]["structuredContent"]["address"], "acme/laptop/alice");
    assert_eq!(batch[2]["error"]["code"], -32601);
}

#[tokio::test]
async fn two_bridges_on_two_machines_message_each_other() {
    let w = world().await;
    let mut alice = bridge(&w.server.url, &w.laptop, "alice");
    let mut bob = bridge(&w.server.url, &w.ci, "bob");
    alice.initialize("2025-06-18").await;
    bob.initialize("2024-11-05").await;

    let listed = alice.tool_ok("relay_list", json!({})).await;
    let listed_text = text(&listed);
    assert!(listed_text.contains("acme/ci/bob") && listed_text.contains("acme/laptop/alice (you)"), "{listed_text}");

    let sent = alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "the build on main is red" })).await;
    let id = sent["structuredContent"]["id"].as_str().unwrap().to_owned();
    assert_eq!(sent["structuredContent"]["recipients"][0]["address"], "acme/ci/bob");
    assert_eq!(sent["structuredContent"]["thread"], id.as_str());

    let inbox = bob.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    let messages = inbox["structuredContent"]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["id"], id.as_str());
    assert_eq!(messages[0]["from"], "acme/laptop/alice");
    let shown = text(&inbox);
    assert!(shown.contains("untrusted data") && shown.contains("<relay-message"), "framed as data: {shown}");

    let reply = bob.tool_ok("relay_reply", json!({ "id": &id[..8], "body": "looking" })).await;
    assert_eq!(reply["structuredContent"]["reply_to"], id.as_str());
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
        if text(&result).contains("1 unread relay message is waiting") {
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
