//! Which releases of the bridge and the server work together. A release is a minor version
//! (`0.4.x`, `1.2.x`); a bridge works with a server of its own release and of the one just before or
//! after it, within one major version. Outside that window the server refuses the bridge's calls,
//! and the bridge refuses a server, saying both versions and how to mend it (docs/operations.md).

use std::fmt;

/// This build's version, the same for every crate of the workspace.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where releases are published.
pub const RELEASES: &str = "https://github.com/agent-relay/relay/releases";

/// A version as `MAJOR.MINOR.PATCH[-PRE][+BUILD]`; only major and minor decide the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub major: u64,
    pub minor: u64,
}

impl Release {
    pub fn parse(version: &str) -> Option<Self> {
        let core = version.trim().split(['-', '+']).next()?;
        let mut parts = core.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        parts.next()?.parse::<u64>().ok()?;
        parts.next().is_none().then_some(Self { major, minor })
    }

    /// The releases of bridges this release of the server takes: its own and one either side.
    pub fn window(self) -> (Self, Self) {
        let low = Self { minor: self.minor.saturating_sub(1), ..self };
        (low, Self { minor: self.minor + 1, ..self })
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A bridge and a server outside each other's window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub bridge: String,
    pub server: String,
    /// Whether the bridge is the older of the two.
    pub bridge_older: bool,
}

/// Whether a bridge of version `bridge` and a server of version `server` work together. A
/// version that is not told (a client that does not say) or cannot be read is not judged.
pub fn check(bridge: &str, server: &str) -> Result<(), Mismatch> {
    let (Some(b), Some(s)) = (Release::parse(bridge), Release::parse(server)) else { return Ok(()) };
    let (low, high) = s.window();
    let (b_key, low_key, high_key) = ((b.major, b.minor), (low.major, low.minor), (high.major, high.minor));
    if (low_key..=high_key).contains(&b_key) {
        return Ok(());
    }
    Err(Mismatch { bridge: bridge.trim().to_owned(), server: server.trim().to_owned(), bridge_older: b_key < low_key })
}

/// The command that installs the newest bridge, for macOS and Linux, and for Windows.
pub fn install_commands(tag: Option<&str>) -> (String, String) {
    let base = match tag {
        Some(tag) => format!("{RELEASES}/download/{tag}"),
        None => format!("{RELEASES}/latest/download"),
    };
    (
        format!("curl --proto '=https' --tlsv1.2 -LsSf {base}/agent-bridge-installer.sh | sh"),
        format!("powershell -ExecutionPolicy Bypass -c \"irm {base}/agent-bridge-installer.ps1 | iex\""),
    )
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let window = Release::parse(&self.server).map(|s| s.window());
        let takes = window.map(|(low, high)| format!(", which works with bridges {low} to {high}")).unwrap_or_default();
        if self.bridge_older {
            let (unix, windows) = install_commands(None);
            write!(
                f,
                "agent-bridge {} is too old for relay-server {}{takes}: upgrade the bridge with `{unix}` (macOS, Linux) or `{windows}` (Windows)",
                self.bridge, self.server
            )
        } else {
            let (unix, windows) = install_commands(Some(&format!("v{}", self.server)));
            write!(
                f,
                "agent-bridge {} is too new for relay-server {}{takes}: ask the server's operator to upgrade it, or install the bridge of the server's release with `{unix}` (macOS, Linux) or `{windows}` (Windows)",
                self.bridge, self.server
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bridge_works_with_its_own_release_and_one_either_side() {
        for bridge in ["0.4.0", "0.4.9", "0.3.2", "0.5.0", "0.5.1-rc.1"] {
            assert_eq!(check(bridge, "0.4.3"), Ok(()), "{bridge}");
        }
        assert_eq!(check("1.0.0", "1.1.0"), Ok(()));
        assert_eq!(check("0.0.3", "0.0.1"), Ok(()), "0.0 and 0.1 are neighbours of nothing below");
    }

    #[test]
    fn outside_the_window_both_versions_and_the_mend_are_said() {
        let old = check("0.2.7", "0.4.3").unwrap_err();
        assert!(old.bridge_older);
        let said = old.to_string();
        assert!(said.starts_with("agent-bridge 0.2.7 is too old for relay-server 0.4.3, which works with bridges 0.3 to 0.5: upgrade the bridge with `curl"), "{said}");
        assert!(
            said.contains("/latest/download/agent-bridge-installer.sh | sh")
                && said.contains("agent-bridge-installer.ps1 | iex"),
            "{said}"
        );

        let new = check("0.6.0", "0.4.3").unwrap_err();
        assert!(!new.bridge_older);
        let said = new.to_string();
        assert!(said.starts_with("agent-bridge 0.6.0 is too new for relay-server 0.4.3"), "{said}");
        assert!(said.contains("upgrade it") && said.contains("/download/v0.4.3/agent-bridge-installer.sh"), "{said}");

        assert!(check("1.4.0", "2.4.0").unwrap_err().bridge_older, "another major release is outside the window");
        assert!(!check("2.0.0", "1.9.0").unwrap_err().bridge_older);
    }

    #[test]
    fn a_version_not_told_or_not_read_is_not_judged() {
        for unread in ["", "dev", "1.2", "1.2.x", "1.2.3.4"] {
            assert_eq!(check(unread, "0.4.0"), Ok(()), "{unread:?}");
            assert_eq!(check("0.4.0", unread), Ok(()), "{unread:?}");
        }
        assert_eq!(Release::parse("0.4.1-rc.2+abc"), Some(Release { major: 0, minor: 4 }));
    }
}
