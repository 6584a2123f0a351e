//! The session file a bridge keeps while it runs: how to call the server as its agent. Programs the
//! agent starts (`agent-bridge spawn`, the Stop hook, Codex's notify program) find it through their
//! process ancestry, so they act as that agent without a credential of their own.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

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
