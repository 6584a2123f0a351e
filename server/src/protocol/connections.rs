//! Who may hold a connection. At most `max` at once per replica, and at most `per_address` not yet
//! authenticated from one address. A connection must finish its setup — its TLS handshake, then the
//! HTTP/2 preface and the header of its first frame — within [`SETUP`] of being accepted, however
//! it spends that time (silent, or dribbling a byte at a time), or it is closed. A new connection
//! whose address holds its share takes the place of that address's oldest connection that has not
//! authenticated a call yet; when every place of the replica is taken, of anyone's oldest such
//! connection (agents authenticate within milliseconds of connecting; a socket that never does is
//! nobody's). It is refused only when every place is held by a connection that authenticated. So
//! nobody can exhaust the server's descriptors, or keep out an agent that works — behind the same
//! address (an office, a CI fleet) or another — by holding sockets open. TLS is done here, with
//! the certificate of `protocol::tls`; a handshake shed for a newcomer stops at once.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use crate::domain::caller::Holder;
use crate::domain::ids::AccountId;
use crate::metrics::{Shed, metrics};

/// How long a new connection has to finish its setup (TLS handshake, HTTP/2 preface).
pub const SETUP: Duration = Duration::from_secs(5);
/// Connections per replica by default; each holds a file descriptor.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Connections of one address that have not authenticated a call yet, by default.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// Connections one account's calls hold, by default: half the replica's, so one account cannot
/// take every place. Each of its agents holds one, and a hook waiting for mail another.
pub const DEFAULT_MAX_CONNECTIONS_PER_ACCOUNT: usize = DEFAULT_MAX_CONNECTIONS / 2;
/// Connections one credential holds, by default: a machine's token opens each of its agents'
/// sessions (up to its 250 endpoints), a session needs one or two.
pub const DEFAULT_MAX_CONNECTIONS_PER_CREDENTIAL: usize = 512;

/// How many connections a replica holds, and whose they may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections held at once.
    pub max: usize,
    /// Of one address, not yet authenticated.
    pub per_address: usize,
    /// Charged to one account (by the first call each authenticates).
    pub per_account: usize,
    /// Charged to one credential.
    pub per_credential: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max: DEFAULT_MAX_CONNECTIONS,
            per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            per_account: DEFAULT_MAX_CONNECTIONS_PER_ACCOUNT,
            per_credential: DEFAULT_MAX_CONNECTIONS_PER_CREDENTIAL,
        }
    }
}

/// A connection whose first authenticated call would take its account or credential past its
/// share; the call is refused and the connection stays nobody's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverShare {
    Account(usize),
    Credential(usize),
}
/// The HTTP/2 client preface (24 bytes) and the header of the SETTINGS frame that must follow it.
const SETUP_BYTES: usize = 24 + 9;
/// Refusals are logged at most this often, so a flood does not flood the log too.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What the calls of a connection know of it (in their extensions): where it comes from, and a way
/// to say it has authenticated a call.
#[derive(Clone)]
pub struct Info {
    pub peer: Option<SocketAddr>,
    state: Arc<Held>,
    registry: Option<Arc<Registry>>,
}

impl Info {
    /// The information of a connection from `peer` that no registry holds.
    #[cfg(test)]
    pub fn for_test(peer: SocketAddr) -> Self {
        let state = Arc::new(Held {
            id: 0,
            ip: Some(peer.ip()),
            opened: Instant::now(),
            authenticated: AtomicBool::new(false),
            owner: Mutex::default(),
            close: CancellationToken::new(),
        });
        Self { peer: Some(peer), state, registry: None }
    }

    /// A call on this connection was authenticated, by `holder` of `account`: the first makes the
    /// connection theirs, charged to their shares, and no longer shed for a newcomer. Refused when
    /// it would take either past its share.
    pub fn authenticated(&self, account: AccountId, holder: &Holder) -> Result<(), OverShare> {
        if self.state.authenticated.load(Ordering::Relaxed) {
            return Ok(());
        }
        let Some(registry) = &self.registry else {
            self.state.authenticated.store(true, Ordering::Relaxed);
            return Ok(());
        };
        let mut owners = registry.owners.lock().expect("connections lock poisoned");
        // Checked again under the lock: two calls of one connection may authenticate at once.
        if self.state.authenticated.load(Ordering::Relaxed) {
            return Ok(());
        }
        let of_account = owners.accounts.get(&account).copied().unwrap_or(0);
        if of_account >= registry.limits.per_account {
            return Err(OverShare::Account(registry.limits.per_account));
        }
        let of_holder = owners.holders.get(holder).copied().unwrap_or(0);
        if of_holder >= registry.limits.per_credential {
            return Err(OverShare::Credential(registry.limits.per_credential));
        }
        *owners.accounts.entry(account).or_insert(0) += 1;
        *owners.holders.entry(holder.clone()).or_insert(0) += 1;
        *self.state.owner.lock().expect("connections lock poisoned") = Some((account, holder.clone()));
        self.state.authenticated.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// One connection the replica holds.
struct Held {
    id: u64,
    ip: Option<IpAddr>,
    opened: Instant,
    authenticated: AtomicBool,
    /// Whom it is charged to, from its first authenticated call.
    owner: Mutex<Option<(AccountId, Holder)>>,
    /// Cancelled to close the connection (shed for a newcomer).
    close: CancellationToken,
}

/// The connections held, for the limits.
struct Registry {
    held: Mutex<HashMap<u64, Arc<Held>>>,
    owners: Mutex<Owners>,
    next: AtomicU64,
    limits: Limits,
}

/// How many connections each account and each credential holds.
#[derive(Default)]
struct Owners {
    accounts: HashMap<AccountId, usize>,
    holders: HashMap<Holder, usize>,
}

/// Takes one from `key`'s count, forgetting it at 0.
fn release<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(count) = counts.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(key);
        }
    }
}

/// Every place is taken by a connection that authenticated: a new one is refused.
struct Full;

impl Registry {
    /// A place for a connection from `ip`. At its address's share of connections that have not
    /// authenticated, it takes the place of that address's oldest one, so a neighbour that holds
    /// sockets open cannot keep an agent behind the same address out; at the replica's cap, the
    /// oldest unauthenticated one of anyone's.
    fn admit(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<Place, Full> {
        let mut held = self.held.lock().expect("connections lock poisoned");
        let unauthenticated = |h: &&Arc<Held>| !h.authenticated.load(Ordering::Relaxed);
        if let Some(ip) = ip {
            let of_address = || held.values().filter(unauthenticated).filter(|h| h.ip == Some(ip));
            if of_address().count() >= self.limits.per_address {
                let oldest = of_address().min_by_key(|h| h.opened).cloned().expect("the address holds some");
                shed_for_newcomer(&mut held, &oldest, Shed::shares);
            }
        }
        if held.len() >= self.limits.max {
            let oldest = held.values().filter(unauthenticated).min_by_key(|h| h.opened).cloned();
            let Some(oldest) = oldest else { return Err(Full) };
            shed_for_newcomer(&mut held, &oldest, Shed::connections);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(Held {
            id,
            ip,
            opened: Instant::now(),
            authenticated: AtomicBool::new(false),
            owner: Mutex::default(),
            close: CancellationToken::new(),
        });
        held.insert(id, state.clone());
        metrics().connections.set(held.len() as i64);
        Ok(Place { registry: self.clone(), state })
    }
}

/// Closes `oldest`, giving its place to a newcomer; counted as `shed` (its address's share, or the
/// replica's).
fn shed_for_newcomer(held: &mut HashMap<u64, Arc<Held>>, oldest: &Held, shed: Shed) {
    held.remove(&oldest.id);
    oldest.close.cancel();
    metrics().shed(shed);
    tracing::debug!(peer = ?oldest.ip, ?shed, "unauthenticated connection closed for a newcomer");
}

/// A connection's place; given back when the connection ends.
struct Place {
    registry: Arc<Registry>,
    state: Arc<Held>,
}

impl Drop for Place {
    fn drop(&mut self) {
        {
            // The shares' lock first, as `Info::authenticated` takes them.
            let mut owners = self.registry.owners.lock().expect("connections lock poisoned");
            let owner = self.state.owner.lock().expect("connections lock poisoned").take();
            if let Some((account, holder)) = owner {
                release(&mut owners.accounts, &account);
                release(&mut owners.holders, &holder);
            }
        }
        let mut held = self.registry.held.lock().expect("connections lock poisoned");
        held.remove(&self.state.id);
        metrics().connections.set(held.len() as i64);
    }
}

/// An accepted connection that finished its TLS handshake in time, holding its place.
pub struct Admitted {
    stream: Stream,
    peer: Option<SocketAddr>,
    place: Place,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Until the preface is read: the deadline, and the bytes read so far.
    setup: Option<(Pin<Box<Sleep>>, usize)>,
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// A caller in this process (the MCP endpoint) over an in-memory pipe.
    Memory(DuplexStream),
}

/// Bytes an in-process connection buffers each way.
const IN_PROCESS_BUFFER: usize = 256 * 1024;

/// Connects callers in this process to the replica's own gRPC service: the MCP endpoint makes its
/// agents' calls through it, so they meet every layer a remote call meets (authentication,
/// admission, rates, time budgets). Each connection holds a place like any other.
#[derive(Clone)]
pub struct InProcess {
    tx: mpsc::Sender<io::Result<Admitted>>,
    registry: Arc<Registry>,
}

impl InProcess {
    /// A new connection to the service, ready for its HTTP/2 preface.
    pub async fn connect(&self) -> io::Result<DuplexStream> {
        let place = self.registry.admit(None).map_err(|_| {
            metrics().shed(Shed::connections);
            io::Error::other("the replica holds as many connections as it takes")
        })?;
        let (client, server) = tokio::io::duplex(IN_PROCESS_BUFFER);
        let closed = Box::pin(place.state.close.clone().cancelled_owned());
        let setup = Some((Box::pin(tokio::time::sleep(SETUP)), 0));
        let admitted = Admitted { stream: Stream::Memory(server), peer: None, place, closed, setup };
        self.tx.send(Ok(admitted)).await.map_err(|_| io::Error::other("the server has stopped"))?;
        Ok(client)
    }
}

/// The connections the server serves, from `listener` and from this process. The accepting runs in
/// a task of its own and ends when the server stops taking connections.
pub fn admit(
    listener: TcpListener,
    limits: Limits,
    tls: Option<TlsAcceptor>,
) -> (impl tokio_stream::Stream<Item = io::Result<Admitted>>, InProcess) {
    let (tx, rx) = mpsc::channel(64);
    let limits = Limits {
        max: limits.max.max(1),
        per_address: limits.per_address.max(1),
        per_account: limits.per_account.max(1),
        per_credential: limits.per_credential.max(1),
    };
    let max = limits.max;
    let registry =
        Arc::new(Registry { held: Mutex::default(), owners: Mutex::default(), next: AtomicU64::new(0), limits });
    let in_process = InProcess { tx: tx.clone(), registry: registry.clone() };
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
            let place = match registry.admit(Some(peer.ip())) {
                Ok(place) => place,
                Err(Full) => {
                    metrics().shed(Shed::connections);
                    if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                        warned = Some(Instant::now());
                        tracing::warn!(%peer, max, "connection refused: the replica holds as many as it takes");
                    }
                    continue;
                }
            };
            // A batched answer must not wait out delayed ACKs.
            let _ = stream.set_nodelay(true);
            let (tx, tls) = (tx.clone(), tls.clone());
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + SETUP;
                let stream = match tls {
                    None => Stream::Plain(stream),
                    // A handshake ends with its place: shed for a newcomer, it stops at once.
                    Some(tls) => match tokio::select! {
                        handshake = tokio::time::timeout_at(deadline, tls.accept(stream)) => Some(handshake),
                        () = place.state.close.cancelled() => None,
                    } {
                        Some(Ok(Ok(stream))) => Stream::Tls(Box::new(stream)),
                        Some(Ok(Err(e))) => {
                            tracing::debug!(%peer, error = %e, "connection closed: tls handshake failed");
                            return;
                        }
                        Some(Err(_)) => {
                            tracing::debug!(%peer, "connection closed: tls handshake not done in time");
                            return;
                        }
                        None => {
                            tracing::debug!(%peer, "connection closed during its tls handshake: its place was given to a newcomer");
                            return;
                        }
                    },
                };
                let closed = Box::pin(place.state.close.clone().cancelled_owned());
                let setup = Some((Box::pin(tokio::time::sleep_until(deadline)), 0));
                let _ = tx.send(Ok(Admitted { stream, peer: Some(peer), place, closed, setup })).await;
            });
        }
    });
    (ReceiverStream::new(rx), in_process)
}

impl Connected for Admitted {
    type ConnectInfo = Info;

    fn connect_info(&self) -> Self::ConnectInfo {
        Info { peer: self.peer, state: self.place.state.clone(), registry: Some(self.place.registry.clone()) }
    }
}

fn shed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "closed: its place was given to a newcomer")
}

impl AsyncRead for Admitted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(shed()));
        }
        if let Some((deadline, _)) = &mut self.setup
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "setup not done in time")));
        }
        let before = buf.filled().len();
        let read = match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Memory(s) => Pin::new(s).poll_read(cx, buf),
        };
        if let (Poll::Ready(Ok(())), Some((_, seen))) = (&read, &mut self.setup) {
            *seen += buf.filled().len() - before;
            if *seen >= SETUP_BYTES {
                self.setup = None;
            }
        }
        read
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(shed()));
        }
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Memory(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Memory(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Memory(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(shed()));
        }
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::Memory(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
            Stream::Memory(s) => s.is_write_vectored(),
        }
    }
}
