//! Files between machines, through the real server and bridges: an agent attaches files from its
//! working directory, another fetches them into its own; text is redacted as bodies are, binary
//! kept as sent; content is stored once; a file out of reach is absent; bad uploads and bad paths
//! are refused and store nothing.

use relay_proto::v1::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tonic::Code;

use relay_tests::client::Agent;
use relay_tests::free_port;
use relay_tests::mcp::{Bridge, BridgeSpec, text};
use relay_tests::pg::TestDb;
use relay_tests::server::Server;

const TOKEN: &str = "ghp_R8x2kLq9Vw3ZtN5mYb7Hc1Jd4Fg6Sp0AeXuQ";

fn bridge_in(server: &str, token: &str, handle: &str, dir: &std::path::Path) -> Bridge {
    Bridge::start_in(BridgeSpec { server, token, handle: Some(handle), channels: false }, dir)
}

async fn count(db: &TestDb, table: &str) -> i64 {
    db.sql().await.query_one(&format!("select count(*) from {table}"), &[]).await.unwrap().get(0)
}

fn upload(name: &str, data: &[u8]) -> UploadRequest {
    UploadRequest {
        name: name.into(),
        size: data.len() as u64,
        sha256: hex::encode(Sha256::digest(data)),
        data: data.to_vec(),
    }
}

fn structured(result: &Value) -> &Value {
    &result["structuredContent"]
}

#[tokio::test]
async fn an_agent_fetches_the_files_another_machine_attached_and_nobody_else_can() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    let (ann_dir, bob_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let patch = format!("--- a/auth.rs\n+++ b/auth.rs\n+// token {TOKEN}\n+fn check() {{}}\n");
    std::fs::write(ann_dir.path().join("fix.patch"), &patch).unwrap();
    let png: Vec<u8> = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0xff].repeat(300);
    std::fs::create_dir(ann_dir.path().join("shots")).unwrap();
    std::fs::write(ann_dir.path().join("shots/screen.png"), &png).unwrap();

    let mut bob = bridge_in(&server.url, &ci, "bob", bob_dir.path());
    bob.initialize("2025-06-18").await;
    bob.tool_ok("relay_whoami", json!({})).await;
    // cat takes pushes: a message with files is pushed with them named.
    let mut cat = Bridge::start(BridgeSpec { server: &server.url, token: &ci, handle: Some("cat"), channels: true });
    cat.initialize_with_channels().await;
    cat.tool_ok("relay_whoami", json!({})).await;
    let mut ann = bridge_in(&server.url, &laptop, "ann", ann_dir.path());
    ann.initialize("2025-06-18").await;
    let sent = ann
        .tool_ok(
            "relay_send",
            json!({ "to": ["ci/bob", "ci/cat"], "body": "the fix and what it looked like", "attach": ["fix.patch", "shots/screen.png"] }),
        )
        .await;
    let said = text(&sent);
    assert!(said.contains("with \"fix.patch\"") && said.contains("1 credential span redacted"), "{said}");
    let files = structured(&sent)["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{sent}");
    assert_eq!(files[0]["redacted"], 1);
    assert_eq!(files[1]["binary"], true);
    assert_eq!(files[1]["size"], png.len());

    let pushed = cat.notification("notifications/claude/channel", relay_tests::mcp::WAIT).await;
    let content = pushed["params"]["content"].as_str().unwrap();
    assert!(content.contains("files=\"fix.patch (") && content.contains("B), screen.png (3.2 KiB)\""), "{content}");
    assert!(content.contains("Save its files with relay_fetch"), "{content}");

    // bob sees the files with the message, in its text and its structured part, and saves them.
    let inbox = bob.tool_ok("relay_inbox", json!({})).await;
    let shown = text(&inbox);
    assert!(shown.contains("files=\"fix.patch (") && shown.contains("relay_fetch"), "{shown}");
    let message = &structured(&inbox)["messages"][0];
    assert_eq!(message["files"].as_array().map(Vec::len), Some(2), "{inbox}");
    let short = message["short"].as_str().unwrap().to_owned();
    let fetched = bob.tool_ok("relay_fetch", json!({ "message": short, "name": "fix.patch" })).await;
    assert!(text(&fetched).contains("saved \"fix.patch\""), "{}", text(&fetched));
    let saved = std::fs::read_to_string(bob_dir.path().join("fix.patch")).unwrap();
    assert!(!saved.contains(TOKEN) && saved.contains("fn check()"), "stored and fetched redacted: {saved}");
    bob.tool_ok("relay_fetch", json!({ "message": short, "name": "screen.png", "save_to": "in/shot.png" })).await;
    assert_eq!(std::fs::read(bob_dir.path().join("in/shot.png")).unwrap(), png, "binary kept byte for byte");

    // Never over a file unasked; never outside the working directory.
    let again = bob.tool("relay_fetch", json!({ "message": short, "name": "fix.patch" })).await;
    assert_eq!(again["isError"], true);
    assert!(text(&again).contains("overwrite: true"), "{}", text(&again));
    std::fs::write(bob_dir.path().join("fix.patch"), "mine").unwrap();
    bob.tool_ok("relay_fetch", json!({ "message": short, "name": "fix.patch", "overwrite": true })).await;
    assert_ne!(std::fs::read_to_string(bob_dir.path().join("fix.patch")).unwrap(), "mine");
    let outside =
        bob.tool("relay_fetch", json!({ "message": short, "name": "fix.patch", "save_to": "../escaped.patch" })).await;
    assert_eq!(outside["isError"], true);
    assert!(text(&outside).contains("leaves the working directory"), "{}", text(&outside));
    assert!(!bob_dir.path().parent().unwrap().join("escaped.patch").exists());
    let unknown = bob.tool("relay_fetch", json!({ "message": short, "name": "notes.txt" })).await;
    assert!(text(&unknown).contains("it carries: fix.patch, screen.png"), "{}", text(&unknown));

    // The sender fetches its own; an agent of the account that did not receive it, and another
    // account's, find no such file.
    let id = message["id"].as_str().unwrap().to_owned();
    let mut ann_rpc = Agent::hello(&server.url, &laptop, "ann-rpc").await.unwrap();
    let mut cid = Agent::hello(&server.url, &ci, "cid").await.unwrap();
    let mut eve = Agent::hello(&server.url, &server.machine("other", "box"), "eve").await.unwrap();
    for outsider in [&mut ann_rpc, &mut cid, &mut eve] {
        let refused =
            outsider.rpc.fetch(FetchRequest { message: id.clone(), name: "fix.patch".into() }).await.unwrap_err();
        assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    }
    let own =
        ann.tool_ok("relay_fetch", json!({ "message": id, "name": "fix.patch", "save_to": "sent-copy.patch" })).await;
    assert!(text(&own).contains("saved"), "{}", text(&own));

    // Content is stored once: the same file sent again adds links, not content.
    let blobs = count(&db, "artifact_blobs").await;
    assert_eq!(blobs, 2);
    ann.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "again", "attach": "fix.patch" })).await;
    assert_eq!(count(&db, "artifact_blobs").await, blobs);
    assert_eq!(count(&db, "message_artifacts").await, 3);
}

#[tokio::test]
async fn bad_uploads_and_bad_attachments_are_refused_and_store_nothing() {
    let db = TestDb::new().await;
    let env = [
        ("RELAY_MAX_FILE_BYTES", "1024"),
        ("RELAY_MAX_MESSAGE_FILE_BYTES", "1500"),
        ("RELAY_MAX_ACCOUNT_FILE_BYTES", "3000"),
    ];
    let server = Server::start_with_env(&db, free_port(), &env).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    let mut ann = Agent::hello(&server.url, &laptop, "ann").await.unwrap();
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();

    let data = vec![b'x'; 800];
    let cut = UploadRequest { size: 900, ..upload("a.txt", &data) };
    let changed = UploadRequest { sha256: hex::encode(Sha256::digest(b"other")), ..upload("a.txt", &data) };
    for (request, said) in [
        (cut, "cut short: 800 of 900 bytes arrived"),
        (changed, "does not match its SHA-256"),
        (upload("big.txt", &[b'y'; 1025]), "a file may be at most 1.0 KiB"),
        (upload("../up.txt", &data), "is a path"),
        (upload("bell\u{7}.txt", &data), "control or invisible"),
    ] {
        let refused = ann.rpc.upload(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(said), "{}", refused.message());
    }
    assert_eq!((count(&db, "artifact_uploads").await, count(&db, "artifact_blobs").await), (0, 0), "nothing stored");

    // Two files within their limit each, over a message's together: the send is refused, nothing
    // is delivered and no file is linked.
    let one = ann.rpc.upload(upload("one.txt", &[b'1'; 800])).await.unwrap().into_inner().upload;
    let two = ann.rpc.upload(upload("two.txt", &[b'2'; 800])).await.unwrap().into_inner().upload;
    let send = |attach: Vec<String>| SendRequest {
        to: vec!["ci/bob".into()],
        body: "files".into(),
        attach,
        ..Default::default()
    };
    let refused = ann.rpc.send(send(vec![one.clone(), two.clone()])).await.unwrap_err();
    assert!(refused.message().contains("a message may carry at most 1.5 KiB"), "{}", refused.message());
    let twice = ann.rpc.send(send(vec![one.clone(), one.clone()])).await.unwrap_err();
    assert!(twice.message().contains("two files are named one.txt"), "{}", twice.message());
    // Another agent's upload is not the sender's to attach.
    let theirs = bob.rpc.upload(upload("bob.txt", b"bob's")).await.unwrap().into_inner().upload;
    let taken = ann.rpc.send(send(vec![theirs])).await.unwrap_err();
    assert_eq!(taken.code(), Code::NotFound, "{taken:?}");
    assert!(taken.message().contains("no upload"), "{}", taken.message());
    assert_eq!(count(&db, "message_artifacts").await, 0);
    assert_eq!(bob.rpc.inbox(InboxRequest::default()).await.unwrap().into_inner().messages.len(), 0);

    // The account's files hold at most 3000 bytes: with 800 + 800 + 5 + 1000 held, 1,000 more
    // is refused.
    ann.rpc.upload(upload("three.txt", &[b'3'; 1000])).await.unwrap();
    let over = ann.rpc.upload(upload("four.txt", &[b'4'; 1000])).await.unwrap_err();
    assert_eq!(over.code(), Code::ResourceExhausted, "{over:?}");
    assert!(over.message().contains("your account's files hold 2.5 KiB of the 2.9 KiB"), "{}", over.message());
    ann.rpc.send(send(vec![one])).await.unwrap();
    assert_eq!(count(&db, "message_artifacts").await, 1);
}

#[tokio::test]
async fn a_path_that_cannot_be_read_refuses_the_send_whole() {
    let w = relay_tests::server::TwoMachines::start().await;
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let secret = elsewhere.path().join("id_ed25519");
    std::fs::write(&secret, "not for sending").unwrap();
    std::fs::create_dir(dir.path().join("folder")).unwrap();
    std::fs::write(dir.path().join("ok.txt"), "fine").unwrap();
    let mut bob = relay_tests::mcp::bridge(&w.server.url, &w.ci, "bob");
    bob.initialize("2025-06-18").await;
    bob.tool_ok("relay_whoami", json!({})).await;
    let mut ann = bridge_in(&w.server.url, &w.laptop, "ann", dir.path());
    ann.initialize("2025-06-18").await;
    for (attach, said) in [
        (json!(["ok.txt", "missing.txt"]), "missing.txt cannot be read"),
        (json!(secret.display().to_string()), "is outside your working directory"),
        (json!("folder"), "folder is not a file"),
        (json!([{ "name": "x.txt" }]), "give its content as text or as base64"),
        (json!([]), "1 to 16 files"),
    ] {
        let refused = ann.tool("relay_send", json!({ "to": "ci/bob", "body": "see attached", "attach": attach })).await;
        assert_eq!(refused["isError"], true, "{refused}");
        assert!(text(&refused).contains(said), "{}", text(&refused));
    }
    let inbox = bob.tool_ok("relay_inbox", json!({})).await;
    assert_eq!(structured(&inbox)["messages"].as_array().map(Vec::len), Some(0), "nothing was sent: {inbox}");
}
