//! The periods the board and the scheduler keep, set by the operator (`serve --help`).

use std::time::Duration;

use super::board::{LEASE_S, PR_CHECK_S};

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
            approval_wait: Duration::from_secs(300),
            lease: Duration::from_secs_f64(LEASE_S),
            pr_check: Duration::from_secs_f64(PR_CHECK_S),
            scheduler_tick: Duration::from_secs(1),
        }
    }
}
