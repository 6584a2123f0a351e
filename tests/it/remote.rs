//! Cloud agents: the server's `/mcp` endpoint (Streamable HTTP) serving the relay tools to agents
//! without a bridge, statelessly (2026-07-28) and in the sessions of the 2025 revisions, with the
//! machine token as the bearer, on any replica.

use relay_tests::free_port;
use relay_tests::http::request;
use relay_tests::mcp::{bridge, text};
use relay_tests::pg::TestDb;
use relay_tests::remote::RemoteAgent;
use relay_tests::server::Server;
use serde_json::{Value, json};

/// acme with a laptop (for a bridged agent) and a cloud machine (no bridge), the server serving
/// `/mcp` on a port of its own.
struct World {
    server: Server,
    mcp: String,
    laptop: String,
    cloud: String,
    db: TestDb,
}

async fn world() -> World {
    let db = TestDb::new().await;
    let mcp = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with_env(&db, free_port(), &[("RELAY_MCP_LISTEN", mcp.as_str())]).await;
    let laptop = server.machine("acme", "laptop");
    let cloud = server.machine("acme", "cloud");
    World { server, mcp, laptop, cloud, db }
}

fn structured(result: &Value) -> &Value {
    &result["structuredContent"]
}

#[tokio::test]
async fn a_cloud_agent_and_a_bridged_one_talk_through_the_mcp_endpoint() {
    let w = world().await;
    let mut alice = bridge(&w.server.url, &w.laptop, "alice");
    alice.initialize("2025-06-18").await;
    alice.tool_ok("relay_whoami", json!({})).await;

    // Stateless: every request names its version, client and handle; the sender is the endpoint
    // the machine token and handle name, whatever the request says.
    let mut ci = RemoteAgent::stateless(&w.mcp, &w.cloud, Some("ci-bot"));
    let me = ci.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(structured(&me)["address"], "acme/cloud/ci-bot", "{me}");
    let sent = ci.tool_ok("relay_send", json!({ "to": "laptop/alice", "body": "the nightly build is red" })).await;
    let id = structured(&sent)["id"].as_str().expect("a message id").to_owned();

    let read = alice.tool_ok("relay_inbox", json!({})).await;
    let shown = text(&read);
    assert!(shown.contains("the nightly build is red") && shown.contains("acme/cloud/ci-bot"), "{shown}");
    alice.tool_ok("relay_reply", json!({ "id": &id[..8], "body": "on it" })).await;

    // Its mail is hinted on the next result, whatever the tool, in both channels.
    let hinted = ci.tool_ok("relay_whoami", json!({})).await;
    assert!(text(&hinted).contains("1 unread relay message"), "{hinted}");
    assert!(structured(&hinted)["hint"].as_str().is_some_and(|h| h.contains("relay_inbox")), "{hinted}");
    let inbox = ci.tool_ok("relay_inbox", json!({})).await;
    let shown = text(&inbox);
    assert!(shown.contains("on it") && shown.contains("acme/laptop/alice"), "{shown}");
    assert!(shown.contains("<relay-message"), "other agents' text is framed: {shown}");
    assert_eq!(structured(&inbox)["untrusted"].as_str().map(|u| !u.is_empty()), Some(true), "{inbox}");
}

#[tokio::test]
async fn each_revision_gets_the_results_it_defines() {
    let w = world().await;
    for (version, structured_content) in [("2025-03-26", false), ("2025-06-18", true), ("2025-11-25", true)] {
        let mut agent = RemoteAgent::initialize(&w.mcp, &w.cloud, Some("worker"), version, "claude-code").await;
        let tools = agent.tools().await;
        let send = tools.iter().find(|t| t["name"] == "relay_send").expect("relay_send is listed");
        assert_eq!(send.get("outputSchema").is_some(), structured_content, "{version}: {send}");
        assert!(send.get("annotations").is_some(), "{version}: {send}");
        let me = agent.tool_ok("relay_whoami", json!({})).await;
        assert_eq!(me.get("structuredContent").is_some(), structured_content, "{version}: {me}");
        assert!(text(&me).contains("acme/cloud/worker"), "{version}: {me}");
        assert!(me.get("resultType").is_none(), "{version}: a 2025 result has no resultType: {me}");
    }
    let mut stateless = RemoteAgent::stateless(&w.mcp, &w.cloud, Some("worker"));
    let me = stateless.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(me["resultType"], "complete", "{me}");
    assert_eq!(structured(&me)["address"], "acme/cloud/worker", "the same endpoint, whatever the revision: {me}");
    let (_, listed) = stateless.exchange("tools/list", json!({})).await;
    assert_eq!(listed["result"]["cacheScope"], "private", "the list follows the agent's role: {listed}");
}

#[tokio::test]
async fn without_a_handle_one_is_picked_and_kept() {
    let w = world().await;
    // A session picks one for itself; a stateless client keeps one per machine token.
    let mut session = RemoteAgent::initialize(&w.mcp, &w.cloud, None, "2025-06-18", "claude-code").await;
    let picked = structured(&session.tool_ok("relay_whoami", json!({})).await)["handle"].clone();
    assert_eq!(picked, "claude-1");
    let again = structured(&session.tool_ok("relay_whoami", json!({})).await)["handle"].clone();
    assert_eq!(again, picked, "a session keeps its handle");

    let mut first = RemoteAgent::stateless(&w.mcp, &w.cloud, None);
    let one = structured(&first.tool_ok("relay_whoami", json!({})).await)["address"].clone();
    let mut second = RemoteAgent::stateless(&w.mcp, &w.cloud, None);
    let two = structured(&second.tool_ok("relay_whoami", json!({})).await)["address"].clone();
    assert_eq!(one, two, "requests without a session or a handle act as one agent");
    assert_ne!(one, json!(format!("acme/cloud/{}", picked.as_str().unwrap())));
}

#[tokio::test]
async fn any_replica_answers_for_the_same_agent() {
    let w = world().await;
    let other_mcp = format!("127.0.0.1:{}", free_port());
    let _other = Server::start_with_env(&w.db, free_port(), &[("RELAY_MCP_LISTEN", other_mcp.as_str())]).await;
    let mut alice = bridge(&w.server.url, &w.laptop, "alice");
    alice.initialize("2025-06-18").await;
    alice.tool_ok("relay_whoami", json!({})).await;

    let mut on_first = RemoteAgent::stateless(&w.mcp, &w.cloud, Some("ci-bot"));
    on_first.tool_ok("relay_send", json!({ "to": "laptop/alice", "body": "one" })).await;
    // The next request lands on the other replica, as behind a plain load balancer: the same
    // agent, not a second claim refused for a handle in use.
    let mut on_second = RemoteAgent::stateless(&other_mcp, &w.cloud, Some("ci-bot"));
    let sent = on_second.tool_ok("relay_send", json!({ "to": "laptop/alice", "body": "two" })).await;
    assert!(structured(&sent)["id"].is_string(), "{sent}");
    let read = alice.tool_ok("relay_inbox", json!({})).await;
    let shown = text(&read);
    assert!(shown.contains("one") && shown.contains("two"), "{shown}");
    assert_eq!(shown.matches("acme/cloud/ci-bot").count(), 2, "both from the one agent: {shown}");

    // A session of a 2025 revision begun on one replica goes on at the other, under its own
    // picked handle, without a new handshake.
    let mut session = RemoteAgent::initialize(&w.mcp, &w.cloud, None, "2025-06-18", "claude-code").await;
    let first = structured(&session.tool_ok("relay_whoami", json!({})).await)["address"].clone();
    session.addr = other_mcp.clone();
    let moved = session.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(structured(&moved)["address"], first, "{moved}");
    let tools = session.tools().await;
    assert!(
        tools.iter().any(|t| t["name"] == "relay_send" && t.get("outputSchema").is_some()),
        "as 2025-06-18 lists them"
    );
}

#[tokio::test]
async fn requests_without_a_live_machine_token_are_told_what_to_present() {
    let w = world().await;
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {} }).to_string();
    let accept = ("Accept", "application/json, text/event-stream");
    let kind = ("Content-Type", "application/json");

    let none = request(&w.mcp, "POST", "/mcp", &[accept, kind], &body).await;
    assert_eq!(none.status, 401, "{none:?}");
    let challenge = none.header("www-authenticate").expect("a challenge");
    let metadata_url = format!("http://{}/.well-known/oauth-protected-resource", w.mcp);
    assert_eq!(challenge, format!("Bearer resource_metadata=\"{metadata_url}\""), "no error code without a token");

    let wrong = request(&w.mcp, "POST", "/mcp", &[accept, kind, ("Authorization", "Bearer nonsense")], &body).await;
    assert_eq!(wrong.status, 401, "{wrong:?}");
    assert!(wrong.header("www-authenticate").unwrap().contains("error=\"invalid_token\""), "{wrong:?}");
    assert!(!wrong.body.contains("nonsense"), "a presented token is never echoed: {wrong:?}");

    let bearer = format!("Bearer {}", w.cloud);
    let auth = ("Authorization", bearer.as_str());
    let taken =
        request(&w.mcp, "POST", "/mcp", &[accept, kind, auth, ("MCP-Protocol-Version", "2026-07-28")], &body).await;
    assert_ne!(taken.status, 401, "{taken:?}");
    // A page in a browser elsewhere cannot call the endpoint with a token it holds (DNS rebinding).
    let from_page =
        request(&w.mcp, "POST", "/mcp", &[accept, kind, auth, ("Origin", "https://evil.example")], &body).await;
    assert_eq!(from_page.status, 403, "{from_page:?}");
    w.server.admin_ok(&["machine", "revoke", "acme/cloud"]);
    let revoked = request(&w.mcp, "POST", "/mcp", &[accept, kind, auth], &body).await;
    assert_eq!(revoked.status, 401, "a revoked machine's token is refused on its next request: {revoked:?}");

    let metadata = request(&w.mcp, "GET", "/.well-known/oauth-protected-resource", &[], "").await;
    assert_eq!(metadata.status, 200, "{metadata:?}");
    let document: Value = serde_json::from_str(&metadata.body).expect("a JSON document");
    assert_eq!(document["resource"], format!("http://{}/mcp", w.mcp));
    assert_eq!(document["bearer_methods_supported"], json!(["header"]));
}
