//! The one place where Postgres and pool errors become domain errors.

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::domain::{EntityKind, Error};

/// What a repository answers when it fails: a domain error, a failure of Postgres or of the pool
/// already classified as one here. The store's own type because only it may convert from
/// tokio-postgres and deadpool (the orphan rule keeps `relay-domain` free of both); the
/// application's `?` turns it into the domain error it holds.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StoreError(#[from] Error);

/// The result of a repository call.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl From<StoreError> for Error {
    fn from(err: StoreError) -> Self {
        err.0
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(err: tokio_postgres::Error) -> Self {
        let Some(code) = err.code() else {
            // No SQLSTATE: the connection broke or could not be made.
            tracing::warn!(error = %err, "database connection error");
            return StoreError(Error::Unavailable("database unavailable; try again shortly".into()));
        };
        StoreError(from_code(code, &err))
    }
}

/// A failure the database reported as a SQLSTATE and message (one caught inside a batch of sends).
pub(crate) fn from_sqlstate(state: &str, message: &str) -> Error {
    from_code(&SqlState::from_code(state), &message)
}

fn from_code(code: &SqlState, err: &dyn std::fmt::Display) -> Error {
    match *code {
        SqlState::UNIQUE_VIOLATION => Error::AlreadyExists("already exists".into()),
        SqlState::FOREIGN_KEY_VIOLATION => {
            Error::not_found(EntityKind::Reference, "refers to something that does not exist")
        }
        SqlState::CHECK_VIOLATION | SqlState::NOT_NULL_VIOLATION | SqlState::STRING_DATA_RIGHT_TRUNCATION => {
            Error::Invalid("value refused by the database".into())
        }
        SqlState::T_R_SERIALIZATION_FAILURE | SqlState::T_R_DEADLOCK_DETECTED | SqlState::LOCK_NOT_AVAILABLE => {
            Error::Conflict("conflicting update; try again".into())
        }
        SqlState::TOO_MANY_CONNECTIONS
        | SqlState::CANNOT_CONNECT_NOW
        | SqlState::ADMIN_SHUTDOWN
        | SqlState::CRASH_SHUTDOWN
        | SqlState::QUERY_CANCELED => Error::Unavailable("database unavailable; try again shortly".into()),
        _ => {
            tracing::error!(error = %err, code = code.code(), "database error");
            Error::Internal("internal database error".into())
        }
    }
}

impl From<PoolError> for StoreError {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::Backend(err) => err.into(),
            other => {
                if matches!(other, PoolError::Timeout(_)) {
                    crate::metrics::metrics().pool_timeouts.inc();
                }
                tracing::warn!(error = %other, "database pool error");
                StoreError(Error::Unavailable("database unavailable; try again shortly".into()))
            }
        }
    }
}

/// Whether a Postgres error is a unique violation, for callers that turn it into a precise message.
pub fn is_unique_violation(err: &tokio_postgres::Error) -> bool {
    err.code() == Some(&SqlState::UNIQUE_VIOLATION)
}
