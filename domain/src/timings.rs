//! The periods the board and the scheduler keep, set by the operator (`serve --help`).

use std::time::Duration;

use super::board::{LEASE_S, PR_CHECK_S};

/// Seconds the operator, then the human, has to answer a permission request, by default.
pub const APPROVAL_WAIT_S: u64 = 300;
/// Milliseconds between the scheduler's rounds, by default. A round of an idle replica is one read
/// (one commit): every 2 s, with the liveness renewal every 5 s, an idle replica commits 0.7 times a
/// second whatever the number of streams, and due work (minute-grained schedules, leases and waits
/// of minutes) is taken up within 2 s.
pub const SCHEDULER_TICK_MS: u64 = 2000;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timings {
    /// How long the operator, then the human, has to answer a permission request.
    pub approval_wait: Duration,
    /// How long a worker's claim on a card lasts unless renewed.
    pub lease: Duration,
    /// How often an open pull request is asked about.
    pub pr_check: Duration,
    /// How often each replica's scheduler looks for due work.
    pub scheduler_tick: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            approval_wait: Duration::from_secs(APPROVAL_WAIT_S),
            lease: Duration::from_secs_f64(LEASE_S),
            pr_check: Duration::from_secs_f64(PR_CHECK_S),
            scheduler_tick: Duration::from_millis(SCHEDULER_TICK_MS),
        }
    }
}
