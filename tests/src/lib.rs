//! The integration harness: a real Postgres, the real `relay-server` binary, and gRPC clients.
//!
//! With `DATABASE_URL` set, tests use that server; with `RELAY_TEST_POSTGRES=container`, one Postgres
//! container of the test run ([`pg::container`]); otherwise one throwaway cluster per test binary is
//! started from the local Postgres binaries. Each test gets its own database either way. Every wait
//! has a deadline ([`process`], [`eventually`]).
//!
//! The bridge over stdio ([`mcp`]), child processes with deadlines ([`process`]) and the helpers
//! here build on every platform, for the smoke test macOS and Windows runners run; the rest of the
//! harness (Postgres clusters run as another user, network namespaces, signals, terminals, `/proc`)
//! is Linux's, as the integration suite that uses it.

pub mod mcp;
pub mod process;

#[cfg(target_os = "linux")]
pub mod agent;
#[cfg(target_os = "linux")]
pub mod client;
#[cfg(target_os = "linux")]
pub mod clients;
#[cfg(target_os = "linux")]
pub mod fake_relay;
#[cfg(target_os = "linux")]
pub mod http;
#[cfg(target_os = "linux")]
pub mod model_api;
#[cfg(target_os = "linux")]
pub mod npm;
#[cfg(target_os = "linux")]
pub mod pg;
#[cfg(target_os = "linux")]
pub mod proxy;
#[cfg(target_os = "linux")]
pub mod remote;
#[cfg(target_os = "linux")]
pub mod server;
#[cfg(target_os = "linux")]
pub mod terminal;
#[cfg(target_os = "linux")]
pub mod venv;

use std::path::PathBuf;
use std::time::Duration;

/// A built workspace binary of the same profile: beside this executable (a bench program) or one
/// directory up (a test, which lives in `deps/`).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let here = exe.parent().expect("executable directory");
    let name = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let candidates = [Some(here.join(&name)), here.parent().map(|p| p.join(&name))];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} is not built next to {}: run `cargo build --workspace` first", exe.display()))
}

/// A message id's short form, as the server accepts and shows it: its first
/// [`SHORT_ID_LEN`](relay_server::domain::ids::SHORT_ID_LEN) characters.
pub fn short_id(id: &str) -> &str {
    &id[..relay_server::domain::ids::SHORT_ID_LEN]
}

/// Sends signal `signal` (`libc::SIGTERM`, …) to process `pid`; whether it was delivered.
#[cfg(target_os = "linux")]
pub fn signal(pid: u32, signal: i32) -> bool {
    // SAFETY: kill takes a pid and a signal number and touches no memory of ours.
    unsafe { libc::kill(pid as libc::pid_t, signal) == 0 }
}

/// A process stopped (SIGSTOP) until dropped: a server that takes connections and never answers,
/// or a bridge gone silent.
#[cfg(target_os = "linux")]
pub struct Frozen(u32);

#[cfg(target_os = "linux")]
impl Frozen {
    pub fn new(pid: u32) -> Self {
        assert!(signal(pid, libc::SIGSTOP), "process {pid} could not be stopped");
        Self(pid)
    }
}

#[cfg(target_os = "linux")]
impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// Polls `check` until it yields a value or `limit` passes: for conditions with no event to wait on.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A free TCP port on loopback, below the kernel's range of ephemeral ports. A port the kernel
/// hands out (`bind` to port 0) comes from that range, which every outgoing connection draws its
/// local port from too: between this check and the server's own bind, one of the many
/// connections the tests and their servers open could take it, and the server would fail to listen
/// while another process answered on its address.
///
/// A port is handed out once per process: two tests asking at once may both find it free before
/// either server binds it.
pub fn free_port() -> u16 {
    use rand::Rng;
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let first_ephemeral = first_ephemeral_port();
    // A kernel whose ephemeral range starts low leaves too little below it: take its ports then.
    let below = 10_000..first_ephemeral;
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rng();
    for _ in 0..1000 {
        let port = if below.len() >= 4096 {
            rng.random_range(below.clone())
        } else {
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
        };
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free loopback port")
}

/// The first port of the kernel's ephemeral range.
#[cfg(target_os = "linux")]
fn first_ephemeral_port() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768)
}

/// The first port of the ephemeral range macOS and Windows use by default (IANA's).
#[cfg(not(target_os = "linux"))]
fn first_ephemeral_port() -> u16 {
    49152
}
