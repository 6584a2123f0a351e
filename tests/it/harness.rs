//! The harness's own promises: a Postgres container of a test run is removed when the run ends,
//! however it ends.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use relay_tests::pg::TestDb;
use relay_tests::pg::container::{self, gone_within, name_of, run_key, test_containers};
use relay_tests::process::RunWithin;
use relay_tests::signal;

/// How long a container may outlive its run.
const REMOVED_WITHIN: Duration = Duration::from_secs(30);

/// A test run of one test binary (this one, running [`holds_a_container_database`]) under a shell
/// standing in for cargo, in a process group of its own as a terminal's foreground job is.
struct Run {
    shell: Child,
    container: String,
}

impl Run {
    fn start() -> Self {
        use std::os::unix::process::CommandExt;
        let mut shell = Command::new("sh")
            // `; :` keeps the shell as the helper's parent, as cargo is a test binary's.
            .args(["-c", r#""$0" --exact harness::holds_a_container_database --ignored --nocapture; :"#])
            .arg(std::env::current_exe().unwrap())
            .env("RELAY_TEST_POSTGRES", "container")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("start a test run");
        let run_id = run_key(shell.id()).expect("the run's shell");
        let container = name_of(&run_id);
        // The helper says when its database is made (the first run may build the image).
        let (said, lines) = std::sync::mpsc::channel();
        let stdout = shell.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = said.send(line);
            }
        });
        let ready =
            std::iter::from_fn(|| lines.recv_timeout(Duration::from_secs(600)).ok()).any(|l| l.starts_with("holding "));
        assert!(ready, "the helper run did not make its database within 10 minutes");
        assert!(
            test_containers().iter().any(|(n, r)| *n == container && *r == run_id),
            "the run's container {container} is listed with its run: {:?}",
            test_containers()
        );
        Self { shell, container }
    }

    /// The processes whose command line names this run's container: its reaper.
    fn reaper(&self) -> Vec<u32> {
        let pids =
            std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
        pids.filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let line = String::from_utf8_lossy(&c).replace('\0', " ");
                line.starts_with("sh -c ") && line.contains(&self.container)
            })
        })
        .collect()
    }

    fn kill_group(&mut self, sig: i32) {
        // SAFETY: killpg takes a process group id and a signal and touches no memory of ours.
        assert_eq!(unsafe { libc::killpg(self.shell.id() as i32, sig) }, 0, "signal the run's process group");
        relay_tests::process::wait_within(&mut self.shell, REMOVED_WITHIN, "the run's shell");
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // SAFETY: as above; the group may be gone already.
        unsafe { libc::killpg(self.shell.id() as i32, libc::SIGKILL) };
        let _ = self.shell.wait();
        let _ = Command::new(container::engine())
            .args(["rm", "-f", "-t", "0", &self.container])
            .stdin(Stdio::null())
            .output_within(relay_tests::process::COMMAND_LIMIT);
    }
}

#[test]
fn a_test_runs_container_is_removed_when_the_run_is_interrupted_killed_or_dies_with_its_reaper() {
    // Ctrl-C: the terminal signals the whole foreground group, test binaries and cargo alike.
    let mut interrupted = Run::start();
    interrupted.kill_group(libc::SIGINT);
    assert!(gone_within(&interrupted.container, REMOVED_WITHIN), "an interrupted run left {}", interrupted.container);

    // The run's process killed outright while its test binary goes on.
    let mut killed = Run::start();
    assert!(signal(killed.shell.id(), libc::SIGKILL));
    relay_tests::process::wait_within(&mut killed.shell, REMOVED_WITHIN, "the killed shell");
    assert!(gone_within(&killed.container, REMOVED_WITHIN), "a killed run left {}", killed.container);

    // Everything killed at once, the reaper too: the next run sweeps the orphan away.
    let mut orphaned = Run::start();
    let reapers = orphaned.reaper();
    assert_eq!(reapers.len(), 1, "one reaper watches the run");
    assert!(signal(reapers[0], libc::SIGKILL));
    orphaned.kill_group(libc::SIGKILL);
    assert!(!gone_within(&orphaned.container, Duration::from_secs(2)), "with no reaper the container is still there");
    let next = Run::start();
    assert!(gone_within(&orphaned.container, REMOVED_WITHIN), "the next run did not sweep {}", orphaned.container);
    drop(next);
}

/// Run by the test above as a test run's binary: makes a database on the run's container, says so,
/// and holds it until its input ends.
#[tokio::test]
#[ignore = "a helper: started by a_test_runs_container_is_removed_when_…"]
async fn holds_a_container_database() {
    let db = TestDb::new().await;
    println!("holding {}", db.name);
    let mut line = String::new();
    let _ = tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line)).await;
}
