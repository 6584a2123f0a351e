//! Who may hold a connection. At most `max` at once per replica. A connection must start talking
//! (the HTTP/2 preface, or a TLS hello) within [`PREFACE`], and finish its TLS handshake within as
//! long again, or it is closed. So nobody can exhaust the server's file descriptors, or the
//! database's, by holding sockets open without speaking. A refused or silent connection costs one
//! accept and one close. TLS is done here, with the certificate of `protocol::tls`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::metrics::{Shed, metrics};

/// How long a new connection may stay silent before it is closed.
pub const PREFACE: Duration = Duration::from_secs(5);
/// Connections per replica by default; each holds a file descriptor.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Refusals are logged at most this often, so a flood does not flood the log too.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// An accepted connection that spoke in time, holding its place among the `max`.
pub struct Admitted {
    stream: Stream,
    _place: Place,
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A place among the `max`, counted in the `relay_connections` gauge while held.
struct Place(#[allow(dead_code)] OwnedSemaphorePermit);

impl Place {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        metrics().connections.inc();
        Self(permit)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        metrics().connections.dec();
    }
}

/// The connections the server serves, from `listener`. The accepting runs in a task of its own and
/// ends when the server stops taking connections.
pub fn admit(
    listener: TcpListener,
    max: usize,
    tls: Option<TlsAcceptor>,
) -> impl tokio_stream::Stream<Item = io::Result<Admitted>> {
    let (tx, rx) = mpsc::channel(64);
    let places = Arc::new(Semaphore::new(max));
    tokio::spawn(async move {
        let mut warned: Option<Instant> = None;
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors, most likely: wait for some to close rather than spin.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            let Ok(place) = places.clone().try_acquire_owned() else {
                metrics().shed(Shed::connections);
                if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    warned = Some(Instant::now());
                    tracing::warn!(%peer, max, "connection refused: the replica holds as many as it takes");
                }
                continue;
            };
            // A batched answer must not wait out delayed ACKs.
            let _ = stream.set_nodelay(true);
            let (tx, tls) = (tx.clone(), tls.clone());
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                match tokio::time::timeout(PREFACE, stream.peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    _ => {
                        tracing::debug!(%peer, "connection closed: nothing said within the preface time");
                        return;
                    }
                }
                let stream = match tls {
                    None => Stream::Plain(stream),
                    Some(tls) => match tokio::time::timeout(PREFACE, tls.accept(stream)).await {
                        Ok(Ok(stream)) => Stream::Tls(Box::new(stream)),
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "connection closed: tls handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "connection closed: tls handshake too slow");
                            return;
                        }
                    },
                };
                let _ = tx.send(Ok(Admitted { stream, _place: Place::new(place) })).await;
            });
        }
    });
    ReceiverStream::new(rx)
}

impl Connected for Admitted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match &self.stream {
            Stream::Plain(s) => s.connect_info(),
            Stream::Tls(s) => s.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Admitted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}
