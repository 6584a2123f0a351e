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
//! 4. **Call rates** per credential and per account (`Gatekeeper::admit_rate`): before the shares
//!    below, so a call held back for its rate holds only its credential's place.
//! 5. **Its account's share** (`per_account`), then the server's (`max_concurrent`). Calls that wait
//!    (long polls, permission requests) and streams count apart from calls doing work, with their
//!    own shares per account and per credential; a stream holds its stream places for its life and
//!    its call places only until it starts streaming.
//! 6. **A time budget** by the method's kind ([`Kind::budget`]).
//!
//! Every refusal is RESOURCE_EXHAUSTED (or DEADLINE_EXCEEDED, INVALID_ARGUMENT) with what was full
//! and when to retry. Health and reflection pass untouched, so readiness answers however busy the
//! replica is.
//!
//! Each step is a tower layer of its own (a [`Job`] in [`Step`]), in a module of its own;
//! `protocol::layers` composes them in this order, behind [`Bypass`].

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::{BuildHasher, Hash, RandomState};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use http::{Request, Response};
use tonic::Status;
use tonic::body::Body;
use tower::{BoxError, Layer, Service, ServiceExt};

mod address;
mod authenticate;
mod budget;
mod credential;
mod message;
mod rates;
mod shares;

pub use address::Address;
pub use authenticate::Authenticate;
pub use budget::TimeBudget;
pub use credential::CredentialShare;
pub use message::WholeMessage;
pub use rates::Rates;
pub use shares::Shares;

use super::calls::{Kind, advise_retry, advise_retry_after};
use super::credential::Credential;
use crate::domain::caller::Holder;
use crate::domain::ids::AccountId;
use crate::domain::rate::{Bucket, Rate};
use crate::domain::{Error, Result};
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
    /// The largest file an upload carries (the files' own limit): `Upload` takes that and its
    /// frame, and more time for it to arrive.
    pub upload_bytes: usize,
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
            upload_bytes: crate::domain::artifact::DEFAULT_MAX_FILE_BYTES as usize,
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

/// Admission's state — the budgets of the replica and what authenticates — from which each step's
/// layer is made; see the module.
#[derive(Clone)]
pub struct AdmissionLayer {
    gatekeeper: Arc<dyn Gatekeeper>,
    budgets: Arc<Budgets>,
}

impl AdmissionLayer {
    pub fn new(gatekeeper: Arc<dyn Gatekeeper>, limits: RpcLimits) -> Self {
        Self { gatekeeper, budgets: Arc::new(Budgets::new(limits)) }
    }

    pub fn address(&self) -> Step<Address> {
        Step(Address { budgets: self.budgets.clone() })
    }

    pub fn authenticate(&self) -> Step<Authenticate> {
        Step(Authenticate { gatekeeper: self.gatekeeper.clone(), budgets: self.budgets.clone() })
    }

    pub fn credential_share(&self) -> Step<CredentialShare> {
        Step(CredentialShare { budgets: self.budgets.clone() })
    }

    pub fn whole_message(&self) -> Step<WholeMessage> {
        let limits = &self.budgets.limits;
        Step(WholeMessage { wait: limits.request_wait, upload_bytes: limits.upload_bytes })
    }

    pub fn rates(&self) -> Step<Rates> {
        Step(Rates { gatekeeper: self.gatekeeper.clone() })
    }

    pub fn shares(&self) -> Step<Shares> {
        Step(Shares { budgets: self.budgets.clone() })
    }

    pub fn time_budget(&self) -> Step<TimeBudget> {
        Step(TimeBudget { timeout: self.budgets.limits.timeout })
    }
}

/// What a step's `next` is: the rest of the stack.
pub trait Next:
    Service<Request<Body>, Response = Response<Body>, Error: Into<BoxError>, Future: Send> + Send + 'static
{
}

impl<S> Next for S where
    S: Service<Request<Body>, Response = Response<Body>, Error: Into<BoxError>, Future: Send> + Send + 'static
{
}

/// One step of admission: it sees a call, and runs the rest of the stack (`next`) when the call may
/// go on, or refuses it.
pub trait Job: Clone + Send + Sync + 'static {
    fn admit<S: Next>(
        &self,
        request: Request<Body>,
        next: S,
    ) -> impl Future<Output = std::result::Result<Response<Body>, Refusal>> + Send;
}

/// A [`Job`] as a tower layer.
#[derive(Clone)]
pub struct Step<J>(J);

impl<J: Clone, S> Layer<S> for Step<J> {
    type Service = Stepped<J, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Stepped { job: self.0.clone(), inner }
    }
}

/// A [`Job`] in front of the rest of the stack.
#[derive(Clone)]
pub struct Stepped<J, S> {
    job: J,
    inner: S,
}

impl<J: Job, S: Next + Clone> Service<Request<Body>> for Stepped<J, S> {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, std::result::Result<Response<Body>, BoxError>>;

    /// Always ready: whether a call may run is decided per call, in `call`.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (job, inner) = (self.job.clone(), self.inner.clone());
        Box::pin(async move {
            match job.admit(request, inner).await {
                Ok(response) => Ok(response),
                Err(Refusal::Status(status)) => Ok(status.into_http()),
                Err(Refusal::Failed(e)) => Err(e),
            }
        })
    }
}

/// Health and reflection go straight to `plain`; every other call through `admitted`.
#[derive(Clone)]
pub struct Bypass<A, S> {
    pub admitted: A,
    pub plain: S,
}

impl<A, S> Service<Request<Body>> for Bypass<A, S>
where
    A: Service<Request<Body>, Response = Response<Body>, Error = BoxError> + Clone + Send + 'static,
    A::Future: Send + 'static,
    S: Next + Clone,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, std::result::Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if Kind::of(request.uri().path()) == Kind::Infrastructure {
            let plain = self.plain.clone();
            return Box::pin(async move { plain.oneshot(request).await.map_err(Into::into) });
        }
        let admitted = self.admitted.clone();
        Box::pin(admitted.oneshot(request))
    }
}

/// Why a step did not let a call on: a status to answer with, or the call failed underneath.
pub enum Refusal {
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
        Self::Status(crate::protocol::status::to_status(err))
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

#[cfg(test)]
pub(super) mod testing {
    //! What the steps' tests share: a gatekeeper, calls, and handlers.

    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::pin::Pin;

    use bytes::Bytes;
    use tokio::sync::Notify;
    use tonic::Code;

    use super::*;
    use crate::domain::caller::{Caller, Holder};
    use crate::domain::ids::{AccountId, EndpointId, MachineId, TokenHash};
    use crate::domain::limits;
    use crate::domain::rate::Rate;
    use crate::protocol::calls::Kind;
    use crate::protocol::connections;
    use crate::protocol::layers::{Admitted, admitted};

    /// Authenticates `Bearer <account>:<endpoint>` as that endpoint of that account; refuses
    /// `Bearer bad`; refuses the rate of endpoint 99.
    pub struct Stub;

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

    /// The whole of admission, in front of `inner`.
    pub fn admission<S: Clone>(inner: S, limits: RpcLimits) -> Admitted<S> {
        admitted(&AdmissionLayer::new(Arc::new(Stub), limits), inner)
    }

    /// A handler that answers every call at once.
    pub fn answering()
    -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone + Send {
        tower::service_fn(|_| async { Ok::<_, Infallible>(ok()) })
    }

    pub fn limits(max_concurrent: usize) -> RpcLimits {
        RpcLimits { max_concurrent, max_waiting: max_concurrent, ..RpcLimits::default() }
    }

    /// A call of `path` by endpoint `endpoint` of account `account`, from 10.0.0.1.
    pub fn call(path: &str, account: i64, endpoint: i64) -> Request<Body> {
        call_from(path, &format!("Bearer {account}:{endpoint}"), "10.0.0.1:5000", Body::empty())
    }

    pub fn call_from(path: &str, token: &str, peer: &str, body: Body) -> Request<Body> {
        let mut request =
            Request::builder().uri(format!("http://relay{path}")).header("authorization", token).body(body).unwrap();
        let peer: SocketAddr = peer.parse().unwrap();
        request.extensions_mut().insert(connections::Info::for_test(peer));
        request
    }

    pub fn ok() -> Response<Body> {
        Status::ok("").into_http()
    }

    pub fn status_of<B>(response: &Response<B>) -> Code {
        Status::from_header_map(response.headers()).map_or(Code::Ok, |s| s.code())
    }

    pub fn message_of<B>(response: &Response<B>) -> String {
        Status::from_header_map(response.headers()).map(|s| s.message().to_owned()).unwrap_or_default()
    }

    /// A request body whose message never comes.
    pub struct Never;

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
    pub fn gated(
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
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tonic::Code;

    use super::testing::*;
    use super::*;
    use crate::protocol::layers::{RpcLayers, panicked};

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
}
