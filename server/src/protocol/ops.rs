//! The ops port: plaintext HTTP for the platform around the server, never for clients.
//!
//! * `/healthz`: the process answers (a liveness probe restarts it when it does not);
//! * `/readyz`: 200 only while the database hands out a connection that answers and the
//!   notification connection listens, and not once shutdown began; 503 with the reason otherwise;
//! * `/metrics`: the figures of [`crate::metrics`], in the OpenMetrics text format.
//!
//! It serves nothing an agent or a person sends, so it is neither authenticated nor rate-limited;
//! bind it to loopback or a network only the platform reaches.

use std::net::SocketAddr;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::app::observe::OpsService;
use crate::metrics::metrics;

/// What Prometheus asks for and prometheus-client writes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where `dev` serves the ops endpoints unless told otherwise.
pub const DEV_OPS_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7448);

/// Binds the ops port. Apart from serving, so that a taken port is reported before anything starts.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("cannot listen for ops on {addr}"))
}

/// Serves the ops endpoints on `listener` until `shutdown`; `/readyz` answers 503 from its start.
pub fn serve(listener: TcpListener, ops: OpsService, shutdown: CancellationToken) -> JoinHandle<()> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(ops);
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the ops endpoints stopped");
        }
    })
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(ops): State<OpsService>) -> Response {
    match ops.not_ready().await {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")).into_response(),
    }
}

async fn metrics_text(State(ops): State<OpsService>) -> Response {
    ops.refresh_metrics().await;
    ([(header::CONTENT_TYPE, OPENMETRICS)], metrics().encode()).into_response()
}

/// The URL of the ops endpoints bound at `addr`, for the line a person reads.
pub fn url(addr: SocketAddr) -> String {
    let host = if addr.ip().is_unspecified() { "127.0.0.1".to_owned() } else { addr.ip().to_string() };
    if addr.is_ipv6() && !addr.ip().is_unspecified() {
        format!("http://[{host}]:{}", addr.port())
    } else {
        format!("http://{host}:{}", addr.port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_reachable_host() {
        assert_eq!(url("0.0.0.0:7448".parse().unwrap()), "http://127.0.0.1:7448");
        assert_eq!(url("127.0.0.1:9".parse().unwrap()), "http://127.0.0.1:9");
        assert_eq!(url("[::1]:9".parse().unwrap()), "http://[::1]:9");
    }
}
