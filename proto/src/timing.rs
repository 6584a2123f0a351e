//! The timing both ends of a stream agree on, and the short form of a message id: defined here once,
//! so the server's heartbeat and its clients' patience cannot drift apart.

use std::time::Duration;

/// How often a server stream (an endpoint's push stream, a waiting announcement) says it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// How many heartbeats in a row a client lets pass unheard before it gives a stream up.
pub const SILENT_BEATS: u32 = 3;
/// What a client allows past those heartbeats for a slow network or a busy server.
pub const SILENCE_MARGIN: Duration = Duration::from_secs(5);
/// This much silence from a server stream means its connection is dead: [`SILENT_BEATS`] periods
/// of [`HEARTBEAT_EVERY`] and the [`SILENCE_MARGIN`].
pub const SILENCE: Duration =
    Duration::from_secs(HEARTBEAT_EVERY.as_secs() * SILENT_BEATS as u64 + SILENCE_MARGIN.as_secs());

/// How long a message id's short form is: its first characters, which the server keeps unique
/// among recent messages and every client shows.
pub const SHORT_ID_LEN: usize = 8;

/// Waits between attempts that double from `first` up to `max`, and start over once one succeeds.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, next: first }
    }

    /// A client reopening a stream to the server: soon after a blip, at most every few seconds.
    pub const fn reopening() -> Self {
        Self::new(Duration::from_millis(200), Duration::from_secs(5))
    }

    /// The wait before the next attempt; the one after it is twice as long, up to the bound.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (wait * 2).min(self.max);
        wait
    }

    /// An attempt succeeded: the next failure waits the first wait again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_bound_and_start_over_after_a_success() {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
        let waits: Vec<u128> = (0..5).map(|_| backoff.next_wait().as_millis()).collect();
        assert_eq!(waits, [200, 400, 800, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.next_wait(), Duration::from_millis(200));
    }
}
