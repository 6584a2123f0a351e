//! The gRPC side of the bridge: one channel to the server, the endpoint session, the push stream.

pub mod connection;
pub mod push;
pub mod session;
pub mod session_file;

pub use session::{Relay, RelayError};
