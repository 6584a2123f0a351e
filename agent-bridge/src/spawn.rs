//! `agent-bridge spawn -- COMMAND…`: starts a worker agent as a child of the calling agent.
//!
//! The calling agent's bridge leaves a session file named after the agent's process id; `spawn`
//! (run from that agent's shell) finds it by walking up its own process ancestry. The server
//! reserves the child endpoint and hands back a one-time grant; a detached supervisor runs the
//! worker with that grant in its environment (so the worker's own bridge claims the child
//! endpoint) and, when the worker ends, reports its final output to the parent as the child.

use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::{SpawnRequest, SpawnResultRequest};
use serde::{Deserialize, Serialize};

use crate::relay::connection;
use crate::relay::session::authed;

/// What a bridge leaves for `spawn`: how to call the server as this agent.
#[derive(Debug, Serialize, Deserialize)]
pub struct SessionFile {
    pub server: String,
    #[serde(default)]
    pub ca: Option<String>,
    pub session_token: String,
    pub address: String,
}

/// Where session files live: the user's runtime directory, else a per-user one under the temp dir.
fn session_dir() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    match dirs::runtime_dir() {
        Some(dir) => dir.join("agent-relay").join("sessions"),
        None => {
            let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0);
            std::env::temp_dir().join(format!("agent-relay-{uid}")).join("sessions")
        }
    }
}

/// The session file this bridge keeps for its agent: named by the agent's process and the
/// bridge's own, so two bridges of one agent keep two files. `RELAY_SESSION_FILE` names one
/// explicitly.
pub fn session_path(agent: u32) -> PathBuf {
    match std::env::var_os("RELAY_SESSION_FILE").filter(|p| !p.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => session_dir().join(format!("{agent}-{}.toml", std::process::id())),
    }
}

/// The session files of the bridges the agent process `agent` runs and that are still alive,
/// newest first. A file whose bridge died without removing it is skipped (and removed).
fn live_sessions(agent: u32) -> Vec<PathBuf> {
    let dir = session_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let prefix = format!("{agent}-");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let bridge: u32 = name.strip_prefix(&prefix)?.strip_suffix(".toml")?.parse().ok()?;
            let path = entry.path();
            if !std::path::Path::new(&format!("/proc/{bridge}")).exists() {
                let _ = std::fs::remove_file(&path);
                return None;
            }
            Some((entry.metadata().and_then(|m| m.modified()).ok()?, path))
        })
        .collect();
    found.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    found.into_iter().map(|(_, path)| path).collect()
}

/// Whether `dir` is a real directory of ours that nobody else can write: a shared temp dir could
/// otherwise hold a folder or link someone planted.
fn private_dir(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta.is_dir() && Some(meta.uid()) == me && meta.mode() & 0o022 == 0,
        Err(_) => false,
    }
}

/// Writes the file owner-only; a failure only costs the agent the ability to spawn.
pub fn write_session_at(path: &std::path::Path, file: &SessionFile) {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
            if !private_dir(dir) {
                return Err(std::io::Error::other(format!(
                    "{} is not a private directory of this user",
                    dir.display()
                )));
            }
        }
        let text = toml::to_string(file).map_err(std::io::Error::other)?;
        relay_proto::bridge_config::write_private(path, text.as_bytes()).map_err(std::io::Error::other)
    };
    if let Err(e) = write() {
        tracing::warn!(error = %e, "cannot write the session file; agent-bridge spawn will not find this agent");
    }
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields resume after the last ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// The session of the nearest ancestor process that runs a bridge-connected agent.
pub fn find_session() -> anyhow::Result<SessionFile> {
    if let Some(path) = std::env::var_os("RELAY_SESSION_FILE").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        return toml::from_str(&text).context("malformed session file");
    }
    if !private_dir(&session_dir()) {
        bail!("no relay session found: {} is not a private directory of this user", session_dir().display());
    }
    let mut pid = std::process::id();
    for _ in 0..64 {
        let Some(parent) = parent_of(pid).filter(|p| *p > 1) else { break };
        // An agent with two relay bridges: the one that connected last speaks for it.
        if let Some(text) = live_sessions(parent).iter().find_map(|path| std::fs::read_to_string(path).ok()) {
            return toml::from_str(&text).context("malformed session file");
        }
        pid = parent;
    }
    bail!(
        "no relay session found: run agent-bridge spawn from the shell of an agent connected through agent-bridge mcp"
    )
}

pub async fn spawn(harness: String, scope: Option<String>, command: Vec<String>) -> anyhow::Result<()> {
    if command.is_empty() {
        bail!("give the worker's command after --, e.g. agent-bridge spawn -- codex exec \"…\"");
    }
    let session = find_session()?;
    let machine = connection::resolve()?;
    let channel = connection::channel(&session.server, session.ca.as_deref())?;
    let request = SpawnRequest { harness: harness.clone(), scope: scope.unwrap_or_default() };
    let reserved = RelayClient::new(channel)
        .spawn(authed(request, &session.session_token))
        .await
        .map_err(|s| anyhow::anyhow!("the server refused the spawn: {}", s.message()))?
        .into_inner();
    let child = reserved.endpoint.context("spawn answered without an endpoint")?;

    let me = std::env::current_exe().context("cannot find agent-bridge itself")?;
    let mut supervisor = Command::new(me);
    supervisor
        .arg("supervise")
        .arg("--")
        .args(&command)
        .env("RELAY_SERVER", &session.server)
        .env("RELAY_TOKEN", &machine.token)
        .env("RELAY_HANDLE", &child.handle)
        .env("RELAY_HARNESS", &harness)
        .env("RELAY_SPAWN_GRANT", &reserved.grant)
        .env_remove("RELAY_SESSION_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: the worker outlives the shell command that started it.
        .process_group(0);
    if let Some(ca) = &session.ca {
        supervisor.env("RELAY_CA", ca);
    }
    supervisor.spawn().context("cannot start the worker")?;
    println!(
        "spawned {} (child of {}); its final output will reach you as a relay message",
        child.address, session.address
    );
    Ok(())
}

/// Most of the worker's output kept for its final report.
const TAIL: usize = 16 * 1024;

/// Runs the worker, keeps the tail of its output, and reports its end to the parent.
pub async fn supervise(command: Vec<String>) -> anyhow::Result<()> {
    let grant = std::env::var("RELAY_SPAWN_GRANT").context("supervise runs only under agent-bridge spawn")?;
    let (program, args) = command.split_first().context("no worker command")?;
    let outcome = tokio::task::spawn_blocking({
        let (program, args) = (program.clone(), args.to_vec());
        move || -> std::io::Result<(i32, String)> {
            let mut child = Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            let mut err = child.stderr.take().expect("piped stderr");
            let errs = std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = err.read_to_end(&mut buf);
                buf
            });
            let mut out = Vec::new();
            child.stdout.take().expect("piped stdout").read_to_end(&mut out)?;
            let status = child.wait()?;
            out.extend(errs.join().unwrap_or_default());
            let start = out.len().saturating_sub(TAIL);
            Ok((status.code().unwrap_or(-1), String::from_utf8_lossy(&out[start..]).into_owned()))
        }
    })
    .await?;
    let (exit_code, output) = match outcome {
        Ok(done) => done,
        Err(e) => (-1, format!("the worker could not be started: {e}")),
    };
    let server = std::env::var("RELAY_SERVER").context("no RELAY_SERVER")?;
    let channel = connection::channel(&server, std::env::var("RELAY_CA").ok().as_deref())?;
    let mut client = RelayClient::new(channel);
    // The parent must hear of the end: retry for a while if the server is briefly away.
    for attempt in 0..30 {
        let request = authed(SpawnResultRequest { exit_code, output: output.clone() }, &grant);
        match client.spawn_result(request).await {
            Ok(_) => return Ok(()),
            Err(status) if status.code() == tonic::Code::Unavailable && attempt < 29 => {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(status) => bail!("cannot report the worker's end: {}", status.message()),
        }
    }
    Ok(())
}
