//! How long an endpoint counts as online. Presence is a lease in the database, so every replica sees
//! it and a crashed replica's endpoints go offline by themselves: an endpoint with its push stream
//! open is online while the replica holding the stream renews its own liveness, which costs one
//! write per replica, however many streams it holds.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

use super::Error;
use super::ids::Seq;

/// A replica's liveness lasts this long and is renewed every [`REPLICA_RENEW`]: a crashed replica's
/// streams count as closed within [`REPLICA_LEASE`].
pub const REPLICA_LEASE: Duration = Duration::from_secs(15);
pub const REPLICA_RENEW: Duration = Duration::from_secs(5);
/// The presence lease a fresh claim takes. A claim whose stream never opens loses its handle long
/// before, after [`UNSTREAMED_HOLD`]; the lease is what remains when a replica dies with streams open.
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);
/// After a stream closes, the endpoint stays online this long, so a quick reconnect is invisible.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(5);
/// A session with no push stream open keeps its handle this long after its last sign of life (its
/// Hello, its stream closing): enough for a bridge to open its stream right after Hello or to
/// reconnect at once, short enough that a crashed agent's handle is free again within 2 s.
pub const UNSTREAMED_HOLD: Duration = Duration::from_millis(1000);

/// A lease length in whole seconds, as SQL interval arithmetic takes it.
pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A push stream just opened: its generation, the inbox head, and the endpoint's role.
pub struct OpenStream {
    pub generation: i64,
    pub head: Seq,
    pub operator: bool,
}

/// The session holding a handle, as a refused claim describes it.
pub struct Holder {
    pub harness: String,
    pub since: DateTime<Utc>,
    pub stream_open: bool,
}

/// The refusal of a claim on a handle another live session holds: by whom, since when, what to do.
pub fn handle_held(handle: &str, machine: &str, holder: &Holder) -> Error {
    let session = match holder.harness.as_str() {
        "" | "other" => "a session".to_owned(),
        harness => format!("a {harness} session"),
    };
    let since = holder.since.to_rfc3339_opts(SecondsFormat::Secs, true);
    let next = if holder.stream_open {
        "with its push stream open: choose another handle (--handle or RELAY_HANDLE), or wait for that session to end"
            .to_owned()
    } else {
        format!(
            "that has not opened its push stream: choose another handle (--handle or RELAY_HANDLE), or claim it again in {} s, when it is free unless that session opens its stream",
            UNSTREAMED_HOLD.as_secs_f64().ceil()
        )
    };
    Error::AlreadyExists(format!("handle {handle} on {machine} is held by {session} connected since {since} {next}"))
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

    #[test]
    fn a_held_handle_says_by_whom_since_when_and_what_to_do() {
        let since = Utc.with_ymd_and_hms(2026, 11, 30, 12, 3, 4).unwrap();
        let open = handle_held("alice", "acme/laptop", &Holder { harness: "claude".into(), since, stream_open: true });
        assert!(matches!(open, Error::AlreadyExists(_)));
        assert_eq!(
            open.to_string(),
            "handle alice on acme/laptop is held by a claude session connected since 2026-11-30T12:03:04Z with its push stream open: choose another handle (--handle or RELAY_HANDLE), or wait for that session to end"
        );
        let quiet = handle_held("bob", "acme/ci", &Holder { harness: "other".into(), since, stream_open: false });
        assert_eq!(
            quiet.to_string(),
            "handle bob on acme/ci is held by a session connected since 2026-11-30T12:03:04Z that has not opened its push stream: choose another handle (--handle or RELAY_HANDLE), or claim it again in 1 s, when it is free unless that session opens its stream"
        );
    }

    #[test]
    fn a_crashed_holder_is_free_within_two_seconds() {
        assert!(UNSTREAMED_HOLD < Duration::from_secs(2));
        assert!(UNSTREAMED_HOLD < RECONNECT_GRACE);
    }

    #[test]
    fn a_replica_survives_one_missed_renewal() {
        assert!(REPLICA_RENEW * 2 < REPLICA_LEASE);
    }
}
