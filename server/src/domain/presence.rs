//! How long an endpoint counts as online. Presence is a lease in the database, so every replica sees
//! it and a crashed replica's endpoints go offline by themselves.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

/// Lease taken by an open push stream; renewed every [`RENEW_EVERY`].
pub const STREAM_LEASE: Duration = Duration::from_secs(30);
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// A fresh claim holds its handle this long before its stream opens.
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);
/// After a stream closes, the endpoint stays online this long, so a quick reconnect is invisible.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(5);

/// A lease length in whole seconds, as SQL interval arithmetic takes it.
pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// What a sender is told about a recipient that is not online: since when, if it was ever seen.
pub fn offline_reason(last_seen: Option<DateTime<Utc>>) -> String {
    match last_seen {
        Some(at) => format!("offline since {}", at.to_rfc3339_opts(SecondsFormat::Secs, true)),
        None => "offline: it has not connected yet".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn offline_reason_says_since_when_in_utc() {
        let at = Utc.with_ymd_and_hms(2026, 11, 30, 12, 3, 4).unwrap();
        assert_eq!(offline_reason(Some(at)), "offline since 2026-11-30T12:03:04Z");
        assert_eq!(offline_reason(None), "offline: it has not connected yet");
    }
}
