//! The gRPC surface: thin handlers that authenticate, validate and call the store.

mod auth;
pub mod convert;
pub mod human;
pub mod layers;
pub mod service;
pub mod status;
pub mod worker;
