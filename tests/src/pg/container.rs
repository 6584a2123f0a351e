//! `RELAY_TEST_POSTGRES=container`: one Postgres container per test run, shared by the run's test
//! binaries, removed when the run ends however it ends.
//!
//! A run is the process that started the test binaries (cargo or nextest): the container is named
//! after it, made by whichever binary comes first, and watched by a reaper in a session of its own
//! (so Ctrl-C, which signals the terminal's process group, does not reach it) that removes the
//! container once the run's process is gone. Containers whose run is gone without its reaper (both
//! killed outright) are swept when the next run starts one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::{COMMAND_LIMIT, INSTALL_LIMIT, RunWithin};

/// The image the container runs, built locally from `tests/container/postgres.Containerfile` and
/// tagged by its content, so a changed file makes a new image rather than running a stale one.
/// Limits every container the tests start asks for: the engine's defaults (a million files, as many
/// processes) are more than a runtime without CAP_SYS_RESOURCE may set, and then no container starts.
pub const LIMITS: [&str; 4] = ["--ulimit", "nofile=8192:8192", "--ulimit", "nproc=16384:16384"];

pub fn image() -> &'static str {
    static IMAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IMAGE.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let file = std::fs::read(source_dir().join("postgres.Containerfile")).expect("postgres.Containerfile");
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        file.hash(&mut hash);
        format!("localhost/relay-test-postgres:15-{:016x}", hash.finish())
    })
}
/// The label every test container carries: the run's process as `PID:START`.
pub const RUN_LABEL: &str = "relay-test-run";
/// The label naming the loopback port the run's Postgres listens on.
const PORT_LABEL: &str = "relay-test-port";

/// podman or docker, whichever answers (a docker client without a daemon does not).
pub fn engine() -> &'static str {
    static ENGINE: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        ["podman", "docker"]
            .into_iter()
            .find(|e| {
                Command::new(e)
                    .arg("info")
                    .stdin(Stdio::null())
                    .output_within(COMMAND_LIMIT)
                    .is_ok_and(|o| o.status.success())
            })
            .expect("RELAY_TEST_POSTGRES=container needs podman or docker (./test installs podman)")
    })
}

/// `ENGINE ARGS`, its output checked; stdout trimmed.
pub fn run(args: &[&str]) -> String {
    let out = Command::new(engine())
        .args(args)
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .expect("run the container engine");
    assert!(out.status.success(), "{} {args:?} failed: {}", engine(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The run this process belongs to: its parent, as `PID:START` (the start time tells a reused pid apart).
pub fn this_run() -> String {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() } as u32;
    run_key(parent).expect("the test run's process")
}

/// `PID:START` for a live process, `None` once it is gone.
pub fn run_key(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start at the last ')'; start time is field 22.
    let start = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?;
    Some(format!("{pid}:{start}"))
}

/// The containers test runs have started, with their run labels.
pub fn test_containers() -> Vec<(String, String)> {
    // The two engines name a label differently in their templates.
    let label = match engine() {
        "podman" => format!("{{{{index .Labels \"{RUN_LABEL}\"}}}}"),
        _ => format!("{{{{.Label \"{RUN_LABEL}\"}}}}"),
    };
    let listed =
        run(&["ps", "-a", "--filter", &format!("label={RUN_LABEL}"), "--format", &format!("{{{{.Names}}}} {label}")]);
    listed.lines().filter_map(|l| l.split_once(' ')).map(|(n, r)| (n.to_owned(), r.to_owned())).collect()
}

/// The Postgres of this test run: started if this is the run's first binary; `host=… port=…`.
pub fn start() -> String {
    let run_id = this_run();
    let name = name_of(&run_id);
    let lock_path = std::env::temp_dir().join(format!("{name}.lock"));
    let lock = std::fs::File::create(&lock_path).expect("the run's lock file");
    flock(&lock);
    sweep();
    let running = Command::new(engine())
        .args(["container", "inspect", "--format", "{{.State.Running}}", &name])
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"true"));
    if !running {
        ensure_image();
        let mut args = vec!["run", "-d", "--rm", "--name", &name, "--label"];
        let label = format!("{RUN_LABEL}={run_id}");
        args.push(&label);
        args.extend(LIMITS);
        // The host's network and its loopback only: no published port and no network of the
        // engine's own, which nested engines (a container in a container) and rootless ones do not
        // all provide. Trust is then open to this machine's users alone.
        let port = crate::free_port().to_string();
        let (port_label, port_setting) = (format!("{PORT_LABEL}={port}"), format!("port={port}"));
        args.extend(["--label", &port_label, "--network", "host", image()]);
        args.extend(["-c", "listen_addresses=127.0.0.1", "-c", &port_setting]);
        run(&args);
        reap_when_gone(&run_id, &name, &lock_path);
        eprintln!("postgres for this test run: container {name} ({} {}) on 127.0.0.1:{port}", engine(), image());
    }
    let port =
        run(&["container", "inspect", "--format", &format!("{{{{index .Config.Labels \"{PORT_LABEL}\"}}}}"), &name]);
    assert!(port.parse::<u16>().is_ok(), "container {name} names no port: {port:?}");
    format!("host=127.0.0.1 port={port} user=postgres")
}

/// Removes the containers (and lock files) of runs that are gone: their reaper killed too, or the
/// machine rebooted.
fn sweep() {
    let gone = |run_id: &str| {
        let pid = run_id.split(':').next().and_then(|p| p.parse().ok());
        pid.and_then(run_key).as_deref() != Some(run_id)
    };
    for (name, run_id) in test_containers() {
        if gone(&run_id) {
            let _ = Command::new(engine())
                .args(["rm", "-f", "-t", "0", &name])
                .stdin(Stdio::null())
                .output_within(COMMAND_LIMIT);
        }
    }
    for entry in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let run_id =
            file.strip_prefix("relay-test-pg-").and_then(|f| f.strip_suffix(".lock")).and_then(|r| r.split_once('-'));
        if let Some((pid, start)) = run_id
            && gone(&format!("{pid}:{start}"))
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The container name of run `run_id`.
pub fn name_of(run_id: &str) -> String {
    format!("relay-test-pg-{}", run_id.replace(':', "-"))
}

/// A process in a session of its own that removes `name` (and the run's lock file) once the run's
/// process `run_id` ends.
#[expect(clippy::zombie_processes, reason = "the reaper outlives this process on purpose; init reaps it")]
fn reap_when_gone(run_id: &str, name: &str, lock: &Path) {
    use std::os::unix::process::CommandExt;
    let pid = run_id.split(':').next().unwrap();
    let script = r#"tail --pid="$1" -f /dev/null; rm -f "$4"; exec "$2" rm -f -t 0 "$3""#;
    let mut reaper = Command::new("sh");
    reaper
        .args(["-c", script, "sh", pid, engine(), name])
        .arg(lock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe and touches nothing of the parent's.
    unsafe {
        reaper.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    reaper.spawn().expect("start the container's reaper");
}

/// Builds [`image`] (and the Debian base under it) when it is not there yet, saying so.
fn ensure_image() {
    let lock =
        std::fs::File::create(std::env::temp_dir().join("relay-test-pg-image.lock")).expect("the image lock file");
    flock(&lock);
    let present =
        Command::new(engine()).args(["image", "inspect", image()]).stdin(Stdio::null()).output_within(COMMAND_LIMIT);
    if present.is_ok_and(|o| o.status.success()) {
        return;
    }
    let dir = source_dir();
    eprintln!(
        "building {} from Debian's postgresql package ({}), once",
        image(),
        dir.join("postgres.Containerfile").display()
    );
    let base = Command::new(dir.join("debian-base.sh"))
        .arg(engine())
        .stdin(Stdio::null())
        .output_within(INSTALL_LIMIT)
        .expect("run tests/container/debian-base.sh");
    assert!(base.status.success(), "the Debian base image: {}", String::from_utf8_lossy(&base.stderr));
    let built = Command::new(engine())
        // The host's network: an engine inside a container may have none of its own that reaches the mirror.
        .args(["build", "-q", "--network", "host", "-t", image(), "-f"])
        .arg(dir.join("postgres.Containerfile"))
        .arg(&dir)
        .stdin(Stdio::null())
        .output_within(INSTALL_LIMIT)
        .expect("run the image build");
    assert!(built.status.success(), "building {}: {}", image(), String::from_utf8_lossy(&built.stderr));
}

/// tests/container in the source tree.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("container")
}

fn flock(file: &std::fs::File) {
    // SAFETY: flock on a descriptor we own; released when the file closes.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(file), libc::LOCK_EX) };
    assert_eq!(locked, 0, "lock {file:?}");
}

/// Waits up to `limit` for `name` to be gone; whether it is.
pub fn gone_within(name: &str, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if !test_containers().iter().any(|(n, _)| n == name) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}
