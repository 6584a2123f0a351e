//! Pure rules of the product and the shapes it reports (endpoints, messages, cards, rules, holds):
//! names, addresses, limits, ids and delivery states. No I/O here, and no wire types.

pub mod address;
pub mod board;
pub mod caller;
pub mod console;
pub mod delivery;
pub mod endpoint;
pub mod error;
pub mod ids;
pub mod limits;
pub mod message;
pub mod names;
pub mod presence;
pub mod rate;
pub mod redact;
pub mod retention;
pub mod schedule;
pub mod scope;
pub mod timings;
pub mod trust;

pub use error::{EntityKind, Error};

/// Result of any operation that can fail with a domain error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
