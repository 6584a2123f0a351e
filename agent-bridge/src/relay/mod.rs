//! The gRPC side of the bridge: the server's replicas, the endpoint session, the push stream.

pub mod connection;
pub mod push;
pub mod replicas;
pub mod session;
pub mod session_file;

pub use session::{Relay, RelayError};
