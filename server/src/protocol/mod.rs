//! The gRPC surface: one layer authenticates every call (`auth`), thin handlers validate and call the
//! application.

pub mod auth;
pub mod connections;
pub mod convert;
pub mod human;
pub mod layers;
pub mod service;
pub mod status;
pub mod worker;
