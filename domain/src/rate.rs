//! Token buckets: a sustained rate with room for a burst. Pure arithmetic on instants the caller
//! gives, so the rules are tested without waiting.

use std::time::{Duration, Instant};

/// A sustained rate per second and the burst allowed above it; a rate of 0 is no limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_s: f64,
    pub burst: f64,
}

impl Rate {
    pub const UNLIMITED: Self = Self { per_s: 0.0, burst: 0.0 };

    pub fn new(per_s: f64, burst: f64) -> Self {
        Self { per_s: per_s.max(0.0), burst: burst.max(1.0) }
    }

    pub fn is_unlimited(self) -> bool {
        self.per_s <= 0.0
    }
}

/// A wait as a person reads it: whole seconds, rounded up, at least one ("try again in 2 s", never
/// "0.0 s").
pub fn whole_seconds(wait: Duration) -> u64 {
    let rounded_up = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    rounded_up.max(1)
}

/// One bucket's state: the tokens it held at `at`.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A bucket that starts full: a newcomer gets its burst.
    pub fn full(rate: Rate, now: Instant) -> Self {
        Self { tokens: rate.burst, at: now }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_s).min(rate.burst);
        self.at = now;
    }

    /// Takes one token, or says how long until one is there.
    pub fn take(&mut self, rate: Rate, now: Instant) -> Result<(), Duration> {
        if rate.is_unlimited() {
            return Ok(());
        }
        self.refill(rate, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate.per_s))
        }
    }

    /// Whether a token is there now, without taking it; otherwise how long until one is.
    pub fn ready(&mut self, rate: Rate, now: Instant) -> Result<(), Duration> {
        if rate.is_unlimited() {
            return Ok(());
        }
        self.refill(rate, now);
        if self.tokens >= 1.0 { Ok(()) } else { Err(Duration::from_secs_f64((1.0 - self.tokens) / rate.per_s)) }
    }

    /// Spends `n` tokens for work already done: the bucket may go into debt (down to one burst
    /// below empty), which later work waits out.
    pub fn spend(&mut self, rate: Rate, n: f64, now: Instant) {
        if rate.is_unlimited() {
            return;
        }
        self.refill(rate, now);
        self.tokens = (self.tokens - n).max(-rate.burst);
    }

    /// Gives back a token taken by a call that was refused further on.
    pub fn give_back(&mut self, rate: Rate) {
        self.tokens = (self.tokens + 1.0).min(rate.burst);
    }

    /// Whether the bucket is full again by `now`, so forgetting it changes nothing.
    pub fn is_full(&self, rate: Rate, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        rate.is_unlimited() || self.tokens + elapsed * rate.per_s >= rate.burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_reads_in_whole_seconds_and_never_as_nothing() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(30)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1200)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
    }

    #[test]
    fn a_burst_passes_then_the_rate_holds_with_the_wait_said() {
        let rate = Rate::new(2.0, 3.0);
        let t0 = Instant::now();
        let mut bucket = Bucket::full(rate, t0);
        for _ in 0..3 {
            assert_eq!(bucket.take(rate, t0), Ok(()));
        }
        let wait = bucket.take(rate, t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500), "one token comes back every half second");
        assert_eq!(bucket.take(rate, t0 + Duration::from_millis(500)), Ok(()));
        assert!(bucket.take(rate, t0 + Duration::from_millis(600)).is_err());
        assert!(!bucket.is_full(rate, t0 + Duration::from_millis(600)));
        assert!(bucket.is_full(rate, t0 + Duration::from_secs(3)), "idle long enough, it holds its burst again");
    }

    #[test]
    fn a_refill_never_exceeds_the_burst_and_a_give_back_restores_a_token() {
        let rate = Rate::new(10.0, 2.0);
        let t0 = Instant::now();
        let mut bucket = Bucket::full(rate, t0);
        let later = t0 + Duration::from_secs(60);
        assert_eq!(bucket.take(rate, later), Ok(()));
        assert_eq!(bucket.take(rate, later), Ok(()));
        assert!(bucket.take(rate, later).is_err(), "a long idle does not bank more than the burst");
        bucket.give_back(rate);
        assert_eq!(bucket.take(rate, later), Ok(()));
    }

    #[test]
    fn work_spent_after_the_fact_is_waited_out_before_more_is_ready() {
        let rate = Rate::new(100.0, 50.0);
        let t0 = Instant::now();
        let mut bucket = Bucket::full(rate, t0);
        assert_eq!(bucket.ready(rate, t0), Ok(()));
        bucket.spend(rate, 80.0, t0);
        assert_eq!(bucket.ready(rate, t0), Err(Duration::from_millis(310)), "30 in debt, one more needed at 100/s");
        bucket.spend(rate, 1000.0, t0);
        assert_eq!(bucket.ready(rate, t0), Err(Duration::from_millis(510)), "debt stops at one burst");
        assert_eq!(bucket.ready(rate, t0 + Duration::from_millis(510)), Ok(()));
    }

    #[test]
    fn a_zero_rate_is_no_limit() {
        let t0 = Instant::now();
        let mut bucket = Bucket::full(Rate::UNLIMITED, t0);
        assert!((0..10_000).all(|_| bucket.take(Rate::UNLIMITED, t0).is_ok()));
    }
}
