//! Nothing secret in the server's log, at any level: a server asked for everything (`RELAY_LOG=trace`,
//! the database client's and the MCP SDK's debug output included) carries a send, a hold, a card and
//! its claim, a console sign-in and a cloud agent's calls over `/mcp`, and its log holds none of the
//! bodies, texts and tokens that went through it.

use relay_proto::v1::{ClaimRequest, RegisterRepoRequest};
use relay_tests::client::{Agent, channel};
use relay_tests::mcp::{Bridge, BridgeSpec};
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithin};
use relay_tests::server::{Server, human};
use serde_json::json;

#[tokio::test]
async fn a_server_logging_everything_logs_no_body_text_or_token() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let console = format!("127.0.0.1:{}", relay_tests::free_port());
    let mcp = format!("127.0.0.1:{}", relay_tests::free_port());
    let everything = [
        ("RELAY_LOG", "trace,tokio_postgres=trace,postgres_protocol=trace,rmcp=trace"),
        ("RELAY_CONSOLE_LISTEN", console.as_str()),
        ("RELAY_MCP_LISTEN", mcp.as_str()),
    ];
    let mut server = Server::start_logging_to(&db, &everything, &log).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    let globex = server.machine("globex", "box");
    server.admin_ok(&["contact", "add", "acme", "globex"]);
    server.admin_ok(&["operator", "acme", "laptop/alice"]);
    let acme_human = server.admin_ok(&["human", "add", "acme"]);

    let mut alice =
        Bridge::start(BridgeSpec { server: &server.url, token: &laptop, handle: Some("alice"), channels: false });
    alice.initialize("2025-06-18").await;
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let _gina = Agent::hello(&server.url, &globex, "gina").await.unwrap();

    // A send, read by its recipient.
    let body = "the launch code is tangerine-9271-orbit";
    alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": body })).await;
    assert_eq!(bob.inbox(5, true).await.unwrap().messages[0].body, body);
    // A message held for the human, then released.
    let (ok, said) = human(&server.url, &acme_human, &["hold-policy", "contact", "on"]).await;
    assert!(ok, "{said}");
    let held_body = "quarterly figures marmalade-4410";
    let held = alice.tool_ok("relay_send", json!({ "to": "globex/box/gina", "body": held_body })).await;
    let hold = held["structuredContent"]["hold"].as_str().unwrap().to_owned();
    let (ok, said) = human(&server.url, &acme_human, &["release", &hold]).await;
    assert!(ok, "{said}");
    // A card, posted and claimed by a worker.
    let repo = tempfile::tempdir().unwrap();
    let path = repo.path().join("app");
    std::fs::create_dir_all(&path).unwrap();
    let status =
        std::process::Command::new("git").args(["init", "-q"]).current_dir(&path).status_within(COMMAND_LIMIT).unwrap();
    assert!(status.success());
    let mut worker = relay_tests::client::worker_client(channel(&server.url).await, &ci);
    worker.register_repo(RegisterRepoRequest { path: path.display().to_string() }).await.unwrap();
    let detail = "rotate the staging secret pistachio-8823";
    alice.tool_ok("post_job", json!({ "title": "Rotate it", "detail": detail, "repo": "app" })).await;
    let claimed = worker.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.expect("a card");
    let job_token = claimed.job_token.clone();

    // The person signs in to the console; the session's cookie is a secret too.
    let form = format!("token={acme_human}");
    let form_type = ("Content-Type", "application/x-www-form-urlencoded");
    let signed_in = relay_tests::http::request(&console, "POST", "/sign-in", &[form_type], &form).await;
    let cookie = signed_in.header("set-cookie").expect("a session cookie").split(';').next().unwrap().to_owned();
    let cookie_value = cookie.split_once('=').unwrap().1.to_owned();
    let board = relay_tests::http::request(&console, "GET", "/board", &[("Cookie", &cookie)], "").await;
    assert_eq!(board.status, 200);

    // An agent without a bridge sends over the MCP endpoint, statelessly and in a session.
    let cloud = server.machine("acme", "cloud");
    let remote_body = "the cloud bucket key is quince-5520-harbour";
    let mut stateless = relay_tests::remote::RemoteAgent::stateless(&mcp, &cloud, Some("ci-bot"));
    stateless.tool_ok("relay_send", json!({ "to": "laptop/alice", "body": remote_body })).await;
    let mut session =
        relay_tests::remote::RemoteAgent::initialize(&mcp, &cloud, Some("ci-bot"), "2025-06-18", "claude-code").await;
    session.tool_ok("relay_inbox", json!({})).await;

    server.stop().await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("TRACE") && text.contains("relay.v1.Relay"), "the log holds the calls at every level");
    for (what, secret) in [
        ("a body", body),
        ("a held body", held_body),
        ("a card's text", detail),
        ("a machine token", laptop.as_str()),
        ("a machine token", ci.as_str()),
        ("a human token", acme_human.as_str()),
        ("a session token", bob.session_token.as_str()),
        ("a job token", job_token.as_str()),
        ("a console session", cookie_value.as_str()),
        ("a body sent over MCP", remote_body),
        ("a machine token over MCP", cloud.as_str()),
    ] {
        let line = text.lines().find(|l| l.contains(secret));
        assert!(
            line.is_none(),
            "{what} is in the log: {}",
            line.unwrap_or_default().chars().take(300).collect::<String>()
        );
    }
    assert!(!text.contains("with parameters"), "no statement's parameters are logged");
}
