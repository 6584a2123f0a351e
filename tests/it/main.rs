//! Relay's integration tests: the real binaries against a real Postgres, one module per area, in
//! one test binary. One process shares one Postgres (a throwaway cluster, `DATABASE_URL`, or the
//! run's container) and gives each test a database of its own.
//!
//! Run one area by its module path, e.g. `./test -p relay-tests --test it messaging::`.
//!
//! The suite runs on Linux, as its harness does (Postgres run as another user, network namespaces,
//! `/proc`); macOS and Windows runners run the smoke test (`tests/smoke.rs`).
#![cfg(target_os = "linux")]

mod attacks;
mod board;
mod bridge;
mod bridge_cli;
mod claims;
mod clients;
mod connections;
mod console;
mod core;
mod cross;
mod deploy;
mod doctor;
mod edges;
mod failover;
mod faults;
mod files;
mod grpc_clients;
mod harness;
mod image;
mod interop;
mod layers;
mod logs;
mod loops;
mod messaging;
mod migrations;
mod ops;
mod portability;
mod promises;
mod quotas;
mod redaction;
mod release;
mod remote;
mod scope;
mod search;
mod server;
mod setup;
mod topics;
mod trust;
mod versions;
mod wake;
