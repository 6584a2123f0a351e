//! What lets a replica keep database reads in memory: it may keep one only while it hears every
//! change that could make it wrong (its listener is connected), and only a read that began after
//! the last thing it forgot. The store's sessions and the send pipeline's resolved recipients
//! each hold one of these beside their entries, and bound their entries alike ([`make_room`]).

use std::collections::HashMap;
use std::hash::Hash;
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

/// Bounds a cache's memory whatever the traffic: once `entries` (each kept with when it was kept)
/// holds `max`, its older half is dropped (the median entry, and any kept at the same instant,
/// with it) and what was dropped is answered, for the caller's other indexes. A dropped entry is
/// only read again from the database.
pub fn make_room<K: Eq + Hash, V>(entries: &mut HashMap<K, (V, Instant)>, max: usize) -> Vec<V> {
    if entries.len() < max.max(1) {
        return Vec::new();
    }
    let mut ages: Vec<Instant> = entries.values().map(|(_, at)| *at).collect();
    let half = ages.len() / 2;
    let (_, median, _) = ages.select_nth_unstable(half);
    let median = *median;
    entries.extract_if(|_, (_, at)| *at <= median).map(|(_, (v, _))| v).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_cache_drops_its_older_half_and_says_what() {
        let start = Instant::now();
        let mut entries: HashMap<u32, (u32, Instant)> =
            (0..10).map(|i| (i, (i * 10, start + Duration::from_millis(u64::from(i))))).collect();
        assert!(make_room(&mut entries, 11).is_empty(), "room left: nothing dropped");
        let mut dropped = make_room(&mut entries, 10);
        dropped.sort_unstable();
        assert_eq!(dropped, [0, 10, 20, 30, 40, 50], "the older half, the median among them");
        let mut kept: Vec<u32> = entries.into_keys().collect();
        kept.sort_unstable();
        assert_eq!(kept, [6, 7, 8, 9]);
    }

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
