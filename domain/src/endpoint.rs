//! An endpoint as the server reports it: who it is, what it says of itself, and whether it is there.

/// One agent's (or the account's human's) endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoint {
    /// account/machine/handle
    pub address: String,
    pub account: String,
    pub machine: String,
    pub handle: String,
    pub harness: String,
    /// idle, busy, blocked or away
    pub status: String,
    pub note: String,
    pub now: String,
    pub title: String,
    pub online: bool,
    pub ended: bool,
    /// Unix milliseconds of the last sign of life.
    pub last_seen_ms: i64,
    /// It lets the endpoints that may message it see its last turns.
    pub peek: bool,
    /// It is its account's operator.
    pub operator: bool,
}
