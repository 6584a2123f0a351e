//! `agent-bridge login` and `agent-bridge install`, run as a user runs them.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use relay_tests::bin;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use serde_json::Value;

fn bridge_cmd(home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(bin("agent-bridge"))
        .args(args)
        .current_dir(home)
        .env("HOME", home)
        .env_remove("RELAY_CONFIG")
        .env_remove("RELAY_SERVER")
        .env_remove("RELAY_TOKEN")
        .output()
        .unwrap()
}

#[tokio::test]
async fn login_checks_the_token_and_writes_a_private_config() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let token = server.machine("acme", "laptop");
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join(".config/agent-relay/bridge.toml");

    let server_url = server.url.clone();
    let home_path = home.path().to_path_buf();
    let bad = tokio::task::spawn_blocking(move || {
        bridge_cmd(
            &home_path,
            &[
                "login",
                "--server",
                &server_url,
                "--token",
                "rlm_0000000000000000000000000000000000000000000000000000000000000000",
            ],
        )
    })
    .await
    .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("refused the token"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    assert!(!config.exists(), "a refused token is not stored");

    let (server_url, home_path, t) = (server.url.clone(), home.path().to_path_buf(), token.clone());
    let ok =
        tokio::task::spawn_blocking(move || bridge_cmd(&home_path, &["login", "--server", &server_url, "--token", &t]))
            .await
            .unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stderr).contains("acme/laptop"));
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains(&token) && text.contains(&server.url), "{text}");
    assert_eq!(std::fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(ok.stdout.is_empty(), "login prints nothing on stdout");

    let unreachable = bridge_cmd(home.path(), &["login", "--server", "http://127.0.0.1:1", "--token", &token]);
    assert!(!unreachable.status.success());
}

#[test]
fn install_writes_client_configs_idempotently_without_the_token() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join(".mcp.json"), r#"{"mcpServers":{"other":{"command":"x"}}}"#).unwrap();
    for _ in 0..2 {
        let out = bridge_cmd(home.path(), &["install", "claude"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(home.path().join(".mcp.json")).unwrap()).unwrap();
    assert_eq!(doc["mcpServers"]["other"]["command"], "x", "other servers are kept");
    let relay = &doc["mcpServers"]["relay"];
    assert!(relay["command"].as_str().unwrap().ends_with("agent-bridge"), "{relay}");
    assert_eq!(relay["args"], serde_json::json!(["mcp", "--harness", "claude", "--channels"]));
    assert!(relay.get("env").is_none(), "no credential in a file that gets committed");

    let out = bridge_cmd(home.path(), &["install", "codex"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let codex = std::fs::read_to_string(home.path().join(".codex/config.toml")).unwrap();
    assert!(codex.contains("[mcp_servers.relay]") && codex.contains("\"--harness\", \"codex\""), "{codex}");
    assert!(!codex.contains("rlm_"));

    for client in ["gemini", "cursor"] {
        assert!(bridge_cmd(home.path(), &["install", client]).status.success());
    }
    assert!(home.path().join(".gemini/settings.json").exists());
    assert!(home.path().join(".cursor/mcp.json").exists());

    let unknown = bridge_cmd(home.path(), &["install", "vim"]);
    assert!(!unknown.status.success());
}

#[test]
fn mcp_without_a_configured_server_says_how_to_set_one_up() {
    let home = tempfile::tempdir().unwrap();
    let out = bridge_cmd(home.path(), &["mcp"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("agent-bridge login"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "nothing but MCP on stdout");
}
