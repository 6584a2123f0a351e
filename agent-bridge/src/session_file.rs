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
            if !alive(bridge) {
                let _ = std::fs::remove_file(&path);
                return None;
            }
            Some((entry.metadata().and_then(|m| m.modified()).ok()?, path, bridge))
        })
        .collect();
    found.sort_by_key(|(modified, ..)| std::cmp::Reverse(*modified));
    found.into_iter().map(|(_, path, bridge)| (path, bridge)).collect()
}

/// Whether process `pid` is still running.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
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

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields resume after the last ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
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
    if !private_dir(&dir) {
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
    if !private_dir(&session_dir()) {
        bail!("no relay session found: {} is not a private directory of this user", session_dir().display());
    }
    let mut pid = std::process::id();
    for _ in 0..64 {
        let Some(parent) = parent_of(pid).filter(|p| *p > 1) else { break };
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
