//! Admission: whether a call may take a place among the calls in flight, and whose place it takes.
//! Every budget belongs to someone, so one client filling its own cannot refuse another's calls.
//! In the order a call meets them:
//!
//! 1. **Its address**, unless its credential is one this replica has accepted before: at most
//!    `per_address` calls of one address may be in their authentication at once, and an address
//!    whose credentials keep failing is refused for a while before its calls reach the database.
//!    A credential known from memory passes neither gate, so an agent is not refused because a
//!    neighbour behind its address (an office, a proxy, a CI fleet) presents bad ones.
//! 2. **Authentication** by the credential the method takes (`auth`).
//! 3. **Its credential's share**: calls in flight with one token (`per_credential`), held from here
//!    to the answer. Then the request message must arrive, whole, within `request_wait` and within
//!    its method's size (`limits::request_bytes`): a call whose client sends its headers and
//!    nothing more ends, and no call holds more memory than its method allows.
//! 4. **Its account's share** (`per_account`), then the server's (`max_concurrent`). Calls that wait
//!    (long polls, permission requests) and streams count apart from calls doing work, with their
//!    own shares per account and per credential; a stream holds its stream places for its life and
//!    its call places only until it starts streaming.
//! 5. **Call rates** per credential and per account (`Gatekeeper::admit_rate`).
//! 6. **A time budget** by the method's kind ([`Kind::budget`]).
//!
//! Every refusal is RESOURCE_EXHAUSTED (or DEADLINE_EXCEEDED, INVALID_ARGUMENT) with what was full
//! and when to retry. Health and reflection pass untouched, so readiness answers however busy the
//! replica is.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash, RandomState};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body_util::BodyExt;
use tonic::Status;
use tonic::body::Body;
use tower::{BoxError, Layer, Service, ServiceExt};

use super::calls::{Kind, advise_retry, advise_retry_after, ran_too_long};
use super::connections;
use super::credential::{Credential, Issued};
use crate::domain::caller::Holder;
use crate::domain::ids::AccountId;
use crate::domain::rate::{Bucket, Rate};
use crate::domain::{Error, Result, limits};
use crate::metrics::{Shed, metrics};

/// The time budget of an ordinary call.
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// The most calls in flight at once (streams count only until their first response).
pub const DEFAULT_MAX_CONCURRENT_RPCS: u32 = 1024;
/// The most calls waiting and streams open at once: they cost a task and no work while they wait,
/// so they never take ordinary calls' places.
pub const DEFAULT_MAX_WAITING_CALLS: u32 = 8192;
/// An account's share of the calls in flight.
pub const DEFAULT_MAX_CALLS_PER_ACCOUNT: u32 = 256;
/// One credential's share: what one agent, machine or person may have in flight.
pub const DEFAULT_MAX_CALLS_PER_CREDENTIAL: u32 = 64;
/// Calls of one address in their authentication at once.
pub const DEFAULT_MAX_CALLS_PER_ADDRESS: u32 = 256;
/// Waiting calls and streams of one account: every endpoint it may hold keeps a push stream, and
/// a hook waiting for its mail.
pub const DEFAULT_MAX_STREAMS_PER_ACCOUNT: u32 = 4096;
/// Waiting calls and streams with one credential.
pub const DEFAULT_MAX_STREAMS_PER_CREDENTIAL: u32 = 16;
/// How long a call's request message may take to arrive after its headers.
pub const DEFAULT_REQUEST_WAIT: Duration = Duration::from_secs(5);
/// Failed authentications one address may make, sustained and at once, before its calls are
/// refused without asking the database.
pub const DEFAULT_FAILED_AUTH: Rate = Rate { per_s: 5.0, burst: 50.0 };

/// The limits admission enforces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RpcLimits {
    /// Budget of an ordinary call; a long poll gets its longest wait on top.
    pub timeout: Duration,
    /// Calls in flight at once beyond which a call is refused.
    pub max_concurrent: usize,
    /// Calls that wait and streams, at once, beside `max_concurrent`.
    pub max_waiting: usize,
    pub per_account: usize,
    pub per_credential: usize,
    pub per_address: usize,
    pub streams_per_account: usize,
    pub streams_per_credential: usize,
    pub request_wait: Duration,
    /// Failed authentications per address (behind a proxy that hides clients' addresses, turn it
    /// off and limit at the proxy).
    pub failed_auth: Rate,
}

impl Default for RpcLimits {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_RPC_TIMEOUT,
            max_concurrent: DEFAULT_MAX_CONCURRENT_RPCS as usize,
            max_waiting: DEFAULT_MAX_WAITING_CALLS as usize,
            per_account: DEFAULT_MAX_CALLS_PER_ACCOUNT as usize,
            per_credential: DEFAULT_MAX_CALLS_PER_CREDENTIAL as usize,
            per_address: DEFAULT_MAX_CALLS_PER_ADDRESS as usize,
            streams_per_account: DEFAULT_MAX_STREAMS_PER_ACCOUNT as usize,
            streams_per_credential: DEFAULT_MAX_STREAMS_PER_CREDENTIAL as usize,
            request_wait: DEFAULT_REQUEST_WAIT,
            failed_auth: DEFAULT_FAILED_AUTH,
        }
    }
}

/// What admission asks of the application.
pub trait Gatekeeper: Send + Sync + 'static {
    /// Who presents the credential of these headers, for a call of `path` (`None` for methods that
    /// take none or check their own).
    fn authenticate<'a>(
        &'a self,
        path: &'a str,
        headers: &'a http::HeaderMap,
    ) -> BoxFuture<'a, Result<Option<Credential>>>;

    /// Takes one call of `path` from the credential's and its account's call rates, or refuses it
    /// with when to retry.
    fn admit_rate(&self, credential: &Credential, path: &str) -> Result<()>;
}

/// How many places each key holds, up to `max` each.
struct Counts<K> {
    held: Mutex<HashMap<K, usize>>,
    max: usize,
}

impl<K: Hash + Eq + Clone + Send + 'static> Counts<K> {
    fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { held: Mutex::default(), max: max.max(1) })
    }

    /// A place for `key`, unless it holds `max` already.
    fn take(self: &Arc<Self>, key: K) -> Option<Place> {
        let mut held = self.held.lock().expect("admission lock poisoned");
        let count = held.entry(key.clone()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        drop(held);
        let counts = self.clone();
        Some(Place(Box::new(move || {
            let mut held = counts.held.lock().expect("admission lock poisoned");
            if let Some(count) = held.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    held.remove(&key);
                }
            }
        })))
    }
}

/// A place held; given back when dropped.
struct Place(Box<dyn FnMut() + Send>);

impl Drop for Place {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// Credentials this replica has accepted, known by a keyed hash of the token (however the header
/// that presents it is spaced, one token is one key). Membership only lets a call past the
/// address's gates: it is still authenticated (a revoked one is refused then, and forgotten).
struct Known {
    hasher: RandomState,
    seen: Mutex<Seen>,
}

/// The keys, and the order they were learnt in: past [`MAX_KNOWN`] the oldest is forgotten, so no
/// flood of new credentials empties the memory at once.
#[derive(Default)]
struct Seen {
    keys: HashSet<u64>,
    order: std::collections::VecDeque<u64>,
}

/// Most credentials remembered.
const MAX_KNOWN: usize = 100_000;

impl Known {
    fn key(&self, authorization: Option<&http::HeaderValue>) -> Option<u64> {
        let bytes = authorization?.as_bytes();
        // The token as authentication reads it: after `Bearer `, trimmed.
        let token = bytes.strip_prefix(b"Bearer ").map_or(bytes, <[u8]>::trim_ascii);
        Some(self.hasher.hash_one(token))
    }

    fn has(&self, key: Option<u64>) -> bool {
        key.is_some_and(|key| self.seen.lock().expect("admission lock poisoned").keys.contains(&key))
    }

    fn learn(&self, key: u64) {
        let mut seen = self.seen.lock().expect("admission lock poisoned");
        if !seen.keys.insert(key) {
            return;
        }
        seen.order.push_back(key);
        while seen.order.len() > MAX_KNOWN {
            if let Some(oldest) = seen.order.pop_front() {
                seen.keys.remove(&oldest);
            }
        }
    }

    fn forget(&self, key: u64) {
        let mut seen = self.seen.lock().expect("admission lock poisoned");
        if seen.keys.remove(&key) {
            seen.order.retain(|k| *k != key);
        }
    }
}

/// The budgets of one replica, shared by every call.
struct Budgets {
    limits: RpcLimits,
    known: Known,
    addresses: Arc<Counts<IpAddr>>,
    failed_auth: Mutex<HashMap<IpAddr, Bucket>>,
    credentials: Arc<Counts<Holder>>,
    accounts: Arc<Counts<AccountId>>,
    server: Arc<Counts<()>>,
    credential_streams: Arc<Counts<Holder>>,
    account_streams: Arc<Counts<AccountId>>,
    server_streams: Arc<Counts<()>>,
}

/// The longest a call refused for its rate is held before the refusal is sent.
const MAX_RATE_HOLD: Duration = Duration::from_secs(1);

/// Most addresses whose failed authentications are remembered; past it the full ones are
/// forgotten (a full bucket is what a new one starts as).
const MAX_FAILURE_BUCKETS: usize = 100_000;

impl Budgets {
    fn new(limits: RpcLimits) -> Self {
        Self {
            limits,
            known: Known { hasher: RandomState::new(), seen: Mutex::default() },
            addresses: Counts::new(limits.per_address),
            failed_auth: Mutex::default(),
            credentials: Counts::new(limits.per_credential),
            accounts: Counts::new(limits.per_account),
            server: Counts::new(limits.max_concurrent),
            credential_streams: Counts::new(limits.streams_per_credential),
            account_streams: Counts::new(limits.streams_per_account),
            server_streams: Counts::new(limits.max_waiting),
        }
    }

    /// A call from `ip` presenting `authorization` arrives: past the address's gates at once when
    /// the credential is known, else it takes a place among its address's calls being
    /// authenticated.
    fn arrive(
        self: &Arc<Self>,
        ip: Option<IpAddr>,
        authorization: Option<&http::HeaderValue>,
    ) -> std::result::Result<Arrival, Denied> {
        let key = self.known.key(authorization);
        let known = self.known.has(key);
        let place = match ip {
            Some(ip) if !known => Some(self.admit_address(ip)?),
            _ => None,
        };
        Ok(Arrival { budgets: self.clone(), ip, key, known, _place: place })
    }

    /// A place among the calls of address `ip` being authenticated, unless its credentials keep
    /// failing or it has its share of them.
    fn admit_address(&self, ip: IpAddr) -> std::result::Result<Place, Denied> {
        if let Some(wait) = self.auth_refused(ip, false) {
            return Err(Denied {
                shed: Shed::authentication,
                message: format!(
                    "too many calls from your address presented a credential the server does not accept: {}",
                    retry_in(wait)
                ),
                retry_after: Some(wait),
            });
        }
        self.addresses.take(ip).ok_or_else(|| Denied {
            shed: Shed::shares,
            message: format!(
                "your address has {} calls being authenticated, its limit: this one was refused; retry after a short backoff",
                self.limits.per_address
            ),
            retry_after: None,
        })
    }

    /// A place among the calls in flight of the credential `holder`.
    fn admit_credential(&self, holder: &Holder) -> std::result::Result<Place, Denied> {
        self.credentials.take(holder.clone()).ok_or_else(|| Denied {
            shed: Shed::shares,
            message: format!(
                "this credential has {} calls in flight, its share of the server: this one was refused; wait for answers before sending more",
                self.limits.per_credential
            ),
            retry_after: None,
        })
    }

    /// Refuses an address whose credentials failed past its rate; counts a new failure.
    fn auth_refused(&self, ip: IpAddr, failed_now: bool) -> Option<Duration> {
        let rate = self.limits.failed_auth;
        if rate.is_unlimited() {
            return None;
        }
        let now = Instant::now();
        let mut buckets = self.failed_auth.lock().expect("admission lock poisoned");
        if buckets.len() >= MAX_FAILURE_BUCKETS {
            buckets.retain(|_, bucket| !bucket.is_full(rate, now));
        }
        let bucket = buckets.entry(ip).or_insert_with(|| Bucket::full(rate, now));
        if failed_now {
            bucket.spend(rate, 1.0, now);
            return None;
        }
        bucket.ready(rate, now).err()
    }
}

/// A call on its way through authentication; say how it went.
pub struct Arrival {
    budgets: Arc<Budgets>,
    ip: Option<IpAddr>,
    key: Option<u64>,
    /// Its credential was known as it arrived.
    known: bool,
    _place: Option<Place>,
}

impl Arrival {
    /// Its credential was accepted: known from now on. Gives back the address's place.
    pub fn accepted(self) {
        if let Some(key) = self.key
            && !self.known
        {
            self.budgets.known.learn(key);
        }
    }

    /// Its credential was not accepted: counted against its address, and no longer known.
    pub fn refused(self) {
        if let Some(key) = self.key {
            self.budgets.known.forget(key);
        }
        if let Some(ip) = self.ip {
            self.budgets.auth_refused(ip, true);
        }
    }
}

/// The admission layer; see the module.
#[derive(Clone)]
pub struct AdmissionLayer {
    gatekeeper: Arc<dyn Gatekeeper>,
    budgets: Arc<Budgets>,
}

impl AdmissionLayer {
    pub fn new(gatekeeper: Arc<dyn Gatekeeper>, limits: RpcLimits) -> Self {
        Self { gatekeeper, budgets: Arc::new(Budgets::new(limits)) }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission { inner, gatekeeper: self.gatekeeper.clone(), budgets: self.budgets.clone() }
    }
}

#[derive(Clone)]
pub struct Admission<S> {
    inner: S,
    gatekeeper: Arc<dyn Gatekeeper>,
    budgets: Arc<Budgets>,
}

impl<S> Service<Request<Body>> for Admission<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, std::result::Result<Self::Response, BoxError>>;

    /// Always ready: whether a call may run is decided per call, in `call`.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let path = request.uri().path().to_owned();
        if Kind::of(&path) == Kind::Infrastructure {
            return Box::pin(async move { inner.oneshot(request).await.map_err(Into::into) });
        }
        let (gatekeeper, budgets) = (self.gatekeeper.clone(), self.budgets.clone());
        Box::pin(async move {
            match admit(request, inner, &*gatekeeper, &budgets, &path).await {
                Ok(response) => Ok(response),
                Err(Refusal::Status(status)) => Ok(status.into_http()),
                Err(Refusal::Failed(e)) => Err(e),
            }
        })
    }
}

enum Refusal {
    Status(Status),
    Failed(BoxError),
}

impl From<Status> for Refusal {
    fn from(status: Status) -> Self {
        Self::Status(status)
    }
}

impl From<Error> for Refusal {
    fn from(err: Error) -> Self {
        Self::Status(err.into())
    }
}

async fn admit<S>(
    request: Request<Body>,
    inner: S,
    gatekeeper: &dyn Gatekeeper,
    budgets: &Arc<Budgets>,
    path: &str,
) -> std::result::Result<Response<Body>, Refusal>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send,
    S::Future: Send,
    S::Error: Into<BoxError>,
{
    let kind = Kind::of(path);
    let limits = budgets.limits;
    let connection = request.extensions().get::<connections::Info>().cloned();
    let ip = connection.as_ref().and_then(|c| c.peer.map(|p| p.ip()));

    // 1. The address, unless the credential is known.
    let arrival = budgets.arrive(ip, request.headers().get(http::header::AUTHORIZATION)).map_err(Denied::refusal)?;

    // 2. Who it is.
    let credential = match gatekeeper.authenticate(path, request.headers()).await {
        Ok(credential) => credential,
        Err(err) => {
            if let Error::Unauthenticated(_) = &err {
                arrival.refused();
            }
            return Err(err.into());
        }
    };
    if credential.is_some() {
        arrival.accepted();
    }
    if let (Some(connection), Some(credential)) = (&connection, &credential) {
        connection.authenticated(credential.account_id(), &credential.holder()).map_err(|over| {
            let (whose, share) = match over {
                connections::OverShare::Account(share) => ("the account", share),
                connections::OverShare::Credential(share) => ("this credential", share),
            };
            refused(
                Shed::shares,
                format!(
                    "{whose} holds {share} connections to this server, its share: this call was refused; make calls on a connection already open, or close some"
                ),
                None,
            )
        })?;
    }

    // 3. Its credential's share, then the request message, whole, in time.
    let holder = credential.as_ref().map(Credential::holder);
    let account = credential.as_ref().map(Credential::account_id);
    let waits = matches!(kind, Kind::LongPoll | Kind::ServerTimed);
    let mut held = Vec::new();
    if let Some(holder) = &holder {
        held.push(budgets.admit_credential(holder).map_err(Denied::refusal)?);
    }
    let (mut parts, body) = request.into_parts();
    let message = read_message(body, limits.request_wait, limits::request_bytes(path)).await?;
    if let Some(credential) = credential.clone() {
        parts.extensions.insert(credential);
    }
    let request = Request::from_parts(parts, Body::new(http_body_util::Full::new(message)));

    // 4. Its account's share, then the server's; waiting calls and streams apart.
    let mut streaming = Vec::new();
    if waits || kind == Kind::Stream {
        if let Some(holder) = &holder {
            streaming.push(budgets.credential_streams.take(holder.clone()).ok_or_else(|| {
                refused(
                    Shed::shares,
                    format!(
                        "this credential has {} streams and waiting calls open, its share: close one before opening another",
                        limits.streams_per_credential
                    ),
                    None,
                )
            })?);
        }
        if let Some(account) = account {
            streaming.push(budgets.account_streams.take(account).ok_or_else(|| {
                refused(
                    Shed::shares,
                    format!(
                        "the account has {} streams and waiting calls open, its share of the server: this one was refused; retry after a short backoff",
                        limits.streams_per_account
                    ),
                    None,
                )
            })?);
        }
        streaming.push(budgets.server_streams.take(()).ok_or_else(|| {
            refused(
                Shed::calls,
                format!(
                    "the server is at its limit of {} waiting calls and refused this one: retry after a short backoff",
                    limits.max_waiting
                ),
                None,
            )
        })?);
    }
    if !waits {
        if let Some(account) = account {
            held.push(budgets.accounts.take(account).ok_or_else(|| {
                refused(
                    Shed::shares,
                    format!(
                        "the account has {} calls in flight, its share of the server: this one was refused; retry after a short backoff",
                        limits.per_account
                    ),
                    None,
                )
            })?);
        }
        held.push(budgets.server.take(()).ok_or_else(|| {
            refused(
                Shed::calls,
                format!(
                    "the server is at its limit of {} calls in flight and refused this one: retry after a short backoff",
                    limits.max_concurrent
                ),
                None,
            )
        })?);
    }

    // 5. Its rates. A call past them waits out what its caller is told to wait (up to
    // `MAX_RATE_HOLD`) before it is answered, holding only its credential's place: a client that
    // ignores the wait and calls on gets no more refusals a second than that place allows, where
    // answering at once would let it spend the server's CPU on refusals.
    if let Some(credential) = &credential
        && let Err(refusal) = gatekeeper.admit_rate(credential, path)
    {
        if let Error::Throttled { retry_after, .. } = &refusal {
            held.truncate(1);
            drop(streaming);
            tokio::time::sleep((*retry_after).min(MAX_RATE_HOLD)).await;
        }
        return Err(refusal.into());
    }

    // 6. The time budget.
    let call = inner.oneshot(request);
    let mut response = match kind.budget(limits.timeout) {
        None => call.await,
        Some(budget) => match tokio::time::timeout(budget, call).await {
            Ok(outcome) => outcome,
            Err(_) => {
                // Dropping the handler's future rolls back whatever it had not committed.
                tracing::warn!(budget_s = budget.as_secs_f64(), "rpc ran past its time budget; stopped");
                return Err(ran_too_long(path, budget).into());
            }
        },
    }
    .map_err(|e| Refusal::Failed(e.into()))?;
    drop(held);
    // A credential the call issued is one the replica has accepted.
    if let Some(key) =
        response.extensions_mut().remove::<Issued>().and_then(|Issued(header)| budgets.known.key(Some(&header)))
    {
        budgets.known.learn(key);
    }
    if streaming.is_empty() {
        return Ok(response);
    }
    // A stream keeps its stream places for as long as its body lives.
    Ok(response.map(|body| Body::new(Holding { body, _places: streaming })))
}

/// The request's message, whole: at most `max` bytes, all of it within `wait`.
async fn read_message(body: Body, wait: Duration, max: usize) -> std::result::Result<Bytes, Refusal> {
    let read = http_body_util::Limited::new(body, max).collect();
    match tokio::time::timeout(wait, read).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(Status::invalid_argument(format!(
            "the request is larger than the {max} bytes this method takes: nothing was done"
        ))
        .into()),
        // The client reset the call or went away while sending it: nobody is there to answer.
        Ok(Err(e)) => Err(Refusal::Failed(e)),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "the request message did not arrive within {} s of the call's headers: nothing was done",
            wait.as_secs_f64()
        ))
        .into()),
    }
}

/// Refusals are logged at info at most this often (each is counted in `relay_shed`): a client
/// flooding refused calls would otherwise cost a log line each, and fill the log.
const LOG_REFUSALS_EVERY: Duration = Duration::from_secs(10);

/// When a refusal was last logged at info, in milliseconds since [`started`].
static REFUSAL_LOGGED_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn started() -> Instant {
    static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *STARTED.get_or_init(Instant::now)
}

/// A refusal at a budget, counted in `relay_shed`, with when to retry when that is known.
fn refused(shed: Shed, message: String, retry_after: Option<Duration>) -> Refusal {
    note_refusal(shed, &message);
    let mut status = Status::resource_exhausted(message);
    match retry_after {
        Some(wait) => advise_retry_after(&mut status, wait),
        None => advise_retry(&mut status),
    }
    Refusal::Status(status)
}

/// Counts a refusal in `relay_shed`, and logs one every [`LOG_REFUSALS_EVERY`].
fn note_refusal(shed: Shed, message: &str) {
    use std::sync::atomic::Ordering;
    metrics().shed(shed);
    let now_ms = started().elapsed().as_millis() as u64 + LOG_REFUSALS_EVERY.as_millis() as u64;
    let last = REFUSAL_LOGGED_MS.load(Ordering::Relaxed);
    let due = now_ms >= last + LOG_REFUSALS_EVERY.as_millis() as u64
        && REFUSAL_LOGGED_MS.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok();
    if due {
        tracing::info!(reason = %message, ?shed, "call refused at admission (more are counted in relay_shed_total, not logged, for 10 s)");
    } else {
        tracing::debug!(reason = %message, "call refused at admission");
    }
}

/// What a budget refused, before it is told in a transport's words.
struct Denied {
    shed: Shed,
    message: String,
    retry_after: Option<Duration>,
}

impl Denied {
    fn refusal(self) -> Refusal {
        refused(self.shed, self.message, self.retry_after)
    }

    fn refused(self) -> Refused {
        note_refusal(self.shed, &self.message);
        Refused { message: self.message, retry_after: self.retry_after }
    }
}

/// A request of another transport (the MCP endpoint's HTTP) refused by the budgets it shares
/// with gRPC: why, and when to retry when that is known.
#[derive(Debug)]
pub struct Refused {
    pub message: String,
    pub retry_after: Option<Duration>,
}

/// A place held by a request of another transport; given back when dropped.
pub struct Held {
    _place: Place,
}

/// The door other transports take into the budgets and rates gRPC calls meet: the same failed
/// authentications per address, the same shares per credential, the same call rates.
impl AdmissionLayer {
    /// A request from `ip` presenting `authorization` arrives (see step 1).
    pub fn arrive(
        &self,
        ip: Option<IpAddr>,
        authorization: Option<&http::HeaderValue>,
    ) -> std::result::Result<Arrival, Refused> {
        self.budgets.arrive(ip, authorization).map_err(Denied::refused)
    }

    /// A place among the credential's requests in flight, and one off its call rates (steps 3 and 5).
    pub fn admit_credential(&self, credential: &Credential, path: &str) -> std::result::Result<Held, Refused> {
        let place = self.budgets.admit_credential(&credential.holder()).map_err(Denied::refused)?;
        self.gatekeeper.admit_rate(credential, path).map_err(|err| {
            let retry_after = match &err {
                Error::Throttled { retry_after, .. } => Some(*retry_after),
                _ => None,
            };
            Denied { shed: Shed::rates, message: err.to_string(), retry_after }.refused()
        })?;
        Ok(Held { _place: place })
    }
}

/// "retry in N s", N a whole number of seconds, at least 1.
pub fn retry_in(wait: Duration) -> String {
    format!("retry in {} s", crate::domain::rate::whole_seconds(wait))
}

/// A response body that holds places until it is done.
struct Holding {
    body: Body,
    _places: Vec<Place>,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use crate::domain::ids::TokenHash;
    use std::convert::Infallible;
    use std::net::SocketAddr;

    use tokio::sync::Notify;
    use tonic::Code;

    use super::*;
    use crate::domain::caller::Caller;
    use crate::domain::ids::{EndpointId, MachineId};
    use crate::protocol::layers::{RpcLayers, panicked};

    /// Authenticates `Bearer <account>:<endpoint>` as that endpoint of that account; refuses
    /// `Bearer bad`; refuses the rate of endpoint 99.
    struct Stub;

    impl Gatekeeper for Stub {
        fn authenticate<'a>(
            &'a self,
            _: &'a str,
            headers: &'a http::HeaderMap,
        ) -> BoxFuture<'a, Result<Option<Credential>>> {
            Box::pin(async move {
                let token = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
                let (account, endpoint) = token
                    .strip_prefix("Bearer ")
                    .and_then(|t| t.split_once(':'))
                    .and_then(|(a, e)| Some((a.parse().ok()?, e.parse().ok()?)))
                    .ok_or_else(|| Error::Unauthenticated("no such token".into()))?;
                Ok(Some(Credential::Session(Caller {
                    endpoint_id: EndpointId(endpoint),
                    account_id: AccountId(account),
                    account: format!("a{account}"),
                    machine_id: MachineId(1),
                    machine: "m".into(),
                    handle: format!("e{endpoint}"),
                    session_hash: TokenHash::from_stored(Vec::new()),
                    attempt: None,
                })))
            })
        }

        fn admit_rate(&self, credential: &Credential, _: &str) -> Result<()> {
            match credential.holder() {
                Holder::Endpoint(EndpointId(99)) => {
                    Err(limits::calling_too_fast("e99", Rate::new(1.0, 1.0), Duration::from_millis(300)))
                }
                _ => Ok(()),
            }
        }
    }

    fn admission<S: Clone>(inner: S, limits: RpcLimits) -> Admission<S> {
        AdmissionLayer::new(Arc::new(Stub), limits).layer(inner)
    }

    fn limits(max_concurrent: usize) -> RpcLimits {
        RpcLimits { max_concurrent, max_waiting: max_concurrent, ..RpcLimits::default() }
    }

    /// A call of `path` by endpoint `endpoint` of account `account`, from 10.0.0.1.
    fn call(path: &str, account: i64, endpoint: i64) -> Request<Body> {
        call_from(path, &format!("Bearer {account}:{endpoint}"), "10.0.0.1:5000", Body::empty())
    }

    fn call_from(path: &str, token: &str, peer: &str, body: Body) -> Request<Body> {
        let mut request =
            Request::builder().uri(format!("http://relay{path}")).header("authorization", token).body(body).unwrap();
        let peer: SocketAddr = peer.parse().unwrap();
        request.extensions_mut().insert(connections::Info::for_test(peer));
        request
    }

    fn ok() -> Response<Body> {
        Status::ok("").into_http()
    }

    fn status_of<B>(response: &Response<B>) -> Code {
        Status::from_header_map(response.headers()).map_or(Code::Ok, |s| s.code())
    }

    fn message_of<B>(response: &Response<B>) -> String {
        Status::from_header_map(response.headers()).map(|s| s.message().to_owned()).unwrap_or_default()
    }

    /// A request body whose message never comes.
    struct Never;

    impl http_body::Body for Never {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<std::result::Result<http_body::Frame<Bytes>, Infallible>>> {
            Poll::Pending
        }
    }

    /// A handler that holds calls to `held` until released (saying when one entered), and answers
    /// anything else at once.
    fn gated(
        held: &'static str,
    ) -> (
        Arc<Notify>,
        Arc<Notify>,
        impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone + Send,
    ) {
        let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let handler = {
            let (entered, release) = (entered.clone(), release.clone());
            tower::service_fn(move |req: Request<Body>| {
                let (entered, release) = (entered.clone(), release.clone());
                async move {
                    if req.uri().path() == held {
                        entered.notify_one();
                        release.notified().await;
                    }
                    if Kind::of(req.uri().path()) == Kind::Stream {
                        // A stream's body goes on until its client drops it.
                        return Ok::<_, Infallible>(Response::new(Body::new(Never)));
                    }
                    Ok::<_, Infallible>(ok())
                }
            })
        };
        (entered, release, handler)
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_internal_and_gives_its_places_back() {
        let panicky = tower::service_fn(|req: Request<Body>| async move {
            if req.uri().path().ends_with("/Boom") {
                panic!("handler bug");
            }
            Ok::<_, Infallible>(ok())
        });
        let single = RpcLayers::new(AdmissionLayer::new(Arc::new(Stub), limits(1))).layer(panicky);
        let boom = single.clone().oneshot(call("/relay.v1.Relay/Boom", 1, 1)).await.unwrap();
        assert_eq!(status_of(&boom), Code::Internal);
        assert_eq!(message_of(&boom), panicked().message());
        assert_eq!(boom.headers()["content-type"], "application/grpc");
        // With a limit of one, the next call still runs: the panicked call gave its place back.
        assert_eq!(status_of(&single.oneshot(call("/relay.v1.Relay/Send", 1, 1)).await.unwrap()), Code::Ok);
    }

    // The clock is paused and jumps ahead whenever every task waits, so the real defaults are tested
    // without the test taking minutes.
    #[tokio::test(start_paused = true)]
    async fn a_stuck_ordinary_call_is_stopped_but_a_long_poll_and_a_stream_are_not() {
        let handler = tower::service_fn(|req: Request<Body>| async move {
            match req.uri().path() {
                "/relay.v1.Relay/Send" => std::future::pending::<()>().await,
                _ => tokio::time::sleep(Duration::from_secs(u64::from(limits::MAX_WAIT_S))).await,
            }
            Ok::<_, Infallible>(ok())
        });
        let service = admission(handler, RpcLimits::default());
        let started = tokio::time::Instant::now();
        let stuck = service.clone().oneshot(call("/relay.v1.Relay/Send", 1, 1)).await.unwrap();
        assert_eq!(status_of(&stuck), Code::DeadlineExceeded);
        assert_eq!(started.elapsed(), DEFAULT_RPC_TIMEOUT);
        assert!(message_of(&stuck).starts_with("relay.v1.Relay/Send took longer than the server allows (30 s)"));

        let started = tokio::time::Instant::now();
        let waited = service.clone().oneshot(call("/relay.v1.Relay/Inbox", 1, 1)).await.unwrap();
        assert_eq!(status_of(&waited), Code::Ok, "a long poll is not cut while it waits");
        assert_eq!(started.elapsed(), Duration::from_secs(u64::from(limits::MAX_WAIT_S)));

        let stream = service.oneshot(call("/relay.v1.Relay/Subscribe", 1, 1)).await.unwrap();
        assert_eq!(status_of(&stream), Code::Ok, "a stream's setup is not timed");
    }

    #[tokio::test]
    async fn beyond_the_servers_limit_calls_are_refused_at_once_but_health_still_answers() {
        let (entered, release, handler) = gated("/relay.v1.Relay/Send");
        let service = admission(handler, limits(1));
        let held = tokio::spawn(service.clone().oneshot(call("/relay.v1.Relay/Send", 1, 1)));
        entered.notified().await;
        let refused = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 2, 2)).await.unwrap();
        assert_eq!(status_of(&refused), Code::ResourceExhausted);
        assert_eq!(
            message_of(&refused),
            "the server is at its limit of 1 calls in flight and refused this one: retry after a short backoff"
        );
        assert_eq!(refused.headers()["grpc-retry-pushback-ms"], "250");
        let health = service.clone().oneshot(call("/grpc.health.v1.Health/Check", 2, 2)).await.unwrap();
        assert_eq!(status_of(&health), Code::Ok, "health bypasses admission");
        release.notify_one();
        assert_eq!(status_of(&held.await.unwrap().unwrap()), Code::Ok);
        assert_eq!(status_of(&service.oneshot(call("/relay.v1.Relay/WhoAmI", 2, 2)).await.unwrap()), Code::Ok);
    }

    #[tokio::test]
    async fn an_account_filling_its_share_refuses_its_own_calls_not_anothers() {
        let (entered, release, handler) = gated("/relay.v1.Relay/Send");
        let shares = RpcLimits { per_account: 2, per_credential: 1, ..limits(16) };
        let service = admission(handler, shares);
        let mut held = Vec::new();
        for endpoint in [1, 2] {
            held.push(tokio::spawn(service.clone().oneshot(call("/relay.v1.Relay/Send", 1, endpoint))));
            entered.notified().await;
        }
        let same_credential = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 1, 1)).await.unwrap();
        assert_eq!(status_of(&same_credential), Code::ResourceExhausted);
        assert!(message_of(&same_credential).starts_with("this credential has 1 calls in flight"));
        let same_account = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 1, 3)).await.unwrap();
        assert_eq!(status_of(&same_account), Code::ResourceExhausted);
        assert!(message_of(&same_account).starts_with("the account has 2 calls in flight, its share"));
        let other_account = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 2, 4)).await.unwrap();
        assert_eq!(status_of(&other_account), Code::Ok, "another account is not refused");
        release.notify_waiters();
        for call in held {
            assert_eq!(status_of(&call.await.unwrap().unwrap()), Code::Ok);
        }
    }

    #[tokio::test]
    async fn waiting_calls_and_streams_have_their_own_places() {
        let (entered, release, handler) = gated("/relay.v1.Relay/Inbox");
        let service = admission(handler, RpcLimits { streams_per_credential: 1, max_waiting: 8, ..limits(1) });
        let waiting = tokio::spawn(service.clone().oneshot(call("/relay.v1.Relay/Inbox", 1, 1)));
        entered.notified().await;
        let ordinary = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 1, 1)).await.unwrap();
        assert_eq!(status_of(&ordinary), Code::Ok, "a waiting call holds no ordinary place");
        let second = service.clone().oneshot(call("/relay.v1.Relay/AskWait", 1, 1)).await.unwrap();
        assert_eq!(status_of(&second), Code::ResourceExhausted);
        assert!(message_of(&second).starts_with("this credential has 1 streams and waiting calls open"));
        let elsewhere = service.clone().oneshot(call("/relay.v1.Relay/Subscribe", 2, 2)).await.unwrap();
        assert_eq!(status_of(&elsewhere), Code::Ok);
        // A stream keeps its place while its body lives, and gives it back with it.
        let again = service.clone().oneshot(call("/relay.v1.Relay/Announce", 2, 2)).await.unwrap();
        assert_eq!(status_of(&again), Code::ResourceExhausted, "{}", message_of(&again));
        drop(elsewhere);
        let after = service.clone().oneshot(call("/relay.v1.Relay/Announce", 2, 2)).await.unwrap();
        assert_eq!(status_of(&after), Code::Ok);
        release.notify_one();
        assert_eq!(status_of(&waiting.await.unwrap().unwrap()), Code::Ok);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_message_never_comes_ends_and_holds_no_place_of_its_account() {
        let service = admission(
            tower::service_fn(|_| async { Ok::<_, Infallible>(ok()) }),
            RpcLimits { per_account: 1, ..RpcLimits::default() },
        );
        let headers_only = call_from("/relay.v1.Relay/Send", "Bearer 1:1", "10.0.0.1:5000", Body::new(Never));
        let half_open = tokio::spawn(service.clone().oneshot(headers_only));
        tokio::task::yield_now().await;
        // Meanwhile another agent of the same account works.
        let other = service.clone().oneshot(call("/relay.v1.Relay/Send", 1, 2)).await.unwrap();
        assert_eq!(status_of(&other), Code::Ok);
        let started = tokio::time::Instant::now();
        let ended = half_open.await.unwrap().unwrap();
        assert_eq!(status_of(&ended), Code::DeadlineExceeded);
        assert!(
            message_of(&ended).starts_with("the request message did not arrive within 5 s"),
            "{}",
            message_of(&ended)
        );
        assert!(started.elapsed() <= DEFAULT_REQUEST_WAIT);
    }

    #[tokio::test]
    async fn a_request_larger_than_its_method_takes_is_refused_unread() {
        let service = admission(tower::service_fn(|_| async { Ok::<_, Infallible>(ok()) }), RpcLimits::default());
        let big = Body::new(http_body_util::Full::new(Bytes::from(vec![0u8; 20 * 1024])));
        let refused = service
            .clone()
            .oneshot(call_from("/relay.v1.Relay/Confirm", "Bearer 1:1", "10.0.0.1:1", big))
            .await
            .unwrap();
        assert_eq!(status_of(&refused), Code::InvalidArgument);
        assert_eq!(
            message_of(&refused),
            "the request is larger than the 16384 bytes this method takes: nothing was done"
        );
        let body = Body::new(http_body_util::Full::new(Bytes::from(vec![0u8; 20 * 1024])));
        let send = service.oneshot(call_from("/relay.v1.Relay/Send", "Bearer 1:1", "10.0.0.1:1", body)).await.unwrap();
        assert_eq!(status_of(&send), Code::Ok, "a send may carry a 64 KiB body");
    }

    #[tokio::test]
    async fn an_address_whose_credentials_keep_failing_is_refused_before_asking_who_it_is() {
        let service = admission(tower::service_fn(|_| async { Ok::<_, Infallible>(ok()) }), RpcLimits::default());
        let bad = || call_from("/relay.v1.Relay/WhoAmI", "Bearer bad", "10.0.0.7:1", Body::empty());
        let mut refused_early = None;
        for _ in 0..DEFAULT_FAILED_AUTH.burst as usize + 5 {
            let answer = service.clone().oneshot(bad()).await.unwrap();
            if status_of(&answer) == Code::ResourceExhausted {
                refused_early = Some(message_of(&answer));
                break;
            }
            assert_eq!(status_of(&answer), Code::Unauthenticated);
        }
        let said = refused_early.expect("the address is refused once past its failures");
        assert!(
            said.contains("presented a credential the server does not accept") && said.contains("retry in"),
            "{said}"
        );
        let elsewhere = call_from("/relay.v1.Relay/WhoAmI", "Bearer 1:1", "10.0.0.8:1", Body::empty());
        assert_eq!(status_of(&service.oneshot(elsewhere).await.unwrap()), Code::Ok, "other addresses are not");
    }

    #[tokio::test]
    async fn a_known_credential_is_not_refused_for_its_neighbours_failures() {
        let service = admission(tower::service_fn(|_| async { Ok::<_, Infallible>(ok()) }), RpcLimits::default());
        let from_office = |token: &str| call_from("/relay.v1.Relay/WhoAmI", token, "10.0.0.7:1", Body::empty());
        let honest = service.clone().oneshot(from_office("Bearer 1:1")).await.unwrap();
        assert_eq!(status_of(&honest), Code::Ok);
        for _ in 0..DEFAULT_FAILED_AUTH.burst as usize * 2 {
            service.clone().oneshot(from_office("Bearer bad")).await.unwrap();
        }
        let refused = service.clone().oneshot(from_office("Bearer bad")).await.unwrap();
        assert_eq!(status_of(&refused), Code::ResourceExhausted, "the failing credentials are held back");
        let honest = service.clone().oneshot(from_office("Bearer 1:1")).await.unwrap();
        assert_eq!(status_of(&honest), Code::Ok, "the credential accepted before is not: {}", message_of(&honest));
        // A credential the replica has not accepted yet meets the address's gate.
        let newcomer = service.oneshot(from_office("Bearer 1:2")).await.unwrap();
        assert_eq!(status_of(&newcomer), Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn behind_a_proxy_failed_authentications_can_be_left_to_it() {
        let limits = RpcLimits { failed_auth: Rate::UNLIMITED, ..RpcLimits::default() };
        let service = admission(tower::service_fn(|_| async { Ok::<_, Infallible>(ok()) }), limits);
        for _ in 0..DEFAULT_FAILED_AUTH.burst as usize * 2 {
            let bad = call_from("/relay.v1.Relay/WhoAmI", "Bearer bad", "10.0.0.7:1", Body::empty());
            assert_eq!(status_of(&service.clone().oneshot(bad).await.unwrap()), Code::Unauthenticated);
        }
        let good = call_from("/relay.v1.Relay/WhoAmI", "Bearer 1:1", "10.0.0.7:1", Body::empty());
        assert_eq!(status_of(&service.oneshot(good).await.unwrap()), Code::Ok, "the proxy's address is not refused");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_rate_is_refused_with_a_real_wait() {
        let service = admission(tower::service_fn(|_| async { Ok::<_, Infallible>(ok()) }), RpcLimits::default());
        let started = tokio::time::Instant::now();
        let refused = service.oneshot(call("/relay.v1.Relay/List", 1, 99)).await.unwrap();
        // Held for the wait it names, so a caller that ignores it floods no faster than its places.
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(status_of(&refused), Code::ResourceExhausted);
        assert!(message_of(&refused).ends_with("try again in 1 s"), "{}", message_of(&refused));
        assert_eq!(refused.headers()["grpc-retry-pushback-ms"], "300");
    }
}
