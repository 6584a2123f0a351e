//! `agent-bridge hook EVENT`: what agent clients run at the end of a turn, to learn of mail and to
//! share turns for peek. Each acts as the agent whose bridge it finds through its process ancestry
//! (the session file that bridge keeps), so it needs no credential of its own.
//!
//! Every hook call has a deadline: a relay that is frozen or gone costs a client at most
//! [`DEADLINE`] at the end of a turn, after which the hook gives up quietly and the turn ends as
//! if Relay were not there. Only the waiters (`wake`, and the one `codex-notify` arms) wait long,
//! and only where the client does not wait for them.

mod claude;
mod codex;
pub mod guard;
mod notice;
mod turn_end;
mod wake;

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use serde_json::Value;

pub use wake::LIFETIME as WAKE_LIFETIME;

use crate::session_file::{self, Found};
use relay_agent::relay::replicas::Replicas;

/// Longest a hook that a client waits for may take, whatever the relay does.
const DEADLINE: Duration = Duration::from_secs(8);
/// Longest a hook waits for the client to hand it the event on stdin.
const EVENT_WAIT: Duration = Duration::from_secs(2);

#[derive(Subcommand)]
pub enum Event {
    /// Claude Code's Stop hook: holds the stop while a request that requires a reply is
    /// unanswered, and shares the last turns for peek when the agent allows it.
    Stop,
    /// Claude Code's asyncRewake Stop hook: waits for mail the model has not been shown and exits
    /// 2 with a short notice, which wakes the idle session. Exits at once in print mode.
    Wake,
    /// Codex's notify program: shares the turn for peek, and after a turn of an interactive session
    /// arms a waiter that wakes the idle session through `codex queue`.
    CodexNotify {
        /// The event Codex passes to its notify program.
        payload: Option<String>,
    },
    /// Codex's Stop hook: holds the end of a turn once for mail the model has not been shown.
    CodexStop,
    /// Gemini CLI's AfterAgent hook: asks for one more turn for mail the model has not been shown.
    GeminiAfterAgent,
    /// Cursor's stop hook: a follow-up message for mail the model has not been shown.
    CursorStop,
    /// git's pre-commit hook: refuses a commit that touches paths another agent holds exclusively
    /// (RELAY_GUARD=off passes it; with the relay out of reach it warns and lets the commit through).
    Guard,
    /// The waiter `codex-notify` arms: queues a notice into the Codex thread when mail comes.
    #[command(hide = true)]
    CodexWake {
        #[arg(long)]
        thread: String,
        /// The Codex process running the thread.
        #[arg(long)]
        agent: u32,
        /// The bridge whose session the waiter acts in (`RELAY_SESSION_FILE` names its file).
        #[arg(long)]
        bridge: u32,
    },
}

pub async fn run(event: Event) -> anyhow::Result<ExitCode> {
    match event {
        Event::Wake => Ok(claude::wake().await),
        Event::Guard => Ok(guard::run().await),
        Event::CodexWake { thread, agent, bridge } => codex::wake(&thread, agent, bridge).await,
        other => {
            // Within the deadline, or not at all: the client is waiting for us to end its turn.
            let outcome = tokio::time::timeout(DEADLINE, at_turn_end(other)).await;
            match outcome {
                Ok(result) => result.map(|()| ExitCode::SUCCESS),
                Err(_) => {
                    eprintln!(
                        "agent-bridge: the relay did not answer within {} s; going on without it",
                        DEADLINE.as_secs()
                    );
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
    }
}

async fn at_turn_end(event: Event) -> anyhow::Result<()> {
    match event {
        Event::Stop => claude::stop(read_event().await).await,
        Event::CodexNotify { payload } => codex::notify(payload).await,
        Event::CodexStop => turn_end::run(turn_end::Client::Codex, read_event().await).await,
        Event::GeminiAfterAgent => turn_end::run(turn_end::Client::Gemini, read_event().await).await,
        Event::CursorStop => turn_end::run(turn_end::Client::Cursor, read_event().await).await,
        Event::Wake | Event::CodexWake { .. } | Event::Guard => unreachable!("run apart"),
    }
}

/// The event JSON a client writes on the hook's stdin; `Null` when it sends none in time (a
/// client that leaves stdin open must not hold the hook).
async fn read_event() -> Value {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A thread of its own: a read that never returns must not keep the runtime from ending.
    std::thread::spawn(move || {
        use std::io::Read;
        let mut input = String::new();
        let _ = std::io::stdin().read_to_string(&mut input);
        let _ = tx.send(input);
    });
    match tokio::time::timeout(EVENT_WAIT, rx).await {
        Ok(Ok(input)) => serde_json::from_str(&input).unwrap_or(Value::Null),
        _ => Value::Null,
    }
}

/// The agent a hook acts for: its bridge's session and how to reach the server.
pub struct Agent {
    pub found: Found,
    pub replicas: Replicas,
}

impl Agent {
    /// The agent whose bridge this hook's ancestry runs; `None` when it runs none (not an agent on
    /// the relay: the hook has nothing to do).
    pub fn find() -> Option<Self> {
        let found = session_file::find().ok()?;
        let replicas = match Replicas::new(&found.session.server, found.session.ca.as_deref()) {
            Ok(replicas) => replicas,
            Err(e) => {
                eprintln!("agent-bridge: {e}");
                return None;
            }
        };
        Some(Self { found, replicas })
    }

    pub fn token(&self) -> &str {
        &self.found.session.session_token
    }

    pub fn address(&self) -> &str {
        &self.found.session.address
    }
}
