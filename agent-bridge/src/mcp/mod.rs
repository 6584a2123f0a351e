//! The MCP side of the bridge: newline-delimited JSON-RPC on stdin/stdout.
//!
//! Hand-written on serde_json rather than built on an SDK: the bridge needs exact control over the
//! wire that the SDKs abstract away — the non-standard `notifications/claude/channel` push, refusing
//! and skipping a 4 MiB line and carrying on, answering unparsable lines with -32700, batches only
//! under the one protocol version that has them, and the version list pinned to the four we test.
//! The protocol surface this takes (initialize, ping, tools, cancellation) is small and stable.

pub mod jsonrpc;
pub mod session;

/// Protocol versions spoken, newest first; a client asking for another gets the newest.
pub const PROTOCOL_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// JSON-RPC batches exist only in this protocol version (added in it, removed in the next).
pub const BATCH_VERSION: &str = "2025-03-26";

pub fn negotiate(asked: Option<&str>) -> &'static str {
    asked.and_then(|v| PROTOCOL_VERSIONS.iter().find(|known| **known == v)).copied().unwrap_or(PROTOCOL_VERSIONS[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_a_known_version_else_the_newest() {
        assert_eq!(negotiate(Some("2024-11-05")), "2024-11-05");
        assert_eq!(negotiate(Some("2025-03-26")), "2025-03-26");
        assert_eq!(negotiate(Some("1999-01-01")), "2025-11-25");
        assert_eq!(negotiate(None), "2025-11-25");
    }
}
