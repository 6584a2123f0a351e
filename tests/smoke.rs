//! The smoke test every platform runs (Linux, and the macOS and Windows CI runners): a dev server on
//! the machine's Postgres, a second machine's bridge logged in, two agents exchanging a message, a
//! hook finding its agent's session, and doctor passing the machine.
//!
//! `relay-server dev` starts its own Postgres cluster from the local server programs; with
//! `RELAY_SMOKE_DATABASE_URL` set (a Windows runner's Postgres service) it is given that database
//! instead. A `DATABASE_URL` of the environment is never used: the test makes accounts and tokens.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use relay_tests::bin;
use relay_tests::mcp::{Bridge, text};
use relay_tests::process::{COMMAND_LIMIT, RunWithin, wait_within};
use serde_json::json;

/// Longest the dev server may take to serve: a first run makes its cluster.
const SERVING: Duration = Duration::from_secs(120);

/// A running `relay-server dev`, stopped as an operator stops it when dropped (so it stops its
/// Postgres too).
struct Dev {
    child: Child,
    url: String,
}

impl Drop for Dev {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: kill takes a pid and a signal number and touches no memory of ours.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        #[cfg(not(unix))]
        let _ = self.child.kill();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test's own directory: readable by the postgres user, which runs the dev cluster when the
/// tests run as root.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("relay-smoke-").tempdir().unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

fn relay_server(args: &[&str], home: &Path) -> Command {
    let mut cmd = Command::new(bin("relay-server"));
    cmd.args(args).env("HOME", home).env("RELAY_LOG", "warn").env_remove("DATABASE_URL").stdin(Stdio::null());
    if let Some(url) = std::env::var_os("RELAY_SMOKE_DATABASE_URL").filter(|u| !u.is_empty()) {
        cmd.env("DATABASE_URL", url);
    }
    cmd
}

fn agent_bridge(args: &[&str], home: &Path, config: &Path) -> Command {
    let mut cmd = Command::new(bin("agent-bridge"));
    cmd.args(args)
        .env("HOME", home)
        .env("RELAY_CONFIG", config)
        .env_remove("RELAY_SERVER")
        .env_remove("RELAY_TOKEN")
        .env_remove("RELAY_SESSION_DIR")
        .env_remove("RELAY_SESSION_FILE");
    cmd
}

/// What `child` said and how it ended, killed (and the test failed) past [`COMMAND_LIMIT`].
fn finish(mut child: Child, what: &str) -> Output {
    wait_within(&mut child, COMMAND_LIMIT, what);
    child.wait_with_output().unwrap()
}

fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Starts `relay-server dev` on a free port and waits until it says it serves.
fn dev(dir: &Path, home: &Path, config: &Path) -> Dev {
    let port = relay_tests::free_port();
    let log = dir.join("dev.log");
    let data = dir.join("data");
    let child = relay_server(&["dev", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"], home)
        .arg(&data)
        .env("RELAY_CONFIG", config)
        .env("RELAY_OPS_LISTEN", "off")
        .env("RELAY_CONSOLE_LISTEN", "off")
        .env("RELAY_MCP_LISTEN", "off")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start relay-server dev");
    let mut dev = Dev { child, url: format!("http://127.0.0.1:{port}") };
    let deadline = Instant::now() + SERVING;
    loop {
        let printed = std::fs::read_to_string(&log).unwrap_or_default();
        if printed.contains("relay dev server: ") {
            return dev;
        }
        if let Ok(Some(status)) = dev.child.try_wait() {
            panic!("relay-server dev ended ({status}):\n{printed}");
        }
        assert!(Instant::now() < deadline, "relay-server dev did not serve within {SERVING:?}:\n{printed}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_agents_on_two_machines_talk_and_a_hook_finds_its_session() {
    let dir = scratch();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let laptop = dir.path().join("laptop.toml");
    let dev = tokio::task::block_in_place(|| dev(dir.path(), &home, &laptop));
    assert!(laptop.exists(), "dev wrote this machine's bridge config");

    // A second machine: its token from admin, straight into its login's stdin.
    let data = dir.path().join("data");
    let added = relay_server(&["admin", "--data-dir"], &home)
        .arg(&data)
        .args(["machine", "add", "local/box2"])
        .output_within(COMMAND_LIMIT)
        .unwrap();
    assert!(added.status.success(), "admin machine add: {}", said(&added));
    let box2 = dir.path().join("box2.toml");
    let mut login = agent_bridge(&["login", "--server", &dev.url], &home, &box2)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut login.stdin.take().unwrap(), &added.stdout).unwrap();
    let login = finish(login, "agent-bridge login");
    assert!(login.status.success(), "login: {}", said(&login));
    assert!(said(&login).contains("logged in as machine local/box2"), "{}", said(&login));

    // Two agents, one on each machine, sharing this process as their agent (and one HOME).
    let shared = [("HOME", home.as_os_str())];
    let mut alice = Bridge::start_configured_with_env(&laptop, "alice", &shared);
    alice.initialize("2025-06-18").await;
    alice.tool_ok("relay_whoami", json!({})).await;
    let mut bob = Bridge::start_configured_with_env(&box2, "bob", &shared);
    bob.initialize("2025-06-18").await;
    assert!(text(&bob.tool_ok("relay_whoami", json!({})).await).contains("local/box2/bob"));

    let sent = alice.tool_ok("relay_send", json!({ "to": "box2/bob", "body": "the build is green" })).await;
    assert!(text(&sent).contains("box2/bob"), "{}", text(&sent));
    let inbox = bob.tool_ok("relay_inbox", json!({})).await;
    assert!(text(&inbox).contains("the build is green"), "{}", text(&inbox));

    // A hook this process starts finds the session of the bridge it runs that connected last
    // (bob's), through its process ancestry and the session files, and hands over unseen mail.
    alice.tool_ok("relay_send", json!({ "to": "box2/bob", "body": "one more thing" })).await;
    let mut hook = agent_bridge(&["hook", "cursor-stop"], &home, &dir.path().join("absent.toml"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut hook.stdin.take().unwrap(), b"{}").unwrap();
    let hooked = tokio::task::block_in_place(|| finish(hook, "the hook"));
    assert!(hooked.status.success(), "the hook: {}", said(&hooked));
    let answer: serde_json::Value = serde_json::from_slice(&hooked.stdout)
        .unwrap_or_else(|e| panic!("the hook's answer is JSON ({e}): {}", said(&hooked)));
    let notice = answer["followup_message"].as_str().unwrap_or_else(|| panic!("a follow-up: {answer}"));
    assert!(notice.contains("alice"), "the hook speaks for bob, of alice's message: {notice}");

    // doctor passes this machine (no client set up here: noted, not failed).
    let doctor = agent_bridge(&["doctor"], &home, &laptop)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .unwrap();
    assert!(doctor.status.success(), "doctor:\n{}", said(&doctor));
    assert!(said(&doctor).contains(&format!("ok    server {}", dev.url)), "{}", said(&doctor));

    drop((alice, bob));
    drop(dev);
}
