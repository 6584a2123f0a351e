//! The MCP side of the bridge: newline-delimited JSON-RPC on stdin/stdout.
//!
//! Hand-written on serde_json rather than built on an SDK: the bridge needs exact control over the
//! wire that the SDKs abstract away — the non-standard `notifications/claude/channel` push, refusing
//! and skipping a 4 MiB line and carrying on, answering unparsable lines with -32700, batches only
//! under the one protocol version that has them, and the version list pinned to the ones we test
//! (the four with a handshake, and the stateless 2026-07-28 whose requests each name their version).
//! The protocol surface this takes (initialize or discovery, ping, tools, cancellation) is small and
//! stable. The server's HTTP endpoint, where the transport is the larger part, is built on the SDK.

pub mod jsonrpc;
pub mod session;

pub use relay_agent::Version;
