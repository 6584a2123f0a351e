//! Codex on the board, with approvals. Codex has no permission-prompt tool; run as `codex
//! mcp-server` it asks its MCP client before a command or a patch (an `elicitation/create` request
//! marked `exec-approval` or `patch-approval`, answered with a `decision`). The worker is that
//! client: it starts the card's run, and turns each question into a permission request for the
//! card, which the operator and then the account's human answer as they do for Claude Code.

use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};

/// Codex's home, where it keeps its config, hooks and sessions: `CODEX_HOME`, else `~/.codex`.
pub fn home() -> Option<PathBuf> {
    match std::env::var_os("CODEX_HOME").filter(|h| !h.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => dirs::home_dir().map(|h| h.join(".codex")),
    }
}

/// What the run needs from the worker: a decision for each question Codex asks.
pub trait Approver {
    /// Asks for `tool` with `input` on behalf of the card; true when allowed.
    fn approve(&self, tool: String, input: String) -> impl std::future::Future<Output = bool> + Send;
}

/// The `codex` tool's arguments for a card: its prompt, its worktree, approvals asked for, and the
/// relay bridge as an MCP server that inherits the variables named in `inherited` (the card's
/// credential among them) from Codex's own environment. Named, not given: the job token is then no
/// part of the call, which Codex may keep in its session files.
pub fn run_arguments(prompt: &str, worktree: &Path, bridge: &str, inherited: &[&str]) -> Value {
    json!({
        "prompt": prompt,
        "cwd": worktree.display().to_string(),
        "approval-policy": "on-request",
        "sandbox": "workspace-write",
        "config": {
            "mcp_servers": { "relay": { "command": bridge, "args": ["mcp", "--harness", "codex"], "env_vars": inherited } }
        },
    })
}

/// What a Codex question asks for, as a permission request names it: the tool and its input.
pub fn question(params: &Value) -> Option<(String, String)> {
    match params.get("codex_elicitation").and_then(Value::as_str)? {
        "exec-approval" => {
            let words: Vec<&str> = params.get("codex_command")?.as_array()?.iter().filter_map(Value::as_str).collect();
            let cwd = params.get("codex_cwd").and_then(Value::as_str).unwrap_or_default();
            Some(("Bash".to_owned(), json!({ "command": shlex::try_join(words).ok()?, "cwd": cwd }).to_string()))
        }
        "patch-approval" => {
            let changes = params.get("codex_changes").cloned().unwrap_or(Value::Null);
            let reason = params.get("codex_reason").and_then(Value::as_str).unwrap_or_default();
            Some(("apply_patch".to_owned(), json!({ "changes": changes, "reason": reason }).to_string()))
        }
        _ => None,
    }
}

async fn send(stdin: &mut ChildStdin, message: Value) -> std::io::Result<()> {
    let mut line = message.to_string();
    line.push('\n');
    stdin.write_all(line.as_bytes()).await?;
    stdin.flush().await
}

/// Drives one run: initialize, call `codex` with `arguments`, answer its questions through
/// `approver`, and return when the call answers (or Codex goes away). Closing stdin then lets it exit.
///
/// Codex is read all along, also while a person decides a question (which may take minutes): a
/// ping, or another question, is answered meanwhile.
pub async fn drive(
    mut stdin: ChildStdin,
    stdout: ChildStdout,
    arguments: Value,
    approver: &impl Approver,
) -> anyhow::Result<()> {
    let mut lines = BufReader::new(stdout).lines();
    let version = env!("CARGO_PKG_VERSION");
    send(
        &mut stdin,
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": { "elicitation": {} },
            "clientInfo": { "name": "agent-bridge worker", "version": version } } }),
    )
    .await?;
    let mut started = false;
    // The questions being decided, each answered as its decision comes.
    let mut deciding = FuturesUnordered::new();
    loop {
        let line = tokio::select! {
            Some((id, allowed)) = deciding.next(), if !deciding.is_empty() => {
                let decision = if allowed { "approved" } else { "denied" };
                send(&mut stdin, json!({ "jsonrpc": "2.0", "id": id, "result": { "decision": decision } })).await?;
                continue;
            }
            line = lines.next_line() => line?,
        };
        let Some(line) = line else { return Ok(()) };
        let Ok(message) = serde_json::from_str::<Value>(&line) else { continue };
        let id = message.get("id").cloned();
        match (message.get("method").and_then(Value::as_str), id) {
            // Answers to our own requests: initialize (1), then the run (2).
            (None, Some(id)) if id == json!(1) && !started => {
                started = true;
                send(&mut stdin, json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).await?;
                send(
                    &mut stdin,
                    json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                            "params": { "name": "codex", "arguments": arguments } }),
                )
                .await?;
            }
            (None, Some(id)) if id == json!(2) => return Ok(()),
            (Some("elicitation/create"), Some(id)) => {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                deciding.push(async move {
                    let allowed = match question(&params) {
                        Some((tool, input)) => approver.approve(tool, input).await,
                        // A question this worker cannot put to a person is not a yes.
                        None => false,
                    };
                    (id, allowed)
                });
            }
            (Some("ping"), Some(id)) => send(&mut stdin, json!({ "jsonrpc": "2.0", "id": id, "result": {} })).await?,
            (Some(method), Some(id)) => {
                let error = json!({ "code": -32601, "message": format!("the worker does not answer {method}") });
                send(&mut stdin, json!({ "jsonrpc": "2.0", "id": id, "error": error })).await?;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_questions_read_as_the_tool_and_input_a_person_decides_on() {
        let exec = json!({ "codex_elicitation": "exec-approval", "codex_command": ["git", "push", "--force"],
                           "codex_cwd": "/w/k1" });
        let (tool, input) = question(&exec).unwrap();
        assert_eq!(tool, "Bash");
        assert_eq!(
            serde_json::from_str::<Value>(&input).unwrap(),
            json!({ "command": "git push --force", "cwd": "/w/k1" })
        );
        let patch =
            json!({ "codex_elicitation": "patch-approval", "codex_changes": { "a.rs": {} }, "codex_reason": "fix" });
        assert_eq!(question(&patch).unwrap().0, "apply_patch");
        assert!(question(&json!({ "message": "something else" })).is_none());
    }

    #[test]
    fn a_run_asks_for_approvals_and_names_the_credential_its_bridge_inherits() {
        let args =
            run_arguments("do it", Path::new("/w/k1"), "/bin/agent-bridge", &["RELAY_JOB_TOKEN", "RELAY_SERVER"]);
        assert_eq!(args["approval-policy"], "on-request");
        assert_eq!(args["cwd"], "/w/k1");
        let relay = &args["config"]["mcp_servers"]["relay"];
        assert_eq!(relay["env_vars"], json!(["RELAY_JOB_TOKEN", "RELAY_SERVER"]));
        assert!(relay.get("env").is_none(), "no values: {relay}");
    }
}
