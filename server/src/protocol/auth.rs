//! Reading the bearer credential of a call. Which endpoint it names is the store's business.

use tonic::Request;

use crate::domain::{Error, Result};

pub fn bearer<T>(request: &Request<T>) -> Result<&str> {
    let value = request
        .metadata()
        .get("authorization")
        .ok_or_else(|| Error::Unauthenticated("missing authorization metadata (Bearer token)".into()))?;
    value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| Error::Unauthenticated("authorization must be \"Bearer <token>\"".into()))
}
