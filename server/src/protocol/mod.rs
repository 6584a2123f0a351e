//! The gRPC surface: admission (`admission`) authenticates every call (`auth`) and holds it to the
//! budgets of its address, credential and account; thin handlers validate and call the
//! application. Beside it, the plaintext ops port (`ops`) for probes and metrics, and the web
//! console (`console`) a person signs in to.

pub mod admission;
pub mod auth;
pub mod calls;
pub mod connections;
pub mod console;
pub mod convert;
pub mod credential;
pub mod human;
pub mod layers;
pub mod listen;
pub mod mcp;
pub mod ops;
pub mod service;
pub mod status;
pub mod tls;
pub mod web;
pub mod worker;
