//! The session file a bridge keeps while it runs: how to call the server as its agent. Programs the
//! agent starts (`agent-bridge spawn`, the Stop hook, Codex's notify program) find it through their
//! process ancestry, so they act as that agent without a credential of their own.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::process;
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

/// Where session files live: `RELAY_SESSION_DIR` when set, else a directory every process of this
/// user finds alike, whatever environment its client started it with. Clients choose what their
/// programs inherit (Codex starts MCP servers with a fixed few variables and hooks with all of
/// them), so the default depends on no variable a client may drop: on Linux the user's runtime
/// directory `/run/user/UID` (what `XDG_RUNTIME_DIR` names on a systemd system) when it is there,
/// else `/tmp/agent-relay-UID`; on macOS `~/Library/Caches/agent-relay`; on Windows
/// `%LOCALAPPDATA%\agent-relay`.
pub fn session_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RELAY_SESSION_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    platform_session_dir()
}

#[cfg(target_os = "linux")]
fn platform_session_dir() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    let runtime = PathBuf::from(format!("/run/user/{uid}"));
    if private_dir(&runtime) {
        return runtime.join("agent-relay").join("sessions");
    }
    PathBuf::from(format!("/tmp/agent-relay-{uid}")).join("sessions")
}

#[cfg(all(unix, not(target_os = "linux")))]
fn platform_session_dir() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    match dirs::cache_dir() {
        Some(cache) => cache.join("agent-relay").join("sessions"),
        None => PathBuf::from(format!("/tmp/agent-relay-{uid}")).join("sessions"),
    }
}

#[cfg(not(unix))]
fn platform_session_dir() -> PathBuf {
    dirs::data_local_dir().unwrap_or_else(std::env::temp_dir).join("agent-relay").join("sessions")
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
/// newest first, each with its bridge's process id. A file whose bridge died without removing it
/// is skipped (and removed).
fn live_sessions(agent: u32) -> Vec<(PathBuf, u32)> {
    let dir = session_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let prefix = format!("{agent}-");
    let mut found: Vec<(std::time::SystemTime, PathBuf, u32)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let bridge: u32 = name.strip_prefix(&prefix)?.strip_suffix(".toml")?.parse().ok()?;
            let path = entry.path();
            if !process::alive(bridge) {
                let _ = std::fs::remove_file(&path);
                return None;
            }
            Some((entry.metadata().and_then(|m| m.modified()).ok()?, path, bridge))
        })
        .collect();
    found.sort_by_key(|(modified, ..)| std::cmp::Reverse(*modified));
    found.into_iter().map(|(_, path, bridge)| (path, bridge)).collect()
}

/// Whether `dir` may hold session files: a private directory of this user, and, when it is the
/// platform's own, inside one (under a shared `/tmp`, someone else could have made the parent first
/// and move `sessions` away).
fn private_session_dir(dir: &Path) -> bool {
    private_dir(dir) && (dir != platform_session_dir() || dir.parent().is_none_or(private_dir))
}

/// Whether `dir` is a real directory of ours that nobody else can write: a shared temp dir could
/// otherwise hold a folder or link someone planted.
#[cfg(unix)]
fn private_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta.is_dir() && meta.uid() == me && meta.mode() & 0o022 == 0,
        Err(_) => false,
    }
}

/// Whether `dir` is a real directory (not a link): on Windows it lies under the user's profile,
/// whose permissions keep other users out.
#[cfg(not(unix))]
fn private_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|meta| meta.is_dir())
}

/// Writes the file owner-only; a failure only costs the agent the ability to spawn.
pub fn write_session_at(path: &Path, file: &SessionFile) {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            relay_proto::bridge_config::private_dir_builder().recursive(true).create(dir)?;
            if !private_session_dir(dir) {
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

/// Keeps the session file at `path` for as long as the session lives.
pub struct Keeper {
    pub path: PathBuf,
    /// The CA file the bridge trusts, for programs that read the file.
    pub ca: Option<String>,
}

impl relay_agent::relay::session::SessionWatcher for Keeper {
    fn began(&self, server: &str, session: &relay_agent::relay::session::Session) {
        let file = SessionFile {
            server: server.to_owned(),
            ca: self.ca.clone(),
            session_token: session.token.clone(),
            address: session.endpoint.address.clone(),
        };
        write_session_at(&self.path, &file);
    }

    fn ended(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A session a program started by an agent found, and where: the agent process whose bridge
/// keeps it and that bridge (both `None` when `RELAY_SESSION_FILE` named the file).
#[derive(Debug)]
pub struct Found {
    pub session: SessionFile,
    pub path: PathBuf,
    pub agent: Option<u32>,
    pub bridge: Option<u32>,
}

impl Found {
    /// The session as its file says now: a bridge that had to claim its endpoint again has
    /// written a new token there. `None` once the file is gone (the bridge left).
    pub fn reread(&self) -> Option<SessionFile> {
        toml::from_str(&std::fs::read_to_string(&self.path).ok()?).ok()
    }
}

/// Where a program's own session files go: beside the bridges' (private to this user), named
/// after the agent process they belong to, so they never pass for a bridge's session file.
pub fn agent_file(agent: u32, what: &str) -> anyhow::Result<PathBuf> {
    let dir = session_dir();
    if !private_session_dir(&dir) {
        bail!("{} is not a private directory of this user", dir.display());
    }
    Ok(dir.join(format!("{what}-{agent}")))
}

/// The session of the nearest ancestor process that runs a bridge-connected agent.
pub fn find_session() -> anyhow::Result<SessionFile> {
    Ok(find()?.session)
}

/// [`find_session`], telling where it was found.
pub fn find() -> anyhow::Result<Found> {
    if let Some(path) = std::env::var_os("RELAY_SESSION_FILE").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let session = toml::from_str(&text).context("malformed session file")?;
        return Ok(Found { session, path, agent: None, bridge: None });
    }
    if !private_session_dir(&session_dir()) {
        bail!("no relay session found: {} is not a private directory of this user", session_dir().display());
    }
    let mut pid = std::process::id();
    for _ in 0..64 {
        let Some(parent) = process::parent(pid).filter(|p| *p > 1) else { break };
        // An agent with two relay bridges: the one that connected last speaks for it.
        for (path, bridge) in live_sessions(parent) {
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let session = toml::from_str(&text).context("malformed session file")?;
            return Ok(Found { session, path, agent: Some(parent), bridge: Some(bridge) });
        }
        pid = parent;
    }
    bail!(
        "no relay session found: run agent-bridge spawn from the shell of an agent connected through agent-bridge mcp"
    )
}
