//! Trust over real processes: credentials never stored, private data kept in, holds for the human,
//! the human's inbox, required replies through the Stop hook, and peek.

use std::path::PathBuf;

use relay_proto::v1::*;
use relay_tests::client::Agent;
use relay_tests::mcp::{Bridge, BridgeSpec, text};
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithinAsync};
use relay_tests::server::{Server, human};
use relay_tests::short_id;
use relay_tests::{bin, free_port};
use serde_json::{Value, json};

struct World {
    db: TestDb,
    server: Server,
    alice: Bridge,
    alice_session: PathBuf,
    bob: Agent,
    gina: Agent,
    acme_human: String,
    globex_human: String,
}

/// acme (alice on laptop via a bridge, bob on ci) and globex (gina), which are contacts.
async fn world() -> World {
    let db = TestDb::new().await;
    let server = Server::start_with_env(&db, free_port(), &[]).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    let globex = server.machine("globex", "box");
    server.admin_ok(&["contact", "add", "acme", "globex"]);
    let acme_human = server.admin_ok(&["human", "add", "acme"]);
    let globex_human = server.admin_ok(&["human", "add", "globex"]);
    let home = tempfile::tempdir().unwrap().keep();
    let alice_session = home.join("alice-session.toml");
    let spec = BridgeSpec { server: &server.url, token: &laptop, handle: Some("alice"), channels: false };
    let mut alice = Bridge::start_with_env(spec, &[("RELAY_SESSION_FILE", alice_session.as_os_str())]);
    alice.initialize("2025-06-18").await;
    alice.tool_ok("relay_whoami", json!({})).await;
    let bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let gina = Agent::hello(&server.url, &globex, "gina").await.unwrap();
    World { db, server, alice, alice_session, bob, gina, acme_human, globex_human }
}

/// Runs the Claude Code Stop hook as alice's client would, with `event` on stdin.
async fn stop_hook(w: &World, event: Value) -> String {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(bin("agent-bridge"))
        .args(["hook", "stop"])
        .env("RELAY_SESSION_FILE", &w.alice_session)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(event.to_string().as_bytes()).await.unwrap();
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success(), "the hook never fails the agent's stop: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(result: &Value) -> bool {
    result["isError"] == json!(true)
}

#[tokio::test]
async fn credentials_never_reach_the_recipient_or_the_database() {
    let mut w = world().await;
    let body =
        "deploy with ghp_8pQz3LmW1xKc7RtY5nV2bJ0dF9gH4sA6eUoT and AKIAZ3MXQ7RTWK5NV2HB, db password=hunter2hunter2";
    let sent = w.alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": body })).await;
    assert!(text(&sent).contains("Redacted 3 credential spans"), "{}", text(&sent));
    let kinds: Vec<&str> =
        sent["structuredContent"]["redacted"].as_array().unwrap().iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["aws-access-token", "github-pat", "password"]);

    let got = w.bob.inbox(5, true).await.unwrap().messages.remove(0).body;
    assert_eq!(
        got,
        "deploy with [REDACTED:github-pat] and [REDACTED:aws-access-token], db password=[REDACTED:password]"
    );
    let (client, conn) = tokio_postgres::connect(&w.db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    for secret in ["ghp_8pQz3LmW1x", "AKIAZ3MXQ7RTWK5NV2HB", "hunter2"] {
        let hits: i64 = client
            .query_one("select count(*) from messages where position($1 in body) > 0", &[&secret])
            .await
            .unwrap()
            .get(0);
        assert_eq!(hits, 0, "{secret} reached the database");
    }
}

#[tokio::test]
async fn private_data_stays_in_the_account_unless_the_contact_allows_it() {
    let mut w = world().await;
    w.alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "salary sheet", "private": true })).await;
    assert!(w.bob.inbox(5, true).await.unwrap().messages[0].private);

    let out =
        w.alice.tool("relay_send", json!({ "to": "globex/box/gina", "body": "salary sheet", "private": true })).await;
    assert!(
        refused(&out) && text(&out).contains("private data may not leave account acme for globex/box/gina"),
        "{}",
        text(&out)
    );
    assert!(w.gina.inbox(0, true).await.unwrap().messages.is_empty());

    let (ok, said) = human(&w.server.url, &w.acme_human, &["contact", "private", "globex", "on"]).await;
    assert!(ok && said.contains("the contact with globex may now carry private data"), "{said}");
    w.alice.tool_ok("relay_send", json!({ "to": "globex/box/gina", "body": "salary sheet", "private": true })).await;
    assert_eq!(w.gina.inbox(5, true).await.unwrap().messages[0].body, "salary sheet");
}

#[tokio::test]
async fn held_messages_wait_for_the_human_who_releases_or_rejects_them() {
    let mut w = world().await;
    let (ok, said) = human(&w.server.url, &w.acme_human, &["hold-policy", "contact", "on"]).await;
    assert!(ok && said.contains("held for the human: contact"), "{said}");

    let held = w.alice.tool_ok("relay_send", json!({ "to": "globex/box/gina", "body": "the roadmap" })).await;
    let hold = held["structuredContent"]["hold"].as_str().expect("a hold id").to_owned();
    assert!(text(&held).contains("held") && text(&held).contains(&hold), "{}", text(&held));
    assert!(w.gina.inbox(0, true).await.unwrap().messages.is_empty(), "a held message reaches nobody");
    // Inside the account nothing is held.
    w.alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "internal" })).await;
    assert_eq!(w.bob.inbox(5, true).await.unwrap().messages.len(), 1);

    let (ok, listed) = human(&w.server.url, &w.acme_human, &["holds"]).await;
    assert!(
        ok && listed.contains(&hold) && listed.contains("the roadmap") && listed.contains("to globex/box/gina"),
        "{listed}"
    );
    let (ok, said) = human(&w.server.url, &w.globex_human, &["release", &hold]).await;
    assert!(!ok && said.contains("no hold"), "another account's human cannot release it: {said}");
    let (ok, said) = human(&w.server.url, &w.acme_human, &["release", &hold]).await;
    assert!(ok && said.contains("released"), "{said}");
    assert_eq!(w.gina.inbox(5, true).await.unwrap().messages[0].body, "the roadmap");

    let second = w.alice.tool_ok("relay_send", json!({ "to": "globex/box/gina", "body": "the pricing" })).await;
    let hold2 = second["structuredContent"]["hold"].as_str().unwrap().to_owned();
    let (ok, said) =
        human(&w.server.url, &w.acme_human, &["reject", &hold2, "--reason", "pricing stays internal"]).await;
    assert!(ok && said.contains("rejected"), "{said}");
    let (ok, said) = human(&w.server.url, &w.acme_human, &["release", &hold2]).await;
    assert!(!ok && said.contains("already rejected"), "{said}");
    assert!(w.gina.inbox(0, true).await.unwrap().messages.is_empty());

    // A hold still waiting when the contact is dropped can never be released.
    let third = w.alice.tool_ok("relay_send", json!({ "to": "globex/box/gina", "body": "the forecast" })).await;
    let hold3 = third["structuredContent"]["hold"].as_str().unwrap().to_owned();
    w.server.admin_ok(&["contact", "drop", "acme", "globex"]);
    let (ok, said) = human(&w.server.url, &w.acme_human, &["release", &hold3]).await;
    assert!(!ok && said.contains("already rejected"), "{said}");
    w.server.admin_ok(&["contact", "add", "acme", "globex"]);
    assert!(w.gina.inbox(0, true).await.unwrap().messages.is_empty());

    // The sender hears both outcomes from its human.
    let inbox = w.alice.tool_ok("relay_inbox", json!({ "wait_s": 5 })).await;
    let notices: Vec<(String, String)> = inbox["structuredContent"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["from"].as_str().unwrap().to_owned(), m["body"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(notices.len(), 2, "{notices:?}");
    assert!(notices.iter().all(|(from, _)| from == "acme/me"));
    assert!(notices[0].1.contains("released") && notices[1].1.contains("pricing stays internal"), "{notices:?}");
}

#[tokio::test]
async fn the_human_inbox_takes_part_from_a_terminal() {
    let mut w = world().await;
    w.alice.tool_ok("relay_send", json!({ "to": "me", "body": "may I merge the migration?" })).await;
    // Screen-clear, window-title and hyperlink sequences, a bell and a bidi override.
    let hostile = "hello from globex\x1b[2J\x1b]0;owned\x07\x1b]8;;https://evil.example\x1b\\link\u{202e}";
    w.gina.send(&["acme/me"], hostile).await.expect("a contact reaches the other account's human");

    let (ok, inbox) = human(&w.server.url, &w.acme_human, &["inbox", "--wait", "5"]).await;
    assert!(ok && inbox.contains("from acme/laptop/alice") && inbox.contains("may I merge the migration?"), "{inbox}");
    assert!(inbox.contains("from globex/box/gina") && inbox.contains("hello from globex"), "{inbox}");
    assert!(!inbox.contains(['\x1b', '\x07', '\u{202e}']), "nothing steers the person's terminal: {inbox:?}");
    assert!(inbox.contains("\u{241b}]0;owned"), "the sequence is shown, not run: {inbox:?}");
    let (ok, said) = human(&w.server.url, &w.acme_human, &["send", "laptop/alice", "yes, after the backup"]).await;
    assert!(ok && said.contains("to acme/laptop/alice"), "{said}");
    let got = w.alice.tool_ok("relay_inbox", json!({ "wait_s": 5 })).await;
    assert_eq!(got["structuredContent"]["messages"][0]["from"], "acme/me");
    assert_eq!(got["structuredContent"]["messages"][0]["body"], "yes, after the backup");

    let (ok, said) = human(&w.server.url, &w.acme_human, &["send", "initech/me", "x"]).await;
    assert!(!ok && said.contains("no agent you can reach at initech/me"), "{said}");
    let claim = Agent::hello(&w.server.url, &w.server.machine("acme", "box2"), "me").await.err().unwrap();
    assert!(claim.message().contains("reserved for the account's human inbox"), "{}", claim.message());
}

#[tokio::test]
async fn required_replies_hold_the_stop_until_answered() {
    let mut w = world().await;
    assert_eq!(stop_hook(&w, json!({ "stop_hook_active": false })).await, "", "nothing pending, nothing held");
    let ask = SendRequest {
        to: vec!["laptop/alice".into()],
        body: "which branch has the fix?".into(),
        kind: MessageKind::Ask as i32,
        require_reply: true,
        ..Default::default()
    };
    let asked = w.bob.rpc.send(ask).await.unwrap().into_inner();

    let inbox = w.alice.tool_ok("relay_inbox", json!({ "wait_s": 5 })).await;
    assert_eq!(inbox["structuredContent"]["messages"][0]["require_reply"], true);
    assert!(
        text(&inbox).contains("The sender requires a reply"),
        "harnesses without hooks see the mark: {}",
        text(&inbox)
    );

    let blocked = stop_hook(&w, json!({ "stop_hook_active": false })).await;
    let decision: Value = serde_json::from_str(blocked.trim()).expect("a hook decision");
    assert_eq!(decision["decision"], "block");
    let reason = decision["reason"].as_str().unwrap();
    assert!(
        reason.contains(short_id(&asked.id)) && reason.contains("acme/ci/bob") && reason.contains("relay_reply"),
        "{reason}"
    );

    assert!(reason.contains("decline"), "the agent learns it may decline: {reason}");
    // Claude Code goes on because of that hold: holding again for the same request would trap it.
    assert_eq!(stop_hook(&w, json!({ "stop_hook_active": true })).await, "", "never held twice in a row");
    let again = stop_hook(&w, json!({ "stop_hook_active": false })).await;
    assert!(again.contains("\"block\""), "a later stop is held again while unanswered: {again}");

    w.alice.tool_ok("relay_reply", json!({ "id": short_id(&asked.id), "body": "fix/login" })).await;
    assert_eq!(stop_hook(&w, json!({ "stop_hook_active": false })).await, "", "answered: the stop goes ahead");
}

#[tokio::test]
async fn peek_shows_redacted_turns_only_when_allowed_and_records_who_looked() {
    let mut w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let transcript = dir.path().join("session.jsonl");
    std::fs::write(
        &transcript,
        [
            r#"{"type":"user","message":{"role":"user","content":"rotate the key ghp_8pQz3LmW1xKc7RtY5nV2bJ0dF9gH4sA6eUoT"}}"#,
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"Rotating it now."},{"type":"tool_use","name":"Bash","input":{}}]}}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let event = json!({ "transcript_path": transcript, "stop_hook_active": false });

    // Off by default: nothing is shared, nobody may look.
    stop_hook(&w, event.clone()).await;
    let denied = w.bob.rpc.peek(PeekRequest { endpoint: "laptop/alice".into(), turns: 3 }).await.unwrap_err();
    assert!(denied.message().contains("does not allow peeking"), "{}", denied.message());

    w.alice.tool_ok("relay_set_peek", json!({ "on": true })).await;
    stop_hook(&w, event.clone()).await;
    let view = w.bob.rpc.peek(PeekRequest { endpoint: "laptop/alice".into(), turns: 3 }).await.unwrap().into_inner();
    assert_eq!(view.turns.len(), 2);
    assert_eq!(view.turns[0].text, "rotate the key [REDACTED:github-pat]", "peeked turns are redacted");
    assert_eq!(view.turns[1].tools, ["Bash"]);
    // Codex has no stop hook: its notify program appends each finished turn instead.
    let notify = json!({ "type": "agent-turn-complete", "input-messages": ["bump the version"], "last-assistant-message": "Bumped to 1.2." });
    let out = tokio::process::Command::new(bin("agent-bridge"))
        .args(["hook", "codex-notify", &notify.to_string()])
        .env("RELAY_SESSION_FILE", &w.alice_session)
        .output_within(COMMAND_LIMIT)
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view = w.bob.rpc.peek(PeekRequest { endpoint: "laptop/alice".into(), turns: 10 }).await.unwrap().into_inner();
    let texts: Vec<&str> = view.turns.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(
        texts,
        ["rotate the key [REDACTED:github-pat]", "Rotating it now.", "bump the version", "Bumped to 1.2."]
    );
    let outsider = w.gina.rpc.peek(PeekRequest { endpoint: "acme/laptop/alice".into(), turns: 3 }).await;
    assert!(outsider.is_ok(), "a contact that may message alice may peek");
    let who = w.alice.tool_ok("relay_peek", json!({ "who": true })).await;
    assert!(text(&who).contains("acme/ci/bob") && text(&who).contains("globex/box/gina"), "{}", text(&who));

    // Alice narrows who may message her: bob loses the right to peek too.
    w.alice.tool_ok("relay_rules", json!({ "action": "set", "in": ["ep:globex/box/gina"] })).await;
    let narrowed = w.bob.rpc.peek(PeekRequest { endpoint: "laptop/alice".into(), turns: 3 }).await.unwrap_err();
    assert!(narrowed.message().contains("you may not message"), "{}", narrowed.message());

    w.alice.tool_ok("relay_set_peek", json!({ "on": false })).await;
    let (client, conn) = tokio_postgres::connect(&w.db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let kept: i64 = client.query_one("select count(*) from peek_turns", &[]).await.unwrap().get(0);
    assert_eq!(kept, 0, "turning peek off deletes what was kept");
}
