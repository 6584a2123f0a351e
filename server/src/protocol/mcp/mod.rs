//! Relay as a remote MCP server, for agents that cannot run a bridge (hosted sandboxes, cloud IDEs,
//! scheduled routines, CI jobs): the relay tools over Streamable HTTP at `/mcp`, on a listener of
//! its own (`--mcp-listen`), with TLS when the server has a certificate.
//!
//! The transport is the official SDK's (`rmcp`): the stateless 2026-07-28 revision, and the 2025
//! revisions with their `initialize` handshake and sessions, negotiated as the specification says.
//! Each request presents a machine token (`Authorization: Bearer`) and may name its handle
//! (`Relay-Handle`); a request without a valid token is answered 401 with where to read what the
//! endpoint asks for (`/.well-known/oauth-protected-resource`). The tools are `relay-agent`'s, run
//! as the bridge runs them, through this replica's own gRPC service (see [`agents`]).

mod agents;
mod handler;
mod origins;
mod resume;
mod sessions;
mod stream;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::SessionState;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::agents::{Agents, Remote, Seat};
use self::handler::Handler;
use self::origins::Origins;
use self::resume::Answers;
use self::sessions::Sessions;
use self::stream::Streams;
use super::admission::{AdmissionLayer, Refused};
use super::connections::InProcess;
use super::credential::Credential;
use super::tls::ReloadingCert;
use super::web::{self, Peer};
use crate::app::identity::IdentityService;
use crate::app::remote::RemoteService;
use crate::metrics::metrics;

/// Where `dev` serves the endpoint unless told otherwise.
pub const DEV_MCP_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7450);
/// Where the tools are served.
pub const PATH: &str = "/mcp";
/// Where a client reads what the endpoint asks of it (RFC 9728).
const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// The header naming the handle a request acts as.
const HANDLE_HEADER: &str = "relay-handle";

/// Refuses a plaintext endpoint where other machines reach it: tokens would cross in the clear.
pub fn check(addr: SocketAddr, tls: bool, insecure_plaintext: bool) -> anyhow::Result<()> {
    web::check("mcp endpoint", addr, tls, insecure_plaintext)
}

pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    web::bind("the mcp endpoint", addr).await
}

/// The URL of the endpoint bound at `addr`, for the line a person reads.
pub fn url(addr: SocketAddr, tls: bool) -> String {
    format!("{}{PATH}", web::url(addr, tls))
}

/// Serves `/mcp` on `listener` until `shutdown`.
#[allow(clippy::too_many_arguments)]
pub fn serve(
    listener: TcpListener,
    allowed_origins: &[String],
    identity: IdentityService,
    remote: RemoteService,
    admission: AdmissionLayer,
    in_process: InProcess,
    tls: Option<Arc<ReloadingCert>>,
    shutdown: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let secure = tls.is_some();
    let loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
    let origins = Arc::new(Origins::new(allowed_origins, loopback)?);
    let max_body = remote.max_request_bytes();
    let agents = Arc::new(Agents::new(identity.clone(), in_process));
    let mut config = StreamableHttpServerConfig::default()
        .with_json_response(true)
        .with_cancellation_token(shutdown.child_token())
        .with_max_request_body_bytes(max_body)
        // Browsers send an Origin; agents do not. The SDK holds its own requests to the same list
        // the endpoint checks every request against (`check_origin`).
        .with_allowed_origins(origins.entries())
        .enforce_origin_validation();
    // Sessions of the 2025 revisions outlive this replica: another takes them up.
    config.session_store = Some(Arc::new(Sessions(remote.clone())));
    if !loopback {
        // The Host check guards servers on a person's own machine against DNS rebinding; a
        // server others reach is named by whatever host its operator gives it, and every request
        // must carry a machine token anyway.
        config = config.disable_allowed_hosts();
    }
    let handler = Handler::new(agents.clone());
    let service =
        StreamableHttpService::new(move || Ok(handler.clone()), Arc::new(LocalSessionManager::default()), config);
    let ending = Ending { service: service.clone(), agents: agents.clone(), remote: remote.clone() };
    let answers = Answers::start(remote.clone());
    let streams =
        Streams { agents, remote, answers: answers.clone(), shutdown: shutdown.clone(), open: Arc::default() };
    // An answer that streams gets ids of this endpoint's own, and is kept if its client leaves.
    let posts = tower::Layer::layer(&middleware::from_fn_with_state(answers, resume::resumable), service);
    let auth = Auth { identity, admission, secure };
    // POST is the SDK's, its answer streams made resumable; GET is ours: a session's stream, fed
    // by the agent's push stream, or an answer resumed; DELETE is the SDK's, then ends the agent's
    // relay session too.
    let mcp = get(stream::open)
        .with_state(streams)
        .post_service(posts)
        .merge(axum::routing::delete(end_session).with_state(ending));
    let router = Router::new()
        .route(PATH, mcp)
        .layer(middleware::from_fn_with_state(auth.clone(), authenticate))
        .layer(middleware::from_fn_with_state(origins, check_origin))
        .layer(middleware::from_fn(count))
        .route(METADATA_PATH, get(metadata))
        .route(&format!("{METADATA_PATH}{PATH}"), get(metadata))
        .with_state(auth);
    web::serve("the mcp endpoint", listener, router, tls, shutdown)
}

#[derive(Clone)]
struct Auth {
    identity: IdentityService,
    /// The budgets and rates gRPC calls meet, shared.
    admission: AdmissionLayer,
    secure: bool,
}

impl Auth {
    /// The base URL a client reached this endpoint by.
    fn base(&self, headers: &HeaderMap) -> String {
        let scheme = if self.secure { "https" } else { "http" };
        // Echoed into a header and a document: only what a host name and port may hold.
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)))
            .unwrap_or("localhost");
        format!("{scheme}://{host}")
    }
}

/// The protected-resource metadata: what the endpoint is and how a token is presented. Tokens are
/// issued by the operator (`relay-server admin machine add`), not by an authorization server.
async fn metadata(State(auth): State<Auth>, headers: HeaderMap) -> Response {
    let base = auth.base(&headers);
    let body = json!({
        "resource": format!("{base}{PATH}"),
        "resource_name": "Relay",
        "bearer_methods_supported": ["header"],
    });
    let mut response = json_response(StatusCode::OK, &body);
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=3600"));
    response
}

/// Admits requests to `/mcp` that present a live machine token, noting who they are from. They
/// meet the budgets a gRPC call meets, shared with gRPC: failed authentications per address, calls
/// being authenticated per address, calls in flight per credential (until the answer begins), call
/// rates per credential and account. A wait or stream the tools then open is counted where gRPC
/// counts them, among the streams and waiting calls of the agent's session and its account.
async fn authenticate(State(auth): State<Auth>, mut request: Request, next: Next) -> Response {
    let ip = request.extensions().get::<ConnectInfo<Peer>>().map(|ConnectInfo(Peer(peer))| peer.ip());
    let arrival = match auth.admission.arrive(ip, request.headers().get(header::AUTHORIZATION)) {
        Ok(arrival) => arrival,
        Err(refused) => return too_many(&refused),
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let base = auth.base(request.headers());
    let Some(token) = presented.map(str::to_owned) else {
        return unauthorized(&base, None);
    };
    let machine = match auth.identity.machine(&token).await {
        Ok(machine) => machine,
        Err(crate::domain::Error::Unauthenticated(why)) => {
            arrival.refused();
            return unauthorized(&base, Some(&why));
        }
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    arrival.accepted();
    let _in_flight = match auth.admission.admit_credential(&Credential::Machine(machine.clone()), PATH) {
        Ok(place) => place,
        Err(refused) => return too_many(&refused),
    };
    let handle = match request.headers().get(HANDLE_HEADER).map(HeaderValue::to_str) {
        None => None,
        Some(Ok(handle)) if !handle.trim().is_empty() => Some(handle.trim().to_owned()),
        Some(_) => return (StatusCode::BAD_REQUEST, "Relay-Handle must name a handle").into_response(),
    };
    let remote = Remote { machine, machine_token: token.into(), handle };
    request.extensions_mut().insert(remote);
    next.run(request).await
}

/// What ending a session needs: the SDK's service, and the agents it served.
#[derive(Clone)]
struct Ending {
    service: StreamableHttpService<Handler, LocalSessionManager>,
    agents: Arc<Agents>,
    remote: RemoteService,
}

/// `DELETE /mcp`: the client ends its session. The SDK ends the MCP session; the agent's relay
/// session ends with it (offline at once, its handle free), and the answer is 204, as the clients
/// of the SDKs expect.
async fn end_session(State(ending): State<Ending>, request: Request) -> Response {
    let remote = request.extensions().get::<Remote>().cloned();
    let session = request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    // Read before the SDK forgets it: the client's name says which agent the session picked.
    let client = match &session {
        Some(id) => ending.remote.session(id).await.ok().flatten().and_then(|state| {
            let state = serde_json::from_str::<SessionState>(&state).ok()?;
            Some(state.initialize_params.client_info.name)
        }),
        None => None,
    };
    let response = match tower::ServiceExt::oneshot(ending.service, request).await {
        Ok(response) => response.into_response(),
        Err(never) => match never {},
    };
    if !response.status().is_success() {
        return response;
    }
    if let (Some(remote), Some(session)) = (remote, session.as_deref()) {
        let harness = agents::harness_of(client.as_deref().unwrap_or_default());
        ending.agents.end(&remote, &Seat { harness, mcp_session: Some(session) }).await;
    }
    StatusCode::NO_CONTENT.into_response()
}

/// Refuses a request from a browser page whose Origin the endpoint does not take (403), before
/// anything else: a page elsewhere may not use a person's credentials here, nor a rebound name reach
/// a server on their machine. Requests without an Origin (agents) pass.
async fn check_origin(State(origins): State<Arc<Origins>>, request: Request, next: Next) -> Response {
    match request.headers().get(header::ORIGIN) {
        Some(origin) if !origin.to_str().is_ok_and(|o| origins.allows(o)) => {
            let said = "this page's Origin may not call the relay's MCP endpoint (an operator allows Origins with --mcp-allowed-origins)";
            json_response(StatusCode::FORBIDDEN, &json!({ "error": said }))
        }
        _ => next.run(request).await,
    }
}

/// Counts each request to `/mcp` by its method and status.
async fn count(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let response = next.run(request).await;
    metrics().mcp_answered(&method, response.status().as_u16());
    response
}

/// 429 with what was full and, when known, when to retry.
fn too_many(refused: &Refused) -> Response {
    let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, &json!({ "error": refused.message }));
    if let Some(wait) = refused.retry_after
        && let Ok(value) = HeaderValue::from_str(&crate::domain::rate::whole_seconds(wait).to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// 401 with the challenge and where the metadata is; `refused` says why a token presented was not
/// taken (a request with none gets no error code, as RFC 6750 asks).
fn unauthorized(base: &str, refused: Option<&str>) -> Response {
    let mut challenge = format!("Bearer resource_metadata=\"{base}{METADATA_PATH}\"");
    if let Some(why) = refused {
        let why = why.replace(['"', '\\'], "'");
        challenge.push_str(&format!(", error=\"invalid_token\", error_description=\"{why}\""));
    }
    let said = refused.unwrap_or("no machine token: send Authorization: Bearer <machine token>");
    let mut response = json_response(StatusCode::UNAUTHORIZED, &json!({ "error": said }));
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}
