//! The server image as deploy/Dockerfile builds it, run: built with podman on the local Debian base
//! (tests/container/server-image.sh), started against the test run's Postgres container, asked for
//! readiness on its ops port and by its own health check, and used by bridges on this machine to
//! send and receive.
//!
//! Slow the first time (a release build inside a container), so it runs when asked:
//! `./test --slow`, or `cargo test -p relay-tests --test it -- --ignored image::`.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use relay_tests::http::get;
use relay_tests::mcp::{bridge, text};
use relay_tests::pg::TestDb;
use relay_tests::pg::container::{self, LIMITS};
use relay_tests::process::{COMMAND_LIMIT, RunWithin};
use relay_tests::{eventually, free_port};
use serde_json::json;

/// A cold build of the image: the dependencies and the server, optimized across crates.
const BUILD_LIMIT: Duration = Duration::from_secs(90 * 60);
/// From `podman run` to a ready server: migrations included.
const READY_LIMIT: Duration = Duration::from_secs(120);

/// The server's container, removed when the test ends however it ends (a test run that is killed
/// leaves it labelled with the run, for the next run's sweep).
struct Running {
    name: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "2", &self.name], &[]);
    }
}

/// `podman ARGS` with `env` set for podman itself (so that `-e NAME` passes a value without
/// putting it on a command line).
fn podman(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("podman")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .expect("run podman (./test installs it)")
}

fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn build_image() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("container/server-image.sh");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output_within(BUILD_LIMIT)
        .expect("run tests/container/server-image.sh");
    ok(out, "build the server image")
}

#[tokio::test]
#[ignore = "slow: builds the server image (a release build in a container); ./test --slow runs it"]
async fn the_server_image_runs_against_postgres_and_bridges_talk_through_it() {
    let db = TestDb::on_container().await;
    let image = tokio::task::spawn_blocking(build_image).await.unwrap();

    let (port, ops_port) = (free_port(), free_port());
    let name = format!("relay-image-test-{}", std::process::id());
    let label = format!("{}={}", container::RUN_LABEL, container::this_run());
    let (listen, ops) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{ops_port}"));
    let env = [("DATABASE_URL", db.url.as_str()), ("RELAY_LISTEN", &listen), ("RELAY_OPS_LISTEN", &ops)];
    // The host's network: the database's published port is on this machine's loopback, and the
    // server listens on loopback only (plaintext is refused anywhere else).
    let mut run = vec!["run", "-d", "--name", &name, "--label", &label, "--network", "host"];
    run.extend_from_slice(&LIMITS);
    run.extend_from_slice(&["-e", "DATABASE_URL", "-e", "RELAY_LISTEN", "-e", "RELAY_OPS_LISTEN", &image]);
    let started = podman(&run, &env);
    let _running = Running { name: name.clone() };
    ok(started, "start the server image");

    let logs = || String::from_utf8_lossy(&podman(&["logs", &name], &[]).stderr).into_owned();
    eventually(READY_LIMIT, "the image's server to answer /readyz with 200", || {
        let ops = ops.clone();
        async move { (get(&ops, "/readyz").await? == (200, "ready\n".to_owned())).then_some(()) }
    })
    .await;
    let user = ok(podman(&["inspect", "--format", "{{.Config.User}}", &name], &[]), "inspect the container");
    assert_eq!(user, "10001:10001", "the server runs unprivileged");
    let health = podman(&["healthcheck", "run", &name], &[]);
    assert!(
        health.status.success(),
        "the image's own health check: {}\n{}",
        String::from_utf8_lossy(&health.stderr),
        logs()
    );

    // Accounts and machines through the image's admin command, as an operator would.
    let admin = |args: &[&str]| {
        // A one-off command: the image's health check is for the server.
        let mut all = vec!["run", "--rm", "--no-healthcheck", "--network", "host", "-e", "DATABASE_URL"];
        all.extend_from_slice(&LIMITS);
        all.extend_from_slice(&[&image, "admin"]);
        all.extend_from_slice(args);
        ok(podman(&all, &env[..1]), &format!("admin {args:?}"))
    };
    admin(&["account", "create", "acme"]);
    let (laptop, ci) = (admin(&["machine", "add", "acme/laptop"]), admin(&["machine", "add", "acme/ci"]));

    let url = format!("http://{listen}");
    let mut alice = bridge(&url, &laptop, "alice");
    let mut bob = bridge(&url, &ci, "bob");
    alice.initialize("2025-06-18").await;
    bob.initialize("2025-06-18").await;
    alice.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "built, run, and answering" })).await;
    let inbox = bob.tool_ok("relay_inbox", json!({ "wait_s": 10, "ack": true })).await;
    let messages = inbox["structuredContent"]["messages"].as_array().cloned().unwrap_or_default();
    assert!(
        messages.iter().any(|m| {
            m["from"] == "acme/laptop/alice"
                && m["body"].as_str().unwrap_or_default().contains("built, run, and answering")
        }),
        "bob's inbox: {}\nserver log:\n{}",
        text(&inbox),
        logs()
    );
    bob.tool_ok("relay_send", json!({ "to": "laptop/alice", "body": "heard you" })).await;
    let inbox = alice.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    assert!(text(&inbox).contains("heard you"), "alice's inbox: {}", text(&inbox));
}
