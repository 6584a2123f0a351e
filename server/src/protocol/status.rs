//! The one place where domain errors become gRPC status codes.

use tonic::{Code, Status};

use crate::domain::Error;

pub fn to_status(err: Error) -> Status {
    let code = match &err {
        Error::Invalid(_) => Code::InvalidArgument,
        Error::NotFound { .. } => Code::NotFound,
        Error::AlreadyExists(_) => Code::AlreadyExists,
        Error::Unauthenticated(_) => Code::Unauthenticated,
        Error::PermissionDenied(_) => Code::PermissionDenied,
        Error::FailedPrecondition(_) => Code::FailedPrecondition,
        Error::ResourceExhausted(_) | Error::Overloaded(_) | Error::Throttled { .. } => Code::ResourceExhausted,
        Error::Unavailable(_) | Error::Conflict(_) => Code::Unavailable,
        Error::Internal(_) => Code::Internal,
    };
    let mut status = Status::new(code, err.to_string());
    match err {
        Error::Overloaded(_) => super::calls::advise_retry(&mut status),
        Error::Throttled { retry_after, .. } => super::calls::advise_retry_after(&mut status, retry_after),
        _ => {}
    }
    status
}
