//! What a call is, by its path, and what a caller is told when a call is refused or stopped:
//! shared by the admission layer and the other layers, which import it and not each other.

use std::time::Duration;

use tonic::Status;
use tonic::metadata::MetadataValue;

use crate::domain::limits::MAX_WAIT_S;

/// What a refused caller is told to wait before retrying (`grpc-retry-pushback-ms`, gRFC A6).
const RETRY_PUSHBACK_MS: &str = "250";

/// How the layers treat a method, by its path (its kind decides its limits and its budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Health and reflection: neither limited nor timed, so readiness never queues behind load.
    Infrastructure,
    /// A server stream: it lives as long as its client wants, so no budget.
    Stream,
    /// A long poll whose wait the request carries (`wait_s`, refused above `MAX_WAIT_S`): that
    /// longest wait plus the ordinary budget, so a wait is never cut but a stuck one still ends.
    LongPoll,
    /// Waits for a decision whose deadlines the server keeps in the database (a permission request
    /// goes to the operator, then the human, about twice `RELAY_APPROVAL_WAIT_S`, longer when it
    /// reaches the human late): no budget here.
    ServerTimed,
    Ordinary,
}

impl Kind {
    pub fn of(path: &str) -> Self {
        let (service, method) = split_path(path);
        match (service, method) {
            ("grpc.health.v1.Health", _)
            | ("grpc.reflection.v1.ServerReflection", _)
            | ("grpc.reflection.v1alpha.ServerReflection", _) => Self::Infrastructure,
            ("relay.v1.Relay", "Subscribe" | "Announce") => Self::Stream,
            ("relay.v1.Relay", "Inbox" | "AskWait") | ("relay.v1.Human", "Inbox") => Self::LongPoll,
            ("relay.v1.Relay", "RequestPermission") => Self::ServerTimed,
            _ => Self::Ordinary,
        }
    }

    /// How long a call of this kind may run before it is stopped; `None` for no limit.
    pub fn budget(self, ordinary: Duration) -> Option<Duration> {
        match self {
            Self::Ordinary => Some(ordinary),
            Self::LongPoll => Some(Duration::from_secs(u64::from(MAX_WAIT_S)) + ordinary),
            Self::Infrastructure | Self::Stream | Self::ServerTimed => None,
        }
    }
}

/// `/pkg.Service/Method` as (`pkg.Service`, `Method`); anything else as (path, "").
pub(super) fn split_path(path: &str) -> (&str, &str) {
    path.trim_start_matches('/').split_once('/').unwrap_or((path, ""))
}

/// Tells a refused caller when to retry (`grpc-retry-pushback-ms`), which the bridge passes on.
pub fn advise_retry(status: &mut Status) {
    status.metadata_mut().insert("grpc-retry-pushback-ms", MetadataValue::from_static(RETRY_PUSHBACK_MS));
}

/// Tells a refused caller to retry after `wait` (at least a millisecond).
pub fn advise_retry_after(status: &mut Status, wait: Duration) {
    let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
    status.metadata_mut().insert("grpc-retry-pushback-ms", MetadataValue::from(ms));
}

/// The status of a call stopped after `budget`.
pub fn ran_too_long(path: &str, budget: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "{} took longer than the server allows ({} s) and was stopped: retry it, and tell the operator if it keeps happening",
        path.trim_start_matches('/'),
        budget.as_secs_f64()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_classified_by_path() {
        assert_eq!(Kind::of("/grpc.health.v1.Health/Check"), Kind::Infrastructure);
        assert_eq!(Kind::of("/grpc.health.v1.Health/Watch"), Kind::Infrastructure);
        assert_eq!(Kind::of("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"), Kind::Infrastructure);
        assert_eq!(Kind::of("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"), Kind::Infrastructure);
        assert_eq!(Kind::of("/relay.v1.Relay/Subscribe"), Kind::Stream);
        assert_eq!(Kind::of("/relay.v1.Relay/Announce"), Kind::Stream);
        assert_eq!(Kind::of("/relay.v1.Relay/Inbox"), Kind::LongPoll);
        assert_eq!(Kind::of("/relay.v1.Relay/AskWait"), Kind::LongPoll);
        assert_eq!(Kind::of("/relay.v1.Human/Inbox"), Kind::LongPoll);
        assert_eq!(Kind::of("/relay.v1.Relay/RequestPermission"), Kind::ServerTimed);
        assert_eq!(Kind::of("/relay.v1.Relay/Send"), Kind::Ordinary);
        assert_eq!(Kind::of("/relay.v1.Worker/Claim"), Kind::Ordinary);
        assert_eq!(Kind::of("/nonsense"), Kind::Ordinary);
        // The names match what the generated servers route on.
        assert_eq!(relay_proto::v1::relay_server::SERVICE_NAME, "relay.v1.Relay");
        assert_eq!(relay_proto::v1::human_server::SERVICE_NAME, "relay.v1.Human");
        assert_eq!(tonic_health::pb::health_server::SERVICE_NAME, "grpc.health.v1.Health");
        assert_eq!(
            tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
            "grpc.reflection.v1.ServerReflection"
        );
    }

    #[test]
    fn budgets_never_cut_a_wait_the_request_may_ask_for() {
        let ordinary = Duration::from_secs(30);
        assert_eq!(Kind::Ordinary.budget(ordinary), Some(ordinary));
        assert_eq!(Kind::LongPoll.budget(ordinary), Some(Duration::from_secs(u64::from(MAX_WAIT_S) + 30)));
        assert!(Kind::LongPoll.budget(Duration::from_secs(1)).unwrap() > Duration::from_secs(u64::from(MAX_WAIT_S)));
        for kind in [Kind::Stream, Kind::ServerTimed, Kind::Infrastructure] {
            assert_eq!(kind.budget(ordinary), None, "{kind:?}");
        }
    }
}
