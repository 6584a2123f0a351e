//! `relay.v1` from the gRPC clients people write against it, as published and with their default
//! options — gRPC's C core (Python's `grpcio`) and `@grpc/grpc-js` — run at full rate without being
//! ended by the server's flood defense: an agent receives a burst of 5,000 pushes on its Subscribe
//! stream, and makes 2,000 serial calls with the stream open (the call rates raised for the test).
//! Such clients return flow-control window as data arrives and probe the bandwidth with PINGs while
//! it flows; the server counts only control frames that come without data.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::StreamExt;
use relay_tests::client::Agent;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

const BURST: usize = 5_000;
const SERIAL: usize = 2_000;
/// Longest either part may take (a debug build of the server, two cores shared with the client).
const LIMIT: Duration = Duration::from_secs(240);

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The Python of `target/grpc-venv` (tests/grpc/requirements.txt).
fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| relay_tests::venv::made("grpc-venv", "grpc/requirements.txt").join("bin/python")).clone()
}

/// The Node.js with which `./test` runs the real clients (22 or later).
fn node() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("node");
    cmd.env("PATH", relay_tests::clients::agent_path());
    cmd
}

/// One of the stock clients.
#[derive(Clone, Copy, Debug)]
enum Stock {
    CCore,
    GrpcJs,
}

impl Stock {
    fn command(self) -> tokio::process::Command {
        match self {
            Stock::CCore => {
                let mut cmd = tokio::process::Command::new(python());
                cmd.arg(tests_dir().join("grpc/relay_client.py"));
                cmd
            }
            Stock::GrpcJs => {
                // The packages come with the test tools (tests/tools, target/tools).
                let tool = relay_tests::npm::tool("buf");
                let modules = tool.parent().and_then(Path::parent).unwrap().to_path_buf();
                let mut cmd = node();
                cmd.arg(tests_dir().join("grpc/relay_client.mjs")).env("RELAY_NODE_MODULES", modules);
                cmd
            }
        }
    }
}

/// Starts the stock client as `handle` with `args`; returns it once its push stream is open.
async fn start(stock: Stock, server: &Server, token: &str, handle: &str, args: &[&str]) -> Running {
    let address = server.url.trim_start_matches("http://").to_owned();
    let mut child = stock
        .command()
        .arg(&address)
        .arg(handle)
        .args(args)
        .env("RELAY_TOKEN", token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start the {stock:?} client: {e}"));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(LIMIT, lines.next_line()).await.expect("the client starts").unwrap();
    assert_eq!(first.as_deref(), Some("subscribed"), "{stock:?}: {first:?}");
    Running { child, lines }
}

struct Running {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Running {
    /// The client's summary, once it ends.
    async fn outcome(mut self) -> Value {
        let line = tokio::time::timeout(LIMIT, self.lines.next_line()).await.expect("the client ends").unwrap();
        let status = self.child.wait().await.unwrap();
        let mut stderr = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut self.child.stderr.take().unwrap(), &mut stderr).await.unwrap();
        assert!(status.success(), "the client failed ({status}): {stderr}");
        serde_json::from_str(line.as_deref().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {line:?} {stderr}"))
    }
}

async fn runs_at_full_rate(stock: Stock) {
    // The test's own rates and inbox: far above an agent's.
    let env = [
        ("RELAY_MAX_UNREAD", "100000"),
        ("RELAY_SEND_RATE_PER_ENDPOINT", "0"),
        ("RELAY_SEND_RATE_PER_ACCOUNT", "0"),
        ("RELAY_DELIVERY_RATE_PER_ACCOUNT", "0"),
        ("RELAY_CALL_RATE_PER_CREDENTIAL", "0"),
        ("RELAY_CALL_RATE_PER_ACCOUNT", "0"),
    ];
    let db = TestDb::new().await;
    let server = Server::start_with_env(&db, relay_tests::free_port(), &env).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");

    // A burst of pushes to the stock client's push stream.
    let count = BURST.to_string();
    let seconds = LIMIT.as_secs().to_string();
    let receiver = start(stock, &server, &laptop, "stock", &["receive", &count, &seconds]).await;
    let sender = Agent::hello(&server.url, &ci, "burst").await.unwrap();
    let sends = (0..BURST).map(|n| {
        let mut rpc = sender.rpc.clone();
        async move {
            let request = relay_proto::v1::SendRequest {
                to: vec!["laptop/stock".into()],
                body: format!("push {n}"),
                client_id: format!("burst-{n}"),
                ..Default::default()
            };
            rpc.send(request).await.map(|_| ())
        }
    });
    let sent: Vec<_> = futures_util::stream::iter(sends).buffer_unordered(32).collect().await;
    assert!(sent.iter().all(Result::is_ok), "every send of the burst is taken: {:?}", sent.iter().find(|r| r.is_err()));
    let received = receiver.outcome().await;
    assert_eq!(received["error"], Value::Null, "{stock:?} was ended while receiving: {received}");
    assert_eq!(received["received"], BURST, "{stock:?} received the whole burst: {received}");

    // Serial calls with the push stream open.
    let count = SERIAL.to_string();
    let caller = start(stock, &server, &laptop, "serial", &["send", "ci/burst", &count, &seconds]).await;
    let called = caller.outcome().await;
    assert_eq!(called["error"], Value::Null, "{stock:?} was ended while calling: {called}");
    assert_eq!(called["sent"], SERIAL, "{stock:?} made every call: {called}");
    assert_eq!(called["stream_open"], true, "{stock:?}'s push stream stayed open: {called}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_c_core_runs_at_full_rate_without_being_ended() {
    runs_at_full_rate(Stock::CCore).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_js_runs_at_full_rate_without_being_ended() {
    runs_at_full_rate(Stock::GrpcJs).await;
}
