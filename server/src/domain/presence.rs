//! How long an endpoint counts as online. Presence is a lease in the database, so every replica sees
//! it and a crashed replica's endpoints go offline by themselves.

use std::time::Duration;

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
