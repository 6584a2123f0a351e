//! Which browser Origins may call the endpoint. Agents send no `Origin`; a browser always does, so
//! a page may call the endpoint only from an Origin allowed here: on a loopback endpoint, pages of
//! this machine (`localhost`, `127.0.0.1`, `[::1]`, any port, as the MCP Inspector is served), and on
//! any endpoint the Origins its operator names (`--mcp-allowed-origins`). Matched as RFC 6454 does:
//! scheme, host and port.

use std::fmt;

/// One allowed Origin: a scheme and host, and a port or any.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Allowed {
    scheme: String,
    host: String,
    /// `None`: any port.
    port: Option<u16>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins(Vec<Allowed>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not an Origin: write scheme://host, scheme://host:port or scheme://host:*")]
pub struct BadOrigin(pub String);

/// The pages of this machine.
const LOOPBACK: [&str; 6] = [
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://[::1]:*",
    "https://[::1]:*",
];

impl Origins {
    /// What an endpoint allows: `named`, and this machine's pages when it listens on loopback.
    pub fn new(named: &[String], loopback: bool) -> Result<Self, BadOrigin> {
        let defaults = if loopback { &LOOPBACK[..] } else { &[][..] };
        let all = defaults.iter().copied().chain(named.iter().map(String::as_str));
        all.map(|entry| parse(entry, true).ok_or_else(|| BadOrigin(entry.to_owned())))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether a request with `Origin: origin` may call the endpoint.
    pub fn allows(&self, origin: &str) -> bool {
        let Some(asked) = parse(origin, false) else { return false };
        self.0.iter().any(|allowed| {
            allowed.scheme == asked.scheme
                && allowed.host == asked.host
                && allowed.port.is_none_or(|port| Some(port) == asked.port)
        })
    }

    /// The list in the form the MCP SDK's own check takes.
    pub fn entries(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

impl fmt::Display for Allowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}://{}:{port}", self.scheme, self.host),
            None => write!(f, "{}://{}:*", self.scheme, self.host),
        }
    }
}

/// `scheme://host[:port]` (and `:*` where `wildcard`), the port made explicit from the scheme's
/// default; hosts compared in lower case.
fn parse(text: &str, wildcard: bool) -> Option<Allowed> {
    let (scheme, rest) = text.trim().split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    // An IPv6 host is bracketed; a port follows the last colon outside the brackets.
    let (host, port) = match rest.rfind(':') {
        Some(at) if !rest[at..].contains(']') => (&rest[..at], Some(&rest[at + 1..])),
        _ => (rest, None),
    };
    if host.is_empty() {
        return None;
    }
    let default = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let port = match port {
        None => Some(default),
        Some("*") if wildcard => None,
        Some(port) => Some(port.parse().ok()?),
    };
    Some(Allowed { scheme, host: host.to_ascii_lowercase(), port })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_endpoint_allows_this_machines_pages_and_nothing_else() {
        let origins = Origins::new(&[], true).unwrap();
        for page in [
            "http://localhost:6274",
            "http://127.0.0.1:3000",
            "https://localhost",
            "http://[::1]:8080",
            "HTTP://LOCALHOST:1",
        ] {
            assert!(origins.allows(page), "{page}");
        }
        for page in
            ["http://evil.example", "http://localhost.evil.example:80", "null", "http://127.0.0.2:80", "file://"]
        {
            assert!(!origins.allows(page), "{page}");
        }
    }

    #[test]
    fn a_public_endpoint_allows_only_what_its_operator_names() {
        let named = vec!["https://console.example.com".to_owned(), "http://dev.example.com:*".to_owned()];
        let origins = Origins::new(&named, false).unwrap();
        assert!(origins.allows("https://console.example.com"));
        assert!(origins.allows("https://console.example.com:443"), "the scheme's default port");
        assert!(!origins.allows("https://console.example.com:8443"));
        assert!(origins.allows("http://dev.example.com:5173"));
        assert!(!origins.allows("http://localhost:6274"), "this machine's pages only on a loopback endpoint");
        assert!(!Origins::new(&[], false).unwrap().allows("https://console.example.com"));
        assert_eq!(origins.entries(), ["https://console.example.com:443", "http://dev.example.com:*"]);
    }

    #[test]
    fn what_is_not_an_origin_is_refused_by_name() {
        for bad in [
            "console.example.com",
            "https://example.com/path",
            "ftp://example.com",
            "https://:443",
            "https://example.com:x",
        ] {
            assert_eq!(Origins::new(&[bad.to_owned()], false), Err(BadOrigin(bad.to_owned())), "{bad}");
        }
    }
}
