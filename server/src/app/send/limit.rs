//! How many sends may be under way at once: as many as this replica completes within
//! [`BUDGET`] at the rate it achieved lately, never fewer than [`FLOOR`] nor more than [`CEILING`].
//! A send beyond that would wait longer than the budget behind the others, so it is refused at once
//! with a retry hint instead: under overload the accepted sends stay fast and the rest are told so
//! in microseconds, rather than every send queueing for seconds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an accepted send should at most wait behind the sends ahead of it.
const BUDGET: Duration = Duration::from_millis(25);
/// Admitted whatever the measured rate: enough for a burst of concurrent agents on an idle server.
const FLOOR: usize = 64;
/// Admitted at most whatever the measured rate.
const CEILING: usize = 4096;
/// The completion rate is measured over windows this long and smoothed across them.
const WINDOW: Duration = Duration::from_millis(100);

pub struct SendLimit {
    under_way: AtomicUsize,
    rate: Mutex<Rate>,
}

struct Rate {
    since: Instant,
    done: u32,
    per_s: f64,
}

/// A send's place among those under way; giving it back counts the send as completed.
pub struct Permit(Arc<SendLimit>);

/// The sends to admit at `per_s` completions a second.
fn limit_for(per_s: f64) -> usize {
    ((per_s * BUDGET.as_secs_f64()) as usize).clamp(FLOOR, CEILING)
}

impl Default for SendLimit {
    fn default() -> Self {
        Self { under_way: AtomicUsize::new(0), rate: Mutex::new(Rate { since: Instant::now(), done: 0, per_s: 0.0 }) }
    }
}

impl SendLimit {
    fn rate(&self) -> std::sync::MutexGuard<'_, Rate> {
        self.rate.lock().expect("send rate lock poisoned")
    }

    /// A place for one more send, or `None` when it would wait past the budget.
    pub fn try_admit(self: &Arc<Self>) -> Option<Permit> {
        let limit = limit_for(self.rate().per_s);
        let before = self.under_way.fetch_add(1, Ordering::AcqRel);
        if before >= limit {
            self.under_way.fetch_sub(1, Ordering::AcqRel);
            crate::metrics::metrics().shed(crate::metrics::Shed::sends);
            return None;
        }
        Some(Permit(self.clone()))
    }

    fn completed(&self) {
        self.under_way.fetch_sub(1, Ordering::AcqRel);
        let mut rate = self.rate();
        rate.done += 1;
        let elapsed = rate.since.elapsed();
        if elapsed >= WINDOW {
            let measured = f64::from(rate.done) / elapsed.as_secs_f64();
            // Smoothed, so one slow window (a checkpoint) does not halve what is admitted.
            rate.per_s = if rate.per_s == 0.0 { measured } else { 0.5 * rate.per_s + 0.5 * measured };
            rate.since = Instant::now();
            rate.done = 0;
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.completed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_what_completes_within_the_budget_within_bounds() {
        assert_eq!(limit_for(0.0), FLOOR, "an idle replica still takes a burst");
        assert_eq!(limit_for(10_000.0), 250);
        assert_eq!(limit_for(1e9), CEILING);
    }

    #[test]
    fn places_beyond_the_limit_are_refused_and_given_back_ones_reused() {
        let limit = Arc::new(SendLimit::default());
        let held: Vec<Permit> = (0..FLOOR).map(|_| limit.try_admit().expect("within the floor")).collect();
        assert!(limit.try_admit().is_none(), "one past the limit is refused");
        drop(held);
        assert_eq!(limit.under_way.load(Ordering::Acquire), 0);
        assert!(limit.try_admit().is_some());
    }
}
