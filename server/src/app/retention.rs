//! The purge round: what outlived its retention is deleted in bounded batches, each its own short
//! transaction, so a large backlog drains over rounds without holding locks for long.

use std::future::Future;

use super::observe::OpsService;
use crate::domain::Result;
use crate::domain::retention::{PURGE_BATCH, PURGE_BATCHES_PER_ROUND};
use crate::store::{artifacts, console, remote, retention};

/// What one round purged.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    pub messages: u64,
    pub cards: u64,
    pub peeks: u64,
    /// Console sessions expired, or of a revoked human token (kept for no retention).
    pub console_sessions: u64,
    /// Sessions of MCP clients at `/mcp` unused past their time.
    pub mcp_sessions: u64,
    /// Answers kept for MCP clients to resume, past their time.
    pub mcp_answers: u64,
    /// Uploads no send attached, files of messages gone, and contents nothing refers to.
    pub files: u64,
}

impl Purged {
    pub fn total(&self) -> u64 {
        self.messages
            + self.cards
            + self.peeks
            + self.console_sessions
            + self.mcp_sessions
            + self.mcp_answers
            + self.files
    }
}

/// Runs `batch` until it deletes less than a full batch or the round's share is spent.
async fn drain<F, Fut>(mut batch: F) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::store::Result<u64>>,
{
    let mut total = 0;
    for _ in 0..PURGE_BATCHES_PER_ROUND {
        let deleted = batch().await?;
        total += deleted;
        if deleted < PURGE_BATCH as u64 {
            break;
        }
    }
    Ok(total)
}

impl OpsService {
    pub async fn purge(&self) -> Result<Purged> {
        let keep = self.retention;
        let db = self.core.store.client().await?;
        let messages = drain(|| retention::purge_messages(&db, keep.messages.as_secs_f64(), PURGE_BATCH)).await?;
        let cards = drain(|| retention::purge_cards(&db, keep.cards.as_secs_f64(), PURGE_BATCH)).await?;
        let peeks = drain(|| retention::purge_peeks(&db, keep.audit.as_secs_f64(), PURGE_BATCH)).await?;
        let console_sessions = drain(|| console::purge_sessions(&db, PURGE_BATCH)).await?;
        let mcp_sessions = drain(|| remote::purge_sessions(&db, PURGE_BATCH)).await?;
        let mcp_answers = drain(|| remote::purge_answers(&db, PURGE_BATCH)).await?;
        let files = drain(|| artifacts::purge(&db, PURGE_BATCH)).await?;
        Ok(Purged { messages, cards, peeks, console_sessions, mcp_sessions, mcp_answers, files })
    }
}
