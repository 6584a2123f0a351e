//! What lets a replica keep database reads in memory: it may keep one only while it hears every
//! change that could make it wrong (its listener is connected), and only a read that began after
//! the last thing it forgot. [`sessions`](super::sessions) and [`resolved`](super::resolved) each
//! hold one of these beside their entries.

use std::time::{Duration, Instant};

/// A safety net only: every change that matters is announced.
const TTL: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
pub struct Heard {
    /// Whether changes are heard: false until the listener is up, and while it reconnects.
    trusted: bool,
    /// Bumped by every forgetting, so a read that began before one is not kept after it.
    epoch: u64,
}

/// Taken before a database read, handed back with its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

impl Heard {
    /// A ticket for a read beginning now.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.epoch)
    }

    /// Whether what a read holding `ticket` found may be kept.
    pub fn admits(&self, ticket: Ticket) -> bool {
        self.trusted && self.epoch == ticket.0
    }

    /// Whether an entry kept at `at` may still be served.
    pub fn serves(&self, at: Instant) -> bool {
        self.trusted && at.elapsed() < TTL
    }

    /// Something was forgotten: reads under way are not kept.
    pub fn forgot(&mut self) {
        self.epoch += 1;
    }

    /// Changes may go unheard from now on (the listener is down); the caller drops its entries.
    pub fn distrust(&mut self) {
        self.trusted = false;
        self.epoch += 1;
    }

    /// Every change is heard from now on. A read that began before (while changes went unheard)
    /// is not kept.
    pub fn trust(&mut self) {
        self.trusted = true;
        self.epoch += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_kept_only_while_heard_and_if_nothing_was_forgotten_since_it_began() {
        let mut heard = Heard::default();
        let before_trust = heard.ticket();
        assert!(!heard.admits(before_trust), "nothing is kept before changes are heard");
        heard.trust();
        assert!(!heard.admits(before_trust), "nor a read that began before");
        let ticket = heard.ticket();
        assert!(heard.admits(ticket) && heard.serves(Instant::now()));
        heard.forgot();
        assert!(!heard.admits(ticket), "a read that raced a forgetting is not kept");
        let ticket = heard.ticket();
        heard.distrust();
        assert!(!heard.admits(ticket) && !heard.serves(Instant::now()), "nothing is kept or served unheard");
    }
}
