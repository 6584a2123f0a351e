//! Waiting for mail an agent's model has not been shown, for as long as the agent runs: Claude
//! Code's `hook wake` (which exits 2 to wake the idle session) and the waiter `hook codex-notify`
//! arms (which queues a notice into the idle Codex thread).
//!
//! A waiter holds one `Announce` stream open on the server, which reads nothing while it waits, and
//! reopens it (on the next replica when one fails) until mail comes. It ends when its agent or that
//! agent's bridge ends, when the session token is refused, or after [`LIFETIME`]; the agent's next
//! turn arms a new one. One waiter per agent (per Codex thread) at a time: a lock file says which.

use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::{AnnounceRequest, Announcement, announce_event};
use tonic::{Code, Status};

use super::Agent;
use crate::process;
use crate::session_file::{self, Found};
use relay_agent::relay::reopen::{self, Attempt, Kept, within_silence};
use relay_agent::relay::replicas::Replicas;
use relay_agent::relay::session::authed;

/// Longest a waiter waits; the agent's next turn arms a new one. Claude Code's hook timeout that
/// `install claude` writes is a little longer, so the waiter ends first, cleanly.
pub const LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
/// Longest the server may take to answer the call at all.
const OPENING: Duration = Duration::from_secs(10);

/// How a wait ended.
#[derive(Debug)]
pub enum Woken {
    /// Mail the model had not been shown, now marked surfaced: it must be told.
    Mail(Announcement),
    /// Nothing more to wait for, and why.
    Ended(String),
}

/// One announcement from the replica in use: with `wait`, once there is mail (`None` when the
/// stream ended without one, as a server stopping ends it); else at once, possibly naming nothing.
pub async fn announce(replicas: &Replicas, token: &str, wait: bool) -> Result<Option<Announcement>, Status> {
    let (index, channel) = replicas.current();
    let outcome = async {
        let request = authed(AnnounceRequest { wait }, token);
        let opened = tokio::time::timeout(OPENING, RelayClient::new(channel).announce(request))
            .await
            .map_err(|_| Status::deadline_exceeded("the relay server did not answer in time"))??;
        let mut stream = opened.into_inner();
        loop {
            match within_silence(stream.message()).await?.and_then(|e| e.event) {
                None => return Ok(None),
                Some(announce_event::Event::Waiting(_)) => {}
                Some(announce_event::Event::Announcement(a)) => return Ok(Some(a)),
            }
        }
    }
    .await;
    if let Err(status) = &outcome {
        replicas.failed(index, status);
    }
    outcome
}

/// Waits until the agent has mail its model was not shown, or until there is nothing more to wait
/// for. Survives a server restart or a replica failover by opening the stream again.
pub async fn until_mail(agent: &Agent) -> Woken {
    let found = &agent.found;
    let ended = async {
        tokio::select! {
            () = process_end(found.agent) => "the agent ended".to_owned(),
            () = process_end(found.bridge) => "the agent's bridge ended".to_owned(),
            () = tokio::time::sleep(LIFETIME) => format!("no mail within {} hours", LIFETIME.as_secs() / 3600),
        }
    };
    tokio::select! {
        woken = watch(found, &agent.replicas) => woken,
        why = ended => Woken::Ended(why),
    }
}

async fn watch(found: &Found, replicas: &Replicas) -> Woken {
    reopen::keep(replicas, "wait for mail", &mut Wait { found, replicas }).await
}

/// The agent's wait for mail: one `Announce` stream at a time, with the session the bridge last wrote.
struct Wait<'a> {
    found: &'a Found,
    replicas: &'a Replicas,
}

impl Kept for Wait<'_> {
    type Done = Woken;

    async fn open(&mut self) -> Attempt<Woken> {
        // A bridge that had to claim its endpoint again wrote its new token to the file.
        let Some(session) = self.found.reread() else {
            return Attempt::Done(Woken::Ended("the agent's relay session ended".into()));
        };
        let (replica, _) = self.replicas.current();
        match announce(self.replicas, &session.session_token, true).await {
            Ok(Some(announcement)) if !announcement.messages.is_empty() => Attempt::Done(Woken::Mail(announcement)),
            // The stream ended without mail (a server stopping ends it): open it again.
            Ok(_) => Attempt::Failed { on: replica, reason: "the wait ended without mail".into(), progressed: true },
            Err(status) if status.code() == Code::Unauthenticated => {
                let renewed = self.found.reread().is_some_and(|now| now.session_token != session.session_token);
                if renewed {
                    Attempt::Again
                } else {
                    Attempt::Done(Woken::Ended(format!("the relay refused the session: {}", status.message())))
                }
            }
            Err(status) => Attempt::Failed { on: replica, reason: status.message().to_owned(), progressed: false },
        }
    }
}

/// Resolves when process `pid` ends; never for `None`.
async fn process_end(pid: Option<u32>) {
    match pid {
        Some(pid) => process::ended(pid).await,
        None => std::future::pending().await,
    }
}

/// Held by the one waiter of an agent (or of a Codex thread); released when the process ends.
pub struct WaiterLock {
    _file: std::fs::File,
}

impl WaiterLock {
    /// Takes the lock at `path`; `None` when another live waiter holds it (or the lock cannot be
    /// had at all, which is logged).
    pub fn take(path: &Path) -> Option<Self> {
        let file = match std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path) {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "cannot open the waiter's lock file; no waiter runs");
                return None;
            }
        };
        // The operating system's own lock (flock, LockFileEx): it goes with the process that held it.
        match file.try_lock() {
            Ok(()) => Some(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => None,
            Err(std::fs::TryLockError::Error(e)) => {
                tracing::warn!(error = %e, path = %path.display(), "cannot lock the waiter's lock file; no waiter runs");
                None
            }
        }
    }
}

/// The lock file of `agent`'s waiter (`name` tells waiters apart), after removing those of agents
/// that ended.
pub fn lock_path(agent: u32, name: &str) -> anyhow::Result<PathBuf> {
    let path = session_file::agent_file(agent, name)?;
    if let Some(dir) = path.parent() {
        sweep(dir);
    }
    Ok(path)
}

/// Removes waiter lock files whose agent process is gone.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with("wake-")) else { continue };
        let Some(pid) = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !process::alive(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
