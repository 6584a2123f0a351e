//! Migrations as an operator meets them: checksums recorded and checked, replicas migrating at once,
//! and the expand/contract rule that lets two releases share one schema (server/migrations/README.md
//! says what these tests prove and what they do not).

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use ::relay_server::domain::delivery::State;
use ::relay_server::store::migrate::{FUNCTIONS, MIGRATIONS};
use relay_proto::v1::*;
use relay_tests::client::{Agent, next_message};
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use relay_tests::{bin, free_port};

/// `relay-server ARGS` on the test database, logging at info without colour.
async fn relay_server(db: &TestDb, args: &[&str]) -> Output {
    relay_server_on(&db.url, args, &[]).await
}

/// `relay-server ARGS` on the database at `url`, with `env` beside the usual logging settings.
async fn relay_server_on(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let run = tokio::process::Command::new(bin("relay-server"))
        .args(args)
        .env("DATABASE_URL", url)
        .env("RELAY_LOG", "info")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), run).await.expect("relay-server exits").expect("run relay-server")
}

fn stderr(out: &Output) -> String {
    strip_ansi(&String::from_utf8_lossy(&out.stderr))
}

/// Log lines without terminal colours, whatever the logger decided.
fn strip_ansi(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            plain.push(c);
        }
    }
    plain
}

fn migrations_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../server/migrations")
}

/// Version, checksum per recorded migration, in order.
async fn history(client: &tokio_postgres::Client) -> Vec<(i32, Option<String>)> {
    let rows = client.query("select version, checksum from schema_migrations order by version", &[]).await.unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// Each migration's file as it is on disk, hashed by Postgres: a check independent of the server's
/// own hashing.
async fn expected_history(client: &tokio_postgres::Client) -> Vec<(i32, Option<String>)> {
    let mut expected = Vec::new();
    for m in MIGRATIONS {
        let text = std::fs::read_to_string(migrations_dir().join(m.file())).expect("migration file");
        let row = client.query_one("select encode(sha256(convert_to($1, 'UTF8')), 'hex')", &[&text]).await.unwrap();
        expected.push((m.version, Some(row.get(0))));
    }
    expected
}

#[tokio::test]
async fn a_fresh_database_gets_every_migration_with_the_checksum_of_its_file() {
    let db = TestDb::new().await;
    let out = relay_server(&db, &["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let client = db.sql().await;
    assert_eq!(history(&client).await, expected_history(&client).await);

    // Again: nothing to do, nothing changes.
    let again = relay_server(&db, &["migrate"]).await;
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(!stderr(&again).contains("applied migration"), "{}", stderr(&again));
    assert_eq!(history(&client).await, expected_history(&client).await);
}

/// A database that applied 1..8 before checksums were kept has the history table without the
/// column: the first run adds it and records the checksums of the files as they are.
#[tokio::test]
async fn a_database_migrated_before_checksums_gets_them_recorded() {
    let db = TestDb::new().await;
    assert!(relay_server(&db, &["migrate"]).await.status.success());
    let client = db.sql().await;
    client.batch_execute("alter table schema_migrations drop column checksum").await.unwrap();

    let out = relay_server(&db, &["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("recorded checksums of migrations applied before checksums were kept"),
        "{}",
        stderr(&out)
    );
    assert_eq!(history(&client).await, expected_history(&client).await);
}

#[tokio::test]
async fn an_edited_migration_is_refused_naming_its_version_and_file() {
    let db = TestDb::new().await;
    assert!(relay_server(&db, &["migrate"]).await.status.success());
    // What the database would hold had 0003 been applied and its file edited since.
    let client = db.sql().await;
    client.execute("update schema_migrations set checksum = repeat('0', 64) where version = 3", &[]).await.unwrap();

    let out = relay_server(&db, &["migrate"]).await;
    assert!(!out.status.success(), "an edited migration must stop migrate");
    let err = stderr(&out);
    assert!(err.contains("migration 3 (0003_board.sql) was changed after it was applied"), "{err}");
    assert!(err.contains(&"0".repeat(64)), "names the recorded checksum: {err}");

    // serve refuses the same way, before it listens.
    let port = free_port().to_string();
    let serve = relay_server(&db, &["serve", "--listen", &format!("127.0.0.1:{port}")]).await;
    assert!(!serve.status.success());
    assert!(stderr(&serve).contains("migration 3 (0003_board.sql) was changed"), "{}", stderr(&serve));
}

/// Name, revision, checksum per recorded function, by name.
async fn functions(client: &tokio_postgres::Client) -> Vec<(String, i32, String)> {
    let rows = client.query("select name, revision, checksum from schema_functions order by name", &[]).await.unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
}

/// Each function's file as it is on disk at its revision, hashed by Postgres.
async fn expected_functions(client: &tokio_postgres::Client) -> Vec<(String, i32, String)> {
    let mut expected = Vec::new();
    for f in FUNCTIONS {
        let text = std::fs::read_to_string(migrations_dir().join(f.file())).expect("function file");
        let row = client.query_one("select encode(sha256(convert_to($1, 'UTF8')), 'hex')", &[&text]).await.unwrap();
        expected.push((f.name.to_owned(), f.revision, row.get(0)));
    }
    expected.sort();
    expected
}

/// The body Postgres holds for function `name`.
async fn body(client: &tokio_postgres::Client, name: &str) -> String {
    client.query_one("select prosrc from pg_proc where proname = $1", &[&name]).await.unwrap().get(0)
}

#[tokio::test]
async fn every_function_is_applied_from_its_file_and_a_newer_revision_is_never_put_back() {
    let db = TestDb::new().await;
    let out = relay_server(&db, &["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let client = db.sql().await;
    assert_eq!(functions(&client).await, expected_functions(&client).await);
    // The file's body, not a migration's: the states are named.
    assert!(body(&client, "relay_take_unread").await.contains("relay_state('read')"));
    // What no release calls is gone.
    let dropped = "select count(*) from pg_proc where proname in
                   ('relay_send_batch', 'relay_write_send', 'relay_write_sends', 'relay_console_session_ended')";
    assert_eq!(client.query_one(dropped, &[]).await.unwrap().get::<_, i64>(0), 0);

    // Again: nothing to apply.
    let again = relay_server(&db, &["migrate"]).await;
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(!stderr(&again).contains("applied functions"), "{}", stderr(&again));

    // A newer release gave relay_look a new body at revision 99: this binary, older, keeps it.
    let newer = body(&client, "relay_look").await + "\n-- the next release's body\n";
    let definition: String =
        client.query_one("select pg_get_functiondef('relay_look'::regproc)", &[]).await.unwrap().get(0);
    let old_body = body(&client, "relay_look").await;
    client.batch_execute(&definition.replace(&old_body, &newer)).await.unwrap();
    client
        .execute("update schema_functions set revision = 99, checksum = 'next' where name = 'relay_look'", &[])
        .await
        .unwrap();
    let older = relay_server(&db, &["migrate"]).await;
    assert!(older.status.success(), "{}", stderr(&older));
    assert!(stderr(&older).contains("holds newer bodies of functions"), "{}", stderr(&older));
    assert_eq!(body(&client, "relay_look").await, newer, "the newer body stays");

    // A database at an older revision gets this one's body.
    client.execute("update schema_functions set revision = 0 where name = 'relay_look'", &[]).await.unwrap();
    let upgrade = relay_server(&db, &["migrate"]).await;
    assert!(upgrade.status.success(), "{}", stderr(&upgrade));
    assert!(stderr(&upgrade).contains(r#"applied functions functions=["relay_look"]"#), "{}", stderr(&upgrade));
    assert_eq!(body(&client, "relay_look").await, old_body);
    assert_eq!(functions(&client).await, expected_functions(&client).await);
}

#[tokio::test]
async fn a_function_changed_without_a_new_revision_is_refused_naming_it() {
    let db = TestDb::new().await;
    assert!(relay_server(&db, &["migrate"]).await.status.success());
    let client = db.sql().await;
    // What the database would hold had the file been edited at the same revision.
    client
        .execute("update schema_functions set checksum = repeat('0', 64) where name = 'relay_advance'", &[])
        .await
        .unwrap();
    let out = relay_server(&db, &["migrate"]).await;
    assert!(!out.status.success(), "a function changed at the same revision must stop migrate");
    let err = stderr(&out);
    assert!(err.contains("function relay_advance (functions/relay_advance.sql) differs from the body the database holds at the same revision 1"), "{err}");
    assert!(err.contains("a changed function needs a new revision"), "{err}");
}

/// SQL names delivery states with `relay_state`; the server spells them from its own enum. The
/// two must agree, and a misspelt name is an error, never a silent null.
#[tokio::test]
async fn the_delivery_states_are_the_same_numbers_in_sql_and_in_the_server() {
    let db = TestDb::new().await;
    assert!(relay_server(&db, &["migrate"]).await.status.success());
    let client = db.sql().await;
    let states = [
        ("queued", State::Queued),
        ("pushed", State::Pushed),
        ("surfaced", State::Surfaced),
        ("read", State::Read),
        ("withdrawn", State::Withdrawn),
    ];
    for (name, state) in states {
        let n: i32 = client.query_one("select relay_state($1)", &[&name]).await.unwrap().get(0);
        assert_eq!(n, i32::from(state.to_db()), "{name}");
    }
    let misspelt = client.query_one("select relay_state('raed')", &[]).await.expect_err("an unknown state is an error");
    assert!(misspelt.as_db_error().unwrap().message().contains("no delivery state is called raed"), "{misspelt}");
}

/// Since migration 39 the database checks no foreign key on a send: a deleted endpoint's mail is
/// removed by a trigger instead, as the keys' cascades removed it, and the counts of what others
/// have unread follow.
#[tokio::test]
async fn an_endpoint_deleted_by_hand_takes_its_mail_and_leaves_no_delivery_behind() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &laptop, "bob").await.unwrap();
    let mut carol = Agent::hello(&server.url, &laptop, "carol").await.unwrap();
    let from_bob = bob.send(&["laptop/alice", "laptop/carol"], "from bob, unread").await.unwrap();
    let to_bob = carol.send(&["laptop/bob"], "to bob").await.unwrap();
    let kept = carol.send(&["laptop/alice"], "carol to alice stays").await.unwrap();
    let client = db.sql().await;
    let deleted = client.execute("delete from endpoints where handle = 'bob'", &[]).await.unwrap();
    assert_eq!(deleted, 1);

    let count = async |sql: &str, id: &str| -> i64 { client.query_one(sql, &[&id]).await.unwrap().get(0) };
    // What bob sent goes, with its deliveries to others; what was sent to bob loses its delivery to
    // him, and the message stays its sender's.
    assert_eq!(count("select count(*) from messages where id = $1", &from_bob.id).await, 0, "bob's message went");
    assert_eq!(count("select count(*) from messages where id = $1", &to_bob.id).await, 1, "carol's message stayed");
    for gone in [&from_bob.id, &to_bob.id] {
        assert_eq!(
            count("select count(*) from deliveries where message_id = $1", gone).await,
            0,
            "{gone}'s deliveries"
        );
    }
    assert_eq!(count("select count(*) from deliveries where message_id = $1", &kept.id).await, 1);
    let unread = alice.rpc.who_am_i(WhoAmIRequest {}).await.unwrap().into_inner().unread;
    assert_eq!(unread, 1, "alice's count lost bob's message with it");
    let inbox = alice.inbox(0, false).await.unwrap().messages;
    assert_eq!(inbox.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), [kept.id.as_str()]);
}

#[tokio::test]
async fn two_migrations_started_together_both_succeed_and_apply_each_migration_once() {
    let db = TestDb::new().await;
    let (a, b) = tokio::join!(relay_server(&db, &["migrate"]), relay_server(&db, &["migrate"]));
    let logs = [stderr(&a), stderr(&b)];
    assert!(a.status.success() && b.status.success(), "{logs:#?}");

    // Every migration was applied by exactly one of the two.
    let applied: Vec<i32> = logs
        .iter()
        .flat_map(|log| log.lines())
        .filter(|l| l.contains("applied migration"))
        .map(|l| {
            let v = l.split("version=").nth(1).expect("version field").split_whitespace().next().unwrap();
            v.parse().unwrap()
        })
        .collect();
    let mut sorted = applied.clone();
    sorted.sort();
    let all: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(sorted, all, "each applied once across both processes: {logs:#?}");
    let functions_applied = logs.iter().flat_map(|log| log.lines()).filter(|l| l.contains("applied functions")).count();
    assert_eq!(functions_applied, 1, "the functions are applied by one of the two: {logs:#?}");
    let client = db.sql().await;
    assert_eq!(history(&client).await, expected_history(&client).await);
}

/// A database migrated by the release that numbered the console's migration 19 (1..18, then the
/// console as 19): this release moves that record to 21, the console's number now, and applies the
/// 19 and 20 it has not seen, ending with every migration recorded as a fresh database has it.
#[tokio::test]
async fn a_database_with_the_console_applied_as_19_is_brought_up_to_date() {
    let db = TestDb::new().await;
    let client = db.sql().await;
    client
        .batch_execute(
            "create table schema_migrations (version integer primary key, name text not null,
                 applied_at timestamptz not null default now(), checksum text)",
        )
        .await
        .unwrap();
    let as_released = MIGRATIONS
        .iter()
        .filter(|m| m.version <= 18)
        .map(|m| (m.version, m))
        .chain(MIGRATIONS.iter().filter(|m| m.name == "console").map(|m| (19, m)));
    for (version, m) in as_released {
        let text = std::fs::read_to_string(migrations_dir().join(m.file())).expect("migration file");
        client.batch_execute(&text).await.unwrap_or_else(|e| panic!("{}: {e}", m.file()));
        client
            .execute(
                "insert into schema_migrations (version, name, checksum)
                 values ($1, $2, encode(sha256(convert_to($3, 'UTF8')), 'hex'))",
                &[&version, &m.name, &text],
            )
            .await
            .unwrap();
    }

    let out = relay_server(&db, &["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("is recorded as 21"), "{}", stderr(&out));
    assert_eq!(history(&client).await, expected_history(&client).await);
    let names: Vec<String> = client
        .query("select name from schema_migrations where version in (19, 20, 21) order by version", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(names, ["pull_requests_followed", "card_agent_sessions", "console"]);
}

/// The binary under test plays the previous release; the schema plays the next one, expanded the
/// way the rule allows: a new column on every table (nullable, or not null with a default), a new
/// table, and a history row for a version this binary does not know. It must start (logging the
/// newer schema) and its messaging must work unchanged.
#[tokio::test]
async fn this_release_keeps_working_on_the_next_releases_expanded_schema() {
    let db = TestDb::new().await;
    assert!(relay_server(&db, &["migrate"]).await.status.success());
    let client = db.sql().await;
    let tables: Vec<String> = client
        .query(
            "select table_name::text from information_schema.tables
             where table_schema = 'public' and table_type = 'BASE TABLE' and table_name <> 'schema_migrations'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tables.iter().any(|t| t == "messages") && tables.iter().any(|t| t == "deliveries"), "{tables:?}");
    let mut expand = String::new();
    for table in &tables {
        expand.push_str(&format!(
            "alter table {table} add column next_note text, add column next_flag boolean not null default false;\n"
        ));
    }
    expand.push_str("create table next_reactions (message_id text not null, emoji text not null);\n");
    let next = MIGRATIONS.last().unwrap().version + 1;
    expand.push_str(&format!(
        "insert into schema_migrations (version, name, checksum) values ({next}, 'next_release_expand', repeat('f', 64));"
    ));
    client.batch_execute(&expand).await.unwrap();

    let out = relay_server(&db, &["migrate"]).await;
    assert!(out.status.success(), "a newer schema is allowed: {}", stderr(&out));
    assert!(stderr(&out).contains("the database schema is newer than this relay-server knows"), "{}", stderr(&out));

    // The messaging core on that schema: hello, send, push, inbox with ack, reply, track.
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let mut stream = bob.subscribe(0).await;
    let sent = alice.send(&["ci/bob"], "does the old code still run?").await.unwrap();
    assert_eq!(next_message(&mut stream, Duration::from_secs(10)).await.id, sent.id);
    let inbox = bob.inbox(0, true).await.unwrap();
    assert_eq!(inbox.messages.len(), 1);
    assert_eq!(inbox.messages[0].body, "does the old code still run?");
    let reply = bob
        .rpc
        .reply(ReplyRequest { id: "last".into(), body: "it does".into(), client_id: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.reply_to, sent.id);
    let answered = alice.inbox(5, true).await.unwrap();
    assert_eq!(answered.messages[0].body, "it does");
    let tracked = alice.rpc.track(TrackRequest { id: sent.id.clone() }).await.unwrap().into_inner();
    assert_eq!(tracked.recipients[0].state(), DeliveryState::Read);
}

#[tokio::test]
async fn a_database_that_refuses_the_connection_is_named_with_its_reason() {
    let db = TestDb::new().await;
    let missing = db.url.replace(&db.name, &format!("{}_missing", db.name));
    for args in [&["migrate"][..], &["serve", "--listen", "127.0.0.1:0"][..]] {
        let out = relay_server_on(&missing, args, &[]).await;
        assert!(!out.status.success(), "{args:?} must fail without its database");
        let err = stderr(&out);
        // The driver alone would say "db error"; the database's own reason must reach the operator.
        assert!(err.contains(&format!("database \"{}_missing\" does not exist", db.name)), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn json_logs_are_one_object_a_line_errors_included() {
    let db = TestDb::new().await;
    let json = [("RELAY_LOG_FORMAT", "json")];
    let lines = |out: &Output| -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}")))
            .collect()
    };

    let applied = relay_server_on(&db.url, &["migrate"], &json).await;
    assert!(applied.status.success());
    let logged = lines(&applied);
    assert!(
        logged.iter().any(|l| l["fields"]["message"] == "applied migration" && l["fields"]["version"] == 1),
        "{logged:?}"
    );
    assert!(logged.iter().any(|l| l["fields"]["message"] == "database schema is up to date"), "{logged:?}");

    let missing = db.url.replace(&db.name, &format!("{}_missing", db.name));
    let refused = relay_server_on(&missing, &["migrate"], &json).await;
    assert!(!refused.status.success());
    let logged = lines(&refused);
    let last = logged.last().expect("the failure is logged");
    assert_eq!(last["level"], "ERROR");
    assert!(last["fields"]["error"].as_str().unwrap().contains("does not exist"), "{last}");
}
