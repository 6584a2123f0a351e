//! Running the locally installed Postgres binaries: the dev command's private cluster, and the test
//! harness's throwaway one.
//!
//! Postgres refuses to run as root, so when we are root every Postgres program runs as the
//! `postgres` user (through `runuser`) and the directories it uses are handed to that user.
//!
//! The private cluster listens on a Unix socket only, so it runs on Linux and macOS; on Windows
//! `dev` is given a database instead (`--database-url`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, bail};

/// The user Postgres programs run as, when it is not us.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// Where packages put the Postgres server programs, `{}` standing for the major version.
const INSTALLS: &[&str] = &[
    // Debian and Ubuntu
    "/usr/lib/postgresql/{}/bin",
    // Red Hat and its kin, from the PostgreSQL project's repository
    "/usr/pgsql-{}/bin",
    // Homebrew's postgresql@NN, on Apple silicon and on Intel Macs
    "/opt/homebrew/opt/postgresql@{}/bin",
    "/usr/local/opt/postgresql@{}/bin",
    // Postgres.app
    "/Applications/Postgres.app/Contents/Versions/{}/bin",
];

/// A program's file name on this platform (`pg_ctl.exe` on Windows).
fn program(name: &str) -> String {
    format!("{name}{}", std::env::consts::EXE_SUFFIX)
}

/// Where the Postgres server programs are when `dev --pg-bin` does not say: the newest version any
/// package installed in a known place ([`INSTALLS`]), else wherever `pg_ctl` is on `PATH`.
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    find_bin_dir(Path::new("/"), &std::env::var_os("PATH").unwrap_or_default())
}

/// [`bin_dir`] with the file system's root and `PATH` given.
fn find_bin_dir(root: &Path, path: &std::ffi::OsStr) -> anyhow::Result<PathBuf> {
    if let Some(bin) = newest_install(root) {
        return Ok(bin);
    }
    for dir in std::env::split_paths(path) {
        let candidate = dir.join(program("pg_ctl"));
        if candidate.exists() {
            // pg_ctl finds `postgres` beside its real location, so resolve links.
            let real = std::fs::canonicalize(&candidate).unwrap_or(candidate);
            return Ok(real.parent().map(Path::to_path_buf).unwrap_or(dir));
        }
    }
    bail!(
        "cannot find the Postgres server programs (initdb, pg_ctl, postgres): {}, or name their directory with --pg-bin (RELAY_PG_BIN)",
        INSTALL_HINT
    )
}

/// How to get Postgres on this platform.
#[cfg(target_os = "macos")]
const INSTALL_HINT: &str = "install them with `brew install postgresql@17` or from https://postgresapp.com";
#[cfg(target_os = "linux")]
const INSTALL_HINT: &str =
    "install them with `apt-get install postgresql` (Debian, Ubuntu) or `dnf install postgresql-server` (Fedora, RHEL)";
#[cfg(not(any(target_os = "macos", target_os = "linux")))]
const INSTALL_HINT: &str = "install Postgres";

/// The newest of the [`INSTALLS`] under `root` that holds `pg_ctl`.
fn newest_install(root: &Path) -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = INSTALLS
        .iter()
        .filter_map(|pattern| {
            let (before, after) = pattern.split_once("{}")?;
            let (parent, prefix) = before.rsplit_once('/')?;
            let parent = root.join(parent.trim_start_matches('/'));
            let entries = std::fs::read_dir(parent).ok()?;
            Some(entries.flatten().filter_map(move |entry| {
                let name = entry.file_name();
                let version: u32 = name.to_str()?.strip_prefix(prefix)?.parse().ok()?;
                let bin = entry.path().join(after.trim_start_matches('/'));
                bin.join(program("pg_ctl")).is_file().then_some((version, bin))
            }))
        })
        .flatten()
        .collect();
    // The newest version; of two places with one version, the first in the list.
    found.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    found.into_iter().next().map(|(_, bin)| bin)
}

/// `Some(postgres user)` when this process is root.
#[cfg(unix)]
pub fn owner() -> anyhow::Result<Option<Owner>> {
    if !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    if cfg!(target_os = "macos") {
        bail!(
            "relay-server dev does not run as root on macOS: Postgres refuses root, and there is no postgres user to run it as; run dev as your own user"
        );
    }
    let passwd = std::fs::read_to_string("/etc/passwd").context("cannot read /etc/passwd")?;
    let entry = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .context("running as root, but there is no postgres user to run Postgres as")?;
    let fields: Vec<&str> = entry.split(':').collect();
    let parse =
        |i: usize| fields.get(i).and_then(|f| f.parse().ok()).context("malformed postgres entry in /etc/passwd");
    Ok(Some(Owner { uid: parse(2)?, gid: parse(3)? }))
}

/// Nobody to hand the cluster to: Windows has no root that Postgres refuses.
#[cfg(not(unix))]
pub fn owner() -> anyhow::Result<Option<Owner>> {
    Ok(None)
}

/// A command running `program` from `bin` as the cluster owner.
pub fn command(bin: &Path, program: &str, owner: Option<Owner>) -> Command {
    match owner {
        Some(_) => {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(bin.join(program));
            cmd
        }
        None => Command::new(bin.join(program)),
    }
}

/// Creates `dir` (mode 0700) and hands it to the owner.
pub fn make_private_dir(dir: &Path, owner: Option<Owner>) -> anyhow::Result<()> {
    relay_proto::bridge_config::private_dir_builder()
        .recursive(true)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    #[cfg(unix)]
    if let Some(owner) = owner {
        std::os::unix::fs::chown(dir, Some(owner.uid), Some(owner.gid))
            .with_context(|| format!("cannot hand {} to the postgres user", dir.display()))?;
    }
    #[cfg(not(unix))]
    let _ = owner;
    Ok(())
}

/// Runs a command to completion; a failure carries the program's own words.
pub fn run(cmd: &mut Command, what: &str) -> anyhow::Result<Output> {
    let output = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let detail = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no output");
        bail!("{what} failed ({}): {detail}", output.status);
    }
    Ok(output)
}

/// The dev command's private cluster: Unix socket only, in a directory only its owner can enter.
pub struct DevCluster {
    bin: PathBuf,
    owner: Option<Owner>,
    pgdata: PathBuf,
    socket_dir: PathBuf,
    log: PathBuf,
    started_here: bool,
}

pub const DEV_USER: &str = "relay";
pub const DEV_DATABASE: &str = "relay";

impl DevCluster {
    /// Creates the cluster under `data_dir` unless it exists already, with the server programs in
    /// `bin` (found by [`bin_dir`] when absent).
    pub fn prepare(data_dir: &Path, bin: Option<PathBuf>) -> anyhow::Result<Self> {
        if cfg!(not(unix)) {
            bail!(
                "relay-server dev starts a Postgres of its own on Linux and macOS only: on this system give it one with --database-url (DATABASE_URL)"
            );
        }
        let bin = match bin {
            Some(bin) if !bin.join(program("pg_ctl")).is_file() => {
                bail!("--pg-bin {} holds no pg_ctl: name the directory of initdb, pg_ctl and postgres", bin.display())
            }
            Some(bin) => bin,
            None => bin_dir()?,
        };
        let owner = owner()?;
        make_private_dir(data_dir, owner)?;
        let cluster = Self {
            pgdata: data_dir.join("pg"),
            socket_dir: data_dir.join("run"),
            log: data_dir.join("postgres.log"),
            bin,
            owner,
            started_here: false,
        };
        if owner.is_some() {
            let reachable = command(Path::new("/usr/bin"), "test", owner).arg("-w").arg(data_dir).status();
            if !matches!(reachable, Ok(s) if s.success()) {
                bail!(
                    "the postgres user cannot write {} (Postgres refuses root, so the dev cluster runs as postgres): choose a --data-dir it can reach, such as /var/lib/agent-relay",
                    data_dir.display()
                );
            }
        }
        make_private_dir(&cluster.socket_dir, owner)?;
        if !cluster.pgdata.join("PG_VERSION").exists() {
            tracing::info!(dir = %cluster.pgdata.display(), "creating the dev database cluster");
            run(
                command(&cluster.bin, "initdb", owner).arg("-D").arg(&cluster.pgdata).args([
                    "-U",
                    DEV_USER,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-instructions",
                ]),
                "initdb",
            )?;
        }
        Ok(cluster)
    }

    fn running(&self) -> bool {
        let status = command(&self.bin, "pg_ctl", self.owner).arg("status").arg("-D").arg(&self.pgdata).output();
        matches!(status, Ok(o) if o.status.success())
    }

    /// Starts the cluster unless it already runs (a previous dev server left it, or another holds it).
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self.running() {
            tracing::info!(dir = %self.pgdata.display(), "reusing the running dev database");
            return Ok(());
        }
        let options = format!("-c listen_addresses='' -k '{}'", self.socket_dir.display());
        run(
            command(&self.bin, "pg_ctl", self.owner)
                .arg("start")
                .arg("-D")
                .arg(&self.pgdata)
                .arg("-l")
                .arg(&self.log)
                .args(["-w", "-t", "60", "-o", &options]),
            "pg_ctl start",
        )
        .with_context(|| format!("the dev database did not start; see {}", self.log.display()))?;
        self.started_here = true;
        Ok(())
    }

    /// Stops the cluster if this process started it.
    pub fn stop(&self) {
        if !self.started_here {
            return;
        }
        let stopped = run(
            command(&self.bin, "pg_ctl", self.owner).arg("stop").arg("-D").arg(&self.pgdata).args(["-m", "fast", "-w"]),
            "pg_ctl stop",
        );
        if let Err(e) = stopped {
            tracing::warn!(error = %e, "cannot stop the dev database");
        }
    }

    /// Connection settings for one database of the cluster, over its Unix socket.
    pub fn pg_config(&self, dbname: &str) -> tokio_postgres::Config {
        socket_config(&self.socket_dir, dbname)
    }
}

/// The port the dev cluster runs on: Postgres's default, which only names its socket file, since
/// the cluster listens on no TCP address.
const DEV_PORT: u16 = 5432;

fn socket_config(socket_dir: &Path, dbname: &str) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    #[cfg(unix)]
    config.host_path(socket_dir);
    // No cluster of dev's own runs here (see DevCluster::prepare): the name only completes the
    // settings.
    #[cfg(not(unix))]
    config.host(&socket_dir.display().to_string());
    config.port(DEV_PORT).user(DEV_USER).dbname(dbname);
    config
}

/// Why the dev cluster under a data dir cannot be used by a command run beside `relay-server dev`.
#[derive(Debug, thiserror::Error)]
pub enum DevClusterError {
    #[error("no dev database under {dir}: start one with `{start}`, or give --database-url/DATABASE_URL")]
    Missing { dir: String, start: String },
    #[error("the dev database under {dir} is not running: start it with `{start}` and run this while it serves")]
    NotRunning { dir: String, start: String },
    #[error("cannot look into {dir} ({source}): run this as the user that runs `relay-server dev`, or as root")]
    Unreadable { dir: String, source: std::io::Error },
}

/// Connection settings for the relay database of the dev cluster under `data_dir`, which a running
/// `relay-server dev` keeps up. This never starts the cluster: stopping it again afterwards could
/// pull it from under a dev server that began reusing it meanwhile. `start` is the command that
/// starts it, for the error.
pub fn running_dev_cluster(data_dir: &Path, start: &str) -> Result<tokio_postgres::Config, DevClusterError> {
    let dir = data_dir.display().to_string();
    let exists =
        |path: PathBuf| path.try_exists().map_err(|source| DevClusterError::Unreadable { dir: dir.clone(), source });
    if !exists(data_dir.join("pg").join("PG_VERSION"))? {
        return Err(DevClusterError::Missing { dir, start: start.to_owned() });
    }
    // Postgres makes its socket file when it starts and removes it when it stops.
    let socket_dir = data_dir.join("run");
    if !exists(socket_dir.join(format!(".s.PGSQL.{DEV_PORT}")))? {
        return Err(DevClusterError::NotRunning { dir, start: start.to_owned() });
    }
    Ok(socket_config(&socket_dir, DEV_DATABASE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn install(root: &Path, bin: &str) {
        let bin = root.join(bin);
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join(program("pg_ctl")), "").unwrap();
    }

    #[test]
    fn the_newest_postgres_a_package_installed_is_found() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(newest_install(root.path()), None, "nothing installed");
        install(root.path(), "opt/homebrew/opt/postgresql@15/bin");
        install(root.path(), "Applications/Postgres.app/Contents/Versions/17/bin");
        install(root.path(), "opt/homebrew/opt/postgresql@16/bin");
        // A directory without pg_ctl (a client-only package) is passed over.
        std::fs::create_dir_all(root.path().join("usr/lib/postgresql/18/bin")).unwrap();
        let found = newest_install(root.path()).unwrap();
        assert_eq!(found, root.path().join("Applications/Postgres.app/Contents/Versions/17/bin"));
        install(root.path(), "usr/lib/postgresql/18/bin");
        assert_eq!(newest_install(root.path()).unwrap(), root.path().join("usr/lib/postgresql/18/bin"));
        // Postgres.app's `latest` link and Homebrew's unversioned formula name no version.
        install(root.path(), "Applications/Postgres.app/Contents/Versions/latest/bin");
        install(root.path(), "usr/local/opt/postgresql/bin");
        assert_eq!(newest_install(root.path()).unwrap(), root.path().join("usr/lib/postgresql/18/bin"));
    }

    #[test]
    fn postgres_on_path_is_found_and_none_at_all_is_explained() {
        let root = tempfile::tempdir().unwrap();
        let none = find_bin_dir(root.path(), std::ffi::OsStr::new("")).unwrap_err().to_string();
        assert!(none.contains(INSTALL_HINT) && none.contains("--pg-bin"), "{none}");
        install(root.path(), "usr/local/bin");
        let path = std::env::join_paths([root.path().join("nothing"), root.path().join("usr/local/bin")]).unwrap();
        assert_eq!(
            find_bin_dir(root.path(), &path).unwrap(),
            root.path().join("usr/local/bin").canonicalize().unwrap()
        );
    }
}
