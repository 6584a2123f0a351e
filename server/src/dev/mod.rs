//! `relay-server dev`: the embedded default. A private Postgres from the local binaries, the server
//! on it, account `local` with this host as a machine, and a bridge config that works at once.

pub mod postgres;

use std::path::PathBuf;

use anyhow::Context;

use crate::domain::names;
use crate::serve::{self, ListenOptions};
use crate::store::{DbConfig, Store};
use relay_proto::bridge_config::{self, BridgeConfig};

pub const DEV_ACCOUNT: &str = "local";

pub struct DevOptions {
    pub listen: ListenOptions,
    /// Use this database instead of a private cluster.
    pub database_url: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub pool_size: usize,
    /// Most unread messages one inbox holds.
    pub max_unread: u32,
}

/// Root keeps its data where the postgres user can reach it; anyone else under their data dir.
fn default_data_dir() -> anyhow::Result<PathBuf> {
    if postgres::owner()?.is_some() {
        return Ok(PathBuf::from("/var/lib/agent-relay"));
    }
    let base = dirs::data_dir().context("cannot find the user data directory; pass --data-dir")?;
    Ok(base.join("agent-relay"))
}

pub async fn run(options: DevOptions) -> anyhow::Result<()> {
    // Fail on a bad listen configuration before starting anything.
    options.listen.tls()?;
    let mut cluster = None;
    let db = match &options.database_url {
        Some(url) => DbConfig::parse(url, options.pool_size, None)?,
        None => {
            let data_dir = match options.data_dir.clone() {
                Some(dir) => dir,
                None => default_data_dir()?,
            };
            let started = tokio::task::spawn_blocking(move || -> anyhow::Result<postgres::DevCluster> {
                let mut c = postgres::DevCluster::prepare(&data_dir)?;
                c.start()?;
                Ok(c)
            })
            .await??;
            ensure_database(&started).await?;
            // A Unix socket in a directory only its owner can enter: no TLS needed.
            let config = DbConfig {
                pg: started.pg_config(postgres::DEV_DATABASE),
                pool_size: options.pool_size,
                tls: crate::store::DbTls::None,
            };
            cluster = Some(started);
            config
        }
    };

    let outcome = async {
        let store = serve::open_store(db).await?.with_max_unread(options.max_unread);
        let config_path = provision(&store, &options.listen).await?;
        eprintln!(
            "relay dev server: {}  (account {DEV_ACCOUNT}; bridge config {})",
            options.listen.local_url(),
            config_path.display()
        );
        serve::serve(store, &options.listen, serve::termination()).await
    }
    .await;

    if let Some(cluster) = cluster {
        tokio::task::spawn_blocking(move || cluster.stop()).await?;
    }
    outcome
}

async fn ensure_database(cluster: &postgres::DevCluster) -> anyhow::Result<()> {
    let (client, connection) = cluster
        .pg_config("postgres")
        .connect(tokio_postgres::NoTls)
        .await
        .context("cannot connect to the dev database cluster")?;
    let driver = tokio::spawn(connection);
    let exists =
        client.query_opt("select 1 from pg_database where datname = $1", &[&postgres::DEV_DATABASE]).await?.is_some();
    if !exists {
        client.batch_execute(&format!("create database {}", postgres::DEV_DATABASE)).await?;
    }
    drop(client);
    let _ = driver.await;
    Ok(())
}

/// Makes sure account `local` and this host's machine exist and the bridge config holds a live token.
async fn provision(store: &Store, listen: &ListenOptions) -> anyhow::Result<PathBuf> {
    store.ensure_account(DEV_ACCOUNT).await?;
    let host = gethostname::gethostname();
    let machine = names::sanitize(&host.to_string_lossy());
    let server = listen.local_url();
    let mut path = bridge_config::default_path()?;
    if let Some(other) = bridge_config::read(&path).filter(|c| c.server != server) {
        // Never clobber a login to a real server: the dev config goes beside it.
        path = path.with_file_name("bridge-dev.toml");
        eprintln!(
            "note: {} already points at {}; the dev config goes to {} (set RELAY_CONFIG to use it)",
            bridge_config::default_path()?.display(),
            other.server,
            path.display()
        );
    }
    let ca = listen.tls_cert.as_ref().map(|p| p.display().to_string());

    let existing = bridge_config::read(&path);
    let human_token = existing.as_ref().and_then(|c| c.human_token.clone());
    let token = match &existing {
        Some(c) if store.machine_token_is(&c.token, DEV_ACCOUNT, &machine).await? => c.token.clone(),
        _ => store.reissue_machine_token(DEV_ACCOUNT, &machine).await?,
    };
    let config = BridgeConfig { server, token, ca, human_token };
    if existing.as_ref() != Some(&config) {
        bridge_config::write(&path, &config)?;
    }
    Ok(path)
}
