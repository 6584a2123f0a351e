//! Push: how a committed delivery reaches the recipient's open stream on whichever replica holds it.
//!
//! Writers send `NOTIFY` from the delivering transaction; each replica `LISTEN`s on one dedicated
//! connection ([`listener`]) and wakes the local waiters of that recipient ([`hub`]); each waiter
//! re-reads the database above the last seq it handled ([`stream`]), so a lost notification costs
//! latency, never a message.

pub mod announce;
pub mod events;
pub mod hub;
pub mod listener;
pub mod liveness;
pub mod stream;

pub use hub::Hub;
