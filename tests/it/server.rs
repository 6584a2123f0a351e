//! The server as an operator runs it: replicas, revocation, shutdown, migrations, the dev default.

use std::process::{Command, Stdio};
use std::time::Duration;

use relay_proto::v1::*;
use relay_tests::client::{Agent, next_message};
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithin};
use relay_tests::server::{Server, admin, terminate, wait_serving};
use relay_tests::{bin, free_port};
use tonic::Code;

#[tokio::test]
async fn two_replicas_on_one_database_push_across() {
    let db = TestDb::new().await;
    // Both start at once: the migration lock makes one apply and the other wait.
    let (a, b) = tokio::join!(Server::start(&db), Server::start(&db));
    let laptop = a.machine("acme", "laptop");
    let ci = a.machine("acme", "ci");
    let mut alice = Agent::hello(&a.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&b.url, &ci, "bob").await.unwrap();

    let mut stream = bob.subscribe(0).await;
    for i in 0..3 {
        let sent = alice.send(&["ci/bob"], &format!("across {i}")).await.unwrap();
        let got = next_message(&mut stream, Duration::from_secs(5)).await;
        assert_eq!((got.id, got.seq), (sent.id, i + 1));
    }
    // And back: bob writes through replica b, alice polls replica a.
    let mut rpc = alice.rpc.clone();
    let poll = tokio::spawn(async move { rpc.inbox(InboxRequest { wait_s: 20, ack: true, limit: 0 }).await });
    bob.send(&["laptop/alice"], "back").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), poll).await.unwrap().unwrap().unwrap().into_inner();
    assert_eq!(got.messages[0].body, "back");
}

#[tokio::test]
async fn a_revoked_machine_is_refused_on_its_next_call() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let mut stream = bob.subscribe(0).await;
    alice.send(&["ci/bob"], "before").await.unwrap();
    assert_eq!(next_message(&mut stream, Duration::from_secs(5)).await.body, "before");

    server.admin_ok(&["machine", "revoke", "acme/ci"]);

    let refused = bob.rpc.who_am_i(WhoAmIRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    let hello = Agent::hello(&server.url, &ci, "bob").await.err().expect("a revoked machine token is refused");
    assert_eq!(hello.code(), Code::Unauthenticated);
    assert!(hello.message().contains("revoked"), "{}", hello.message());
    let gone = alice.send(&["ci/bob"], "after").await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "a revoked machine's endpoints are unreachable");

    // Its open stream ends by the next presence renewal at the latest.
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status.code()),
            }
        }
    })
    .await
    .expect("the stream of a revoked machine ends");
    assert_eq!(ended, Some(Code::Unauthenticated));

    // A re-added machine gets a new token; the old one stays dead.
    let fresh = server.admin_ok(&["machine", "add", "acme/ci"]);
    assert_ne!(fresh, ci);
    Agent::hello(&server.url, &fresh, "bob").await.unwrap();
    assert_eq!(Agent::hello(&server.url, &ci, "bob").await.err().unwrap().code(), Code::Unauthenticated);
    let garbage = Agent::hello(&server.url, "rlm_nonsense", "bob").await.err().unwrap();
    assert_eq!(garbage.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn admin_commands_report_errors_and_print_only_the_token() {
    let db = TestDb::new().await;
    let ok = admin(&db.url, &["account", "create", "acme"]);
    assert!(ok.status.success());
    let dup = admin(&db.url, &["account", "create", "acme"]);
    assert!(!dup.status.success());
    assert!(String::from_utf8_lossy(&dup.stderr).contains("already exists"));

    let added = admin(&db.url, &["machine", "add", "acme/laptop"]);
    assert!(added.status.success());
    let stdout = String::from_utf8(added.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "only the token on stdout: {stdout:?}");
    assert!(stdout.starts_with("rlm_"));
    let again = admin(&db.url, &["machine", "add", "acme/laptop"]);
    assert!(!again.status.success(), "an active machine is not silently re-keyed");

    for (args, expect) in [
        (&["machine", "add", "nobody/laptop"][..], "no account nobody"),
        (&["machine", "add", "acme"][..], "ACCOUNT/MACHINE"),
        (&["account", "create", "Bad_Name"][..], "invalid account name"),
        (&["machine", "revoke", "acme/ghost"][..], "no machine acme/ghost"),
        (&["contact", "add", "acme", "acme"][..], "its own contact"),
    ] {
        let out = admin(&db.url, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one clear line: {stderr}");
    }

    let no_db = Command::new(bin("relay-server"))
        .args(["admin", "account", "create", "x"])
        .env_remove("DATABASE_URL")
        .output_within(COMMAND_LIMIT)
        .unwrap();
    assert!(!no_db.status.success());
    assert!(String::from_utf8_lossy(&no_db.stderr).contains("DATABASE_URL"));
    let unreachable = admin("postgres://relay:secret-pw@127.0.0.1:1/relay", &["account", "create", "x"]);
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(!unreachable.status.success() && stderr.contains("cannot reach the database"), "{stderr}");
    assert!(!stderr.contains("secret-pw"), "the password never reaches output: {stderr}");
}

#[tokio::test]
async fn serve_refuses_plaintext_off_loopback_and_stops_gracefully() {
    let db = TestDb::new().await;
    let refused = Command::new(bin("relay-server"))
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env("DATABASE_URL", &db.url)
        .output_within(COMMAND_LIMIT)
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("refusing plaintext"));

    let mut server = Server::start(&db).await;
    let token = server.machine("acme", "laptop");
    let mut agent = Agent::hello(&server.url, &token, "alice").await.unwrap();
    let mut stream = agent.subscribe(0).await;
    let status = server.stop().await;
    assert!(status.success(), "SIGTERM ends the server cleanly even with a stream open: {status}");
    let end =
        tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = stream.message().await {} }).await;
    assert!(end.is_ok(), "open streams are closed at shutdown");
}

/// The board's and the scheduler's periods are settings like the others: on `--help` with their
/// environment variables, and a value out of range is refused before anything starts.
#[test]
fn the_periods_and_devs_postgres_are_settings_and_bad_values_are_refused() {
    let help = Command::new(bin("relay-server")).args(["serve", "--help"]).output_within(COMMAND_LIMIT).unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    for (flag, env) in [
        ("--approval-wait-s", "RELAY_APPROVAL_WAIT_S"),
        ("--lease-s", "RELAY_LEASE_S"),
        ("--pr-check-s", "RELAY_PR_CHECK_S"),
        ("--scheduler-tick-ms", "RELAY_SCHEDULER_TICK_MS"),
    ] {
        assert!(
            help.contains(flag) && help.contains(&format!("env: {env}=")),
            "{flag} ({env}) on serve --help:\n{help}"
        );
    }
    for (setting, value, why) in [
        ("RELAY_LEASE_S", "0.5", "at least 1 s"),
        ("RELAY_PR_CHECK_S", "soon", "is not a number of seconds"),
        ("RELAY_SCHEDULER_TICK_MS", "5", "10..=60000"),
        ("RELAY_APPROVAL_WAIT_S", "0", "1..=3600"),
    ] {
        let refused = Command::new(bin("relay-server"))
            .arg("serve")
            .env(setting, value)
            .env("DATABASE_URL", "host=127.0.0.1 port=1")
            .stdin(Stdio::null())
            .output_within(COMMAND_LIMIT)
            .unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{setting}={value} is refused");
        assert!(stderr.contains(why), "{setting}={value}: {stderr}");
    }

    // dev's Postgres programs are a setting too: a directory without them is refused, and nothing
    // is made.
    let empty = tempfile::tempdir().unwrap();
    let data = empty.path().join("data");
    let help = Command::new(bin("relay-server")).args(["dev", "--help"]).output_within(COMMAND_LIMIT).unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("env: RELAY_PG_BIN="), "dev --help names --pg-bin");
    let refused = Command::new(bin("relay-server"))
        .args(["dev", "--pg-bin"])
        .arg(empty.path())
        .arg("--data-dir")
        .arg(&data)
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("holds no pg_ctl"), "{stderr}");
    assert!(!data.exists(), "a refused dev makes no data dir");
}

#[tokio::test]
async fn migrate_is_idempotent() {
    let db = TestDb::new().await;
    for _ in 0..2 {
        let out = Command::new(bin("relay-server"))
            .arg("migrate")
            .env("DATABASE_URL", &db.url)
            .output_within(COMMAND_LIMIT)
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// The README's first command on a machine with nothing configured: a private cluster, the server,
/// and a bridge config that authenticates.
#[tokio::test]
async fn dev_runs_on_a_private_postgres_and_writes_the_bridge_config() {
    let home = tempfile::tempdir().unwrap();
    // Root's private cluster runs as postgres, which must reach the data directory.
    let data = tempfile::Builder::new().prefix("relay-dev-test-").tempdir_in("/tmp").unwrap();
    let config = home.path().join("bridge.toml");
    let port = free_port();
    let ops = format!("127.0.0.1:{}", free_port());
    let dev_server = || {
        Command::new(bin("relay-server"))
            .args(["dev", "--listen", &format!("127.0.0.1:{port}")])
            .env("RELAY_OPS_LISTEN", &ops)
            .arg("--data-dir")
            .arg(data.path().join("relay"))
            .env_remove("DATABASE_URL")
            .env("HOME", home.path())
            .env("RELAY_CONFIG", &config)
            .env("RELAY_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut dev = dev_server();
    let url = format!("http://127.0.0.1:{port}");
    wait_serving(&url).await;
    let ready = relay_tests::http::get(&ops, "/readyz").await;
    assert_eq!(ready, Some((200, "ready\n".to_owned())), "dev serves the ops port where it is told");

    let text = std::fs::read_to_string(&config).expect("the bridge config is written");
    let token = text.lines().find_map(|l| l.strip_prefix("token = \"")).unwrap().trim_end_matches('"').to_owned();
    assert!(text.contains(&format!("server = \"{url}\"")), "{text}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600);
    let agent = Agent::hello(&url, &token, "first").await.expect("the written token works");
    assert!(agent.address.starts_with("local/"), "{}", agent.address);

    assert!(terminate(&mut dev).await.success());

    // Running it again reuses the cluster, the data and the token.
    let mut again = dev_server();
    wait_serving(&url).await;
    assert_eq!(std::fs::read_to_string(&config).unwrap(), text, "a valid config is kept as it is");
    let mut resumed = Agent::hello(&url, &token, "second").await.unwrap();
    let listed = resumed.rpc.list(ListRequest { all: true, contacts: false }).await.unwrap().into_inner();
    assert!(listed.endpoints.iter().any(|e| e.handle == "first"), "data survives a restart");
    assert!(terminate(&mut again).await.success());
}

#[tokio::test]
async fn the_database_connection_takes_libpq_sslmodes_with_their_meaning() {
    let db = TestDb::new().await;
    let Some((url, ca)) = relay_tests::pg::tls_url(&db) else {
        eprintln!("skipped: the external DATABASE_URL server has no test certificate");
        return;
    };
    let migrate = |url: &str, ca: Option<&std::path::Path>| {
        let mut cmd = Command::new(bin("relay-server"));
        cmd.arg("migrate").env("DATABASE_URL", url).env_remove("RELAY_DB_CA");
        if let Some(ca) = ca {
            cmd.env("RELAY_DB_CA", ca);
        }
        let out = cmd.output_within(COMMAND_LIMIT).unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // The test certificate names localhost and is signed by a CA the system does not know.
    let with = |mode: &str, host: &str| {
        url.replace("sslmode=require", &format!("sslmode={mode}")).replace("host=localhost", &format!("host={host}"))
    };
    let (ok, said) = migrate(&with("require", "localhost"), None);
    assert!(ok, "require encrypts without checking the certificate, as libpq: {said}");
    let (ok, said) = migrate(&with("verify-full", "localhost"), None);
    assert!(!ok && said.contains("cannot reach the database"), "an unknown CA is refused: {said}");
    let (ok, said) = migrate(&format!("{} sslrootcert={}", with("verify-full", "localhost"), ca.display()), None);
    assert!(ok, "sslrootcert names the CA: {said}");
    let (ok, said) = migrate(&with("verify-full", "127.0.0.1"), Some(&ca));
    assert!(!ok && said.contains("cannot reach the database"), "verify-full checks the host name: {said}");
    let (ok, said) = migrate(&with("verify-ca", "127.0.0.1"), Some(&ca));
    assert!(ok, "verify-ca checks the chain only: {said}");
    let (ok, said) = migrate(&with("require", "127.0.0.1"), Some(&ca));
    assert!(ok, "require with a CA checks the chain, as libpq: {said}");
    let (ok, said) = migrate(&with("verify_full", "localhost"), None);
    assert!(!ok && said.contains("not one of disable, allow, prefer, require, verify-ca, verify-full"), "{said}");
    let url = with("verify-full", "localhost");

    // The server serves over it, its LISTEN connection included: a push crosses.
    let port = free_port();
    let mut server = Command::new(bin("relay-server"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("DATABASE_URL", &url)
        .env("RELAY_DB_CA", &ca)
        .env("RELAY_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    wait_serving(&url).await;
    assert!(admin(&db.url, &["account", "create", "acme"]).status.success());
    let token = String::from_utf8(admin(&db.url, &["machine", "add", "acme/laptop"]).stdout).unwrap().trim().to_owned();
    let mut alice = Agent::hello(&url, &token, "alice").await.unwrap();
    let mut bob = Agent::hello(&url, &token, "bob").await.unwrap();
    let mut stream = bob.subscribe(0).await;
    alice.send(&["bob"], "over tls").await.unwrap();
    assert_eq!(next_message(&mut stream, Duration::from_secs(10)).await.body, "over tls");
    drop((alice, bob, stream));
    assert!(terminate(&mut server).await.success());
}

#[tokio::test]
async fn the_database_url_can_come_from_a_file() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("database-url");
    std::fs::write(&file, format!("{}\n", db.url)).unwrap();
    let migrate = |path: &std::path::Path| {
        Command::new(bin("relay-server"))
            .args(["migrate"])
            .env_remove("DATABASE_URL")
            .env("DATABASE_URL_FILE", path)
            .stdin(Stdio::null())
            .output_within(COMMAND_LIMIT)
            .unwrap()
    };
    let ran = migrate(&file);
    let said = String::from_utf8_lossy(&ran.stderr);
    assert!(ran.status.success() && said.contains("database schema is up to date"), "{said}");
    let missing = migrate(&dir.path().join("nope"));
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && said.contains("cannot read the database URL file"), "{said}");
    assert!(!said.contains(&db.url), "the error does not repeat a URL");
}
