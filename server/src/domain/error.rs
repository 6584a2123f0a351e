use thiserror::Error;

/// Every failure the server can report, by what the caller can do about it.
///
/// Store errors are mapped here in `store::error`; these map to gRPC status in `protocol::status`.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// The request itself is wrong; retrying it unchanged will fail again.
    #[error("{0}")]
    Invalid(String),
    /// The thing named does not exist, or the caller may not know that it exists.
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// No valid credential: missing, unknown, revoked or ended.
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// The request is well formed but the state of things does not allow it now.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Something the request needs is full (a recipient's inbox); it may succeed once that drains.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The database could not be reached or is overloaded; the call may be retried.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::Invalid(msg.into())
    }

    pub fn not_found(msg: impl Into<String>) -> Self {
        Self::NotFound(msg.into())
    }
}
