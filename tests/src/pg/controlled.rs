//! A Postgres cluster a test may stop, crash and start again, for the fault suite: the test's own,
//! from the local server binaries, never shared.
//!
//! Commits wait for their WAL to be written (`synchronous_commit=on`), so a crash of any Postgres
//! process loses nothing that was acknowledged; `fsync` stays off, as only the operating system's
//! crash could lose what was written and not flushed.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rand::Rng;
use relay_server::dev::postgres;
use tokio_postgres::NoTls;

use super::TestDb;
use crate::process::{COMMAND_LIMIT, EXIT_LIMIT, RunWithin, wait_within};

/// How a running cluster is brought down.
#[derive(Clone, Copy, Debug)]
pub enum Down {
    /// `pg_ctl stop -m fast` (SIGINT): sessions ended, a checkpoint written.
    Fast,
    /// `pg_ctl stop -m immediate` (SIGQUIT): everything ends at once, recovery at the next start.
    Immediate,
    /// SIGKILL of the postmaster and of every one of its children, as the kernel's OOM killer would.
    Killed,
}

pub struct ControlledCluster {
    dir: PathBuf,
    bin: PathBuf,
    owner: Option<postgres::Owner>,
    pub port: u16,
    postmaster: Option<Child>,
}

impl ControlledCluster {
    /// A new cluster, started.
    pub async fn start() -> Self {
        let bin = postgres::bin_dir().expect("the Postgres server binaries (./test installs them)");
        let owner = postgres::owner().expect("the postgres user, to run Postgres as root");
        let dir = std::env::temp_dir().join(format!("relay-fault-pg-{:08x}", rand::rng().random::<u32>()));
        postgres::make_private_dir(&dir, owner).expect("the cluster's directory");
        let mut cluster = Self { dir, bin, owner, port: crate::free_port(), postmaster: None };
        let initdb = cluster
            .as_owner(Command::new(cluster.bin.join("initdb")))
            .args(["-A", "trust", "-N", "-U", "postgres", "--no-instructions", "-D"])
            .arg(cluster.dir.join("data"))
            .output_within(COMMAND_LIMIT)
            .expect("run initdb");
        assert!(initdb.status.success(), "initdb: {}", String::from_utf8_lossy(&initdb.stderr));
        cluster.up().await;
        cluster
    }

    fn as_owner(&self, mut cmd: Command) -> Command {
        use std::os::unix::process::CommandExt;
        if let Some(o) = self.owner {
            cmd.uid(o.uid).gid(o.gid);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    fn base(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres", self.port)
    }

    /// Starts the postmaster on the cluster's port and waits until it takes connections.
    pub async fn up(&mut self) {
        assert!(self.postmaster.is_none(), "the cluster is already up");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("postgres.log")).unwrap();
        let child = self
            .as_owner(Command::new(self.bin.join("postgres")))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-c", "listen_addresses=127.0.0.1", "-k"])
            .arg(&self.dir)
            .args(["-c", "fsync=off", "-c", "synchronous_commit=on", "-c", "max_connections=200"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.postmaster = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.postmaster.as_mut().unwrap().try_wait().unwrap() {
                panic!("postgres exited at start ({status}): {}", self.log_tail());
            }
            let url = format!("{} dbname=postgres", self.base());
            if tokio::time::timeout(Duration::from_secs(5), tokio_postgres::connect(&url, NoTls))
                .await
                .is_ok_and(|c| c.is_ok())
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "postgres did not take connections within 60s: {}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Brings the cluster down as `how` says and waits until every one of its processes is gone.
    pub fn down(&mut self, how: Down) {
        let mut postmaster = self.postmaster.take().expect("the cluster is up");
        let pid = postmaster.id();
        let children = children_of(pid);
        match how {
            Down::Fast => assert!(crate::signal(pid, libc::SIGINT)),
            Down::Immediate => assert!(crate::signal(pid, libc::SIGQUIT)),
            Down::Killed => {
                assert!(crate::signal(pid, libc::SIGKILL));
                for child in &children {
                    crate::signal(*child, libc::SIGKILL);
                }
            }
        }
        wait_within(&mut postmaster, EXIT_LIMIT, "the postmaster");
        // Backends left behind would hold the shared memory and refuse the next start.
        let deadline = std::time::Instant::now() + EXIT_LIMIT;
        while children.iter().any(|c| std::path::Path::new(&format!("/proc/{c}")).exists() && !zombie(*c)) {
            assert!(
                std::time::Instant::now() < deadline,
                "postgres's processes {children:?} outlived it by {EXIT_LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A new database on this cluster.
    pub async fn database(&self) -> TestDb {
        let name = format!("relay_fault_{:016x}", rand::rng().random::<u64>());
        let (client, connection) = tokio_postgres::connect(&format!("{} dbname=postgres", self.base()), NoTls)
            .await
            .expect("connect to the cluster");
        tokio::spawn(connection);
        client.batch_execute(&format!("create database {name}")).await.expect("create the database");
        TestDb { url: format!("{} dbname={name}", self.base()), name }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
        log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for ControlledCluster {
    fn drop(&mut self) {
        if let Some(mut postmaster) = self.postmaster.take() {
            crate::signal(postmaster.id(), libc::SIGQUIT);
            // No panic in a drop: a postmaster that outlives the deadline is killed instead.
            let deadline = std::time::Instant::now() + EXIT_LIMIT;
            while postmaster.try_wait().is_ok_and(|s| s.is_none()) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = postmaster.kill();
            let _ = postmaster.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    pids.filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| stat_field(*p, 1).is_some_and(|ppid| ppid == pid.to_string()))
        .collect()
}

fn zombie(pid: u32) -> bool {
    stat_field(pid, 0).is_some_and(|state| state == "Z")
}

/// Field `n` after the command in `/proc/PID/stat` (0: state, 1: parent).
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(n).map(str::to_owned)
}
