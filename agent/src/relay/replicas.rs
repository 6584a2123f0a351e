//! The server's replicas: `RELAY_SERVER` (or the config's `server`) may name several, separated by
//! commas. All share one database, so a session, a lease or a send's client id means the same on
//! each; the bridge stays on one replica until it fails, then moves to the next in the list.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tonic::codegen::http::Uri;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

/// A server list that cannot be used: a bad address, or a CA file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("invalid server url {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot read the CA certificate {path}: {source}")]
    Ca { path: String, source: std::io::Error },
}

/// The URLs `list` names, in order of preference: separated by commas, whitespace around each
/// ignored, a URL named twice kept once. Each must be an http:// or https:// URL of a host.
pub fn parse_list(list: &str) -> Result<Vec<String>, AddressError> {
    let mut urls: Vec<(String, Uri)> = Vec::new();
    for url in list.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let uri = parse_url(url)?;
        if !urls.iter().any(|(_, seen)| *seen == uri) {
            urls.push((url.to_owned(), uri));
        }
    }
    if urls.is_empty() {
        return Err(AddressError::BadUrl { url: list.to_owned(), reason: "it names no server".into() });
    }
    Ok(urls.into_iter().map(|(url, _)| url).collect())
}

/// Whether every replica `asked` names is one of `known`'s (in any order): a credential stored for
/// `known` may go to them.
pub fn within(asked: &str, known: &str) -> Result<bool, AddressError> {
    let known = parse_list(known)?.iter().map(|u| parse_url(u)).collect::<Result<Vec<_>, _>>()?;
    let asked = parse_list(asked)?.iter().map(|u| parse_url(u)).collect::<Result<Vec<_>, _>>()?;
    Ok(asked.iter().all(|uri| known.contains(uri)))
}

fn parse_url(url: &str) -> Result<Uri, AddressError> {
    let bad = |reason: String| AddressError::BadUrl { url: url.to_owned(), reason };
    let lower = url.to_ascii_lowercase();
    let Some(rest) = lower.strip_prefix("http://").or_else(|| lower.strip_prefix("https://")) else {
        return Err(bad("use http:// or https://".into()));
    };
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("it names no host".into()));
    }
    let uri: Uri = url.parse().map_err(|e| bad(format!("not a url ({e})")))?;
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(bad("it names no host".into()));
    };
    // It would be logged and passed on to agents' environments: no credential may ride in it.
    if authority.as_str().contains('@') {
        return Err(bad("a user or password does not belong in it; the token goes in RELAY_TOKEN".into()));
    }
    if authority.as_str().len() > authority.host().len() && authority.port_u16().is_none() {
        return Err(bad("its port is not a number".into()));
    }
    Ok(uri)
}

/// How a failed call went, as far as moving to another replica is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No connection could be made (refused, timed out, TLS refused): the request never left, so
    /// it may go to any replica.
    NotSent,
    /// The replica went away or stopped answering with the request possibly acted on: only a
    /// call that is safe to repeat is tried again.
    Lost,
    /// The server answered: another replica would answer the same.
    Answered,
}

pub fn failure(status: &Status) -> Failure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() {
            return Failure::NotSent;
        }
        source = err.source();
    }
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => Failure::Lost,
        _ => Failure::Answered,
    }
}

/// What went wrong, down to the root cause ("tcp connect error: Connection refused").
fn cause(status: &Status) -> String {
    let mut root = None;
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        root = Some(err);
        source = err.source();
    }
    match root.map(ToString::to_string) {
        Some(root) if !status.message().contains(&root) => format!("{}: {root}", status.message()),
        _ => status.message().to_owned(),
    }
}

/// The replicas and which one is in use. Channels connect lazily and redial by themselves.
pub struct Replicas {
    urls: Vec<String>,
    endpoints: Vec<Endpoint>,
    channels: Vec<Channel>,
    current: AtomicUsize,
}

impl Replicas {
    /// Every URL of `list` checked, and set up to trust the CA file `ca` beside the system's roots.
    pub fn new(list: &str, ca: Option<&str>) -> Result<Self, AddressError> {
        let urls = parse_list(list)?;
        let pem = match ca {
            Some(path) => {
                Some(std::fs::read(path).map_err(|source| AddressError::Ca { path: path.to_owned(), source })?)
            }
            None => None,
        };
        let endpoints = urls.iter().map(|url| endpoint(url, pem.as_deref())).collect::<Result<Vec<_>, _>>()?;
        let channels = endpoints.iter().map(Endpoint::connect_lazy).collect();
        Ok(Self { urls, endpoints, channels, current: AtomicUsize::new(0) })
    }

    /// One replica, reached by `channel` (which `endpoint` made): the server's own, in-process.
    pub fn one(name: &str, endpoint: Endpoint, channel: Channel) -> Self {
        Self {
            urls: vec![name.to_owned()],
            endpoints: vec![endpoint],
            channels: vec![channel],
            current: AtomicUsize::new(0),
        }
    }

    /// How many replicas there are (at least one).
    pub fn count(&self) -> usize {
        self.urls.len()
    }

    /// The replica in use: its place in the list and its channel.
    pub fn current(&self) -> (usize, Channel) {
        let index = self.current.load(Ordering::Acquire);
        (index, self.channels[index].clone())
    }

    pub fn url(&self, index: usize) -> &str {
        &self.urls[index]
    }

    /// The channel of replica `index`, whether or not it is the one in use.
    pub fn channel(&self, index: usize) -> Channel {
        self.channels[index].clone()
    }

    /// The list as the environment carries it; `from` first, the others after it in order, so
    /// whoever reads it starts on the replica known to work.
    pub fn list_from(&self, from: usize) -> String {
        let n = self.urls.len();
        (0..n).map(|i| self.urls[(from + i) % n].as_str()).collect::<Vec<_>>().join(",")
    }

    /// Moves on from replica `from` to the next (the first after the last), unless another call
    /// already did; returns the replica now in use.
    pub fn fail_over(&self, from: usize, why: &str) -> usize {
        let to = (from + 1) % self.urls.len();
        if to == from {
            return from;
        }
        match self.current.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                tracing::warn!(from = %self.urls[from], to = %self.urls[to], reason = why, "relay replica failed; moved to the next");
                to
            }
            Err(now) => now,
        }
    }

    /// Moves on from `from` when `status` says the replica failed; whether it did.
    pub fn failed(&self, from: usize, status: &Status) -> Failure {
        let kind = failure(status);
        if kind != Failure::Answered {
            self.fail_over(from, &cause(status));
        }
        kind
    }

    /// Runs `call` on the replica in use, moving along the list when one cannot be reached (each
    /// replica tried once) or fails under the call; after such a failure the call is made again
    /// only when `repeatable` (a read, or a change the server recognises when repeated), and once.
    pub async fn call<T, F, Fut>(&self, repeatable: bool, call: F) -> Result<T, Status>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        Ok(self.call_on(repeatable, call).await?.1)
    }

    /// [`Replicas::call`], telling which replica answered.
    pub async fn call_on<T, F, Fut>(&self, repeatable: bool, mut call: F) -> Result<(usize, T), Status>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut unsent = self.count();
        let mut repeat = repeatable;
        loop {
            let (index, channel) = self.current();
            let status = match call(channel).await {
                Ok(answer) => return Ok((index, answer)),
                Err(status) => status,
            };
            match self.failed(index, &status) {
                Failure::NotSent if unsent > 1 => unsent -= 1,
                Failure::Lost if repeat => repeat = false,
                _ => return Err(status),
            }
        }
    }

    /// For a command that makes a few calls and ends: the first replica, in order from the one in
    /// use, that takes a connection. When none does, the first one's channel, whose calls then say
    /// why it cannot be reached.
    pub async fn reachable(&self) -> Channel {
        if self.count() == 1 {
            return self.channels[0].clone();
        }
        let start = self.current.load(Ordering::Acquire);
        for i in 0..self.count() {
            let index = (start + i) % self.count();
            match self.endpoints[index].connect().await {
                Ok(channel) => {
                    self.current.store(index, Ordering::Release);
                    return channel;
                }
                Err(e) => {
                    let why = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
                    tracing::warn!(replica = %self.urls[index], reason = %why, "relay replica cannot be reached; trying the next");
                }
            }
        }
        self.channels[start].clone()
    }
}

fn endpoint(url: &str, ca: Option<&[u8]>) -> Result<Endpoint, AddressError> {
    let bad = |reason: String| AddressError::BadUrl { url: url.to_owned(), reason };
    let mut endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_keepalive(Some(Duration::from_secs(30)))
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    if url.to_ascii_lowercase().starts_with("https://") {
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(pem) = ca {
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| bad(e.to_string()))?;
    }
    Ok(endpoint)
}

/// What a failed call says when the cause is the server's certificate: that it was not trusted,
/// why, and against which CA it was checked. `None` for any other failure.
pub fn untrusted_certificate(status: &tonic::Status, ca: Option<&str>) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        let text = err.to_string();
        if text.contains("invalid peer certificate") || text.contains("certificate") && text.contains("verif") {
            let checked = match ca {
                Some(path) => format!("the CA in {path} and the system's root certificates"),
                None => "the system's root certificates (no CA file given)".to_owned(),
            };
            let advice = if text.contains("NotValidForName") {
                "it was not issued for this host name: connect by the name on the certificate"
            } else if text.contains("Expired") {
                "it has expired: the server's operator must renew it"
            } else {
                "pass the CA that signed it with --ca or RELAY_CA"
            };
            return Some(format!(
                "the server's certificate was not trusted ({text}); it was checked against {checked}: {advice}"
            ));
        }
        source = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(list: &str) -> String {
        parse_list(list).unwrap_err().to_string()
    }

    #[test]
    fn one_url_or_several_in_order() {
        assert_eq!(parse_list("https://a:7447").unwrap(), ["https://a:7447"]);
        assert_eq!(
            parse_list(" https://a:7447 ,https://b:7447,\thttp://127.0.0.1:9 ").unwrap(),
            ["https://a:7447", "https://b:7447", "http://127.0.0.1:9"]
        );
        // A trailing comma is harmless.
        assert_eq!(parse_list("https://b:7447,").unwrap(), ["https://b:7447"]);
    }

    #[test]
    fn a_url_named_twice_is_kept_once_where_it_first_appears() {
        assert_eq!(
            parse_list("https://b:7447, https://a:7447, https://B:7447/, https://a:7447").unwrap(),
            ["https://b:7447", "https://a:7447"]
        );
        // Another port or scheme is another replica.
        assert_eq!(parse_list("https://a:1,https://a:2,http://a:1").unwrap().len(), 3);
    }

    #[test]
    fn a_bad_url_is_named_with_the_reason() {
        let said = reason("https://a:7447, ftp://b:7447");
        assert!(said.contains("\"ftp://b:7447\"") && said.contains("use http:// or https://"), "{said}");
        assert!(!said.contains("a:7447\""), "only the bad one is named: {said}");
        let said = reason("https://a:7447,b:7447");
        assert!(said.contains("\"b:7447\"") && said.contains("http://"), "{said}");
        let said = reason("https://a b:7447");
        assert!(said.contains("\"https://a b:7447\"") && said.contains("not a url"), "{said}");
        assert!(reason("https://").contains("no host"), "{}", reason("https://"));
        assert!(reason("http://a:port").contains("port is not a number"), "{}", reason("http://a:port"));
        assert_eq!(parse_list("http://[::1]:7447").unwrap(), ["http://[::1]:7447"]);
        assert!(reason(" , ").contains("names no server"), "{}", reason(" , "));
        assert!(reason("").contains("names no server"));
    }

    #[test]
    fn a_credential_may_go_to_the_replicas_it_was_stored_for() {
        let known = "https://a:7447,https://b:7447";
        assert!(within("https://b:7447, https://a:7447/", known).unwrap());
        assert!(within("https://b:7447", known).unwrap());
        assert!(!within("https://a:7447,https://c:7447", known).unwrap());
        assert!(within("ftp://a", known).is_err());
    }

    #[test]
    fn no_credentials_ride_in_a_url() {
        let said = reason("https://user:secret@a:7447");
        assert!(said.contains("RELAY_TOKEN"), "{said}");
    }

    #[tokio::test]
    async fn the_list_is_handed_on_from_the_replica_in_use() {
        let replicas = Replicas::new("http://a:1, http://b:2,http://c:3", None).unwrap();
        assert_eq!(replicas.list_from(0), "http://a:1,http://b:2,http://c:3");
        assert_eq!(replicas.list_from(2), "http://c:3,http://a:1,http://b:2");
    }

    #[tokio::test]
    async fn failing_over_moves_once_per_failure_and_wraps() {
        let replicas = Replicas::new("http://a:1,http://b:2", None).unwrap();
        assert_eq!(replicas.current().0, 0);
        assert_eq!(replicas.fail_over(0, "gone"), 1);
        // A second call that failed on the same replica does not move past the one now in use.
        assert_eq!(replicas.fail_over(0, "gone too"), 1);
        assert_eq!(replicas.fail_over(1, "gone"), 0);
        let single = Replicas::new("http://a:1", None).unwrap();
        assert_eq!(single.fail_over(0, "gone"), 0);
    }

    #[tokio::test]
    async fn a_call_goes_to_the_next_replica_only_when_that_is_safe() {
        let replicas = Replicas::new("http://a:1,http://b:2,http://c:3", None).unwrap();
        let lost = || Status::unavailable("connection reset");
        let mut tried = Vec::new();
        let answer = replicas
            .call(false, |ch| {
                tried.push(ch);
                let status = lost();
                async move { Err::<(), _>(status) }
            })
            .await;
        assert!(answer.is_err());
        assert_eq!(tried.len(), 1, "a change that may have been made is not made again");
        assert_eq!(replicas.current().0, 1, "but the next call goes to the next replica");

        let mut calls = 0;
        let answer = replicas
            .call(true, |_| {
                calls += 1;
                let answer = if calls == 1 { Err(lost()) } else { Ok(calls) };
                async move { answer }
            })
            .await;
        assert_eq!(answer.unwrap(), 2, "a repeatable call is made again, once");
        assert_eq!(replicas.current().0, 2);

        let mut calls = 0;
        let refused = replicas
            .call(true, |_| {
                calls += 1;
                async { Err::<(), _>(Status::permission_denied("no")) }
            })
            .await;
        assert_eq!((refused.unwrap_err().code(), calls), (Code::PermissionDenied, 1));
        assert_eq!(replicas.current().0, 2, "an answer is no reason to move");
    }

    #[tokio::test]
    async fn a_request_that_never_left_tries_every_replica_once() {
        // Nothing listens on these ports: each connection is refused before anything is sent.
        let ports: Vec<u16> =
            (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
        let list = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
        let replicas = Replicas::new(&list, None).unwrap();
        let mut calls = 0;
        let answer = replicas
            .call(false, |channel| {
                calls += 1;
                async move {
                    let mut health = relay_proto::v1::relay_client::RelayClient::new(channel);
                    health.check_machine(relay_proto::v1::CheckMachineRequest::default()).await.map(|_| ())
                }
            })
            .await;
        let status = answer.unwrap_err();
        assert_eq!(failure(&status), Failure::NotSent, "{status:?}");
        assert_eq!(calls, 3, "every replica was tried, none twice");
        assert_eq!(replicas.current().0, 0, "round the list and back to the first");
    }
}
