//! Pure rules of the product: names, addresses, limits, ids and delivery states. No I/O here.

pub mod address;
pub mod board;
pub mod delivery;
pub mod error;
pub mod ids;
pub mod limits;
pub mod names;
pub mod presence;
pub mod redact;
pub mod schedule;
pub mod scope;

pub use error::Error;

/// Result of any operation that can fail with a domain error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
