//! The one place where Postgres and pool errors become domain errors.

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::domain::Error;

impl From<tokio_postgres::Error> for Error {
    fn from(err: tokio_postgres::Error) -> Self {
        let Some(code) = err.code() else {
            // No SQLSTATE: the connection broke or could not be made.
            tracing::warn!(error = %err, "database connection error");
            return Error::Unavailable("database unavailable; try again shortly".into());
        };
        match *code {
            SqlState::UNIQUE_VIOLATION => Error::AlreadyExists("already exists".into()),
            SqlState::FOREIGN_KEY_VIOLATION => Error::NotFound("refers to something that does not exist".into()),
            SqlState::CHECK_VIOLATION | SqlState::NOT_NULL_VIOLATION | SqlState::STRING_DATA_RIGHT_TRUNCATION => {
                Error::Invalid("value refused by the database".into())
            }
            SqlState::T_R_SERIALIZATION_FAILURE | SqlState::T_R_DEADLOCK_DETECTED | SqlState::LOCK_NOT_AVAILABLE => {
                Error::Unavailable("conflicting update; try again".into())
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
}

impl From<PoolError> for Error {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::Backend(err) => err.into(),
            other => {
                tracing::warn!(error = %other, "database pool error");
                Error::Unavailable("database unavailable; try again shortly".into())
            }
        }
    }
}

/// Whether a Postgres error is a unique violation, for callers that turn it into a precise message.
pub fn is_unique_violation(err: &tokio_postgres::Error) -> bool {
    err.code() == Some(&SqlState::UNIQUE_VIOLATION)
}
