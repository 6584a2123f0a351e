//! relay-server: the one component of Relay that decides anything.
//!
//! * [`protocol`]: the gRPC handlers, thin: authenticate, map `relay.v1` to and from the server's
//!   own shapes, call the application.
//! * [`app`]: the application, one module per area: limits, redaction, waits, then the store.
//! * [`domain`]: the product's rules, pure and unit-tested.
//! * [`store`]: all SQL, over a Postgres pool.
//! * [`push`]: LISTEN/NOTIFY fan-out and the per-endpoint push streams.
//! * [`scheduler`]: the timed rounds: due schedules, expired worker leases.
//! * [`serve`], [`dev`], [`admin`]: what the `relay-server` commands run.

pub mod admin;
pub mod app;
pub mod dev;
/// The product's rules: a crate of their own, so that nothing with I/O can reach them.
pub use relay_domain as domain;
pub mod metrics;
pub mod protocol;
pub mod push;
pub mod scheduler;
pub mod serve;
pub mod store;
