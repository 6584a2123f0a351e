//! What every call goes through, whatever its handler, as tower layers on the tonic server
//! (outermost first):
//!
//! 1. metrics: each call counted by method and code, and timed to its response (`relay_rpcs`,
//!    `relay_rpc_duration_seconds`);
//! 2. a span per call (`rpc`, with service, method, caller, code, latency) and one event when it ends;
//! 3. catch-panic: a handler that panics answers INTERNAL and is logged; the server keeps serving;
//! 4. admission: a global limit on calls in flight that refuses at once with RESOURCE_EXHAUSTED
//!    rather than queueing, and a time budget per call that answers DEADLINE_EXCEEDED.
//!
//! Health and reflection pass admission untouched, so readiness probes answer however busy the
//! server is. Calls that wait (long polls, permission requests) have a limit of their own, so
//! clients waiting for mail never take the places of calls doing work. Long polls get their longest wait plus the ordinary budget; streams and calls whose
//! wait the server itself bounds get no budget here (see [`Kind`]).

use futures_util::future::BoxFuture;
use std::any::Any;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, Request, Response};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tower::limit::ConcurrencyLimit;
use tower::load_shed::LoadShed;
use tower::load_shed::error::Overloaded;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http::catch_panic::{CatchPanic, ResponseForPanic};
use tower_http::classify::{GrpcErrorsAsFailures, SharedClassifier};
use tower_http::trace::{MakeSpan, OnEos, OnResponse, Trace, TraceLayer};
use tracing::Span;
use tracing::field::Empty;

use crate::domain::limits::MAX_WAIT_S;
use crate::metrics::{Shed, metrics};

/// The time budget of an ordinary call.
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// The most calls in flight at once (streams count only until their first response).
pub const DEFAULT_MAX_CONCURRENT_RPCS: u32 = 1024;
/// What a refused caller is told to wait before retrying (`grpc-retry-pushback-ms`, gRFC A6).
const RETRY_PUSHBACK_MS: &str = "250";

/// The most calls waiting at once (long polls, permission requests): they cost a task and no
/// work while they wait, so they have their own limit and never take ordinary calls' places.
pub const DEFAULT_MAX_WAITING_CALLS: u32 = 8192;

/// The limits the layers enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcLimits {
    /// Budget of an ordinary call; a long poll gets its longest wait on top.
    pub timeout: Duration,
    /// Calls in flight at once beyond which a call is refused.
    pub max_concurrent: usize,
    /// Calls that wait (long polls and permission requests) at once, beside `max_concurrent`.
    pub max_waiting: usize,
}

impl Default for RpcLimits {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_RPC_TIMEOUT,
            max_concurrent: DEFAULT_MAX_CONCURRENT_RPCS as usize,
            max_waiting: DEFAULT_MAX_WAITING_CALLS as usize,
        }
    }
}

/// How the layers treat a method, by its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Health and reflection: neither limited nor timed, so readiness never queues behind load.
    Infrastructure,
    /// A server stream: it lives as long as its client wants, so no budget.
    Stream,
    /// A long poll whose wait the request carries (`wait_s`, refused above `MAX_WAIT_S`): that
    /// longest wait plus the ordinary budget, so a wait is never cut but a stuck one still ends.
    LongPoll,
    /// Waits for a decision whose deadlines the server keeps in the database (a permission request
    /// goes to the operator, then the human, about twice `RELAY_APPROVAL_WAIT_S`, longer when it
    /// reaches the human late): no budget here.
    ServerTimed,
    Ordinary,
}

impl Kind {
    pub fn of(path: &str) -> Self {
        let (service, method) = split_path(path);
        match (service, method) {
            ("grpc.health.v1.Health", _)
            | ("grpc.reflection.v1.ServerReflection", _)
            | ("grpc.reflection.v1alpha.ServerReflection", _) => Self::Infrastructure,
            ("relay.v1.Relay", "Subscribe" | "Announce") => Self::Stream,
            ("relay.v1.Relay", "Inbox" | "AskWait") | ("relay.v1.Human", "Inbox") => Self::LongPoll,
            ("relay.v1.Relay", "RequestPermission") => Self::ServerTimed,
            _ => Self::Ordinary,
        }
    }

    /// How long a call of this kind may run before it is stopped; `None` for no limit.
    pub fn budget(self, ordinary: Duration) -> Option<Duration> {
        match self {
            Self::Ordinary => Some(ordinary),
            Self::LongPoll => Some(Duration::from_secs(u64::from(MAX_WAIT_S)) + ordinary),
            Self::Infrastructure | Self::Stream | Self::ServerTimed => None,
        }
    }
}

/// `/pkg.Service/Method` as (`pkg.Service`, `Method`); anything else as (path, "").
fn split_path(path: &str) -> (&str, &str) {
    path.trim_start_matches('/').split_once('/').unwrap_or((path, ""))
}

/// Records the authenticated caller on the current call's span. Handlers run inside that span, so
/// whatever authenticates a call can name its caller here.
pub fn record_caller(caller: &dyn std::fmt::Display) {
    Span::current().record("caller", tracing::field::display(caller));
}

/// All of the layers, for `Server::builder().layer(RpcLayers::new(limits))`.
#[derive(Debug, Clone, Copy)]
pub struct RpcLayers {
    limits: RpcLimits,
}

impl RpcLayers {
    pub fn new(limits: RpcLimits) -> Self {
        Self { limits }
    }
}

/// The trace layer with the spans and events of [`RpcSpan`] and [`RpcEnd`].
pub type RpcTrace<S> = Trace<S, SharedClassifier<GrpcErrorsAsFailures>, RpcSpan, (), RpcEnd, (), RpcEnd, ()>;

impl<S: Clone> Layer<S> for RpcLayers {
    type Service = Measured<RpcTrace<CatchPanic<Admission<S>, PanicToStatus>>>;

    fn layer(&self, inner: S) -> Self::Service {
        let admitted = Admission::new(inner, self.limits);
        let guarded = CatchPanic::custom(admitted, PanicToStatus);
        let traced = TraceLayer::new_for_grpc()
            .make_span_with(RpcSpan)
            .on_request(())
            .on_response(RpcEnd)
            .on_body_chunk(())
            .on_eos(RpcEnd)
            .on_failure(())
            .layer(guarded);
        Measured { inner: traced }
    }
}

/// Counts and times every call by its response's head: an error's code is there; a call that
/// answers with a body counts as OK (a stream's later end is not counted again).
#[derive(Debug, Clone)]
pub struct Measured<S> {
    inner: S,
}

impl<S, B, ResBody> Service<Request<B>> for Measured<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let method = metrics().method(request.uri().path());
        let started = std::time::Instant::now();
        let call = self.inner.call(request);
        Box::pin(async move {
            let outcome = call.await;
            let code = match &outcome {
                Ok(response) => grpc_code(response.headers()).unwrap_or(Code::Ok),
                Err(_) => Code::Unknown,
            };
            metrics().rpc_answered(method, code, started.elapsed().as_secs_f64());
            outcome
        })
    }
}

/// Opens the `rpc` span of a call.
#[derive(Debug, Clone, Copy, Default)]
pub struct RpcSpan;

impl<B> MakeSpan<B> for RpcSpan {
    fn make_span(&mut self, request: &Request<B>) -> Span {
        let (service, method) = split_path(request.uri().path());
        // At WARN, so that a call's warnings and errors name it even when only warnings are logged.
        tracing::warn_span!("rpc", service, method, caller = Empty, code = Empty, latency_ms = Empty)
    }
}

/// Records how a call ended: when its response carries the status at once (an error, which has no
/// body), or else when its body ends with the status in the trailers.
#[derive(Debug, Clone, Copy, Default)]
pub struct RpcEnd;

impl<B> OnResponse<B> for RpcEnd {
    fn on_response(self, response: &Response<B>, latency: Duration, span: &Span) {
        span.record("latency_ms", millis(latency));
        if let Some(code) = grpc_code(response.headers()) {
            ended(span, code, None);
        }
    }
}

impl OnEos for RpcEnd {
    fn on_eos(self, trailers: Option<&HeaderMap>, stream_duration: Duration, span: &Span) {
        // A body that ends without a status was cut short: the client sees it as unknown.
        let code = trailers.and_then(grpc_code).unwrap_or(Code::Unknown);
        ended(span, code, Some(stream_duration));
    }
}

fn grpc_code(headers: &HeaderMap) -> Option<Code> {
    headers.get("grpc-status").map(|v| Code::from_bytes(v.as_bytes()))
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One event per call, at a level by whose side the failure is on. `latency_ms` (to the response
/// headers, the whole call for a unary one) is on the span; `body_ms` is the time the body took.
fn ended(span: &Span, code: Code, body: Option<Duration>) {
    span.record("code", tracing::field::debug(code));
    let body_ms = body.map(millis);
    match code {
        Code::Unknown
        | Code::DeadlineExceeded
        | Code::Unimplemented
        | Code::Internal
        | Code::Unavailable
        | Code::DataLoss => tracing::warn!(?code, body_ms, "rpc failed"),
        Code::ResourceExhausted => tracing::info!(?code, body_ms, "rpc refused"),
        _ => tracing::debug!(?code, body_ms, "rpc ended"),
    }
}

/// Turns a handler's panic into INTERNAL, logging what the panic said (the caller is not told).
#[derive(Debug, Clone, Copy, Default)]
pub struct PanicToStatus;

impl ResponseForPanic for PanicToStatus {
    type ResponseBody = tonic::body::Body;

    fn response_for_panic(&mut self, err: Box<dyn Any + Send + 'static>) -> Response<Self::ResponseBody> {
        let what = err
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| err.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        tracing::error!(panic = what, "rpc handler panicked; answered INTERNAL");
        panicked().into_http()
    }
}

/// The status of a call whose handler panicked.
pub fn panicked() -> Status {
    Status::internal(
        "internal error: the server failed while handling this call and logged it; retry, and tell the operator if it keeps happening",
    )
}

/// The status of a call refused because `limit` calls are in flight.
pub fn overloaded(limit: usize) -> Status {
    let mut status = Status::resource_exhausted(format!(
        "the server is at its limit of {limit} calls in flight and refused this one: retry after a short backoff"
    ));
    advise_retry(&mut status);
    status
}

/// The status of a waiting call refused because `limit` calls wait already.
pub fn too_many_waiting(limit: usize) -> Status {
    let mut status = Status::resource_exhausted(format!(
        "the server is at its limit of {limit} waiting calls and refused this one: retry after a short backoff"
    ));
    advise_retry(&mut status);
    status
}

/// Tells a refused caller when to retry (`grpc-retry-pushback-ms`), which the bridge passes on.
pub fn advise_retry(status: &mut Status) {
    status.metadata_mut().insert("grpc-retry-pushback-ms", MetadataValue::from_static(RETRY_PUSHBACK_MS));
}

/// Tells a refused caller to retry after `wait` (at least a millisecond).
pub fn advise_retry_after(status: &mut Status, wait: Duration) {
    let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
    status.metadata_mut().insert("grpc-retry-pushback-ms", MetadataValue::from(ms));
}

/// The status of a call stopped after `budget`.
pub fn ran_too_long(path: &str, budget: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "{} took longer than the server allows ({} s) and was stopped: retry it, and tell the operator if it keeps happening",
        path.trim_start_matches('/'),
        budget.as_secs_f64()
    ))
}

/// The global concurrency limit and the time budgets. Refusals and timeouts are answered here as
/// gRPC statuses, never as transport errors (which would reset the connection).
#[derive(Debug, Clone)]
pub struct Admission<S> {
    /// For health and reflection, which bypass the limit.
    inner: S,
    /// Shares one semaphore among all clones: tonic clones the service for every call.
    limited: LoadShed<ConcurrencyLimit<S>>,
    /// The same for calls that wait, with a semaphore of their own.
    waiting: LoadShed<ConcurrencyLimit<S>>,
    limits: RpcLimits,
}

impl<S: Clone> Admission<S> {
    pub fn new(inner: S, limits: RpcLimits) -> Self {
        let limited = LoadShed::new(ConcurrencyLimit::new(inner.clone(), limits.max_concurrent.max(1)));
        let waiting = LoadShed::new(ConcurrencyLimit::new(inner.clone(), limits.max_waiting.max(1)));
        Self { inner, limited, waiting, limits }
    }
}

impl<S, B, ResBody> Service<Request<B>> for Admission<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    /// Always ready: whether a call may run is decided per call, by its path, in `call`.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let path = request.uri().path().to_owned();
        let kind = Kind::of(&path);
        if kind == Kind::Infrastructure {
            let inner = self.inner.clone();
            return Box::pin(async move { inner.oneshot(request).await.map_err(Into::into) });
        }
        let waits = matches!(kind, Kind::LongPoll | Kind::ServerTimed);
        let limited = if waits { self.waiting.clone() } else { self.limited.clone() };
        let limits = self.limits;
        Box::pin(async move {
            let call = limited.oneshot(request);
            let outcome = match kind.budget(limits.timeout) {
                None => call.await,
                Some(budget) => match tokio::time::timeout(budget, call).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        // Dropping the handler's future rolls back whatever it had not committed.
                        tracing::warn!(budget_s = budget.as_secs_f64(), "rpc ran past its time budget; stopped");
                        return Ok(ran_too_long(&path, budget).into_http());
                    }
                },
            };
            match outcome {
                Err(e) if e.is::<Overloaded>() => {
                    metrics().shed(Shed::calls);
                    let refusal =
                        if waits { too_many_waiting(limits.max_waiting) } else { overloaded(limits.max_concurrent) };
                    Ok(refusal.into_http())
                }
                other => other,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;

    use tokio::sync::Notify;

    use super::*;

    type Body = tonic::body::Body;

    fn request(path: &str) -> Request<Body> {
        Request::builder().uri(format!("http://relay{path}")).body(Body::default()).unwrap()
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

    fn limits(timeout: Duration, max_concurrent: usize) -> RpcLimits {
        RpcLimits { timeout, max_concurrent, max_waiting: max_concurrent }
    }

    #[test]
    fn methods_are_classified_by_path() {
        assert_eq!(Kind::of("/grpc.health.v1.Health/Check"), Kind::Infrastructure);
        assert_eq!(Kind::of("/grpc.health.v1.Health/Watch"), Kind::Infrastructure);
        assert_eq!(Kind::of("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"), Kind::Infrastructure);
        assert_eq!(Kind::of("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"), Kind::Infrastructure);
        assert_eq!(Kind::of("/relay.v1.Relay/Subscribe"), Kind::Stream);
        assert_eq!(Kind::of("/relay.v1.Relay/Announce"), Kind::Stream);
        assert_eq!(Kind::of("/relay.v1.Relay/Inbox"), Kind::LongPoll);
        assert_eq!(Kind::of("/relay.v1.Relay/AskWait"), Kind::LongPoll);
        assert_eq!(Kind::of("/relay.v1.Human/Inbox"), Kind::LongPoll);
        assert_eq!(Kind::of("/relay.v1.Relay/RequestPermission"), Kind::ServerTimed);
        assert_eq!(Kind::of("/relay.v1.Relay/Send"), Kind::Ordinary);
        assert_eq!(Kind::of("/relay.v1.Worker/Claim"), Kind::Ordinary);
        assert_eq!(Kind::of("/nonsense"), Kind::Ordinary);
        // The names match what the generated servers route on.
        assert_eq!(relay_proto::v1::relay_server::SERVICE_NAME, "relay.v1.Relay");
        assert_eq!(relay_proto::v1::human_server::SERVICE_NAME, "relay.v1.Human");
        assert_eq!(tonic_health::pb::health_server::SERVICE_NAME, "grpc.health.v1.Health");
        assert_eq!(
            tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
            "grpc.reflection.v1.ServerReflection"
        );
    }

    #[test]
    fn budgets_never_cut_a_wait_the_request_may_ask_for() {
        let ordinary = Duration::from_secs(30);
        assert_eq!(Kind::Ordinary.budget(ordinary), Some(ordinary));
        assert_eq!(Kind::LongPoll.budget(ordinary), Some(Duration::from_secs(u64::from(MAX_WAIT_S) + 30)));
        assert!(Kind::LongPoll.budget(Duration::from_secs(1)).unwrap() > Duration::from_secs(u64::from(MAX_WAIT_S)));
        for kind in [Kind::Stream, Kind::ServerTimed, Kind::Infrastructure] {
            assert_eq!(kind.budget(ordinary), None, "{kind:?}");
        }
    }

    /// Panics on `/Boom`, answers anything else.
    fn panicky()
    -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone + Send {
        tower::service_fn(|req: Request<Body>| async move {
            if req.uri().path().ends_with("/Boom") {
                panic!("handler bug");
            }
            Ok::<_, Infallible>(ok())
        })
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_internal_and_the_service_keeps_serving() {
        let service = RpcLayers::new(RpcLimits::default()).layer(panicky());

        let boom = service.clone().oneshot(request("/relay.v1.Relay/Boom")).await.unwrap();
        assert_eq!(status_of(&boom), Code::Internal);
        assert_eq!(message_of(&boom), panicked().message());
        assert_eq!(boom.headers()["content-type"], "application/grpc");
        let fine = service.clone().oneshot(request("/relay.v1.Relay/WhoAmI")).await.unwrap();
        assert_eq!(status_of(&fine), Code::Ok);

        // The panicked call gave its slot back: with a limit of one, the next call still runs.
        let single = RpcLayers::new(limits(DEFAULT_RPC_TIMEOUT, 1)).layer(panicky());
        assert_eq!(status_of(&single.clone().oneshot(request("/relay.v1.Relay/Boom")).await.unwrap()), Code::Internal);
        assert_eq!(status_of(&single.oneshot(request("/relay.v1.Relay/Send")).await.unwrap()), Code::Ok);
    }

    // The clock is paused and jumps ahead whenever every task waits, so the real defaults are tested
    // without the test taking minutes.
    #[tokio::test(start_paused = true)]
    async fn a_stuck_ordinary_call_is_stopped_but_a_long_poll_is_not() {
        // Send is stuck for good; Inbox waits as long as a request may ask, then answers.
        let handler = tower::service_fn(|req: Request<Body>| async move {
            match req.uri().path() {
                "/relay.v1.Relay/Send" => std::future::pending::<()>().await,
                _ => tokio::time::sleep(Duration::from_secs(u64::from(MAX_WAIT_S))).await,
            }
            Ok::<_, Infallible>(ok())
        });
        let service = Admission::new(handler, RpcLimits::default());

        let started = tokio::time::Instant::now();
        let stuck = service.clone().oneshot(request("/relay.v1.Relay/Send")).await.unwrap();
        assert_eq!(status_of(&stuck), Code::DeadlineExceeded);
        assert_eq!(started.elapsed(), DEFAULT_RPC_TIMEOUT);
        assert!(
            message_of(&stuck).starts_with("relay.v1.Relay/Send took longer than the server allows (30 s)"),
            "{}",
            message_of(&stuck)
        );

        let started = tokio::time::Instant::now();
        let waited = service.clone().oneshot(request("/relay.v1.Relay/Inbox")).await.unwrap();
        assert_eq!(status_of(&waited), Code::Ok, "a long poll is not cut while it waits");
        assert_eq!(started.elapsed(), Duration::from_secs(u64::from(MAX_WAIT_S)));

        // A stream's setup is not timed either: its body lives as long as the client wants.
        let started = tokio::time::Instant::now();
        let stream = service.oneshot(request("/relay.v1.Relay/Subscribe")).await.unwrap();
        assert_eq!(status_of(&stream), Code::Ok);
        assert!(started.elapsed() > DEFAULT_RPC_TIMEOUT);
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
                    Ok::<_, Infallible>(ok())
                }
            })
        };
        (entered, release, handler)
    }

    #[tokio::test]
    async fn beyond_the_limit_calls_are_refused_at_once_but_health_still_answers() {
        let (entered, release, handler) = gated("/relay.v1.Relay/Send");
        let service = Admission::new(handler, limits(DEFAULT_RPC_TIMEOUT, 1));

        let held = tokio::spawn(service.clone().oneshot(request("/relay.v1.Relay/Send")));
        entered.notified().await;
        let refused = service.clone().oneshot(request("/relay.v1.Relay/WhoAmI")).await.unwrap();
        assert_eq!(status_of(&refused), Code::ResourceExhausted);
        assert_eq!(
            message_of(&refused),
            "the server is at its limit of 1 calls in flight and refused this one: retry after a short backoff"
        );
        assert_eq!(refused.headers()["grpc-retry-pushback-ms"], RETRY_PUSHBACK_MS);

        let health = service.clone().oneshot(request("/grpc.health.v1.Health/Check")).await.unwrap();
        assert_eq!(status_of(&health), Code::Ok, "health bypasses the limit");

        release.notify_one();
        assert_eq!(status_of(&held.await.unwrap().unwrap()), Code::Ok);
        let after = service.oneshot(request("/relay.v1.Relay/WhoAmI")).await.unwrap();
        assert_eq!(status_of(&after), Code::Ok, "the slot is free again");
    }

    #[tokio::test]
    async fn waiting_calls_have_their_own_limit_and_never_take_ordinary_places() {
        let (entered, release, handler) = gated("/relay.v1.Relay/Inbox");
        let service = Admission::new(handler, limits(DEFAULT_RPC_TIMEOUT, 1));

        let waiting = tokio::spawn(service.clone().oneshot(request("/relay.v1.Relay/Inbox")));
        entered.notified().await;
        let ordinary = service.clone().oneshot(request("/relay.v1.Relay/WhoAmI")).await.unwrap();
        assert_eq!(status_of(&ordinary), Code::Ok, "a waiting call holds no ordinary place");
        let second = service.clone().oneshot(request("/relay.v1.Relay/AskWait")).await.unwrap();
        assert_eq!(status_of(&second), Code::ResourceExhausted);
        assert_eq!(
            message_of(&second),
            "the server is at its limit of 1 waiting calls and refused this one: retry after a short backoff"
        );
        release.notify_one();
        assert_eq!(status_of(&waiting.await.unwrap().unwrap()), Code::Ok);
    }
}
