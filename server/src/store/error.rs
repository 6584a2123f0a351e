//! The one place where Postgres and pool errors become domain errors.

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::domain::{EntityKind, Error};

impl From<tokio_postgres::Error> for Error {
    fn from(err: tokio_postgres::Error) -> Self {
        let Some(code) = err.code() else {
            // No SQLSTATE: the connection broke or could not be made.
            tracing::warn!(error = %err, "database connection error");
            return Error::Unavailable("database unavailable; try again shortly".into());
        };
        from_code(code, &err)
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

impl From<PoolError> for Error {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::Backend(err) => err.into(),
            other => {
                if matches!(other, PoolError::Timeout(_)) {
                    crate::metrics::metrics().pool_timeouts.inc();
                }
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
