//! Postgres for tests: `DATABASE_URL`; with `RELAY_TEST_POSTGRES=container` a Postgres container of
//! the test run ([`container`]); otherwise a throwaway cluster (`initdb -A trust -N`, `fsync=off`) per
//! test process.

pub mod container;
pub mod controlled;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rand::Rng;
use relay_server::dev::postgres;
use tokio_postgres::NoTls;

/// The server all databases of this test process live on.
struct Cluster {
    /// Connection string without a database name.
    base: String,
    /// The CA of the cluster's TLS certificate (for host `localhost`), when the harness started it.
    tls_ca: Option<PathBuf>,
    /// Holding the watchdog's stdin open keeps the cluster alive; the process's exit closes it,
    /// and the watchdog then stops Postgres and deletes its files.
    _watchdog: Option<Mutex<(Child, ChildStdin)>>,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// Set before the first database is made: the cluster then runs as production does (fsync and
/// synchronous commit on) and loads pg_stat_statements, counting planning too. Tests leave it off for
/// speed.
static DURABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes this process's throwaway cluster durable (see [`DURABLE`]); for benchmarks.
pub fn durable_cluster() {
    DURABLE.store(true, std::sync::atomic::Ordering::SeqCst);
}

// Runs as the cluster owner: make the cluster, serve it until stdin closes, then clean up. The
// fourth argument holds the durability settings.
const WATCHDOG: &str = r#"
bin="$1"; dir="$2"; port="$3"; durability="$4"
"$bin/initdb" -D "$dir/data" -A trust -N -U postgres --no-instructions >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
"$bin/postgres" -D "$dir/data" -p "$port" -k "$dir" -c listen_addresses=127.0.0.1 $durability -c max_connections=400 \
  -c ssl=on -c ssl_cert_file="$dir/tls/server.crt" -c ssl_key_file="$dir/tls/server.key" >"$dir/postgres.log" 2>&1 &
pid=$!
cat >/dev/null
kill -INT "$pid"; wait "$pid"; rm -rf "$dir"
"#;

/// The test run's Postgres container, started by the first test that needs it.
static CONTAINER: OnceLock<String> = OnceLock::new();

/// The connection string (without a database) of the test run's Postgres container.
fn container_base() -> String {
    CONTAINER
        .get_or_init(|| {
            let base = container::start();
            wait_ready(&base, None, "the test run's postgres container");
            base
        })
        .clone()
}

fn start_cluster() -> Cluster {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return Cluster { base: url, tls_ca: None, _watchdog: None };
    }
    match std::env::var("RELAY_TEST_POSTGRES").as_deref() {
        Err(_) | Ok("" | "local") => {}
        Ok("container") => return Cluster { base: container_base(), tls_ca: None, _watchdog: None },
        Ok(other) => panic!("RELAY_TEST_POSTGRES={other}: expected `container` or `local`"),
    }
    let bin = postgres::bin_dir().expect("postgres binaries");
    let owner = postgres::owner().expect("postgres owner");
    let dir =
        std::env::temp_dir().join(format!("relay-test-pg-{}-{:08x}", std::process::id(), rand::rng().random::<u32>()));
    postgres::make_private_dir(&dir, owner).expect("cluster directory");
    // TLS for the tests of sslmode=require: a certificate for localhost, readable only by the cluster.
    let tls = dir.join("tls");
    postgres::make_private_dir(&tls, owner).expect("tls directory");
    let issued = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("test certificate");
    let (cert, key) = (tls.join("server.crt"), tls.join("server.key"));
    std::fs::write(&cert, issued.cert.pem()).unwrap();
    std::fs::write(&key, issued.signing_key.serialize_pem()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    if let Some(o) = owner {
        for f in [&cert, &key] {
            std::os::unix::fs::chown(f, Some(o.uid), Some(o.gid)).unwrap();
        }
    }
    let ca = std::env::temp_dir().join(format!("relay-test-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, issued.cert.pem()).unwrap();
    let port = crate::free_port();
    let mut cmd = if owner.is_some() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "sh"]);
        c
    } else {
        Command::new("sh")
    };
    let mut child = cmd
        .arg("-c")
        .arg(WATCHDOG)
        .arg("sh")
        .arg(&bin)
        .arg(&dir)
        .arg(port.to_string())
        .arg(if DURABLE.load(std::sync::atomic::Ordering::SeqCst) {
            let statements = bin.join("../lib/pg_stat_statements.so").exists();
            let preload = if statements {
                " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_planning=on"
            } else {
                ""
            };
            // synchronous_commit is left at its default (on) rather than set here: a setting on
            // the command line would outrank the `alter system` with which relay-bench measures
            // Relay without it.
            format!("-c fsync=on -c full_page_writes=on{preload}")
        } else {
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off".to_owned()
        })
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the postgres watchdog");
    let stdin = child.stdin.take().expect("watchdog stdin");
    let base = format!("host=127.0.0.1 port={port} user=postgres");

    wait_ready(&base, Some(&mut child), "the test postgres cluster");
    Cluster { base, tls_ca: Some(ca), _watchdog: Some(Mutex::new((child, stdin))) }
}

/// Waits up to a minute for Postgres at `base` to accept connections; a starter that exits first
/// fails at once with what it said.
fn wait_ready(base: &str, mut starter: Option<&mut Child>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    loop {
        if let Some(child) = starter.as_deref_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            let mut err = String::new();
            child.stderr.take().map(|mut s| s.read_to_string(&mut err));
            panic!("{what} failed to start ({status}): {err}");
        }
        let url = format!("{base} dbname=postgres");
        let connect = tokio_postgres::connect(&url, NoTls);
        if runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), connect).await })
            .is_ok_and(|c| c.is_ok())
        {
            return;
        }
        assert!(Instant::now() < deadline, "{what} did not accept connections within 60s ({base})");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// For TLS tests: the test database's URL through `localhost` with `sslmode=require`, and the CA to
/// trust. `None` when the tests run against an external `DATABASE_URL`.
pub fn tls_url(db: &TestDb) -> Option<(String, PathBuf)> {
    let cluster = CLUSTER.get()?;
    let ca = cluster.tls_ca.clone()?;
    let port = cluster.base.split_whitespace().find_map(|kv| kv.strip_prefix("port="))?;
    Some((format!("host=localhost port={port} user=postgres dbname={} sslmode=require", db.name), ca))
}

/// One test's own database.
pub struct TestDb {
    pub url: String,
    pub name: String,
}

impl TestDb {
    pub async fn new() -> Self {
        let base = tokio::task::spawn_blocking(|| CLUSTER.get_or_init(start_cluster).base.clone()).await.unwrap();
        Self::on(&base).await
    }

    /// A database on the test run's Postgres container whatever the environment says, for tests
    /// of what runs in containers.
    pub async fn on_container() -> Self {
        let base = tokio::task::spawn_blocking(container_base).await.unwrap();
        Self::on(&base).await
    }

    async fn on(base: &str) -> Self {
        let name = format!("relay_test_{:016x}", rand::rng().random::<u64>());
        let (client, connection) =
            tokio_postgres::connect(&with_dbname(base, "postgres"), NoTls).await.expect("connect to the test postgres");
        tokio::spawn(connection);
        client.batch_execute(&format!("create database {name}")).await.expect("create the test database");
        Self { url: with_dbname(base, &name), name }
    }

    /// A plain connection to this database, for tests that arrange or read state straight through
    /// SQL.
    pub async fn sql(&self) -> tokio_postgres::Client {
        let (client, connection) =
            tokio_postgres::connect(&self.url, NoTls).await.expect("connect to the test database");
        tokio::spawn(connection);
        client
    }
}

/// `base` with its database replaced: works for URLs and for key=value strings.
fn with_dbname(base: &str, dbname: &str) -> String {
    if let Some(rest) = base.strip_prefix("postgres://").or_else(|| base.strip_prefix("postgresql://")) {
        let (main, query) = rest.split_once('?').map_or((rest, None), |(m, q)| (m, Some(q)));
        let authority = main.split_once('/').map_or(main, |(a, _)| a);
        match query {
            Some(q) => format!("postgres://{authority}/{dbname}?{q}"),
            None => format!("postgres://{authority}/{dbname}"),
        }
    } else {
        format!("{base} dbname={dbname}")
    }
}

#[cfg(test)]
mod tests {
    use super::with_dbname;

    #[test]
    fn database_names_are_replaced() {
        assert_eq!(with_dbname("postgres://u:p@h:5/db?sslmode=disable", "x"), "postgres://u:p@h:5/x?sslmode=disable");
        assert_eq!(with_dbname("postgresql://h", "x"), "postgres://h/x");
        assert_eq!(with_dbname("host=h port=1", "x"), "host=h port=1 dbname=x");
    }
}
