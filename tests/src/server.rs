//! The real `relay-server` binary, on a free loopback port.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::pg::TestDb;
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
        let child = Command::new(bin("relay-server"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--db-pool-size", "8"])
            .env("DATABASE_URL", &db.url)
            .env("RELAY_LOG", std::env::var("RELAY_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start relay-server");
        let server = Self { child, url: format!("http://127.0.0.1:{port}"), db_url: db.url.clone(), port };
        wait_serving(&server.url).await;
        server
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

    /// SIGTERM, then waits for the exit while this runtime keeps serving the test's own connections.
    pub async fn stop(&mut self) -> std::process::ExitStatus {
        terminate(&mut self.child).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends SIGTERM and waits for the process without blocking the async runtime.
pub async fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return status;
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
        .output()
        .expect("run relay-server admin")
}

/// Waits until the gRPC health service at `url` says SERVING.
pub async fn wait_serving(url: &str) {
    let url = url.to_owned();
    eventually(Duration::from_secs(30), "relay-server to report SERVING", || {
        let url = url.clone();
        async move {
            let channel = tonic::transport::Endpoint::from_shared(url).ok()?.connect().await.ok()?;
            let status = HealthClient::new(channel)
                .check(HealthCheckRequest { service: String::new() })
                .await
                .ok()?
                .into_inner()
                .status();
            (status == ServingStatus::Serving).then_some(())
        }
    })
    .await
}
