//! `relay-server dev`: the embedded default. A private Postgres from the local binaries, the server
//! on it, account `local` with this host as a machine, and a bridge config that works at once.

pub mod postgres;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::app::identity;
use crate::domain::names;
use crate::protocol::listen::Listen;
use crate::protocol::ops;
use crate::protocol::{console, mcp};
use crate::serve::{self, ListenOptions, SideListeners};
use crate::store::{DbConfig, Store};
use relay_proto::bridge_config::{self, BridgeConfig};

pub const DEV_ACCOUNT: &str = "local";

pub struct DevOptions {
    pub listen: ListenOptions,
    /// Use this database instead of a private cluster.
    pub database_url: Option<String>,
    pub data_dir: Option<PathBuf>,
    /// Where the Postgres server programs are; found by [`postgres::bin_dir`] when absent.
    pub pg_bin: Option<PathBuf>,
    pub pool_size: usize,
    /// Most unread messages one inbox holds.
    pub max_unread: u32,
    /// Per-call time budget and the limit of calls in flight.
    pub settings: serve::Settings,
    /// Where the ops endpoints listen; by default [`ops::DEV_OPS_LISTEN`] when it is free.
    pub ops_listen: Option<Listen>,
    /// Where the web console listens; by default [`console::DEV_CONSOLE_LISTEN`] when it is free.
    pub console_listen: Option<Listen>,
    /// Where the MCP endpoint listens; by default [`mcp::DEV_MCP_LISTEN`] when it is free.
    pub mcp_listen: Option<Listen>,
}

/// Root keeps its data where the postgres user can reach it; anyone else under their data dir.
pub fn default_data_dir() -> anyhow::Result<PathBuf> {
    if postgres::owner()?.is_some() {
        return Ok(PathBuf::from("/var/lib/agent-relay"));
    }
    let base = dirs::data_dir().context("cannot find the user data directory; pass --data-dir")?;
    Ok(base.join("agent-relay"))
}

/// A path as one shell word, for commands printed to be copied.
pub fn shell_word(path: &Path) -> String {
    let text = path.to_string_lossy();
    shlex::try_quote(&text).map_or_else(|_| text.clone().into_owned(), |q| q.into_owned())
}

/// How to reach the database of the dev server under `data_dir` (default: the one `dev` uses), for
/// `admin` run beside it. It must be running: see [`postgres::running_dev_cluster`].
pub fn running_database(data_dir: Option<PathBuf>, pool_size: usize) -> anyhow::Result<DbConfig> {
    let data_dir = match data_dir {
        Some(dir) => dir,
        None => default_data_dir()?,
    };
    let start = format!("relay-server dev --data-dir {}", shell_word(&data_dir));
    let pg = postgres::running_dev_cluster(&data_dir, &start)?;
    Ok(DbConfig { pg, pool_size, tls: crate::store::DbTls::None })
}

pub async fn run(options: DevOptions) -> anyhow::Result<()> {
    // Fail on a bad listen configuration before starting anything.
    options.listen.tls()?;
    let ops = match options.ops_listen {
        Some(Listen::At(addr)) => Some(ops::bind(addr).await?),
        Some(Listen::Off) => None,
        // A second dev server on the machine goes without rather than failing.
        None => match ops::bind(ops::DEV_OPS_LISTEN).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "ops endpoints off (set RELAY_OPS_LISTEN to place them)");
                None
            }
        },
    };
    let ops_addr = ops.as_ref().and_then(|l| l.local_addr().ok());
    let console = match options.console_listen {
        Some(Listen::At(addr)) => {
            options.listen.check_console(addr)?;
            Some(console::bind(addr).await?)
        }
        Some(Listen::Off) => None,
        // Like the ops port: a second dev server on the machine goes without.
        None => match console::bind(console::DEV_CONSOLE_LISTEN).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "web console off (set RELAY_CONSOLE_LISTEN to place it)");
                None
            }
        },
    };
    let console_url = console
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|addr| crate::protocol::web::url(addr, options.listen.tls_cert.is_some()));
    let mcp = match options.mcp_listen {
        Some(Listen::At(addr)) => {
            options.listen.check_mcp(addr)?;
            Some(mcp::bind(addr).await?)
        }
        Some(Listen::Off) => None,
        None => match mcp::bind(mcp::DEV_MCP_LISTEN).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "mcp endpoint off (set RELAY_MCP_LISTEN to place it)");
                None
            }
        },
    };
    let mcp_url =
        mcp.as_ref().and_then(|l| l.local_addr().ok()).map(|addr| mcp::url(addr, options.listen.tls_cert.is_some()));
    let mut cluster = None;
    let mut data_dir = None;
    let db = match &options.database_url {
        Some(url) => DbConfig::parse(url, options.pool_size, None)?,
        None => {
            let dir = match options.data_dir.clone() {
                Some(dir) => dir,
                None => default_data_dir()?,
            };
            data_dir = Some(dir.clone());
            let pg_bin = options.pg_bin.clone();
            let started = tokio::task::spawn_blocking(move || -> anyhow::Result<postgres::DevCluster> {
                let mut c = postgres::DevCluster::prepare(&dir, pg_bin)?;
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
        let listen = &options.listen;
        let side = SideListeners { ops, console, mcp };
        serve::serve_with(store, listen, options.settings, side, serve::termination(), |bound| {
            let at = Listening { bound, ops: ops_addr, console: console_url.as_deref(), mcp: mcp_url.as_deref() };
            eprint!("{}", announcement(listen, &at, &config_path, data_dir.as_deref()));
        })
        .await
    }
    .await;

    if let Some(cluster) = cluster {
        tokio::task::spawn_blocking(move || cluster.stop()).await?;
    }
    outcome
}

/// Where a dev server serves: gRPC, and the ops endpoints, console and MCP endpoint when they are on.
struct Listening<'a> {
    bound: SocketAddr,
    ops: Option<SocketAddr>,
    console: Option<&'a str>,
    mcp: Option<&'a str>,
}

/// What `dev` prints once it serves: where, and the two commands that add another machine. The
/// token goes from the first to the second through stdin, never through a command line.
fn announcement(listen: &ListenOptions, at: &Listening<'_>, config: &Path, data_dir: Option<&Path>) -> String {
    let Listening { bound, ops, console, mcp } = *at;
    let mut text = format!(
        "relay dev server: {}  (account {DEV_ACCOUNT}; bridge config {})\n",
        listen.local_url_of(bound),
        config.display()
    );
    if let Some(ops) = ops {
        text.push_str(&format!("ops: {}  (/healthz, /readyz, /metrics)\n", ops::url(ops)));
    }
    if let Some(console) = console {
        text.push_str(&format!(
            "console: {console}  (sign in with a human token: relay-server admin{} human add {DEV_ACCOUNT})\n",
            data_dir.map(|d| format!(" --data-dir {}", shell_word(d))).unwrap_or_default()
        ));
    }
    if let Some(mcp) = mcp {
        text.push_str(&format!("mcp: {mcp}  (for agents without a bridge: a machine token as the bearer)\n"));
    }
    let admin = match data_dir {
        Some(dir) => format!("relay-server admin --data-dir {} machine add {DEV_ACCOUNT}/OTHER", shell_word(dir)),
        None => format!("relay-server admin machine add {DEV_ACCOUNT}/OTHER   (with this server's DATABASE_URL)"),
    };
    text.push_str(&format!(
        "to add another machine, run here (it prints the machine's token):\n  {admin}\n\
         then on that machine (it reads the token from stdin):\n  agent-bridge login --server {}\n",
        listen.remote_url_of(bound)
    ));
    if let Some(cert) = &listen.tls_cert {
        text.push_str(&format!("  (add --ca with a copy of {} there unless a public CA signed it)\n", cert.display()));
    }
    if bound.ip().is_loopback() {
        text.push_str(&format!(
            "note: this server listens on loopback only; for other machines give --listen 0.0.0.0:{} with --tls-cert and --tls-key\n",
            bound.port()
        ));
    }
    text
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
    identity::ensure_account(store, DEV_ACCOUNT).await?;
    let host = gethostname::gethostname();
    let machine = names::sanitize(&host.to_string_lossy());
    let server = listen.local_url();
    let mut path = bridge_config::default_path()?;
    if let Some(other) = bridge_config::read(&path)?.filter(|c| c.server != server) {
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

    let existing = bridge_config::read(&path)?;
    let human_token = existing.as_ref().and_then(|c| c.human_token.clone());
    let token = match &existing {
        Some(c) if identity::machine_token_is(store, &c.token, DEV_ACCOUNT, &machine).await? => c.token.clone(),
        _ => identity::reissue_machine_token(store, DEV_ACCOUNT, &machine).await?,
    };
    let config = BridgeConfig { server, token, ca, human_token };
    if existing.as_ref() != Some(&config) {
        bridge_config::write(&path, &config)?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen(addr: &str) -> ListenOptions {
        ListenOptions {
            listen: addr.parse().unwrap(),
            tls_cert: None,
            tls_key: None,
            insecure_plaintext: false,
            connections: crate::protocol::connections::Limits { max: 16, per_address: 16, ..Default::default() },
            mcp_allowed_origins: Vec::new(),
        }
    }

    #[test]
    fn the_announcement_says_how_another_machine_joins() {
        let opts = listen("127.0.0.1:0");
        let at = Listening {
            bound: "127.0.0.1:7447".parse().unwrap(),
            ops: Some("127.0.0.1:7448".parse().unwrap()),
            console: Some("http://127.0.0.1:7449"),
            mcp: Some("http://127.0.0.1:7450/mcp"),
        };
        let text = announcement(&opts, &at, Path::new("/h/bridge.toml"), Some(Path::new("/var/lib/agent relay")));
        assert!(text.starts_with("relay dev server: http://127.0.0.1:7447  (account local;"), "{text}");
        assert!(
            text.contains("\n  relay-server admin --data-dir '/var/lib/agent relay' machine add local/OTHER\n"),
            "{text}"
        );
        assert!(text.contains("\n  agent-bridge login --server http://127.0.0.1:7447\n"), "{text}");
        assert!(text.contains("loopback only"), "{text}");
        assert!(text.contains("\nops: http://127.0.0.1:7448  (/healthz, /readyz, /metrics)\n"), "{text}");
        assert!(text.contains("\nmcp: http://127.0.0.1:7450/mcp  (for agents without a bridge"), "{text}");
        assert!(
            text.contains("\nconsole: http://127.0.0.1:7449  (sign in with a human token: relay-server admin --data-dir '/var/lib/agent relay' human add local)\n"),
            "{text}"
        );
        let at = Listening { bound: "0.0.0.0:7447".parse().unwrap(), ops: None, console: None, mcp: None };
        let everywhere = announcement(&opts, &at, Path::new("/b"), Some(Path::new("/d")));
        assert!(!everywhere.contains("loopback only") && !everywhere.contains("login --server http://0.0.0.0"));
        assert!(!everywhere.contains("ops:"), "no ops line when the ops port is off: {everywhere}");
        assert!(!everywhere.contains("console:"), "no console line when the console is off: {everywhere}");
    }
}
