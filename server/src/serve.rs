//! `relay-server serve`: the gRPC server with health, reflection, TLS and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use relay_proto::v1::FILE_DESCRIPTOR_SET;
use relay_proto::v1::human_server::HumanServer;
use relay_proto::v1::relay_server::RelayServer;
use relay_proto::v1::worker_server::WorkerServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::app::{App, Core};
use crate::domain::limits::Quotas;
use crate::domain::retention::Retention;
use crate::domain::timings::Timings;
use crate::protocol::admission::{AdmissionLayer, RpcLimits};
use crate::protocol::auth::Gate;
use crate::protocol::connections;
use crate::protocol::human::HumanService;
use crate::protocol::layers::RpcLayers;
use crate::protocol::service::RelayService;
use crate::protocol::tls::ReloadingCert;
use crate::protocol::worker::WorkerService;
use crate::push::{self, Hub};
use crate::store::{DbConfig, Store, migrate};

/// How long calls in flight may take to finish after a shutdown signal.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// How long recording the last pushes may hold a stopping server.
const PUSH_MARKS_LIMIT: Duration = Duration::from_secs(5);
/// How long a client keeps one connection before it is asked to open another for new calls; calls
/// in flight, push streams included, finish on the old one.
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(30 * 60);
/// A connection the server has heard nothing on for this long is pinged; one that does not answer
/// within [`KEEPALIVE_TIMEOUT`] is closed. A bridge that froze or vanished without closing its
/// connection thus gives up its push stream, and with it its handle, within 15 s.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Calls one connection may have open at once. A bridge needs a few; without a cap (tonic sets
/// none) one connection could open streams without end, each held until admission answers it.
const MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// Raises the soft limit of open files to the hard limit: every connection takes a descriptor, and
/// the usual soft limit of 1,024 is below the connections a replica takes.
fn raise_open_files_limit(max_connections: usize) {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => {
            let short = limit < max_connections as u64 + 256;
            if short {
                tracing::warn!(
                    limit,
                    max_connections,
                    "the open files limit is below the connections allowed; raise the hard limit (LimitNOFILE=)"
                );
            } else {
                tracing::info!(limit, "open files limit");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit"),
    }
}

/// What the operator sets beside where to listen: call limits, retention, quotas and the board's periods.
#[derive(Debug, Clone, Copy, Default)]
pub struct Settings {
    pub rpc: RpcLimits,
    pub retention: Retention,
    pub quotas: Quotas,
    pub timings: Timings,
}

/// The listeners beside gRPC, bound before anything starts so that a taken port is reported first:
/// the ops endpoints (see `protocol::ops`), the web console (see `protocol::console`) and the MCP
/// endpoint (see `protocol::mcp`).
#[derive(Default)]
pub struct SideListeners {
    pub ops: Option<TcpListener>,
    pub console: Option<TcpListener>,
    pub mcp: Option<TcpListener>,
}

/// Where and how to listen.
#[derive(Debug, Clone)]
pub struct ListenOptions {
    pub listen: SocketAddr,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub insecure_plaintext: bool,
    /// Connections held at once, and whose they may be (see `protocol::connections`).
    pub connections: connections::Limits,
    /// Browser Origins the MCP endpoint takes besides this machine's pages on loopback.
    pub mcp_allowed_origins: Vec<String>,
}

impl ListenOptions {
    /// Loads the TLS certificate (reloaded when its files change), or checks that plaintext is
    /// acceptable on this address.
    pub fn tls(&self) -> anyhow::Result<Option<Arc<ReloadingCert>>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(ReloadingCert::load(cert, key)?)),
            (None, None) => {
                if !self.listen.ip().is_loopback() && !self.insecure_plaintext {
                    bail!(
                        "refusing plaintext on non-loopback address {}: give --tls-cert and --tls-key, or --insecure-plaintext behind a TLS-terminating proxy",
                        self.listen
                    );
                }
                Ok(None)
            }
            _ => bail!("--tls-cert and --tls-key go together: give both or neither"),
        }
    }

    /// Refuses a plaintext console where the gRPC listener would refuse plaintext.
    pub fn check_console(&self, addr: SocketAddr) -> anyhow::Result<()> {
        let tls = self.tls_cert.is_some() && self.tls_key.is_some();
        crate::protocol::console::check(addr, tls, self.insecure_plaintext)
    }

    /// Refuses a plaintext MCP endpoint where the gRPC listener would refuse plaintext.
    pub fn check_mcp(&self, addr: SocketAddr) -> anyhow::Result<()> {
        let tls = self.tls_cert.is_some() && self.tls_key.is_some();
        crate::protocol::mcp::check(addr, tls, self.insecure_plaintext)
    }

    /// The URL a bridge on this machine uses to reach the server.
    pub fn local_url(&self) -> String {
        self.local_url_of(self.listen)
    }

    /// The URL a bridge on this machine uses to reach the server bound at `addr`.
    pub fn local_url_of(&self, addr: SocketAddr) -> String {
        let host = if addr.ip().is_unspecified() {
            if addr.is_ipv4() { "127.0.0.1".to_owned() } else { "[::1]".to_owned() }
        } else {
            Self::host_of(addr)
        };
        self.url(&host, addr.port())
    }

    /// The URL a bridge on another machine would use for the server bound at `addr`: an address
    /// bound to every interface is named by this host's name.
    pub fn remote_url_of(&self, addr: SocketAddr) -> String {
        let host = if addr.ip().is_unspecified() {
            gethostname::gethostname().to_string_lossy().into_owned()
        } else {
            Self::host_of(addr)
        };
        self.url(&host, addr.port())
    }

    fn host_of(addr: SocketAddr) -> String {
        if addr.is_ipv6() { format!("[{}]", addr.ip()) } else { addr.ip().to_string() }
    }

    fn url(&self, host: &str, port: u16) -> String {
        let scheme = if self.tls_cert.is_some() { "https" } else { "http" };
        format!("{scheme}://{host}:{port}")
    }
}

/// Connects to the database and applies pending migrations (on a connection of their own, see
/// [`migrate::apply`]).
pub async fn open_store(db: DbConfig) -> anyhow::Result<Store> {
    let store = Store::connect(db).await?;
    let report = migrate::apply(store.config()).await.context("cannot apply migrations")?;
    if !report.applied.is_empty() {
        tracing::info!(versions = ?report.applied, "database schema updated");
    }
    Ok(store)
}

/// Serves until `shutdown_signal` resolves, then ends open streams and waits for calls in flight.
pub async fn serve(
    store: Store,
    options: &ListenOptions,
    settings: Settings,
    side: SideListeners,
    shutdown_signal: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    serve_with(store, options, settings, side, shutdown_signal, |_| {}).await
}

/// Serves with the given call limits, calling `ready` with the bound address once the port is taken,
/// so that what it prints is true (the real port, even for port 0) and comes only when the server
/// is up. `side.ops`, when bound, serves health, readiness and metrics (see `protocol::ops`);
/// `side.console` the web console, over TLS when the server has a certificate.
pub async fn serve_with(
    store: Store,
    options: &ListenOptions,
    settings: Settings,
    side: SideListeners,
    shutdown_signal: impl Future<Output = ()>,
    ready: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let tls = options.tls()?;
    if let Some(console) = &side.console {
        options.check_console(console.local_addr()?)?;
    }
    if let Some(mcp) = &side.mcp {
        options.check_mcp(mcp.local_addr()?)?;
    }
    let rpc = RpcLimits { upload_bytes: settings.quotas.files.file_bytes as usize, ..settings.rpc };
    let shutdown = CancellationToken::new();
    let hub = Hub::default();
    let replica = store.register_replica().await.context("cannot register this replica")?;
    let liveness = push::liveness::start(store.clone(), shutdown.clone());
    let core = Core::new(store.clone(), hub.clone(), shutdown.clone())
        .with_quotas(settings.quotas)
        .with_timings(settings.timings);
    let app = App::start(core, settings.retention)?;
    let listener = push::listener::start(store.clone(), hub, app.messaging.sends(), shutdown.clone()).await?;
    tracing::info!(%replica, "replica registered");
    // The redaction rules are compiled now, beside the start, rather than in the first write.
    tokio::task::spawn_blocking(crate::domain::redact::prepare);

    let (health, health_service) = tonic_health::server::health_reporter();
    let readiness = follow_readiness(&store, health, shutdown.clone());
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("cannot build the reflection service")?;
    let ops = side.ops.map(|listener| {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(addr = %addr, "serving ops endpoints (/healthz, /readyz, /metrics)");
        }
        crate::protocol::ops::serve(listener, app.ops.clone(), shutdown.clone())
    });
    let console = side
        .console
        .map(|listener| crate::protocol::console::serve(listener, app.clone(), tls.clone(), shutdown.clone()))
        .transpose()?;
    let scheduler = crate::scheduler::start(&app, shutdown.clone());
    let human = HumanServer::new(HumanService::new(&app));
    let worker = WorkerServer::new(WorkerService::new(&app));
    // Admission bounds each method's request before it is decoded (an upload by the files' limit).
    let relay = RelayServer::new(RelayService::new(&app))
        .max_decoding_message_size(rpc.upload_bytes + crate::domain::limits::REQUEST_FRAME_BYTES);

    let socket = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    let local = socket.local_addr()?;
    raise_open_files_limit(options.connections.max);
    // A dead peer is noticed by the HTTP/2 keepalive pings below.
    let acceptor = match &tls {
        Some(cert) => {
            cert.watch(shutdown.clone());
            Some(cert.acceptor()?)
        }
        None => None,
    };
    let (incoming, in_process) = connections::admit(socket, options.connections, acceptor);
    // Spans, caught panics, and admission (budgets, authentication, rates, time budgets) for every
    // call; health and reflection pass admission untouched. The MCP endpoint's requests meet the
    // same budgets.
    let admission = AdmissionLayer::new(Arc::new(Gate::new(&app)), rpc);
    // Remote agents' calls go through the gRPC service in-process, meeting every layer below.
    let mcp = side
        .mcp
        .map(|listener| {
            let (identity, remote) = (app.identity.clone(), app.remote.clone());
            let admission = admission.clone();
            crate::protocol::mcp::serve(
                listener,
                &options.mcp_allowed_origins,
                identity,
                remote,
                admission,
                in_process,
                tls.clone(),
                shutdown.clone(),
            )
        })
        .transpose()?;

    let builder = Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_EVERY))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        // Clients are asked (GOAWAY) to open new connections now and then, so load spreads again
        // after a restart. No grace is set: with one, tonic cuts the connection at age + grace
        // without asking first, killing calls in flight.
        .max_connection_age(MAX_CONNECTION_AGE);
    let mut builder = builder.layer(RpcLayers::new(admission));
    tracing::info!(
        addr = %local,
        tls = options.tls_cert.is_some(),
        max_concurrent_rpcs = rpc.max_concurrent,
        rpc_timeout_s = rpc.timeout.as_secs_f64(),
        "serving relay.v1"
    );
    ready(local);

    // Health turns NOT_SERVING as shutdown begins (see `follow_readiness`).
    let stop = {
        let shutdown = shutdown.clone();
        async move {
            shutdown_signal.await;
            tracing::info!("shutting down: closing streams and finishing calls in flight");
            shutdown.cancel();
        }
    };
    let server = builder
        .add_service(health_service)
        .add_service(reflection)
        .add_service(relay)
        .add_service(human)
        .add_service(worker)
        .serve_with_incoming_shutdown(incoming, stop);
    // A client that never closes its connection must not hold the shutdown forever.
    let drain_limit = async {
        shutdown.cancelled().await;
        tokio::time::sleep(DRAIN_LIMIT).await;
    };
    let served = tokio::select! {
        served = server => served,
        () = drain_limit => {
            tracing::warn!(limit_s = DRAIN_LIMIT.as_secs(), "connections still open after the drain limit; stopping anyway");
            Ok(())
        }
    };
    shutdown.cancel();
    let _ = listener.await;
    let _ = scheduler.await;
    let _ = liveness.await;
    let _ = readiness.await;
    if let Some(ops) = ops {
        let _ = ops.await;
    }
    if let Some(console) = console {
        let _ = console.await;
    }
    if let Some(mcp) = mcp {
        let _ = mcp.await;
    }
    // What the streams pushed last is recorded before the replica goes.
    if tokio::time::timeout(PUSH_MARKS_LIMIT, store.write_push_marks()).await.is_err() {
        tracing::warn!("pushes still unrecorded at shutdown; their senders see them queued until surfaced");
    }
    served.context("grpc server failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// Keeps gRPC health in step with readiness: SERVING while the replica hears the database (its
/// notification connection is up), NOT_SERVING while it does not and once shutdown begins. Empty
/// service name and `relay.v1.Relay` both follow it.
fn follow_readiness(
    store: &Store,
    health: tonic_health::server::HealthReporter,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut heard = store.heard();
    tokio::spawn(async move {
        loop {
            let up = *heard.borrow_and_update();
            if up {
                health.set_service_status("", tonic_health::ServingStatus::Serving).await;
                health.set_serving::<RelayServer<RelayService>>().await;
            } else {
                tracing::warn!("not serving: the database's notifications are not heard");
                health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
                health.set_not_serving::<RelayServer<RelayService>>().await;
            }
            tokio::select! {
                changed = heard.changed() => if changed.is_err() { return },
                () = shutdown.cancelled() => {
                    health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
                    health.set_not_serving::<RelayServer<RelayService>>().await;
                    return;
                }
            }
        }
    })
}

/// Resolves on SIGINT or SIGTERM.
pub async fn termination() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler cannot fail on unix");
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(listen: &str) -> ListenOptions {
        ListenOptions {
            listen: listen.parse().unwrap(),
            tls_cert: None,
            tls_key: None,
            insecure_plaintext: false,
            connections: connections::Limits { max: 16, per_address: 16, ..Default::default() },
            mcp_allowed_origins: Vec::new(),
        }
    }

    #[test]
    fn plaintext_only_on_loopback_unless_asked() {
        assert!(options("127.0.0.1:7447").tls().unwrap().is_none());
        assert!(options("[::1]:7447").tls().unwrap().is_none());
        let err = options("0.0.0.0:7447").tls().unwrap_err().to_string();
        assert!(err.contains("refusing plaintext"), "{err}");
        let mut open = options("0.0.0.0:7447");
        open.insecure_plaintext = true;
        assert!(open.tls().unwrap().is_none());
    }

    #[test]
    fn cert_and_key_go_together() {
        let mut half = options("127.0.0.1:1");
        half.tls_cert = Some("/nonexistent".into());
        assert!(half.tls().unwrap_err().to_string().contains("go together"));
    }

    #[test]
    fn the_console_is_plaintext_only_where_grpc_may_be() {
        let any = "0.0.0.0:7449".parse().unwrap();
        assert!(options("127.0.0.1:7447").check_console("127.0.0.1:7449".parse().unwrap()).is_ok());
        assert!(options("127.0.0.1:7447").check_console(any).is_err());
        let mut tls = options("0.0.0.0:7447");
        tls.tls_cert = Some("c.pem".into());
        tls.tls_key = Some("k.pem".into());
        assert!(tls.check_console(any).is_ok());
        let mut proxied = options("0.0.0.0:7447");
        proxied.insecure_plaintext = true;
        assert!(proxied.check_console(any).is_ok());
    }

    #[test]
    fn local_url_reaches_the_listener() {
        assert_eq!(options("0.0.0.0:7447").local_url(), "http://127.0.0.1:7447");
        assert_eq!(options("[::1]:9000").local_url(), "http://[::1]:9000");
    }

    #[test]
    fn remote_url_names_this_host_for_every_interface() {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        let any = options("0.0.0.0:7447");
        assert_eq!(any.remote_url_of("0.0.0.0:7447".parse().unwrap()), format!("http://{host}:7447"));
        assert_eq!(any.remote_url_of("10.0.0.5:7447".parse().unwrap()), "http://10.0.0.5:7447");
    }
}
