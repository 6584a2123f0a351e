//! Serving an HTTP/1.1 router on a listener of its own, with TLS when the server has a certificate
//! (the same certificate, reloaded with it): the web console and the MCP endpoint. Each request
//! knows its client's address ([`Peer`]). A hostile client cannot hold the listener: a slow TLS
//! handshake holds up nobody else, one address holds at most its share of connections, a request's
//! head must arrive in time, and a connection silent for longer than any answer may take is
//! closed. Open connections get [`DRAIN_LIMIT`] once the server stops.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, bail};
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::tls::ReloadingCert;
use crate::metrics::{Shed, metrics};

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
/// Each request carries its client's address (`ConnectInfo<Peer>`).
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
        let held = Arc::new(Held::default());
        match acceptor {
            None => loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = stop.cancelled() => return,
                };
                match accepted {
                    Ok((stream, peer)) => {
                        // An event stream's events are small writes: none may wait out a delayed ACK.
                        let _ = stream.set_nodelay(true);
                        connection(what, stream, peer, &router, &held, &stop);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            },
            Some(acceptor) => {
                let mut listener = TlsListener::start(listener, acceptor, stop.clone());
                loop {
                    let (stream, peer) = tokio::select! {
                        accepted = listener.ready.recv() => match accepted {
                            Some(accepted) => accepted,
                            None => return,
                        },
                        () = stop.cancelled() => return,
                    };
                    connection(what, stream, peer, &router, &held, &stop);
                }
            }
        }
    });
    Ok(drain(task, shutdown))
}

/// Connections held at once by one listener.
const MAX_CONNECTIONS: usize = 4096;
/// Of them, connections of one address.
const MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// How long a request's head may take to arrive, and an idle kept-alive connection may wait for
/// the next one.
const HEADER_TIME: Duration = Duration::from_secs(10);
/// How long a connection may carry no byte either way: longer than the longest wait a request
/// may make (300 s) while its answer has nothing to say; event streams say something every 15 s.
const SILENT_TIME: Duration = Duration::from_secs(330);

/// The connections a listener holds, by address.
#[derive(Default)]
struct Held {
    by_address: std::sync::Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place among those held; given back when dropped.
struct Place {
    held: Arc<Held>,
    ip: IpAddr,
}

impl Held {
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<Place> {
        let mut by_address = self.by_address.lock().expect("connections lock poisoned");
        let total: usize = by_address.values().sum();
        let of_address = by_address.entry(ip).or_insert(0);
        if total >= MAX_CONNECTIONS || *of_address >= MAX_CONNECTIONS_PER_ADDRESS {
            return None;
        }
        *of_address += 1;
        Some(Place { held: self.clone(), ip })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut by_address = self.held.by_address.lock().expect("connections lock poisoned");
        if let Some(count) = by_address.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                by_address.remove(&self.ip);
            }
        }
    }
}

/// Serves one connection in a task of its own, within its address's share, its heads on time
/// and never silent for long; on shutdown it finishes the request in hand and closes.
fn connection<S>(
    what: &'static str,
    stream: S,
    peer: SocketAddr,
    router: &axum::Router,
    held: &Arc<Held>,
    stop: &CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Some(place) = held.take(peer.ip()) else {
        metrics().shed(Shed::connections);
        tracing::debug!(%peer, "{what}: connection refused, its address holds its share");
        return;
    };
    let service = router.clone().map_request(move |request: http::Request<hyper::body::Incoming>| {
        let mut request = request.map(axum::body::Body::new);
        request.extensions_mut().insert(ConnectInfo(Peer(peer)));
        request
    });
    let stop = stop.clone();
    tokio::spawn(async move {
        let _place = place;
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIME);
        let builder = builder.http1_only();
        // A new connection must start its first request as soon as a head must arrive.
        let io = TokioIo::new(Silent::new(stream, HEADER_TIME, SILENT_TIME));
        let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(service));
        tokio::pin!(conn);
        let served = tokio::select! {
            served = conn.as_mut() => served,
            () = stop.cancelled() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = served {
            tracing::debug!(%peer, error = %e, "{what}: connection ended");
        }
    });
}

/// A stream that fails once nothing has crossed it either way for its time (`first` until the
/// first byte crosses).
struct Silent<S> {
    inner: S,
    limit: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl<S> Silent<S> {
    fn new(inner: S, first: Duration, limit: Duration) -> Self {
        Self { inner, limit, deadline: Box::pin(tokio::time::sleep(first)) }
    }

    fn heard(&mut self) {
        self.deadline.as_mut().reset(tokio::time::Instant::now() + self.limit);
    }

    fn silent_too_long(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn too_silent() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "nothing crossed the connection for too long")
}

impl<S: AsyncRead + Unpin> AsyncRead for Silent<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.heard();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.silent_too_long(cx) => Poll::Ready(Err(too_silent())),
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Silent<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.heard();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.silent_too_long(cx) => Poll::Ready(Err(too_silent())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
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

/// Connections whose TLS handshake finished, in the order they finished. Handshakes run in tasks
/// of their own, so one slow client holds up nobody else.
struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    fn start(listener: TcpListener, acceptor: TlsAcceptor, shutdown: CancellationToken) -> Self {
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
                let _ = stream.set_nodelay(true);
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
        Self { ready }
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

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_closed_once_silent_for_its_time_and_not_before() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(64);
        let mut silent = Silent::new(server, HEADER_TIME, SILENT_TIME);
        let mut buf = [0u8; 8];
        // Bytes within the first deadline, then a long quiet that is still within the next.
        tokio::time::sleep(HEADER_TIME - Duration::from_secs(1)).await;
        client.write_all(b"GET").await.unwrap();
        assert_eq!(silent.read(&mut buf).await.unwrap(), 3);
        let read = tokio::time::timeout(SILENT_TIME - Duration::from_secs(1), silent.read(&mut buf)).await;
        assert!(read.is_err(), "still open just before its time: {read:?}");
        let closed = silent.read(&mut buf).await.unwrap_err();
        assert_eq!(closed.kind(), std::io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_must_speak_within_the_head_time() {
        use tokio::io::AsyncReadExt;
        let (_client, server) = tokio::io::duplex(64);
        let mut silent = Silent::new(server, HEADER_TIME, SILENT_TIME);
        let started = tokio::time::Instant::now();
        let closed = silent.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!((closed.kind(), started.elapsed()), (std::io::ErrorKind::TimedOut, HEADER_TIME));
    }

    #[test]
    fn urls_name_a_reachable_host_and_the_scheme() {
        assert_eq!(url("127.0.0.1:7449".parse().unwrap(), false), "http://127.0.0.1:7449");
        assert_eq!(url("0.0.0.0:7449".parse().unwrap(), true), "https://127.0.0.1:7449");
        assert_eq!(url("[::1]:7449".parse().unwrap(), false), "http://[::1]:7449");
    }
}
