//! Serving an HTTP/1.1 router on a listener of its own, with TLS when the server has a certificate
//! (the same certificate, reloaded with it): the web console and the MCP endpoint. Each request
//! knows its client's address ([`Peer`]); a slow TLS handshake holds up nobody else; open
//! connections get [`DRAIN_LIMIT`] once the server stops.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::tls::ReloadingCert;

/// How long open requests and streams get to finish once the server stops.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// How long a new connection has to finish its TLS handshake.
const HANDSHAKE_TIME: Duration = Duration::from_secs(10);
/// TLS handshakes under way at once; more connections wait to start theirs.
const HANDSHAKES: usize = 64;

/// Refuses a plaintext listener (`what`) on an address other machines reach, as the gRPC listener
/// does: tokens would cross the network in the clear.
pub fn check(what: &str, addr: SocketAddr, tls: bool, insecure_plaintext: bool) -> anyhow::Result<()> {
    if !tls && !addr.ip().is_loopback() && !insecure_plaintext {
        bail!(
            "refusing a plaintext {what} on non-loopback address {addr}: give --tls-cert and --tls-key, or --insecure-plaintext behind a TLS-terminating proxy"
        );
    }
    Ok(())
}

/// Binds a port for `what`. Apart from serving, so that a taken port is reported before anything
/// starts.
pub async fn bind(what: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("cannot listen for {what} on {addr}"))
}

/// The URL of a listener bound at `addr`, for the line a person reads.
pub fn url(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = match addr.ip() {
        ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("{scheme}://{host}:{}", addr.port())
}

/// Serves `router` (named `what` in logs) on `listener` until `shutdown`, over TLS with `tls`.
pub fn serve(
    what: &'static str,
    listener: TcpListener,
    router: axum::Router,
    tls: Option<Arc<ReloadingCert>>,
    shutdown: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let acceptor = tls.as_ref().map(|cert| cert.acceptor_for(b"http/1.1")).transpose()?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(addr = %addr, tls = acceptor.is_some(), "serving {what}");
    }
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        let stopped = stop.clone().cancelled_owned();
        let service = router.into_make_service_with_connect_info::<Peer>();
        let served = match acceptor {
            None => axum::serve(listener, service).with_graceful_shutdown(stopped).await,
            Some(acceptor) => {
                let listener = TlsListener::start(listener, acceptor, stop);
                axum::serve(listener, service).with_graceful_shutdown(stopped).await
            }
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "{what} stopped");
        }
    });
    Ok(drain(task, shutdown))
}

/// The serving task, given [`DRAIN_LIMIT`] after shutdown before it is ended: a client holding a
/// connection open must not hold the server's stop.
fn drain(task: JoinHandle<()>, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let abort = task.abort_handle();
        tokio::select! {
            _ = task => {}
            () = async { shutdown.cancelled().await; tokio::time::sleep(DRAIN_LIMIT).await } => abort.abort(),
        }
    })
}

/// The address of a request's client.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TcpListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

/// Connections whose TLS handshake finished, handed to axum one at a time. Handshakes run in
/// tasks of their own, so one slow client holds up nobody else.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    fn start(listener: TcpListener, acceptor: TlsAcceptor, shutdown: CancellationToken) -> Self {
        let local = listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (tx, ready) = mpsc::channel(HANDSHAKES);
        let handshakes = Arc::new(Semaphore::new(HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = shutdown.cancelled() => return,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIME, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "tls handshake failed"),
                        Err(_) => tracing::debug!(%peer, "tls handshake too slow"),
                    }
                });
            }
        });
        Self { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accepting stopped (shutdown): wait for the graceful stop to end the server.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_only_on_loopback_unless_asked() {
        let any: SocketAddr = "0.0.0.0:7449".parse().unwrap();
        let refused = check("mcp endpoint", any, false, false).unwrap_err().to_string();
        assert!(refused.starts_with("refusing a plaintext mcp endpoint on non-loopback address"), "{refused}");
        assert!(check("mcp endpoint", "127.0.0.1:1".parse().unwrap(), false, false).is_ok());
    }

    #[test]
    fn urls_name_a_reachable_host_and_the_scheme() {
        assert_eq!(url("127.0.0.1:7449".parse().unwrap(), false), "http://127.0.0.1:7449");
        assert_eq!(url("0.0.0.0:7449".parse().unwrap(), true), "https://127.0.0.1:7449");
        assert_eq!(url("[::1]:7449".parse().unwrap(), false), "http://[::1]:7449");
    }
}
