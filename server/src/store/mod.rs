//! Everything the server keeps lives in Postgres; this module holds all of the SQL.

pub mod activity;
pub mod approvals;
pub mod artifacts;
pub mod board;
pub mod claims;
pub mod console;
pub mod contacts;
pub mod due;
mod error;
pub(crate) mod heard;
pub mod identity;
pub mod loops;
pub mod messages;
pub mod migrate;
pub mod notices;
pub mod observe;
pub(crate) mod pages;
mod push_marks;
pub mod remote;
pub(crate) mod replicas;
pub mod retention;
pub(crate) mod row;
pub mod scope;
pub mod search;
pub mod sessions;
pub mod spawn;
#[cfg(test)]
pub(crate) mod testing;
pub mod tls;
pub mod topics;
pub mod trust;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres_rustls::MakeRustlsConnect;

pub use error::{Result, StoreError, is_unique_violation};

/// An open transaction. Repository functions that lock rows take one, so a lock is never taken on
/// a connection in autocommit, where it would end with its statement.
pub type Tx<'a> = deadpool_postgres::Transaction<'a>;

/// Begins a transaction on `client`: for the application, which owns its transactions' extent.
pub async fn begin(client: &mut deadpool_postgres::Object) -> Result<Tx<'_>> {
    Ok(client.transaction().await?)
}

/// Commits `tx`.
pub async fn commit(tx: Tx<'_>) -> Result<()> {
    Ok(tx.commit().await?)
}

use crate::domain::Error;
use crate::domain::ids::{EndpointId, Seq};

/// How connections to the database are protected.
#[derive(Clone)]
pub enum DbTls {
    /// Plaintext (`sslmode` disable or absent: a Unix socket, or a trusted network).
    None,
    /// TLS as `sslmode` asks (see [`tls`]).
    Rustls(MakeRustlsConnect),
}

/// How to reach the database.
#[derive(Clone)]
pub struct DbConfig {
    pub pg: tokio_postgres::Config,
    pub pool_size: usize,
    pub tls: DbTls,
}

impl DbConfig {
    /// Parses a libpq-style URL or key=value string, with libpq's TLS settings (`sslmode` up to
    /// verify-full, `sslrootcert`, `sslcert`, `sslkey`; see [`tls`]); `ca` is trusted beside the
    /// system's roots. The error never repeats the URL, which may hold a password.
    pub fn parse(url: &str, pool_size: usize, ca: Option<&Path>) -> Result<Self> {
        let (driver_url, tls_settings) = tls::split(url)?;
        let mut pg = tokio_postgres::Config::from_str(&driver_url)
            .map_err(|e| Error::invalid(format!("invalid database url: {e}")))?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(5));
        }
        if pg.get_application_name().is_none() {
            pg.application_name("relay-server");
        }
        pg.keepalives(true);
        // Notice a dead peer in about a minute rather than the system's two hours.
        pg.keepalives_idle(Duration::from_secs(30));
        let (mode, connector) = tls::connector(&tls_settings, ca)?;
        pg.ssl_mode(mode);
        let tls = connector.map_or(DbTls::None, DbTls::Rustls);
        Ok(Self { pg, pool_size, tls })
    }
}

impl DbConfig {
    /// Whether a database URL or key=value string carries a password. One that does not parse is
    /// judged by the redactor's shapes (`user:pass@`, `password=`).
    pub fn has_password(url: &str) -> bool {
        match tokio_postgres::Config::from_str(url) {
            Ok(config) => config.get_password().is_some(),
            Err(_) => crate::domain::redact::redact(url).total() > 0,
        }
    }
}

/// A handle on the database: a pool of connections with a bounded wait.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    /// Shared: every call's service stack holds a copy of the store, and the driver's settings are
    /// a dozen strings and lists to copy.
    config: Arc<DbConfig>,
    /// This process's replica id once registered (see `replicas`), 0 before.
    replica: Arc<std::sync::atomic::AtomicI64>,
    /// Sessions authenticated from memory while their changes are heard.
    sessions: Arc<sessions::SessionCache>,
    /// Each inbox's last page, answered again while its inbox is unchanged.
    pages: Arc<pages::PageCache>,
    /// Records what streams pushed, many inboxes a statement.
    push_marks: Arc<push_marks::PushMarks>,
    /// The most unread messages one inbox holds.
    max_unread: u32,
    /// Whether this replica hears the database's notifications (its listener is connected).
    heard: Arc<tokio::sync::watch::Sender<bool>>,
}

/// A pool of at most `size` connections to the configured database. Connections are made when
/// first wanted, their tasks on the runtime of the caller that wanted them.
fn build_pool(config: &DbConfig, size: usize) -> Result<Pool> {
    let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
    let manager = match &config.tls {
        DbTls::None => Manager::from_config(config.pg.clone(), NoTls, recycling),
        DbTls::Rustls(tls) => Manager::from_config(config.pg.clone(), tls.clone(), recycling),
    };
    Ok(Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| Error::Internal(format!("cannot build the database pool: {e}")))?)
}

impl Store {
    /// Builds the pool and checks that the database answers.
    pub async fn connect(config: DbConfig) -> Result<Self> {
        let pool = build_pool(&config, config.pool_size)?;
        let replica: Arc<std::sync::atomic::AtomicI64> = Arc::default();
        let push_marks = push_marks::PushMarks::start(pool.clone());
        let store = Self {
            push_marks,
            pool,
            config: Arc::new(config),
            replica,
            sessions: Arc::default(),
            pages: Arc::default(),
            max_unread: crate::domain::limits::DEFAULT_MAX_UNREAD,
            heard: Arc::new(tokio::sync::watch::Sender::new(false)),
        };
        // Startup is the one place where the driver's own words help the operator most.
        let probe = store.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => {
                Error::Unavailable(format!("cannot reach the database: {}", with_causes(&e)))
            }
            other => Error::Unavailable(format!("cannot reach the database: {}", with_causes(&other))),
        })?;
        drop(probe);
        Ok(store)
    }

    /// Sets the most unread messages one inbox holds (at least 1).
    pub fn with_max_unread(mut self, cap: u32) -> Self {
        self.max_unread = cap.max(1);
        self
    }

    /// Most unread messages one inbox holds: the send writer refuses a send beyond it, and the
    /// transactional paths check it.
    pub fn max_unread(&self) -> u32 {
        self.max_unread
    }

    /// The pool every call takes its connections from.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// A pool of its own of at most `size` connections to the same database, beside the shared
    /// one (the send writer's own connection).
    pub(crate) fn dedicated_pool(&self, size: usize) -> Result<Pool> {
        build_pool(&self.config, size)
    }

    /// This replica's id as registered, shared with what needs it as it changes (0 before).
    pub(crate) fn replica_cell(&self) -> Arc<std::sync::atomic::AtomicI64> {
        self.replica.clone()
    }

    /// Every delivery of `inbox` up to seq `through` reached its bridge. Recorded in the background
    /// with the marks other streams leave meanwhile (see [`push_marks`]).
    pub fn mark_pushed(&self, inbox: EndpointId, through: Seq) {
        self.push_marks.pushed(inbox, through);
    }

    /// Writes the pushes recorded and not yet written, as the server stops.
    pub async fn write_push_marks(&self) {
        self.push_marks.write_waiting(&self.pool).await;
    }

    /// Each inbox's last page (see [`pages`]).
    pub(crate) fn pages(&self) -> &pages::PageCache {
        &self.pages
    }

    /// The in-memory sessions, for the listener that keeps them true.
    pub fn sessions(&self) -> &sessions::SessionCache {
        &self.sessions
    }

    /// Every change to sessions and scope is heard from now on: what memory holds can be trusted.
    pub fn changes_heard(&self) {
        self.sessions.trust();
        self.heard.send_replace(true);
        crate::metrics::metrics().listening.set(1);
    }

    /// Follows whether changes are heard: the replica's notification connection is up.
    pub fn heard(&self) -> tokio::sync::watch::Receiver<bool> {
        self.heard.subscribe()
    }

    /// Whether the pool hands out a connection that answers, within `within`.
    pub async fn check(&self, within: Duration) -> Result<()> {
        let answered = tokio::time::timeout(within, async {
            let client = self.client().await?;
            client.simple_query("select 1").await?;
            Ok::<_, StoreError>(())
        })
        .await;
        answered.unwrap_or_else(|_| Err(Error::Unavailable("the database did not answer in time".into()).into()))
    }

    /// Sets the pool's gauges to what it holds now.
    pub fn observe_pool(&self) {
        let status = self.pool.status();
        let m = crate::metrics::metrics();
        m.pool_connections.set(status.size as i64);
        m.pool_idle.set(status.available as i64);
        m.pool_waiting.set(status.waiting as i64);
        m.pool_max.set(status.max_size as i64);
        m.sessions_cached.set(self.sessions.held() as i64);
    }

    /// Changes may go unheard (the listener is down): memory forgets and keeps nothing meanwhile.
    pub fn changes_unheard(&self) {
        self.sessions.distrust();
        self.heard.send_replace(false);
        crate::metrics::metrics().listening.set(0);
    }

    pub fn config(&self) -> &DbConfig {
        &self.config
    }

    /// A pooled connection. The application layer opens its transactions on it and passes the
    /// connection or transaction to the repository functions, which take `&impl GenericClient`
    /// (or a [`Tx`], where they lock rows).
    pub async fn client(&self) -> Result<Object> {
        Ok(self.pool.get().await?)
    }
}

/// An error with its causes, "error: cause: cause". The driver shows a database's refusal as only
/// "db error"; the reason (a wrong password, an unknown database) is its source.
pub fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::DbConfig;

    #[test]
    fn passwords_in_database_urls_are_noticed() {
        assert!(DbConfig::has_password("postgres://relay:s3cret@db/relay"));
        assert!(DbConfig::has_password("postgres://db/relay?password=s3cret"));
        assert!(DbConfig::has_password("host=db user=relay password=s3cret"));
        assert!(!DbConfig::has_password("postgres://relay@db/relay"));
        assert!(!DbConfig::has_password("host=/var/run/postgresql user=relay"));
    }
}
