//! What every call goes through, whatever its handler, as tower layers on the tonic server
//! (outermost first):
//!
//! 1. metrics: each call counted by method and code, and timed to its response (`relay_rpcs`,
//!    `relay_rpc_duration_seconds`);
//! 2. a span per call (`rpc`, with service, method, caller, code, latency) and one event when it ends;
//! 3. catch-panic: a handler that panics answers INTERNAL and is logged; the server keeps serving;
//! 4. admission (`admission`), a layer per step, in this order: the address's budget,
//!    authentication, the credential's share, the request message whole and in time, call rates,
//!    the account's and the server's shares, and a time budget per call.
//!
//! Health and reflection pass admission untouched, so readiness probes answer however busy the
//! server is.

use std::any::Any;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{HeaderMap, Request, Response};
use tonic::{Code, Status};
use tower::{Layer, Service};
use tower_http::catch_panic::{CatchPanic, ResponseForPanic};
use tower_http::classify::{GrpcErrorsAsFailures, SharedClassifier};
use tower_http::trace::{MakeSpan, OnEos, OnResponse, Trace, TraceLayer};
use tracing::Span;
use tracing::field::Empty;

use super::admission::{
    Address, AdmissionLayer, Authenticate, Bypass, CredentialShare, Rates, Shares, Stepped, TimeBudget, WholeMessage,
};
use super::calls::split_path;
use crate::metrics::metrics;

/// Records the authenticated caller on the current call's span. Handlers run inside that span, so
/// whatever authenticates a call can name its caller here.
pub fn record_caller(caller: &dyn std::fmt::Display) {
    Span::current().record("caller", tracing::field::display(caller));
}

/// All of the layers, for `Server::builder().layer(RpcLayers::new(admission))`.
#[derive(Clone)]
pub struct RpcLayers {
    admission: AdmissionLayer,
}

impl RpcLayers {
    pub fn new(admission: AdmissionLayer) -> Self {
        Self { admission }
    }
}

/// The trace layer with the spans and events of [`RpcSpan`] and [`RpcEnd`].
pub type RpcTrace<S> = Trace<S, SharedClassifier<GrpcErrorsAsFailures>, RpcSpan, (), RpcEnd, (), RpcEnd, ()>;

/// Admission's steps in front of a service, outermost first; health and reflection go around them.
pub type Admitted<S> = Bypass<
    Stepped<
        Address,
        Stepped<
            Authenticate,
            Stepped<CredentialShare, Stepped<WholeMessage, Stepped<Rates, Stepped<Shares, Stepped<TimeBudget, S>>>>>,
        >,
    >,
    S,
>;

/// `inner` behind admission's steps, in the order the admission module gives.
pub fn admitted<S: Clone>(admission: &AdmissionLayer, inner: S) -> Admitted<S> {
    let steps = tower::ServiceBuilder::new()
        .layer(admission.address())
        .layer(admission.authenticate())
        .layer(admission.credential_share())
        .layer(admission.whole_message())
        .layer(admission.rates())
        .layer(admission.shares())
        .layer(admission.time_budget());
    Bypass { admitted: steps.service(inner.clone()), plain: inner }
}

impl<S: Clone> Layer<S> for RpcLayers {
    type Service = Measured<RpcTrace<CatchPanic<Admitted<S>, PanicToStatus>>>;

    fn layer(&self, inner: S) -> Self::Service {
        let admitted = admitted(&self.admission, inner);
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
        // Refusals are counted (`relay_rpcs`, `relay_shed`) and admission logs them sampled: one
        // line each would let a flooding client fill the log.
        Code::ResourceExhausted => tracing::debug!(?code, body_ms, "rpc refused"),
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
