//! The real `relay-server` binary, on a free loopback port.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::pg::TestDb;
use crate::process::{COMMAND_LIMIT, EXIT_LIMIT, RunWithin, RunWithinAsync};
use crate::{bin, eventually, free_port};

pub struct Server {
    child: Child,
    pub url: String,
    pub db_url: String,
    pub port: u16,
}

impl Server {
    /// Starts `relay-server serve` on the test database and waits until it reports SERVING.
    pub async fn start(db: &TestDb) -> Self {
        Self::start_on(db, free_port()).await
    }

    /// Starts on a given port (a restart keeps the address the bridges know).
    pub async fn start_on(db: &TestDb, port: u16) -> Self {
        Self::start_with_env(db, port, &[]).await
    }

    /// Starts with extra environment (fast scheduler ticks, short leases).
    pub async fn start_with_env(db: &TestDb, port: u16, env: &[(&str, &str)]) -> Self {
        let mut server = Self::spawn_with(db, port, &[], format!("http://127.0.0.1:{port}"), env);
        server.wait_serving(None).await;
        server
    }

    /// Starts with TLS from the given PEM files; `url` is https and names the certificate's host.
    pub async fn start_tls(db: &TestDb, cert: &Path, key: &Path) -> Self {
        Self::start_tls_with_env(db, cert, key, &[]).await
    }

    /// [`Server::start_tls`] with extra environment.
    pub async fn start_tls_with_env(db: &TestDb, cert: &Path, key: &Path, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let tls = ["--tls-cert".as_ref(), cert.as_os_str(), "--tls-key".as_ref(), key.as_os_str()];
        let mut server = Self::spawn_with(db, port, &tls, format!("https://localhost:{port}"), env);
        let ca = tonic::transport::Certificate::from_pem(std::fs::read(cert).unwrap());
        server.wait_serving(Some(ca)).await;
        server
    }

    /// Starts with extra environment, its log (stderr) written to `log`.
    pub async fn start_logging_to(db: &TestDb, env: &[(&str, &str)], log: &Path) -> Self {
        let port = free_port();
        let file = std::fs::File::create(log).expect("create the server's log file");
        let mut server = Self::spawn_to(db, port, &[], format!("http://127.0.0.1:{port}"), env, Stdio::from(file));
        server.wait_serving(None).await;
        server
    }

    fn spawn_with(db: &TestDb, port: u16, extra: &[&std::ffi::OsStr], url: String, env: &[(&str, &str)]) -> Self {
        Self::spawn_to(db, port, extra, url, env, Stdio::inherit())
    }

    fn spawn_to(
        db: &TestDb,
        port: u16,
        extra: &[&std::ffi::OsStr],
        url: String,
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Self {
        let child = Command::new(bin("relay-server"))
            .env("RELAY_LOG", std::env::var("RELAY_LOG").unwrap_or_else(|_| "warn".into()))
            .envs(env.iter().copied())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--db-pool-size", "8"])
            .args(extra)
            .env("DATABASE_URL", &db.url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start relay-server");
        Self { child, url, db_url: db.url.clone(), port }
    }

    /// Runs `relay-server admin ARGS` against this server's database.
    pub fn admin(&self, args: &[&str]) -> Output {
        admin(&self.db_url, args)
    }

    /// `admin` that must succeed; returns its stdout, trimmed.
    pub fn admin_ok(&self, args: &[&str]) -> String {
        let out = self.admin(args);
        assert!(out.status.success(), "admin {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Creates an account (if new) and a machine in it; returns the machine token.
    pub fn machine(&self, account: &str, machine: &str) -> String {
        let _ = self.admin(&["account", "create", account]);
        self.admin_ok(&["machine", "add", &format!("{account}/{machine}")])
    }

    /// Waits until this server says SERVING. A server that exits first (it could not listen, say)
    /// fails the test at once, rather than leaving it to talk to whatever else answers there.
    async fn wait_serving(&mut self, ca: Option<Certificate>) {
        let (child, url) = (&mut self.child, self.url.as_str());
        eventually(Duration::from_secs(30), "relay-server to report SERVING", || {
            if let Some(status) = child.try_wait().expect("relay-server's status") {
                panic!("relay-server for {url} exited before serving ({status}); its stderr is above");
            }
            let ca = ca.clone();
            async move { serving(url, ca).await.then_some(()) }
        })
        .await
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits for the exit while this runtime keeps serving the test's own connections.
    pub async fn stop(&mut self) -> std::process::ExitStatus {
        terminate(&mut self.child).await
    }

    /// Kills the process outright (SIGKILL), as a crash would: nothing is cleaned up.
    pub fn crash(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends SIGTERM and waits for the process without blocking the async runtime; one still running
/// after [`EXIT_LIMIT`] is killed and fails the test.
pub async fn terminate(child: &mut Child) -> std::process::ExitStatus {
    crate::signal(child.id(), libc::SIGTERM);
    let deadline = tokio::time::Instant::now() + EXIT_LIMIT;
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return status;
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {EXIT_LIMIT:?} of SIGTERM: killed", child.id());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn admin(db_url: &str, args: &[&str]) -> Output {
    Command::new(bin("relay-server"))
        .arg("admin")
        .args(args)
        .env("DATABASE_URL", db_url)
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .expect("run relay-server admin")
}

/// Waits until the gRPC health service at `url` says SERVING.
pub async fn wait_serving(url: &str) {
    wait_serving_with(url, None).await
}

/// [`wait_serving`] over TLS, trusting `ca`.
pub async fn wait_serving_with(url: &str, ca: Option<Certificate>) {
    eventually(Duration::from_secs(30), "relay-server to report SERVING", || {
        let ca = ca.clone();
        async move { serving(url, ca).await.then_some(()) }
    })
    .await
}

/// Whether the gRPC health service at `url` says SERVING now (a listener that never answers is
/// taken for no).
async fn serving(url: &str, ca: Option<Certificate>) -> bool {
    let check = async {
        let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned()).ok()?;
        if let Some(ca) = ca {
            endpoint = endpoint.tls_config(ClientTlsConfig::new().ca_certificate(ca)).ok()?;
        }
        let channel = endpoint.connect().await.ok()?;
        let status =
            HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await.ok()?.into_inner();
        Some(status.status() == ServingStatus::Serving)
    };
    tokio::time::timeout(Duration::from_secs(2), check).await.ok().flatten() == Some(true)
}

/// Runs `agent-bridge human ARGS` as the person holding the human `token`; returns whether it
/// succeeded and everything it printed.
pub async fn human(url: &str, token: &str, args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(bin("agent-bridge"))
        .arg("human")
        .args(args)
        .env("RELAY_SERVER", url)
        .env_remove("RELAY_TOKEN")
        .env("RELAY_HUMAN_TOKEN", token)
        .env("RELAY_CONFIG", "/nonexistent/bridge.toml")
        .output_within(COMMAND_LIMIT)
        .await
        .expect("run agent-bridge human");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// One account, `acme`, with two machines: the world most bridge tests start from.
pub struct TwoMachines {
    pub server: Server,
    pub laptop: String,
    pub ci: String,
    _db: TestDb,
}

impl TwoMachines {
    pub async fn start() -> Self {
        let db = TestDb::new().await;
        let server = Server::start(&db).await;
        let laptop = server.machine("acme", "laptop");
        let ci = server.machine("acme", "ci");
        Self { server, laptop, ci, _db: db }
    }
}
