//! Pure rules of the product and the shapes it reports (endpoints, messages, cards, rules, holds):
//! names, addresses, limits, ids and delivery states. No I/O here, and no wire types: the crate
//! depends on nothing that reaches a socket, a file or the database, so the compiler keeps it so.

pub mod activity;
pub mod address;
pub mod artifact;
pub mod board;
pub mod caller;
pub mod claims;
pub mod console;
pub mod delivery;
pub mod endpoint;
pub mod error;
pub mod ids;
pub mod limits;
pub mod loops;
pub mod message;
pub mod names;
pub mod presence;
pub mod rate;
pub mod redact;
pub mod retention;
pub mod schedule;
pub mod scope;
pub mod search;
#[cfg(feature = "postgres")]
mod sql;
pub mod timings;
pub mod topic;
pub mod trust;

pub use error::{EntityKind, Error};

/// Result of any operation that can fail with a domain error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    /// What the crate may never depend on: anything that reaches a socket, a file watcher, the
    /// database or the wire. Cargo would build it; this says no.
    #[test]
    fn the_crate_depends_on_nothing_that_does_io() {
        let manifest = include_str!("../Cargo.toml");
        let deps = manifest.split("[dependencies]").nth(1).expect("a [dependencies] table");
        let deps = deps.split("\n[").next().unwrap_or_default();
        for forbidden in
            ["tokio", "tonic", "prost", "hyper", "axum", "tower", "postgres =", "deadpool", "rustls", "reqwest"]
        {
            let found = deps.lines().any(|l| l.trim_start().starts_with(forbidden));
            assert!(!found, "relay-domain depends on {forbidden}: its rules must stay free of I/O");
        }
        assert!(
            deps.contains("relay-proto.workspace = true") && !deps.contains("\"grpc\""),
            "relay-proto only without its gRPC feature"
        );
    }
}
