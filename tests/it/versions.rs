//! Bridge and server state their releases at `Hello` (and `CheckMachine`): a bridge one release
//! older or newer works; outside that window each side says so, naming both versions and the
//! command that mends it, and nothing else happens.

use std::process::{Command, Stdio};

use relay_proto::release::{Release, VERSION};
use relay_proto::v1::{CheckMachineRequest, HelloRequest};
use relay_tests::client::{channel, client};
use relay_tests::mcp::{BridgeSpec, text};
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithin};
use relay_tests::server::Server;
use relay_tests::{bin, fake_relay};
use serde_json::json;
use tonic::Code;

/// A version `steps` releases from this build's (negative: older).
fn release(steps: i64) -> String {
    let this = Release::parse(VERSION).expect("the build's version");
    let minor = this.minor as i64 + steps;
    assert!(minor >= 0, "no release {steps} from {VERSION}");
    format!("{}.{minor}.0", this.major)
}

#[tokio::test]
async fn a_bridge_one_release_either_side_is_taken_and_one_further_is_told_why_not() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let token = server.machine("acme", "laptop");
    let mut rpc = client(channel(&server.url).await, &token);

    // Its own release, the next, and an older one where there is one; a client that does not say.
    let mut taken = vec![VERSION.to_owned(), release(1), String::new()];
    if Release::parse(VERSION).unwrap().minor > 0 {
        taken.push(release(-1));
    }
    for (n, version) in taken.iter().enumerate() {
        let hello = HelloRequest { handle: format!("ok-{n}"), client_version: version.clone(), ..Default::default() };
        let reply = rpc.hello(hello).await.unwrap_or_else(|s| panic!("{version:?} refused: {}", s.message()));
        assert_eq!(reply.into_inner().server_version, VERSION, "the server states its release");
        let checked = rpc.check_machine(CheckMachineRequest { client_version: version.clone() }).await.unwrap();
        let checked = checked.into_inner();
        assert_eq!(checked.server_version, VERSION);
        let skew = checked.server_time_ms - chrono_ms();
        assert!(skew.abs() < 60_000, "the server's clock is told: {skew} ms off");
    }

    // Two releases newer: refused before anything is claimed, both versions and the mend named.
    let too_new = release(2);
    let hello = HelloRequest { handle: "too-new".into(), client_version: too_new.clone(), ..Default::default() };
    let refused = rpc.hello(hello).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    let said = refused.message();
    assert!(said.contains(&format!("agent-bridge {too_new} is too new for relay-server {VERSION}")), "{said}");
    assert!(said.contains(&format!("/download/v{VERSION}/agent-bridge-installer.sh | sh")), "{said}");
    let checked = rpc.check_machine(CheckMachineRequest { client_version: too_new.clone() }).await.unwrap_err();
    assert_eq!((checked.code(), checked.message()), (Code::FailedPrecondition, said));
    let claimed = db.sql().await.query("select 1 from endpoints where handle = 'too-new'", &[]).await.unwrap();
    assert!(claimed.is_empty(), "no endpoint was claimed");
}

fn chrono_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[tokio::test]
async fn the_real_bridge_is_told_it_is_too_old_for_a_server_two_releases_on() {
    let newer = release(2);
    let url = fake_relay::serve(&newer).await;
    let home = tempfile::tempdir().unwrap();

    // login checks the token: it says why it cannot work with that server, and writes nothing.
    let (dir, login_url) = (home.path().to_path_buf(), url.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin("agent-bridge"))
            .args(["login", "--server", &login_url])
            .env("HOME", &dir)
            .env("RELAY_TOKEN", "rlm_standin")
            .env_remove("RELAY_CONFIG")
            .stdin(Stdio::null())
            .output_within(COMMAND_LIMIT)
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let told = format!("agent-bridge {VERSION} is too old for relay-server {newer}");
    assert!(said.contains(&told) && said.contains("latest/download/agent-bridge-installer.sh | sh"), "{said}");
    assert!(said.contains("agent-bridge-installer.ps1 | iex"), "the Windows command too: {said}");
    assert!(!home.path().join(".config").exists(), "no config was written");

    // An agent's bridge: its tools say the same, as a refusal the model can act on.
    let mut bridge = relay_tests::mcp::Bridge::start(BridgeSpec {
        server: &url,
        token: "rlm_standin",
        handle: Some("alice"),
        channels: false,
    });
    bridge.initialize("2025-06-18").await;
    let result = bridge.tool("relay_whoami", json!({})).await;
    assert_eq!(result["isError"], true);
    assert!(text(&result).contains(&told), "{}", text(&result));
}

/// `buf breaking` on a module at `dir` against the released API's image; its output when it fails.
fn breaking(dir: &std::path::Path) -> Result<(), String> {
    let released = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/released/relay-v1.binpb");
    let out = Command::new(relay_tests::npm::tool("buf"))
        .arg("breaking")
        .arg(dir)
        .arg("--against")
        .arg(&released)
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .expect("run buf");
    if out.status.success() {
        return Ok(());
    }
    Err(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn relay_v1_keeps_every_promise_of_the_released_api() {
    let proto = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    breaking(&proto).unwrap_or_else(|said| panic!("relay.v1 breaks the released API:\n{said}"));

    // The check can fail: the same module with a released field renumbered is refused, naming it.
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(proto.join("buf.yaml"), copy.path().join("buf.yaml")).unwrap();
    std::fs::create_dir_all(copy.path().join("relay/v1")).unwrap();
    let source = std::fs::read_to_string(proto.join("relay/v1/relay.proto")).unwrap();
    let changed = source.replacen("string spawn_grant = 4;", "string spawn_grant = 7;", 1);
    assert_ne!(changed, source, "the field to renumber is in relay.proto");
    std::fs::write(copy.path().join("relay/v1/relay.proto"), changed).unwrap();
    let said = breaking(copy.path()).expect_err("a renumbered field breaks the API");
    assert!(said.contains("HelloRequest") && said.contains("spawn_grant"), "{said}");
}
