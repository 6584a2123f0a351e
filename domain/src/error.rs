use thiserror::Error;

/// What a lookup did not find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityKind {
    Account,
    Machine,
    Endpoint,
    Human,
    Contact,
    Message,
    Thread,
    Group,
    Cap,
    Hold,
    Approval,
    Card,
    Repository,
    Claim,
    Attachment,
    Upload,
    Topic,
    /// A row another one refers to (a foreign key).
    Reference,
}

impl EntityKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Account => "account",
            Self::Machine => "machine",
            Self::Endpoint => "endpoint",
            Self::Human => "human",
            Self::Contact => "contact",
            Self::Message => "message",
            Self::Thread => "thread",
            Self::Group => "group",
            Self::Cap => "cap",
            Self::Hold => "hold",
            Self::Approval => "approval",
            Self::Card => "card",
            Self::Repository => "repository",
            Self::Claim => "claim",
            Self::Attachment => "attachment",
            Self::Upload => "upload",
            Self::Topic => "topic",
            Self::Reference => "reference",
        }
    }
}

/// Every failure the server can report, by what the caller can do about it.
///
/// relay-server maps Postgres failures to these in `store::error` (its `StoreError` holds one) and
/// these to gRPC statuses in `protocol::status`.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum Error {
    /// The request itself is wrong; retrying it unchanged will fail again.
    #[error("{0}")]
    Invalid(String),
    /// The thing named does not exist, or the caller may not know that it exists.
    #[error("{message}")]
    NotFound { kind: EntityKind, message: String },
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
    /// The server is at capacity: refused at once, nothing was done; retry after a moment.
    #[error("{0}")]
    Overloaded(String),
    /// The caller went past a rate it is allowed: nothing was done; retry after `retry_after`.
    #[error("{message}")]
    Throttled { message: String, retry_after: std::time::Duration },
    /// The database could not be reached or is overloaded; the call may be retried.
    #[error("{0}")]
    Unavailable(String),
    /// A concurrent change met this one (a deadlock, a serialization failure): nothing of it was
    /// done, and the same call may succeed at once. Told to callers as `Unavailable`.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::Invalid(msg.into())
    }

    pub fn not_found(kind: EntityKind, msg: impl Into<String>) -> Self {
        Self::NotFound { kind, message: msg.into() }
    }
}
