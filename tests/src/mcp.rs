//! An MCP client driving a real `agent-bridge mcp` over stdio, as an agent's client would.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::bin;

pub const WAIT: Duration = Duration::from_secs(15);

pub struct Bridge {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<Value>,
    /// Messages read while looking for something else.
    held: VecDeque<Value>,
    next_id: i64,
    pub home: tempfile::TempDir,
}

/// How to start a bridge.
pub struct BridgeSpec<'a> {
    pub server: &'a str,
    pub token: &'a str,
    pub handle: Option<&'a str>,
    pub channels: bool,
}

impl Bridge {
    pub fn start(spec: BridgeSpec<'_>) -> Self {
        Self::start_with_env(spec, &[])
    }

    /// [`Bridge::start`] with extra environment variables.
    pub fn start_with_env(spec: BridgeSpec<'_>, env: &[(&str, &std::ffi::OsStr)]) -> Self {
        let (cmd, home) = Self::command(spec, env);
        Self::spawn(cmd, home)
    }

    /// [`Bridge::start`] with `dir` as the agent's working directory.
    pub fn start_in(spec: BridgeSpec<'_>, dir: &Path) -> Self {
        let (mut cmd, home) = Self::command(spec, &[]);
        cmd.current_dir(dir);
        Self::spawn(cmd, home)
    }

    /// [`Bridge::start`] in the network namespace at `netns` (`/run/netns/NAME`): the bridge sees only
    /// that namespace's network.
    #[cfg(target_os = "linux")]
    pub fn start_in_netns(spec: BridgeSpec<'_>, netns: &Path) -> Self {
        let (mut cmd, home) = Self::command(spec, &[]);
        let namespace = std::fs::File::open(netns).unwrap_or_else(|e| panic!("open {}: {e}", netns.display()));
        let fd = std::os::fd::AsRawFd::as_raw_fd(&namespace);
        // SAFETY: setns is async-signal-safe; the descriptor stays open until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let bridge = Self::spawn(cmd, home);
        drop(namespace);
        bridge
    }

    fn command(spec: BridgeSpec<'_>, env: &[(&str, &std::ffi::OsStr)]) -> (Command, tempfile::TempDir) {
        let home = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(bin("agent-bridge"));
        cmd.arg("mcp").args(["--harness", "claude"]);
        if let Some(handle) = spec.handle {
            cmd.args(["--handle", handle]);
        }
        if spec.channels {
            cmd.arg("--channels");
        }
        cmd.env("RELAY_SERVER", spec.server)
            .env("RELAY_TOKEN", spec.token)
            .env("HOME", home.path())
            .env("RELAY_CONFIG", home.path().join("absent.toml"))
            .env_remove("RELAY_HANDLE")
            .env_remove("RELAY_CHANNELS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            cmd.env(name, value);
        }
        (cmd, home)
    }

    /// A card's agent's bridge, as the worker starts it: the card's job token is its only
    /// credential (no `RELAY_TOKEN`, no config file), and it claims the card's endpoint.
    pub fn start_card(server: &str, job_token: &str) -> Self {
        let home = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(bin("agent-bridge"));
        cmd.args(["mcp", "--harness", "claude"])
            .env("RELAY_SERVER", server)
            .env("RELAY_JOB_TOKEN", job_token)
            .env_remove("RELAY_TOKEN")
            .env_remove("RELAY_CA")
            .env_remove("RELAY_HANDLE")
            .env_remove("RELAY_CHANNELS")
            .env("HOME", home.path())
            .env("RELAY_CONFIG", home.path().join("absent.toml"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        Self::spawn(cmd, home)
    }

    /// A bridge of a machine that logged in: server and token come from the config file at
    /// `config` (as `agent-bridge login` or `relay-server dev` wrote it), none from the environment.
    pub fn start_configured(config: &Path, handle: &str) -> Self {
        Self::start_configured_with_env(config, handle, &[])
    }

    /// [`Bridge::start_configured`] with extra environment variables (a shared `HOME`, say).
    pub fn start_configured_with_env(config: &Path, handle: &str, env: &[(&str, &std::ffi::OsStr)]) -> Self {
        let home = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(bin("agent-bridge"));
        cmd.args(["mcp", "--harness", "claude", "--handle", handle])
            .env_remove("RELAY_SERVER")
            .env_remove("RELAY_TOKEN")
            .env_remove("RELAY_CA")
            .env_remove("RELAY_HANDLE")
            .env_remove("RELAY_CHANNELS")
            .env("HOME", home.path())
            .env("RELAY_CONFIG", config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            cmd.env(name, value);
        }
        Self::spawn(cmd, home)
    }

    /// A bridge `cmd` starts however it likes (in a container, say), spoken to over its stdio.
    pub fn over(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).kill_on_drop(true);
        Self::spawn(cmd, tempfile::tempdir().unwrap())
    }

    fn spawn(mut cmd: Command, home: tempfile::TempDir) -> Self {
        let mut child = cmd.spawn().expect("start agent-bridge");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                // Nothing but MCP on stdout: every line must be one JSON-RPC message.
                let value: Value =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("non-JSON on stdout ({e}): {line}"));
                assert_eq!(
                    value.get("jsonrpc").or_else(|| value.get(0).and_then(|v| v.get("jsonrpc"))),
                    Some(&json!("2.0")),
                    "{line}"
                );
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        Self { child, stdin, lines, held: VecDeque::new(), next_id: 1, home }
    }

    pub fn home(&self) -> &Path {
        self.home.path()
    }

    pub async fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    pub async fn send(&mut self, message: &Value) {
        self.send_raw(&message.to_string()).await;
    }

    /// Closes stdin: the end of the session.
    pub fn close(&mut self) {
        self.stdin.take();
    }

    /// Sends a request and returns its id.
    pub async fn start_request(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })).await;
        id
    }

    /// The next message matching `pred`, keeping the others for later.
    pub async fn wait_for(&mut self, what: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.held.iter().position(&pred) {
            return self.held.remove(i).unwrap();
        }
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let next = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .unwrap_or_else(|_| panic!("timed out after {limit:?} waiting for {what}; held: {:?}", self.held))
                .unwrap_or_else(|| panic!("the bridge closed stdout while waiting for {what}"));
            if pred(&next) {
                return next;
            }
            self.held.push_back(next);
        }
    }

    /// A message already read or waiting, without waiting for one.
    pub fn try_next(&mut self) -> Option<Value> {
        self.held.pop_front().or_else(|| self.lines.try_recv().ok())
    }

    /// The next message within `limit`, or `None` when none came (or the bridge ended).
    pub async fn next_within(&mut self, limit: Duration) -> Option<Value> {
        if let Some(held) = self.held.pop_front() {
            return Some(held);
        }
        tokio::time::timeout(limit, self.lines.recv()).await.ok().flatten()
    }

    /// A tool call answered within `limit` (the result, error or not).
    pub async fn tool_within(&mut self, name: &str, arguments: Value, limit: Duration) -> Value {
        let id = self.start_request("tools/call", json!({ "name": name, "arguments": arguments })).await;
        let answer = self.wait_for(&format!("the answer to {name}"), limit, |v| v["id"] == json!(id)).await;
        answer["result"].clone()
    }

    /// The next message of any kind.
    pub async fn next(&mut self, limit: Duration) -> Value {
        self.wait_for("any message", limit, |_| true).await
    }

    pub async fn response(&mut self, id: i64) -> Value {
        self.wait_for(&format!("response {id}"), WAIT, |v| v["id"] == json!(id)).await
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.start_request(method, params).await;
        self.response(id).await
    }

    pub async fn initialize_with(&mut self, params: Value) -> Value {
        let answer = self.request("initialize", params).await;
        self.send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).await;
        answer
    }

    /// Initializes as a client that takes channel pushes (`claude/channel`).
    pub async fn initialize_with_channels(&mut self) -> Value {
        self.initialize_with(json!({
            "protocolVersion": "2025-06-18",
            "capabilities": { "experimental": { "claude/channel": {} } },
            "clientInfo": { "name": "some-client", "version": "1" },
        }))
        .await
    }

    /// Initializes as a plain client speaking `version`.
    pub async fn initialize(&mut self, version: &str) -> Value {
        self.initialize_with(json!({
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": { "name": "relay-tests", "version": "0" },
        }))
        .await
    }

    /// Calls a tool; returns the `result` (which may be an isError result).
    pub async fn tool(&mut self, name: &str, arguments: Value) -> Value {
        let answer = self.request("tools/call", json!({ "name": name, "arguments": arguments })).await;
        assert!(answer.get("error").is_none(), "{name} failed at the protocol level: {answer}");
        answer["result"].clone()
    }

    /// Calls a tool that must succeed; returns the result.
    pub async fn tool_ok(&mut self, name: &str, arguments: Value) -> Value {
        let result = self.tool(name, arguments).await;
        assert_ne!(result["isError"], json!(true), "{name} was refused: {}", text(&result));
        result
    }

    /// Waits until `address` is listed online to this bridge's agent.
    pub async fn wait_online(&mut self, address: &str, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let listed = text(&self.tool_ok("relay_list", json!({})).await);
            if listed.lines().any(|l| l.starts_with(&format!("{address} ")) && l.contains(" online ")) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{address} was not online within {limit:?}: {listed}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn notification(&mut self, method: &str, limit: Duration) -> Value {
        self.wait_for(method, limit, |v| v["method"] == method).await
    }
}

/// The text content of a tool result.
/// The names a `tools/list` answer lists.
pub fn tool_names(listed: &Value) -> Vec<String> {
    listed["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
}

pub fn text(result: &Value) -> String {
    result["content"].as_array().map_or_else(String::new, |items| {
        items.iter().filter_map(|c| c["text"].as_str()).collect::<Vec<_>>().join("\n")
    })
}

/// A bridge claiming `handle`, without channels.
pub fn bridge(server: &str, token: &str, handle: &str) -> Bridge {
    Bridge::start(BridgeSpec { server, token, handle: Some(handle), channels: false })
}
