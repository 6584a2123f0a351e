//! Codex's `notify` program, run after each turn: shares the turn for peek, and after a turn of an
//! interactive session arms a waiter that wakes the idle thread by queueing a notice into it with
//! `codex queue` (what a person typing would start, from another process).
//!
//! Codex runs its threads, and their MCP servers and notify programs, in a daemon of its own: the
//! waiter's agent is that process, and it runs the same `codex` binary for `queue`.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::Context;
use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::{PeekTurn, PutPeekTurnsRequest, WhoAmIRequest};
use serde_json::Value;

use super::Agent;
use super::notice::{self, Client};
use super::wake::{self, Woken};
use crate::process;
use crate::session_file::{self, Found};
use relay_agent::relay::session::authed;

/// The `client` Codex names in a notify event of its interactive terminal UI; `codex exec` says
/// `codex_exec`, where nobody is idle to wake.
const INTERACTIVE_CLIENT: &str = "codex-tui";
/// Longest `codex queue` may take.
const QUEUE_DEADLINE: Duration = Duration::from_secs(30);

/// The turn a Codex `notify` event describes: the prompt(s) it answered and its last reply.
pub fn codex_turns(event: &Value) -> Vec<PeekTurn> {
    let mut turns = Vec::new();
    let prompts: Vec<String> = event["input-messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let clip = |text: &str| relay_agent::frame::clip(text, super::claude::TURN_BYTES);
    if !prompts.is_empty() {
        turns.push(PeekTurn { role: "user".into(), text: clip(&prompts.join("\n")), tools: Vec::new() });
    }
    if let Some(reply) = event["last-assistant-message"].as_str().filter(|r| !r.is_empty()) {
        turns.push(PeekTurn { role: "assistant".into(), text: clip(reply), tools: Vec::new() });
    }
    turns
}

/// `agent-bridge hook codex-notify JSON`.
pub async fn notify(payload: Option<String>) -> anyhow::Result<()> {
    let event: Value = payload.as_deref().and_then(|p| serde_json::from_str(p).ok()).unwrap_or(Value::Null);
    if event["type"].as_str() != Some("agent-turn-complete") {
        return Ok(());
    }
    let Some(agent) = Agent::find() else { return Ok(()) };
    if let Some(thread) = event["thread-id"].as_str()
        && event["client"].as_str() == Some(INTERACTIVE_CLIENT)
        && crate::codex::home().is_some_and(|home| persistent_thread(&home, thread))
    {
        arm_waiter(&agent.found, thread);
    }
    let mut client = RelayClient::new(agent.replicas.reachable().await);
    let token = agent.token();
    let peek_on = client
        .who_am_i(authed(WhoAmIRequest {}, token))
        .await
        .ok()
        .and_then(|r| r.into_inner().endpoint)
        .is_some_and(|e| e.peek);
    if peek_on {
        let turns = codex_turns(&event);
        client.put_peek_turns(authed(PutPeekTurnsRequest { turns, append: true }, token)).await?;
    }
    Ok(())
}

/// Whether `thread` is one a person works in: Codex keeps a rollout file of each under its home's
/// `sessions/YYYY/MM/DD/`, and none of the side threads it runs for itself (a title for the
/// session, say), which also notify.
fn persistent_thread(codex_home: &Path, thread: &str) -> bool {
    let suffix = format!("-{thread}.jsonl");
    // Newest days first: a turn that just ended is there.
    let newest_first = |dir: &Path| -> Vec<PathBuf> {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(dir).map(|e| e.filter_map(Result::ok).map(|e| e.path()).collect()).unwrap_or_default();
        entries.sort_unstable_by(|a, b| b.cmp(a));
        entries
    };
    let days = newest_first(&codex_home.join("sessions"))
        .into_iter()
        .flat_map(|year| newest_first(&year))
        .flat_map(|month| newest_first(&month));
    days.into_iter().any(|day| {
        std::fs::read_dir(day)
            .is_ok_and(|files| files.filter_map(Result::ok).any(|f| f.file_name().to_string_lossy().ends_with(&suffix)))
    })
}

/// Starts the waiter in a session of its own, so it outlives this notify program (Codex does not
/// wait for it) but not the Codex process it watches.
fn arm_waiter(found: &Found, thread: &str) {
    let (Some(agent), Some(bridge)) = (found.agent, found.bridge) else { return };
    let Ok(me) = std::env::current_exe() else { return };
    let mut command = std::process::Command::new(me);
    command
        .args(["hook", "codex-wake", "--thread", thread])
        .args(["--agent", &agent.to_string(), "--bridge", &bridge.to_string()])
        .env("RELAY_SESSION_FILE", &found.path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    process::detach(&mut command);
    if let Err(e) = command.spawn() {
        tracing::warn!(error = %e, "cannot start the waiter that wakes this Codex session");
    }
}

/// `agent-bridge hook codex-wake`: waits for mail, then queues a notice into `thread` with the
/// `codex` that runs it. One waiter per thread.
pub async fn wake(thread: &str, agent_pid: u32, bridge: u32) -> anyhow::Result<ExitCode> {
    // The file RELAY_SESSION_FILE names is that bridge's; the pids say what to outlive.
    let mut found = session_file::find()?;
    found.agent = Some(agent_pid);
    found.bridge = Some(bridge);
    let Some(_held) = wake::WaiterLock::take(&wake::lock_path(agent_pid, &format!("wake-codex-{thread}"))?) else {
        return Ok(ExitCode::SUCCESS);
    };
    let replicas = relay_agent::relay::replicas::Replicas::new(&found.session.server, found.session.ca.as_deref())?;
    let agent = Agent { found, replicas };
    let announcement = match wake::until_mail(&agent).await {
        Woken::Mail(announcement) => announcement,
        Woken::Ended(_) => return Ok(ExitCode::SUCCESS),
    };
    let Some(text) = notice::text(Client::Codex, agent.address(), &announcement) else { return Ok(ExitCode::SUCCESS) };
    let codex = process::executable(agent_pid)
        .with_context(|| format!("cannot find the program of the Codex process {agent_pid}"))?;
    let queued = tokio::process::Command::new(&codex)
        .args(["queue", "--thread", thread, "--message", &text])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(QUEUE_DEADLINE, queued).await {
        Ok(Ok(out)) if out.status.success() => Ok(ExitCode::SUCCESS),
        Ok(Ok(out)) => anyhow::bail!("codex queue failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
        Ok(Err(e)) => anyhow::bail!("cannot run {}: {e}", codex.display()),
        Err(_) => anyhow::bail!("codex queue took longer than {} s", QUEUE_DEADLINE.as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_notify_events_become_turns() {
        let event = serde_json::json!({
            "type": "agent-turn-complete",
            "input-messages": ["rename the crate"],
            "last-assistant-message": "Renamed it."
        });
        let turns = codex_turns(&event);
        assert_eq!(turns.len(), 2);
        assert_eq!((turns[0].role.as_str(), turns[1].text.as_str()), ("user", "Renamed it."));
        assert!(codex_turns(&serde_json::json!({})).is_empty());
    }

    #[test]
    fn only_threads_codex_keeps_are_woken() {
        let home = tempfile::tempdir().unwrap();
        let day = home.path().join("sessions/2026/12/02");
        std::fs::create_dir_all(&day).unwrap();
        std::fs::write(day.join("rollout-2026-12-02T15-20-07-01a23757-714d.jsonl"), "{}").unwrap();
        assert!(persistent_thread(home.path(), "01a23757-714d"));
        assert!(!persistent_thread(home.path(), "01a23757-a0e7"), "a side thread (a title) has no rollout");
        assert!(!persistent_thread(&home.path().join("absent"), "01a23757-714d"));
    }
}
