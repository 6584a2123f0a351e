//! How long what the server keeps is kept: nothing grows forever.

use std::time::Duration;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// How long each kind of record outlives its use before it is purged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A message (and its deliveries) once every recipient has read it or it was withdrawn; unread
    /// mail stays until it is read, bounded by the unread cap of each inbox.
    pub messages: Duration,
    /// A finished card (Done, its worktree cleaned up), from when it was closed.
    pub cards: Duration,
    /// Who peeked at whom, from when they looked.
    pub audit: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self { messages: 30 * DAY, cards: 90 * DAY, audit: 90 * DAY }
    }
}

/// Rows deleted per statement, so a purge never holds many locks or one long transaction.
pub const PURGE_BATCH: i64 = 1000;
/// Batches of one kind per round at most; the rest waits for the next round.
pub const PURGE_BATCHES_PER_ROUND: usize = 10;
