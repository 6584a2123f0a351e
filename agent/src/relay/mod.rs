//! The gRPC side of an agent: the server's replicas, the endpoint session, the push stream.

pub mod push;
pub mod reopen;
pub mod replicas;
pub mod session;

pub use session::{Relay, RelayError};
