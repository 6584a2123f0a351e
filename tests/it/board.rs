//! The board: card tools and their refusals, schedules fired exactly once across replicas, worker
//! leases, and a card run end to end by a worker on another machine.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use relay_proto::v1::worker_client::WorkerClient;
use relay_proto::v1::*;
use relay_tests::agent::{StandIn, executable};
use relay_tests::client::{Agent, Bearer, channel, client};
use relay_tests::mcp::{Bridge, BridgeSpec, WAIT, bridge, text, tool_names as listed};
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithin};
use relay_tests::server::Server;
use relay_tests::{bin, eventually, free_port};
use serde_json::{Value, json};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// An RFC 3339 time as the server writes it (UTC, seconds).
fn rfc3339_utc(rfc3339: &str) -> &str {
    assert_eq!(rfc3339.len(), 20, "{rfc3339}");
    rfc3339
}

fn refused(result: &Value) -> bool {
    result["isError"] == json!(true)
}

async fn sql_at(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

fn worker_client(ch: Channel, token: &str) -> WorkerClient<InterceptedService<Channel, Bearer>> {
    WorkerClient::with_interceptor(ch, Bearer::new(token))
}

/// A git repository with one commit.
fn git_repo(dir: &Path) {
    let run = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .status_within(COMMAND_LIMIT)
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    std::fs::create_dir_all(dir).unwrap();
    run(&["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README"), "app\n").unwrap();
    run(&["add", "README"]);
    run(&["-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "initial"]);
}

struct Board {
    server: Server,
    laptop: String,
    ci: String,
    alice: Bridge,
    repo: tempfile::TempDir,
}

/// acme with machines laptop (alice, the operator) and ci (which has the repository `app`).
async fn board(env: &[(&str, &str)]) -> Board {
    let db = TestDb::new().await;
    let server = Server::start_with_env(&db, free_port(), env).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    server.admin_ok(&["operator", "acme", "laptop/alice"]);
    let repo = tempfile::tempdir().unwrap();
    git_repo(&repo.path().join("app"));
    let mut w = worker_client(channel(&server.url).await, &ci);
    let path = repo.path().join("app").display().to_string();
    w.register_repo(RegisterRepoRequest { path }).await.unwrap();
    let mut alice =
        Bridge::start(BridgeSpec { server: &server.url, token: &laptop, handle: Some("alice"), channels: false });
    alice.initialize("2025-06-18").await;
    Board { server, laptop, ci, alice, repo }
}

/// The board's tools cost a model words on every turn: they are listed to an account's agents once
/// its board has a repository, and until then only `add_repo`, to its operator.
#[tokio::test]
async fn the_boards_tools_are_listed_once_the_account_has_a_repository() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    server.admin_ok(&["operator", "acme", "laptop/alice"]);
    let (mut alice, mut bob) = (bridge(&server.url, &laptop, "alice"), bridge(&server.url, &ci, "bob"));
    alice.initialize("2025-06-18").await;
    bob.initialize("2025-06-18").await;
    let board_tools = ["post_job", "list_jobs", "read_job", "edit_job"];
    let has = |names: &[String], tool: &str| names.iter().any(|n| n == tool);
    let before = listed(&alice.request("tools/list", json!({})).await);
    assert!(board_tools.iter().all(|t| !has(&before, t)), "no board yet: {before:?}");
    assert!(has(&before, "add_repo"), "the operator may start one: {before:?}");
    let bobs = listed(&bob.request("tools/list", json!({})).await);
    assert!(board_tools.iter().all(|t| !has(&bobs, t)), "{bobs:?}");

    let repo = tempfile::tempdir().unwrap();
    git_repo(&repo.path().join("app"));
    let path = repo.path().join("app").display().to_string();
    alice.tool_ok("add_repo", json!({ "path": path })).await;
    alice.notification("notifications/tools/list_changed", WAIT).await;
    let after = listed(&alice.request("tools/list", json!({})).await);
    assert!(board_tools.iter().all(|t| has(&after, t)), "{after:?}");
    // Another agent of the account sees them the next time its client lists tools.
    let others = listed(&bob.request("tools/list", json!({})).await);
    assert!(board_tools.iter().all(|t| has(&others, t)), "{others:?}");
}

/// A worker asking again and again with nothing to do does not rewrite its machine each time: it
/// is marked seen at most once in half the time it counts as running, and it is running throughout.
#[tokio::test]
async fn an_idle_workers_claims_do_not_rewrite_its_machine() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let ci = server.machine("acme", "ci");
    let sql = db.sql().await;
    let mut w = worker_client(channel(&server.url).await, &ci);
    // The row's version (xmin) changes with every write to it.
    let row = async || -> (String, bool) {
        let r = sql
            .query_one(
                "select xmin::text, worker_seen_at > now() - interval '60 seconds' from machines where name = 'ci'",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get::<_, Option<bool>>(1).unwrap_or(false))
    };
    assert!(!row().await.1, "never seen before it asks");
    assert!(w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.is_none());
    let first = row().await;
    assert!(first.1, "seen once it asks");
    for _ in 0..3 {
        assert!(w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.is_none());
        assert_eq!(row().await, first, "asking again soon after rewrites nothing");
    }
}

#[tokio::test]
async fn card_tools_read_back_and_refuse_clearly() {
    let mut b = board(&[]).await;
    let posted = b
        .alice
        .tool_ok(
            "post_job",
            json!({ "title": "Fix the flaky login test", "detail": "It fails one run in ten.", "repo": "app" }),
        )
        .await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();
    assert_eq!(posted["structuredContent"]["state"], "todo");
    assert_eq!(posted["structuredContent"]["requires_pr"], true);
    assert_eq!(posted["structuredContent"]["agent"], "claude", "the poster's harness");
    assert!(
        text(&posted).contains("No worker is serving ci right now"),
        "the stopped dispatcher is said: {}",
        text(&posted)
    );

    // A schedule is read in the poster's zone and stored in UTC: Mondays 09:00 in Berlin are 08:00Z in winter.
    let spec = BridgeSpec { server: &b.server.url, token: &b.laptop, handle: Some("planner"), channels: false };
    let mut planner = Bridge::start_with_env(spec, &[("TZ", std::ffi::OsStr::new("Europe/Berlin"))]);
    planner.initialize("2025-06-18").await;
    let scheduled = planner
        .tool_ok("post_job", json!({ "title": "Weekly dependency report", "repo": "app", "schedule": "0 9 * * 1" }))
        .await;
    let s = &scheduled["structuredContent"];
    assert_eq!((s["schedule"].as_str(), s["time_zone"].as_str()), (Some("0 9 * * 1"), Some("Europe/Berlin")));
    assert_eq!(s["requires_pr"], false, "schedules default to a summary");
    let next = rfc3339_utc(s["next_run_at"].as_str().unwrap());
    let local = s.get("next_run_local").and_then(Value::as_str).unwrap_or_default().to_owned();
    let shown = text(&scheduled);
    // Winter (CET) or summer (CEST): 09:00 local is 08:00 or 07:00 UTC.
    let winter = shown.contains("09:00 CET") && next.ends_with("T08:00:00Z");
    let summer = shown.contains("09:00 CEST") && next.ends_with("T07:00:00Z");
    assert!(shown.contains("next run Mon ") && (winter || summer), "{shown} / {next} / {local}");

    let listed = b.alice.tool_ok("list_jobs", json!({})).await;
    let shown = text(&listed);
    assert!(
        shown.starts_with("Relay content below") && shown.contains("2 card(s) on the board:\n\nTo do (2)"),
        "{shown}"
    );
    assert_eq!(listed["structuredContent"]["untrusted"].as_str().map(|u| shown.starts_with(u)), Some(true));
    let read = b.alice.tool_ok("read_job", json!({ "id": id })).await;
    assert!(text(&read).contains("posted") && text(&read).contains("acme/laptop/alice"), "{}", text(&read));

    let edited = b.alice.tool_ok("edit_job", json!({ "id": id, "detail": "Replaced text." })).await;
    assert!(text(&edited).contains("Updated detail"), "{}", text(&edited));
    let read = b.alice.tool_ok("read_job", json!({ "id": id })).await;
    assert!(text(&read).ends_with("Replaced text.") && text(&read).contains("last edited by: acme/laptop/alice"));

    for (tool, args, expect) in [
        ("post_job", json!({ "detail": "no title" }), "title is required"),
        ("post_job", json!({ "title": "t", "repo": "app", "schedule": "0 9 * *" }), "4 fields"),
        ("post_job", json!({ "title": "t", "repo": "app", "schedule": "0 9 * * 1#2" }), "crontab does not accept"),
        ("post_job", json!({ "title": "t", "repo": "nowhere" }), "no repository \"nowhere\""),
        ("post_job", json!({ "title": "t", "repo": "app", "agent": "gemini" }), "use claude or codex"),
        ("post_job", json!({ "title": "t" }), "not inside a repository on the board"),
        ("read_job", json!({ "id": "nope" }), "no card with id"),
        ("edit_job", json!({ "id": id }), "nothing to change"),
        ("list_jobs", json!({ "state": "doing" }), "invalid state"),
        ("finish_job", json!({ "summary": "x" }), "this session has no card"),
        ("close_job", json!({ "id": id, "accept": true }), "only cards in Review can be closed"),
        ("close_job", json!({ "id": id }), "accept is required"),
        ("add_repo", json!({ "path": "relative/path" }), "must be absolute"),
    ] {
        let result = b.alice.tool(tool, args.clone()).await;
        assert!(refused(&result), "{tool} {args} should be refused");
        assert!(text(&result).contains(expect), "{tool} {args}: {}", text(&result));
    }

    // The operator's tools are the operator's alone.
    let mut carol =
        Bridge::start(BridgeSpec { server: &b.server.url, token: &b.laptop, handle: Some("carol"), channels: false });
    carol.initialize("2025-06-18").await;
    let denied = carol.tool("add_repo", json!({ "path": "/srv/app" })).await;
    assert!(refused(&denied) && text(&denied).contains("only the account's operator"), "{}", text(&denied));
    let added = b.alice.tool_ok("add_repo", json!({ "path": "/srv/app" })).await;
    assert_eq!(added["structuredContent"]["machine"], "laptop");

    // Once dispatched, a card cannot be edited.
    let mut w = worker_client(channel(&b.server.url).await, &b.ci);
    let claimed = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.expect("a card to claim");
    assert_eq!(claimed.job.as_ref().unwrap().id, id);
    let late = b.alice.tool("edit_job", json!({ "id": id, "title": "too late" })).await;
    assert!(refused(&late) && text(&late).contains("only cards still in To do can be edited"), "{}", text(&late));
}

#[tokio::test]
async fn two_replicas_fire_each_due_schedule_exactly_once() {
    let db = TestDb::new().await;
    let fast = [("RELAY_SCHEDULER_TICK_MS", "20")];
    let (a, _b) =
        tokio::join!(Server::start_with_env(&db, free_port(), &fast), Server::start_with_env(&db, free_port(), &fast));
    let laptop = a.machine("acme", "laptop");
    let repo = tempfile::tempdir().unwrap();
    let mut w = worker_client(channel(&a.url).await, &laptop);
    w.register_repo(RegisterRepoRequest { path: repo.path().display().to_string() }).await.unwrap();
    let mut alice =
        Bridge::start(BridgeSpec { server: &a.url, token: &laptop, handle: Some("alice"), channels: false });
    alice.initialize("2025-06-18").await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let posted = alice
            .tool_ok("post_job", json!({ "title": format!("report {i}"), "repo": repo.path().display().to_string(), "schedule": "@hourly" }))
            .await;
        ids.push(posted["structuredContent"]["id"].as_str().unwrap().to_owned());
    }
    // All twenty come due at once, and several slots were missed: each must fire once.
    let db_client = db.sql().await;
    db_client
        .execute("update jobs set next_run_at = now() - interval '3 hours' where kind = 'schedule'", &[])
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "every schedule to fire", || async {
        let pending: i64 = db_client
            .query_one("select count(*) from jobs where kind = 'schedule' and next_run_at <= now()", &[])
            .await
            .unwrap()
            .get(0);
        (pending == 0).then_some(())
    })
    .await;
    let runs = db_client
        .query("select s.id, s.run_count, count(r.id) from jobs s left join jobs r on r.schedule_id = s.id where s.kind = 'schedule' group by s.id, s.run_count", &[])
        .await
        .unwrap();
    assert_eq!(runs.len(), 20);
    for row in runs {
        let (id, count, cards): (String, i32, i64) = (row.get(0), row.get(1), row.get(2));
        assert_eq!((count, cards), (1, 1), "schedule {id} fired {cards} times");
    }

    // Due again while its run is still waiting: held off, and the card says why.
    db_client
        .execute("update jobs set next_run_at = now() - interval '1 minute' where id = $1", &[&ids[0]])
        .await
        .unwrap();
    let reason = eventually(Duration::from_secs(30), "the hold-off", || async {
        let row = db_client
            .query_one("select last_skip_reason, next_run_at > now() from jobs where id = $1", &[&ids[0]])
            .await
            .unwrap();
        row.get::<_, bool>(1).then(|| row.get::<_, Option<String>>(0)).flatten()
    })
    .await;
    assert!(reason.contains("still in progress"), "{reason}");
    let read = alice.tool_ok("read_job", json!({ "id": ids[0] })).await;
    assert!(text(&read).contains("last held off: its last run is still in progress"), "{}", text(&read));
    let count: i64 =
        db_client.query_one("select count(*) from jobs where schedule_id = $1", &[&ids[0]]).await.unwrap().get(0);
    assert_eq!(count, 1);
}

#[tokio::test]
async fn leases_expire_and_a_card_is_never_claimed_twice() {
    let b = board(&[("RELAY_SCHEDULER_TICK_MS", "50"), ("RELAY_LEASE_S", "1")]).await;
    let mut alice = b.alice;
    let posted = alice.tool_ok("post_job", json!({ "title": "one card", "repo": "app" })).await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();

    // Two workers ask at once; one gets it.
    let ch = channel(&b.server.url).await;
    let (mut w1, mut w2) = (worker_client(ch.clone(), &b.ci), worker_client(ch, &b.ci));
    let (r1, r2) = tokio::join!(w1.claim(ClaimRequest::default()), w2.claim(ClaimRequest::default()));
    let claims: Vec<_> =
        [r1.unwrap().into_inner(), r2.unwrap().into_inner()].into_iter().filter_map(|r| r.claimed).collect();
    assert_eq!(claims.len(), 1, "exactly one worker holds the card");

    // That worker goes silent: the card comes back with the reason and the attempt counted.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let back = loop {
        let read = alice.tool_ok("read_job", json!({ "id": id })).await;
        if read["structuredContent"]["state"] == "todo" {
            break read;
        }
        assert!(tokio::time::Instant::now() < deadline, "the lease never expired: {read}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let s = &back["structuredContent"];
    assert_eq!(s["attempts"], 1);
    assert!(s["last_error"].as_str().unwrap().contains("the worker on ci stopped renewing its lease"), "{s}");
    // The stale token finishes nothing.
    let stale = w1
        .renew(RenewRequest { job_token: claims[0].job_token.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(!stale.in_progress);
}

#[tokio::test]
async fn a_card_out_of_attempts_is_announced_to_the_operator() {
    let b = board(&[]).await;
    let mut alice = b.alice;
    let posted = alice.tool_ok("post_job", json!({ "title": "Migrate the schema", "repo": "app" })).await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();

    // Each attempt's agent exits before calling finish_job.
    let mut w = worker_client(channel(&b.server.url).await, &b.ci);
    for attempt in 1..=3 {
        let claimed = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed;
        let claimed = claimed.unwrap_or_else(|| panic!("attempt {attempt}: nothing to claim"));
        assert_eq!(claimed.job.as_ref().unwrap().id, id);
        let release =
            ReleaseRequest { job_token: claimed.job_token, exit_code: 1, error: "psql: connection refused".into() };
        w.release(release).await.unwrap();
    }
    assert!(w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.is_none(), "no fourth attempt");

    // The operator (here also the poster) hears of it as a message it can act on.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let notice = loop {
        let inbox = alice.tool_ok("relay_inbox", json!({ "wait_s": 5 })).await;
        let messages = inbox["structuredContent"]["messages"].as_array().cloned().unwrap_or_default();
        if let Some(m) = messages.iter().find(|m| m["body"].as_str().unwrap_or_default().contains("failed all")) {
            break (m.clone(), text(&inbox));
        }
        assert!(tokio::time::Instant::now() < deadline, "no notice that the card ran out of attempts");
    };
    let (message, shown) = notice;
    let body = message["body"].as_str().unwrap();
    assert!(body.contains(&format!("Card {id} \"Migrate the schema\" failed all 3 attempts")), "{body}");
    assert!(body.contains("psql: connection refused"), "the last cause: {body}");
    assert!(body.contains(&format!("edit_job {{id: \"{id}\"")), "what to do: {body}");
    assert!(shown.contains(body), "{shown}");
    let read = alice.tool_ok("read_job", json!({ "id": id })).await;
    assert_eq!(read["structuredContent"]["state"], "todo");
    assert_eq!(read["structuredContent"]["attempts"], 3);
}

#[tokio::test]
async fn a_card_posted_on_one_machine_is_done_by_a_worker_on_another() {
    let mut b = board(&[]).await;
    let scripts = tempfile::tempdir().unwrap();
    let agent = StandIn { records: true, ..StandIn::default() }.write(scripts.path(), "stand-in.sh");
    let worktrees = scripts.path().join("worktrees");
    let human = b.server.admin_ok(&["human", "add", "acme"]);

    let posted = b
        .alice
        .tool_ok(
            "post_job",
            json!({ "title": "Write result.txt", "detail": "Say done.", "repo": "app", "requires_pr": false }),
        )
        .await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();

    let worker = tokio::process::Command::new(bin("agent-bridge"))
        .arg("worker")
        .arg("--repo")
        .arg(b.repo.path().join("app"))
        .arg("--worktrees")
        .arg(&worktrees)
        .arg("--agent")
        .arg(format!("claude={} {{mcp_config}} {{prompt}}", agent.display()))
        .args(["--poll-ms", "100", "--once"])
        .env("BRIDGE", bin("agent-bridge"))
        .env("RELAY_SERVER", &b.server.url)
        .env("RELAY_TOKEN", &b.ci)
        .env("RELAY_HUMAN_TOKEN", &human)
        .env("RELAY_CONFIG", "/nonexistent/bridge.toml")
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), worker).await.expect("the worker runs one card").unwrap();
    assert!(out.status.success(), "worker: {}", String::from_utf8_lossy(&out.stderr));

    let read = b.alice.tool_ok("read_job", json!({ "id": id })).await;
    let s = &read["structuredContent"];
    assert_eq!(s["state"], "review", "{s}");
    assert_eq!(s["summary"], format!("committed result.txt on relay/{id}"));
    assert_eq!(s["agent_state"], "exited with code 0");
    let worktree = worktrees.join(&id);
    assert_eq!(std::fs::read_to_string(worktree.join("result.txt")).unwrap(), "done\n");
    // The agent held the card's job token and nothing of the machine's or the person's: not in its
    // environment, its arguments or the MCP config it was given.
    let given = |file: &str| std::fs::read_to_string(worktree.join(file)).unwrap();
    let env = given("agent-env.txt");
    assert!(env.lines().any(|l| l.starts_with("RELAY_JOB_TOKEN=rlj_")), "{env}");
    assert!(!env.lines().any(|l| l.starts_with("RELAY_TOKEN=") || l.starts_with("RELAY_HUMAN_TOKEN=")), "{env}");
    for file in ["agent-env.txt", "agent-argv.txt", "agent-mcp.json"] {
        let text = given(file);
        assert!(!text.contains(&b.ci) && !text.contains(&human), "{file} holds a machine or human token: {text}");
    }
    // Its bridge said Hello as the card's endpoint, whose session ended with the attempt.
    let db = sql_at(&b.server.db_url).await;
    let row = db
        .query_one(
            "select m.name, e.ended_at is not null from endpoints e join machines m on m.id = e.machine_id
             where e.handle = $1",
            &[&format!("job-{id}")],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, bool>(1)), ("ci".to_owned(), true));

    let closed = b.alice.tool_ok("close_job", json!({ "id": id, "accept": true })).await;
    assert_eq!(closed["structuredContent"]["state"], "done");
    let archived = b.alice.tool_ok("list_jobs", json!({})).await;
    assert!(text(&archived).contains("1 finished card(s) are archived"), "{}", text(&archived));

    // The worker's next round removes the finished card's worktree; the branch keeps the work.
    let mut w = worker_client(channel(&b.server.url).await, &b.ci);
    let round = w.claim(ClaimRequest::default()).await.unwrap().into_inner();
    assert_eq!(round.cleanup.len(), 1);
    let again = tokio::process::Command::new(bin("agent-bridge"))
        .arg("worker")
        .arg("--worktrees")
        .arg(&worktrees)
        .args(["--poll-ms", "100"])
        .env("RELAY_SERVER", &b.server.url)
        .env("RELAY_TOKEN", &b.ci)
        .env("RELAY_CONFIG", "/nonexistent/bridge.toml")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(20), "the worktree to be removed", || async { (!worktree.exists()).then_some(()) })
        .await;
    drop(again);
    let log = std::process::Command::new("git")
        .args(["log", "--oneline", &format!("relay/{id}")])
        .current_dir(b.repo.path().join("app"))
        .output_within(COMMAND_LIMIT)
        .unwrap();
    assert!(String::from_utf8_lossy(&log.stdout).contains("the work"));

    // Sent back instead: the note goes to the next worker.
    let second = b.alice.tool_ok("post_job", json!({ "title": "Redo", "repo": "app", "requires_pr": false })).await;
    let id2 = second["structuredContent"]["id"].as_str().unwrap().to_owned();
    let mut w = worker_client(channel(&b.server.url).await, &b.ci);
    let claimed = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.unwrap();
    let pr_needed = b.alice.tool("close_job", json!({ "id": id2, "accept": false })).await;
    assert!(refused(&pr_needed), "not in review yet");
    let token = claimed.job_token;
    // Finish through a bridge holding the job token alone, as the card's agent would.
    let mut agent_bridge = Bridge::start_card(&b.server.url, &token);
    agent_bridge.initialize("2025-06-18").await;
    let me = agent_bridge.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(me["structuredContent"]["address"], format!("acme/ci/job-{id2}"));
    let no_summary = agent_bridge.tool("finish_job", json!({})).await;
    assert!(refused(&no_summary) && text(&no_summary).contains("pass a summary"), "{}", text(&no_summary));
    agent_bridge.tool_ok("finish_job", json!({ "summary": "half done" })).await;
    // Finished, the card's agent can do nothing more, and its tools say why.
    let after = agent_bridge.tool("relay_whoami", json!({})).await;
    assert!(
        refused(&after) && text(&after).contains("a card's agent acts only while its card is in progress"),
        "{}",
        text(&after)
    );
    let no_note = b.alice.tool("close_job", json!({ "id": id2, "accept": false })).await;
    assert!(refused(&no_note) && text(&no_note).contains("needs a note"), "{}", text(&no_note));
    let back =
        b.alice.tool_ok("close_job", json!({ "id": id2, "accept": false, "note": "also update the docs" })).await;
    assert_eq!(back["structuredContent"]["state"], "todo");
    // The operator was told of both cards reaching Review; read, they leave no unread hint behind.
    let notices = b.alice.tool_ok("relay_inbox", json!({ "ack": true })).await;
    let from: Vec<&str> = notices["structuredContent"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["from"].as_str().unwrap())
        .collect();
    assert_eq!(from, ["acme/me/board", "acme/me/board"], "{}", text(&notices));
    let read = b.alice.tool_ok("read_job", json!({ "id": id2 })).await;
    assert!(
        text(&read).ends_with("Review note from acme/laptop/alice for the next attempt:\nalso update the docs"),
        "{}",
        text(&read)
    );
}

#[tokio::test]
async fn permission_requests_go_to_the_operator_then_the_human() {
    let mut b = board(&[("RELAY_APPROVAL_WAIT_S", "5")]).await;
    let human = b.server.admin_ok(&["human", "add", "acme"]);
    let (id, mut agent) = running_card(&mut b, "Clean the build").await;
    let tools = agent.request("tools/list", json!({})).await;
    assert!(tools.to_string().contains("relay_permission"), "a board agent is offered the permission tool");
    let plain = b.alice.request("tools/list", json!({})).await;
    assert!(!plain.to_string().contains("relay_permission"), "other sessions are not");

    // The operator answers (carol, who is not the operator, is ready before the request, so that
    // the operator's answer comes well within its time).
    let mut carol =
        Bridge::start(BridgeSpec { server: &b.server.url, token: &b.laptop, handle: Some("carol"), channels: false });
    carol.initialize("2025-06-18").await;
    let asking = agent
        .start_request("tools/call", json!({ "name": "relay_permission", "arguments": { "tool_name": "Bash", "input": { "command": "rm -rf build" } } }))
        .await;
    let inbox = b.alice.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    let body = inbox["structuredContent"]["messages"][0]["body"].as_str().unwrap().to_owned();
    assert!(body.starts_with("[Approval a") && body.contains("rm -rf build") && body.contains(&id), "{body}");
    assert!(body.contains(&format!("acme/ci/job-{id} working on card {id}")), "asked by the card's endpoint: {body}");
    let approval = body[10..20].to_owned();
    let not_operator = carol.tool("answer_permission", json!({ "id": approval, "decision": "allow" })).await;
    assert!(refused(&not_operator), "{}", text(&not_operator));
    b.alice.tool_ok("answer_permission", json!({ "id": approval, "decision": "allow" })).await;
    let answer = agent.response(asking).await["result"].clone();
    let decision: Value = serde_json::from_str(&text(&answer)).unwrap();
    assert_eq!(decision, json!({ "behavior": "allow", "updatedInput": { "command": "rm -rf build" } }));

    // Unanswered, it goes to the human, whose no the agent reads.
    let asking = agent
        .start_request("tools/call", json!({ "name": "relay_permission", "arguments": { "tool_name": "Bash", "input": { "command": "git push --force" } } }))
        .await;
    let run = |args: Vec<String>| {
        let (url, human_token) = (b.server.url.clone(), human.clone());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            relay_tests::server::human(&url, &human_token, &args).await.1
        }
    };
    let listed = eventually(Duration::from_secs(20), "the request to reach the human", || async move {
        let out = run(vec!["approvals".into()]).await;
        out.contains("escalated").then_some(out)
    })
    .await;
    assert!(listed.contains("git push --force"), "{listed}");
    let approval = listed.split_whitespace().next().unwrap().to_owned();
    let said = run(vec!["approve".into(), approval, "deny".into(), "--reason".into(), "not on main".into()]).await;
    assert!(said.contains("deny"), "{said}");
    let answer = agent.response(asking).await["result"].clone();
    let decision: Value = serde_json::from_str(&text(&answer)).unwrap();
    assert_eq!(decision["behavior"], "deny");
    assert!(decision["message"].as_str().unwrap().contains("not on main"), "{decision}");
}

#[tokio::test]
async fn a_card_agent_acts_only_as_its_card_and_only_while_the_card_runs() {
    let mut b = board(&[("RELAY_SCHEDULER_TICK_MS", "50")]).await;
    let url = b.server.url.clone();
    let posted = b.alice.tool_ok("post_job", json!({ "title": "Tidy the build", "repo": "app", "requires_pr": false }));
    let id = posted.await["structuredContent"]["id"].as_str().unwrap().to_owned();
    let mut w = worker_client(channel(&url).await, &b.ci);
    let token = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.unwrap().job_token;

    // What the machine does, a job token does not.
    let mut as_worker = worker_client(channel(&url).await, &token);
    let claim = as_worker.claim(ClaimRequest::default()).await.unwrap_err();
    assert_eq!(claim.code(), Code::PermissionDenied, "{claim:?}");
    assert!(claim.message().contains("relay.v1.Worker/Claim needs the machine's token"), "{}", claim.message());
    let path = b.repo.path().join("app").display().to_string();
    let register = as_worker.register_repo(RegisterRepoRequest { path }).await.unwrap_err();
    assert_eq!(register.code(), Code::PermissionDenied, "{register:?}");
    let renew = RenewRequest { job_token: token.clone(), ..Default::default() };
    assert_eq!(as_worker.renew(renew).await.unwrap_err().code(), Code::PermissionDenied);
    let check = client(channel(&url).await, &token).check_machine(CheckMachineRequest::default()).await.unwrap_err();
    assert_eq!(check.code(), Code::PermissionDenied, "{check:?}");

    // Hello with it claims the card's endpoint and no other: not a handle it names, not a spawned
    // worker's, not a session it resumes.
    let asked = Agent::hello(&url, &token, "alice").await.err().expect("another handle is refused");
    assert_eq!(asked.code(), Code::PermissionDenied);
    assert!(asked.message().contains(&format!("job-{id}, not alice")), "{}", asked.message());
    let mut bob = Agent::hello(&url, &b.ci, "bob").await.unwrap();
    let grant = bob.rpc.spawn(SpawnRequest { harness: "claude".into(), scope: String::new() }).await.unwrap();
    let spawned =
        HelloRequest { harness: "claude".into(), spawn_grant: grant.into_inner().grant, ..Default::default() };
    let spawned = Agent::hello_with(&url, &token, spawned).await.err().expect("a spawn grant is refused");
    assert_eq!(spawned.code(), Code::PermissionDenied, "{spawned:?}");
    let resume = HelloRequest { harness: "claude".into(), resume: bob.session_token.clone(), ..Default::default() };
    let mut agent = Agent::hello_with(&url, &token, resume).await.unwrap();
    assert_eq!(agent.address, format!("acme/ci/job-{id}"), "bob's session is not the card's");

    // As the card's endpoint it works: it messages the operator and is answered.
    agent.send(&["laptop/alice"], "which build dir?").await.unwrap();
    let inbox = b.alice.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    let asked = &inbox["structuredContent"]["messages"][0];
    assert_eq!(asked["from"], format!("acme/ci/job-{id}"), "{inbox}");
    b.alice.tool_ok("relay_reply", json!({ "id": asked["id"], "body": "target/" })).await;
    assert_eq!(agent.inbox(10, true).await.unwrap().messages[0].body, "target/");
    // Beyond its endpoint it does nothing: no workers, no groups, no other's rules, no operator's work.
    let denied = |status: tonic::Status, what: &str| {
        assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status:?}");
        assert!(status.message().contains("not for a card's agent"), "{what}: {}", status.message());
    };
    let spawn = SpawnRequest { harness: "claude".into(), scope: String::new() };
    denied(agent.rpc.spawn(spawn).await.unwrap_err(), "spawn");
    let group = GroupRequest { action: GroupAction::Create as i32, name: "mine".into(), ..Default::default() };
    denied(agent.rpc.group(group).await.unwrap_err(), "group");
    let rules = SetRulesRequest { endpoint: "ci/bob".into(), scope: "none".into(), ..Default::default() };
    denied(agent.rpc.set_rules(rules).await.unwrap_err(), "rules");
    denied(agent.rpc.add_repo(AddRepoRequest { path: "/srv/other".into() }).await.unwrap_err(), "add_repo");
    let close = CloseJobRequest { id: id.clone(), accept: true, note: String::new() };
    denied(agent.rpc.close_job(close).await.unwrap_err(), "close_job");
    let own = SetRulesRequest { scope: "tree".into(), ..Default::default() };
    agent.rpc.set_rules(own).await.expect("its own rules are its to set");

    // The worker releases the card: at once the open session, its push stream and the job token
    // stop working, each saying why.
    let mut stream = agent.subscribe(0).await;
    w.release(ReleaseRequest { job_token: token.clone(), exit_code: 1, error: "gave up".into() }).await.unwrap();
    let ended = agent.rpc.who_am_i(WhoAmIRequest {}).await.unwrap_err();
    assert_eq!(ended.code(), Code::Unauthenticated);
    assert!(
        ended.message().contains(&format!("the session of acme/ci/job-{id} ended with its card's attempt")),
        "{}",
        ended.message()
    );
    let closed =
        tokio::time::timeout(Duration::from_secs(10), async { while let Ok(Some(_)) = stream.message().await {} });
    closed.await.expect("the push stream ends with the session");
    let again = Agent::hello(&url, &token, "").await.err().expect("the job token is spent");
    assert_eq!(again.code(), Code::Unauthenticated);
    assert!(again.message().contains("a card's agent acts only while its card is in progress"), "{}", again.message());

    // A lease that runs out ends the agent of the next attempt the same way.
    let token = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.unwrap().job_token;
    let mut agent = Agent::hello(&url, &token, "").await.unwrap();
    assert_eq!(agent.address, format!("acme/ci/job-{id}"), "the next attempt's agent has the card's endpoint");
    agent.rpc.who_am_i(WhoAmIRequest {}).await.unwrap();
    let db = sql_at(&b.server.db_url).await;
    db.execute("update jobs set lease_until = now() - interval '1 second' where id = $1", &[&id]).await.unwrap();
    let lost = eventually(Duration::from_secs(10), "the lost lease to end the session", || {
        let mut rpc = agent.rpc.clone();
        async move { rpc.who_am_i(WhoAmIRequest {}).await.err() }
    })
    .await;
    assert_eq!(lost.code(), Code::Unauthenticated, "{lost:?}");
    // Refused from the moment the lease ran out; the scheduler then puts the card back.
    card_until(&mut b, &id, "the card to go back to To do", |c| c["state"] == "todo").await;
    let again = Agent::hello(&url, &token, "").await.err().expect("the lost lease's token is spent");
    assert_eq!(again.code(), Code::Unauthenticated, "{again:?}");
    bob.rpc.who_am_i(WhoAmIRequest {}).await.expect("the machine's own agents go on");
}

#[tokio::test]
async fn what_outlived_its_retention_is_purged_and_nothing_else() {
    let ops = format!("127.0.0.1:{}", free_port());
    let env = [
        ("RELAY_RETAIN_MESSAGES", "1s"),
        ("RELAY_RETAIN_CARDS", "1s"),
        ("RELAY_RETAIN_AUDIT", "1h"),
        ("RELAY_SCHEDULER_TICK_MS", "20"),
        ("RELAY_OPS_LISTEN", ops.as_str()),
    ];
    let mut b = board(&env).await;
    let mut post = async |title: &str| {
        let posted = b.alice.tool_ok("post_job", json!({ "title": title, "detail": "d", "repo": "app" })).await;
        posted["structuredContent"]["id"].as_str().unwrap().to_owned()
    };
    let (finished, uncleaned, waiting) = (post("finished").await, post("worktree left").await, post("to do").await);
    // Two cards were closed an hour ago; a worker has yet to clean up the second one's worktree.
    let (db, conn) = tokio_postgres::connect(&b.server.db_url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    db.execute(
        "update jobs set state = 'done', closed_at = now() - interval '1 hour',
                         worktree = case when id = $2 then '/tmp/wt' end, worktree_removed = false
         where id = any($1)",
        &[&vec![finished.clone(), uncleaned.clone()], &uncleaned],
    )
    .await
    .unwrap();

    // Messages: one read, one left unread, both older than the retention by the time it is checked.
    let mut bob = relay_tests::client::Agent::hello(&b.server.url, &b.ci, "bob").await.unwrap();
    let mut carol = relay_tests::client::Agent::hello(&b.server.url, &b.ci, "carol").await.unwrap();
    let read = carol.send(&["ci/bob"], "read and done with").await.unwrap();
    assert_eq!(bob.inbox(0, true).await.unwrap().messages.len(), 1);
    let unread = carol.send(&["ci/bob"], "still to be read").await.unwrap();
    // Who peeked at bob: one record two hours old, one from now.
    db.execute(
        "insert into peeks (target_id, peeker, turns, at)
         select e.id, 'acme/laptop/alice', 1, now() - interval '2 hours' from endpoint_addresses e where e.address = 'acme/ci/bob'
         union all
         select e.id, 'acme/laptop/alice', 1, now() from endpoint_addresses e where e.address = 'acme/ci/bob'",
        &[],
    )
    .await
    .unwrap();

    eventually(
        Duration::from_secs(20),
        "the finished card, the read message and the old peek record to be purged",
        || async {
            let (status, text) = relay_tests::http::get(&ops, "/metrics").await?;
            let purged =
                |kind: &str| relay_tests::http::sample(&text, &format!("relay_purged_total{{kind=\"{kind}\"}}"));
            (status == 200 && purged("cards")? >= 1.0 && purged("messages")? >= 1.0 && purged("peeks")? >= 1.0)
                .then_some(())
        },
    )
    .await;
    let gone = b.alice.tool("read_job", json!({ "id": finished })).await;
    assert!(refused(&gone) && text(&gone).contains("no card"), "{}", text(&gone));
    for kept in [&uncleaned, &waiting] {
        b.alice.tool_ok("read_job", json!({ "id": kept })).await;
    }
    let tracked = carol.rpc.track(TrackRequest { id: read.id.clone() }).await.unwrap_err();
    assert_eq!(tracked.code(), tonic::Code::NotFound, "{}", tracked.message());
    let deliveries: i64 =
        db.query_one("select count(*) from deliveries where message_id = $1", &[&read.id]).await.unwrap().get(0);
    assert_eq!(deliveries, 0, "a purged message's deliveries go with it");
    let peeks: i64 =
        db.query_one("select count(*) from peeks where at > now() - interval '1 hour'", &[]).await.unwrap().get(0);
    let all_peeks: i64 = db.query_one("select count(*) from peeks", &[]).await.unwrap().get(0);
    assert_eq!((peeks, all_peeks), (1, 1), "the old peek record went, the recent one stayed");
    let kept = bob.inbox(0, true).await.unwrap().messages;
    assert_eq!(kept.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), [unread.id.as_str()], "unread mail stays");
}

#[tokio::test]
async fn a_permission_request_whose_call_is_gone_is_still_escalated_then_refused() {
    // The first replica's wait is long: the request stays with the operator until it stops.
    let mut b = board(&[("RELAY_APPROVAL_WAIT_S", "60")]).await;
    let human = b.server.admin_ok(&["human", "add", "acme"]);
    // The operator is asked; then the asking agent dies and the replica stops, and no replica runs
    // until both of the request's deadlines have passed.
    let (approval, mut agent) = operator_asked(&mut b, "Tidy up", "make clean").await;
    agent.child.kill().await.unwrap();
    let port = b.server.port;
    b.server.stop().await;
    let db = TestDb { url: b.server.db_url.clone(), name: String::new() };
    let sql = db.sql().await;
    let overdue =
        "update approvals set escalate_at = now() - interval '2 seconds', expire_at = now() - interval '1 second'
                   where id = $1 and state = 'pending'";
    assert_eq!(sql.execute(overdue, &[&approval]).await.unwrap(), 1, "the request waits for the operator");
    let server = Server::start_with_env(&db, port, &[("RELAY_APPROVAL_WAIT_S", "5")]).await;

    // The human is still asked, and has the whole wait (5 s) to answer before it is refused.
    let asked_human = "select m.created_at from messages m
                       join deliveries d on d.message_id = m.id
                       join endpoint_addresses ea on ea.id = d.recipient_id
                       where ea.address = 'acme/me' and starts_with(m.body, '[Approval ' || $1 || ']')";
    eventually(Duration::from_secs(20), "the request to reach the human", || async {
        sql.query_opt(asked_human, &[&approval]).await.unwrap().map(|_| ())
    })
    .await;
    let listed = relay_tests::server::human(&server.url, &human, &["approvals"]).await.1;
    assert!(listed.contains(&approval), "the human's list shows it: {listed}");
    let decided = format!(
        "select a.state, coalesce(a.decided_by, ''), extract(epoch from a.decided_at - ({asked_human}))::float8
         from approvals a where a.id = $1"
    );
    let (by, human_had): (String, f64) =
        eventually(Duration::from_secs(20), "the unanswered request to be refused", || async {
            let row = sql.query_one(&decided, &[&approval]).await.unwrap();
            (row.get::<_, String>(0) == "deny").then(|| (row.get(1), row.get(2)))
        })
        .await;
    assert_eq!(by, "timeout", "refused for want of an answer, by nobody");
    assert!(human_had >= 5.0, "refused {human_had} s after the human was asked");
}

#[tokio::test]
async fn an_operator_handing_a_request_on_late_gives_the_human_the_whole_wait() {
    let mut b = board(&[("RELAY_APPROVAL_WAIT_S", "5")]).await;
    b.server.admin_ok(&["human", "add", "acme"]);
    let (approval, _agent) = operator_asked(&mut b, "Prune branches", "git branch -D old").await;
    // The operator answers with three seconds of the request's time left.
    let db = TestDb { url: b.server.db_url.clone(), name: String::new() };
    let sql = db.sql().await;
    let late =
        "update approvals set escalate_at = now() + interval '1 minute', expire_at = now() + interval '3 seconds'
                where id = $1 and state = 'pending'";
    assert_eq!(sql.execute(late, &[&approval]).await.unwrap(), 1);
    b.alice.tool_ok("answer_permission", json!({ "id": approval, "decision": "owner" })).await;

    // The human is asked, with the whole wait from then.
    let human_has = "select a.state, extract(epoch from a.expire_at - m.created_at)::float8
                     from approvals a, messages m
                     join deliveries d on d.message_id = m.id
                     join endpoint_addresses ea on ea.id = d.recipient_id
                     where a.id = $1 and ea.address = 'acme/me' and starts_with(m.body, '[Approval ' || $1 || ']')";
    let row = sql.query_one(human_has, &[&approval]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "escalated");
    let window: f64 = row.get(1);
    assert!(window >= 5.0, "the human has {window} s to answer");
}

/// A card's agent asks to run `command` and waits; the operator, alice, reads the question. The
/// request's id, and the agent's bridge.
async fn operator_asked(b: &mut Board, title: &str, command: &str) -> (String, Bridge) {
    let (_, mut agent) = running_card(b, title).await;
    let arguments = json!({ "tool_name": "Bash", "input": { "command": command } });
    agent.start_request("tools/call", json!({ "name": "relay_permission", "arguments": arguments })).await;
    let question = b.alice.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    let body = question["structuredContent"]["messages"][0]["body"].as_str().unwrap().to_owned();
    assert!(body.starts_with("[Approval ") && body.contains(command), "{body}");
    (body[10..20].to_owned(), agent)
}

/// A card posted by alice, claimed by ci's worker, and its agent's bridge, holding the card's job
/// token, started and initialized.
async fn running_card(b: &mut Board, title: &str) -> (String, Bridge) {
    let posted = b.alice.tool_ok("post_job", json!({ "title": title, "repo": "app" })).await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();
    let mut w = worker_client(channel(&b.server.url).await, &b.ci);
    let claimed = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.unwrap();
    assert_eq!(claimed.job.unwrap().id, id);
    let mut agent = Bridge::start_card(&b.server.url, &claimed.job_token);
    agent.initialize("2025-06-18").await;
    (id, agent)
}

/// The card as `read_job` shows it.
async fn card(b: &mut Board, id: &str) -> Value {
    b.alice.tool_ok("read_job", json!({ "id": id })).await["structuredContent"].clone()
}

/// The card once `ready` holds for it, read every 100 ms for up to 30 s (through alice's bridge,
/// which the closure of `eventually` cannot borrow).
async fn card_until(b: &mut Board, id: &str, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = card(b, id).await;
        if ready(&now) {
            return now;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}: {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `agent-bridge worker` serving the board's repository with `agent` as every card's agent CLI.
fn worker(b: &Board, worktrees: &Path, agent: &Path, extra: &[&str], env: &[(&str, &Path)]) -> tokio::process::Child {
    worker_with(b, worktrees, &format!("claude={} {{prompt}}", agent.display()), extra, env)
}

/// `agent-bridge worker` serving the board's repository, its agents set by `--agent agent`.
fn worker_with(
    b: &Board,
    worktrees: &Path,
    agent: &str,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> tokio::process::Child {
    tokio::process::Command::new(bin("agent-bridge"))
        .arg("worker")
        .arg("--repo")
        .arg(b.repo.path().join("app"))
        .arg("--worktrees")
        .arg(worktrees)
        .arg("--agent")
        .arg(agent)
        .args(["--poll-ms", "100"])
        .args(extra)
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .env("BRIDGE", bin("agent-bridge"))
        .env("RELAY_SERVER", &b.server.url)
        .env("RELAY_TOKEN", &b.ci)
        .env("RELAY_CONFIG", "/nonexistent/bridge.toml")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn a_worker_with_concurrency_runs_cards_at_once_each_in_its_worktree() {
    let mut b = board(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("go");
    let agent = StandIn { gated: true, ..StandIn::default() }.write(dir.path(), "gated.sh");
    let worktrees = dir.path().join("worktrees");
    let mut ids = Vec::new();
    for title in ["First", "Second"] {
        let posted = b.alice.tool_ok("post_job", json!({ "title": title, "repo": "app", "requires_pr": false })).await;
        ids.push(posted["structuredContent"]["id"].as_str().unwrap().to_owned());
    }
    let _worker = worker(&b, &worktrees, &agent, &["--concurrency", "2"], &[("GO", &gate)]);
    eventually(Duration::from_secs(30), "both cards' agents to run at once", || async {
        ids.iter().all(|id| worktrees.join(id).join("started").exists()).then_some(())
    })
    .await;
    let listed = b.alice.tool_ok("list_jobs", json!({ "state": "in-progress" })).await;
    let running = listed["structuredContent"]["jobs"].as_array().unwrap().len();
    assert_eq!(running, 2, "each under its own lease: {}", text(&listed));
    std::fs::write(&gate, "").unwrap();
    for id in &ids {
        card_until(&mut b, id, "the card to reach review", |c| c["state"] == "review").await;
        assert!(worktrees.join(id).join("result.txt").exists(), "each card works in its own worktree");
    }
}

#[tokio::test]
async fn a_worker_that_cannot_renew_for_a_whole_lease_stops_the_agent() {
    let mut b = board(&[("RELAY_LEASE_S", "2")]).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = executable(dir.path(), "long.sh", "#!/bin/sh\necho $$ > \"$PIDS/agent.pid\"\nexec sleep 300\n");
    let worktrees = dir.path().join("worktrees");
    b.alice.tool_ok("post_job", json!({ "title": "Long", "repo": "app", "requires_pr": false })).await;
    let _worker = worker(&b, &worktrees, &agent, &[], &[("PIDS", dir.path())]);
    let pid_file = dir.path().join("agent.pid");
    let pid = eventually(Duration::from_secs(30), "the card's agent to start", || async {
        std::fs::read_to_string(&pid_file).ok().filter(|p| p.ends_with('\n')).map(|p| p.trim().to_owned())
    })
    .await;
    let alive = |pid: &str| relay_tests::signal(pid.parse().expect("a pid"), 0);
    assert!(alive(&pid));
    // The server goes away: the worker cannot renew, and after a whole lease stops the agent.
    b.server.stop().await;
    eventually(Duration::from_secs(20), "the agent to be stopped", || async { (!alive(&pid)).then_some(()) }).await;
}

#[tokio::test]
async fn a_card_whose_pull_request_merges_is_done_and_a_failed_check_shows_on_it() {
    let mut b = board(&[("RELAY_PR_CHECK_S", "0.2")]).await;
    let dir = tempfile::tempdir().unwrap();
    let pr = "https://forge.example/acme/app/pull/7";
    let agent = StandIn { pr_url: Some(pr), ..StandIn::default() }.write(dir.path(), "pr.sh");
    // The forge says what the test wrote (read once), or fails like a CLI that is not logged in.
    let forge = executable(
        dir.path(),
        "forge.sh",
        "#!/bin/sh\nsaid=$(cat \"$FORGE_STATE\")\nif [ \"$said\" = fail ]; then echo 'gh: not logged in' >&2; exit 1; fi\nprintf '%s\\n' \"$said\"\n",
    );
    let state = dir.path().join("state.json");
    // Replaced whole, so the forge never reads a file half written.
    let say = |path: &Path, text: &str| {
        let next = path.with_extension("next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, path).unwrap();
    };
    say(&state, r#"{"state":"OPEN","mergedAt":null}"#);
    let posted = b.alice.tool_ok("post_job", json!({ "title": "Open a PR", "repo": "app", "requires_pr": true })).await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();
    let forge_flag = format!("*={} {{pr}}", forge.display());
    let _worker =
        worker(&b, &dir.path().join("worktrees"), &agent, &["--forge", &forge_flag], &[("FORGE_STATE", &state)]);

    let reviewed = card_until(&mut b, &id, "the card to reach review", |c| c["state"] == "review").await;
    assert_eq!(reviewed["pr_url"], pr);

    say(&state, "fail");
    let failed = card_until(&mut b, &id, "the failed check to show", |c| {
        c["last_error"].as_str().is_some_and(|e| e.contains("cannot check the pull request"))
    })
    .await;
    assert!(failed["last_error"].as_str().unwrap().contains("gh: not logged in"), "{failed}");
    assert_eq!(failed["state"], "review", "a failed check moves nothing");

    say(&state, r#"{"state":"MERGED","mergedAt":"2026-11-30T10:00:00Z"}"#);
    card_until(&mut b, &id, "the merged card to reach done", |c| c["state"] == "done").await;
    let inbox = b.alice.tool_ok("relay_inbox", json!({})).await;
    assert!(text(&inbox).contains(&format!("its pull request {pr} was merged")), "{}", text(&inbox));
}

/// A stand-in `codex mcp-server`: asks once to run a command, keeps the answer in its worktree.
const CODEX_STAND_IN: &str = r#"import json, os, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def read():
    return json.loads(sys.stdin.readline())
init = read()
assert init["params"]["capabilities"].get("elicitation") == {}, init
send({"jsonrpc": "2.0", "id": init["id"], "result": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "codex", "version": "0"}}})
read()
call = read()
args = call["params"]["arguments"]
relay = args["config"]["mcp_servers"]["relay"]
with open(os.path.join(args["cwd"], "run.json"), "w") as f:
    json.dump({"approval": args["approval-policy"], "relay_env": sorted(relay["env_vars"]),
               "token_in_call": os.environ["RELAY_JOB_TOKEN"] in json.dumps(call)}, f)
send({"jsonrpc": "2.0", "id": "q1", "method": "elicitation/create", "params": {
    "message": "Allow Codex to run `git push --force`?", "requestedSchema": {"type": "object", "properties": {}},
    "codex_elicitation": "exec-approval", "codex_command": ["git", "push", "--force"], "codex_cwd": args["cwd"]}})
# Codex goes on talking while a person decides: its ping is answered before the decision comes.
send({"jsonrpc": "2.0", "id": "p1", "method": "ping"})
first, second = read(), read()
answer = first if first.get("id") == "q1" else second
with open(os.path.join(args["cwd"], "ping.txt"), "w") as f:
    f.write("answered first" if first.get("id") == "p1" else "answered after the decision")
# Written whole under a name of its own, then renamed: the test never reads half a file.
with open(os.path.join(args["cwd"], "decision.part"), "w") as f:
    f.write(answer["result"]["decision"])
os.rename(os.path.join(args["cwd"], "decision.part"), os.path.join(args["cwd"], "decision.txt"))
send({"jsonrpc": "2.0", "id": call["id"], "result": {"content": [{"type": "text", "text": "asked"}]}})
"#;

/// A stand-in `codex mcp-server` that asks twice: the second time once the file `go` appears in its
/// worktree. Each answer is kept in the worktree (`decision-1.txt`, `decision-2.txt`).
const CODEX_ASKING_TWICE: &str = r#"import json, os, sys, time
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def read():
    return json.loads(sys.stdin.readline())
init = read()
send({"jsonrpc": "2.0", "id": init["id"], "result": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "codex", "version": "0"}}})
read()
call = read()
cwd = call["params"]["arguments"]["cwd"]
for n in (1, 2):
    while n == 2 and not os.path.exists(os.path.join(cwd, "go")):
        time.sleep(0.05)
    send({"jsonrpc": "2.0", "id": "q%d" % n, "method": "elicitation/create", "params": {
        "message": "Allow Codex to run `make step%d`?" % n, "requestedSchema": {"type": "object", "properties": {}},
        "codex_elicitation": "exec-approval", "codex_command": ["make", "step%d" % n], "codex_cwd": cwd}})
    answer = read()
    # Written whole under a name of its own, then renamed: the test never reads half a file.
    path = os.path.join(cwd, "decision-%d.txt" % n)
    with open(path + ".part", "w") as f:
        f.write(answer["result"]["decision"])
    os.rename(path + ".part", path)
send({"jsonrpc": "2.0", "id": call["id"], "result": {"content": [{"type": "text", "text": "asked twice"}]}})
"#;

/// The worker asks as an endpoint of its own. When that session is lost between two questions (here
/// another client of the machine takes its handle over), the worker opens one anew and the second
/// question still reaches the operator, instead of every later question being refused.
#[tokio::test]
async fn a_worker_whose_session_was_taken_over_still_asks_the_operator() {
    let mut b = board(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let codex = dir.path().join("codex.py");
    std::fs::write(&codex, CODEX_ASKING_TWICE).unwrap();
    let worktrees = dir.path().join("worktrees");
    let posted = b
        .alice
        .tool_ok("post_job", json!({ "title": "Two steps", "repo": "app", "agent": "codex", "requires_pr": false }))
        .await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();
    let _worker = worker_with(&b, &worktrees, &format!("codex=python3 {}", codex.display()), &[], &[]);

    let answer = async |b: &mut Board, step: &str, asker: &str| {
        let inbox = b.alice.tool_ok("relay_inbox", json!({ "wait_s": 30 })).await;
        let body = inbox["structuredContent"]["messages"][0]["body"].as_str().unwrap().to_owned();
        assert!(body.starts_with("[Approval a") && body.contains(step), "{body}");
        assert!(body.contains(asker), "asked as {asker}: {body}");
        b.alice.tool_ok("answer_permission", json!({ "id": &body[10..20], "decision": "allow" })).await;
    };
    let decision = |n: u32| worktrees.join(&id).join(format!("decision-{n}.txt"));
    answer(&mut b, "make step1", "acme/ci/worker").await;
    eventually(Duration::from_secs(20), "codex to hear the first decision", || async {
        std::fs::read_to_string(decision(1)).ok()
    })
    .await;

    // Another client of the machine takes the handle `worker` once its session shows no life.
    let server_url = b.server.url.clone();
    let ci = b.ci.clone();
    eventually(Duration::from_secs(20), "the handle `worker` to be taken over", || {
        let (url, token) = (server_url.clone(), ci.clone());
        async move { relay_tests::client::Agent::hello(&url, &token, "worker").await.ok() }
    })
    .await;
    std::fs::write(worktrees.join(&id).join("go"), "").unwrap();

    // Its handle taken, the worker asks under a name of its own.
    answer(&mut b, "make step2", "acme/ci/other-1").await;
    eventually(Duration::from_secs(20), "codex to hear the second decision", || async {
        std::fs::read_to_string(decision(2)).ok()
    })
    .await;
    assert_eq!(std::fs::read_to_string(decision(2)).unwrap(), "approved");
}

#[tokio::test]
async fn a_codex_run_asks_the_operator_before_a_command_like_claude_code() {
    let mut b = board(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let codex = dir.path().join("codex.py");
    std::fs::write(&codex, CODEX_STAND_IN).unwrap();
    let worktrees = dir.path().join("worktrees");
    let posted = b
        .alice
        .tool_ok("post_job", json!({ "title": "Push it", "repo": "app", "agent": "codex", "requires_pr": false }))
        .await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();
    // Another worker of the machine holds the handle `worker`: this one asks under a name of its own.
    let mut other = relay_tests::client::Agent::hello(&b.server.url, &b.ci, "worker").await.unwrap();
    let _held = other.subscribe(0).await;
    let _worker = worker_with(&b, &worktrees, &format!("codex=python3 {}", codex.display()), &[], &[]);

    // The operator is asked, as for Claude Code, and allows it.
    let inbox = b.alice.tool_ok("relay_inbox", json!({ "wait_s": 30 })).await;
    let body = inbox["structuredContent"]["messages"][0]["body"].as_str().unwrap().to_owned();
    assert!(body.starts_with("[Approval a") && body.contains("git push --force") && body.contains(&id), "{body}");
    assert!(body.contains("acme/ci/other-1") && !body.contains("acme/ci/worker"), "asked under a free name: {body}");
    let approval = body[10..20].to_owned();
    b.alice.tool_ok("answer_permission", json!({ "id": approval, "decision": "allow" })).await;
    let decision = worktrees.join(&id).join("decision.txt");
    eventually(Duration::from_secs(20), "codex to hear the decision", || async {
        std::fs::read_to_string(&decision).ok()
    })
    .await;
    assert_eq!(std::fs::read_to_string(&decision).unwrap(), "approved");
    assert_eq!(
        std::fs::read_to_string(worktrees.join(&id).join("ping.txt")).unwrap(),
        "answered first",
        "the worker answers codex while the operator decides"
    );
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(worktrees.join(&id).join("run.json")).unwrap()).unwrap();
    assert_eq!(run["approval"], "on-request", "codex asks rather than running everything");
    let env: Vec<&str> = run["relay_env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(
        env.contains(&"RELAY_JOB_TOKEN") && !env.contains(&"RELAY_TOKEN"),
        "its bridge holds the card's credential only: {env:?}"
    );
    assert_eq!(run["token_in_call"], false, "the job token is named, never written into the call Codex may keep");
}

/// A card may name the paths its work changes: while its agent runs, the card's endpoint holds them
/// (others are told whose they are), and the claim ends with the attempt.
#[tokio::test]
async fn a_card_that_names_paths_holds_them_for_its_agent_while_it_runs() {
    let mut b = board(&[]).await;
    let scripts = tempfile::tempdir().unwrap();
    let agent = StandIn { gated: true, ..StandIn::default() }.write(scripts.path(), "stand-in.sh");
    let go = scripts.path().join("go");
    let bad = b.alice.tool("post_job", json!({ "title": "Nope", "repo": "app", "paths": ["../x"] })).await;
    assert!(bad["isError"] == true && text(&bad).contains("leaves the repository"), "{}", text(&bad));
    let post = json!({ "title": "Rework auth", "repo": "app", "requires_pr": false, "paths": ["src/auth/", "docs"] });
    let posted = b.alice.tool_ok("post_job", post).await;
    assert_eq!(posted["structuredContent"]["paths"], json!(["docs", "src/auth"]));
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();

    let worker = tokio::process::Command::new(bin("agent-bridge"))
        .arg("worker")
        .arg("--worktrees")
        .arg(scripts.path().join("worktrees"))
        .arg("--agent")
        .arg(format!("claude={} {{prompt}}", agent.display()))
        .args(["--poll-ms", "100", "--once"])
        .env("BRIDGE", bin("agent-bridge"))
        .env("GO", &go)
        .env("RELAY_SERVER", &b.server.url)
        .env("RELAY_TOKEN", &b.ci)
        .env("RELAY_CONFIG", "/nonexistent/bridge.toml")
        .env("RELAY_LOG", "info")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(scripts.path().join("worker.log")).unwrap())
        .kill_on_drop(true)
        .output();
    let worker = tokio::spawn(worker);
    let log = || std::fs::read_to_string(scripts.path().join("worker.log")).unwrap_or_default();

    let holder = format!("acme/ci/job-{id}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let claim = loop {
        let listed = b.alice.tool_ok("relay_claims", json!({})).await;
        let claims = listed["structuredContent"]["claims"].as_array().cloned().unwrap_or_default();
        if let Some(claim) = claims.into_iter().find(|c| c["holder"] == holder.as_str()) {
            break claim;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the card's paths were not claimed: {}\n{}",
            text(&listed),
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(claim["paths"], json!(["docs", "src/auth"]));
    assert_eq!(claim["exclusive"], true);
    assert!(claim["reason"].as_str().unwrap().contains("Rework auth"), "{claim}");
    let repo = claim["repo"].as_str().unwrap().to_owned();
    assert!(repo.starts_with("local:acme/ci:"), "a repository without a remote: {repo}");
    let hotfix = json!({ "paths": ["src/auth/login.rs"], "repo": repo, "reason": "hotfix" });
    let refused = b.alice.tool_ok("relay_claim", hotfix.clone()).await;
    assert_eq!(refused["structuredContent"]["granted"], false, "{}", text(&refused));
    assert_eq!(refused["structuredContent"]["conflicts"][0]["holder"], holder.as_str());

    std::fs::write(&go, "").unwrap();
    let out =
        tokio::time::timeout(Duration::from_secs(60), worker).await.expect("the worker ran the card").unwrap().unwrap();
    assert!(out.status.success(), "worker: {}", log());
    let read = b.alice.tool_ok("read_job", json!({ "id": id })).await;
    assert_eq!(read["structuredContent"]["state"], "review");
    let granted = b.alice.tool_ok("relay_claim", hotfix).await;
    assert_eq!(granted["structuredContent"]["granted"], true, "the claim ended with the attempt: {}", text(&granted));
}
