//! The MCP protocol versions the tools are served under, and what each has.

/// A protocol version spoken, and what it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(&'static str);

impl Version {
    /// Spoken, newest first; a client asking for another gets the newest.
    pub const ALL: [Version; 4] =
        [Version("2025-11-25"), Version("2025-06-18"), Version("2025-03-26"), Version("2024-11-05")];
    pub const LATEST: Version = Self::ALL[0];
    /// The revision without a handshake: every request carries its version (served over HTTP).
    pub const STATELESS: Version = Version("2026-07-28");

    pub fn parse(asked: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.0 == asked)
    }

    /// Any version known, the stateless one included: how to shape results for a request of it.
    pub fn known(asked: &str) -> Option<Self> {
        if asked == Self::STATELESS.0 { Some(Self::STATELESS) } else { Self::parse(asked) }
    }

    /// The version to answer a client asking for `asked`.
    pub fn negotiate(asked: Option<&str>) -> Self {
        asked.and_then(Self::parse).unwrap_or(Self::LATEST)
    }

    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// JSON-RPC batches: added in 2025-03-26, removed in the next version.
    pub fn has_batches(self) -> bool {
        self.0 == "2025-03-26"
    }

    /// Tool annotations (readOnlyHint, …) exist from 2025-03-26 on.
    pub fn has_annotations(self) -> bool {
        self.0 >= "2025-03-26"
    }

    /// `structuredContent` and `outputSchema` exist from 2025-06-18 on.
    pub fn has_structured_content(self) -> bool {
        self.0 >= "2025-06-18"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_a_known_version_else_the_newest() {
        assert_eq!(Version::negotiate(Some("2024-11-05")).as_str(), "2024-11-05");
        assert_eq!(Version::negotiate(Some("2025-03-26")).as_str(), "2025-03-26");
        assert_eq!(Version::negotiate(Some("1999-01-01")).as_str(), "2025-11-25");
        assert_eq!(Version::negotiate(None).as_str(), "2025-11-25");
    }

    #[test]
    fn features_follow_the_version() {
        let v = |s| Version::parse(s).unwrap();
        assert!(!v("2024-11-05").has_annotations() && !v("2024-11-05").has_structured_content());
        assert!(v("2025-03-26").has_annotations() && v("2025-03-26").has_batches());
        assert!(!v("2025-03-26").has_structured_content());
        assert!(v("2025-06-18").has_structured_content() && !v("2025-06-18").has_batches());
        assert!(v("2025-11-25").has_structured_content());
        let stateless = Version::known("2026-07-28").unwrap();
        assert!(stateless.has_structured_content() && stateless.has_annotations() && !stateless.has_batches());
        assert_eq!(Version::parse("2026-07-28"), None, "no handshake negotiates it");
    }
}
