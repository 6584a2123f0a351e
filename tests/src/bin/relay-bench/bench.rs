//! Relay beside its floor: one relay-server on a throwaway Postgres cluster that is durable like
//! production (fsync and synchronous commit on), the raw Postgres floor measured in the same run on
//! the same cluster, and Relay's figures printed beside it as ratios, with the targets.
//!
//! usage: relay-bench [--fsync-off] [--seconds N] [--rate-seconds N] [--idle N,N] [--unread N] [--stored N]
//!   --fsync-off       a fast, non-durable cluster (figures not comparable to production)
//!   --seconds N       length of each throughput phase (default 5)
//!   --rate-seconds N  length of each fixed-rate phase (default 20)
//!   --idle N,N        idle push streams to hold open (default 1000,10000)
//!   --idle-shared     idle agents a hundred to a connection (beyond 15000 they always are)
//!   --unread N        unread messages for the inbox phase (default 100000)
//!   --stored N        sends already stored for the ids phase, messages for the search phase (default 1000000)
//! With DATABASE_URL set it uses that database instead. Every phase is bounded in count and time.
//! With `nats-server` on PATH, the nats phase measures NATS JetStream beside Relay, and Relay again
//! with `synchronous_commit=off` (JetStream's own durability class: it does not fsync each message).
//! Before the rate, idle and inbox phases it vacuums and analyzes the tables the earlier phases
//! wrote, as pgbench does before a run, and checkpoints, so no phase meets the autovacuum or the
//! checkpoint of another's writes.
//! Build with `cargo build --release --workspace` and run `target/release/relay-bench`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use relay_proto::v1::{HelloRequest, InboxRequest, Push, SendRequest, WhoAmIRequest, push};
use relay_server::domain::delivery::Kind;
use relay_server::domain::ids::{AccountId, EndpointId, ReplicaId, new_message_id};
use relay_server::domain::limits;
use relay_server::store::messages::write;
use relay_tests::client::{self, Agent, Client};
use relay_tests::mcp::{Bridge, BridgeSpec};
use relay_tests::pg::{self, TestDb};
use relay_tests::server::Server;
use tokio::sync::Mutex;
use tokio_postgres::NoTls;
use tonic::{Code, Streaming};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

mod ids;
mod nats;
mod redaction;
mod search;
mod topics;

/// Followers of the topics phase's topic, each with its push stream open.
const TOPIC_FOLLOWERS: usize = 1_000;

/// No single wait of a phase may run longer than this, whatever the counts.
const PHASE_LIMIT: Duration = Duration::from_secs(120);
/// Most requests of an open-loop phase in flight at once; beyond it the phase stops offering.
const MAX_IN_FLIGHT: usize = 20_000;

struct Args {
    durable: bool,
    seconds: u64,
    rate_seconds: u64,
    idle: Vec<usize>,
    /// Idle agents a hundred to a connection at every step, for a curve of one kind.
    idle_shared: bool,
    unread: i64,
    /// Sends already stored when the ids phase writes more.
    stored: i64,
    /// The phases to run; the floor always runs.
    only: Vec<String>,
}

/// The benchmark's phases, in the order they run.
/// `redact` runs first, in this process, with no server: `--only redact` needs no database.
const PHASES: [&str; 11] =
    ["redact", "serial", "throughput", "nats", "mcp", "rate", "idle", "inbox", "ids", "search", "topics"];
/// Bodies of each kind the redact phase redacts.
const REDACT_RUNS: usize = 300;
/// The most idle streams one step of the idle phase holds open.
const MAX_IDLE: usize = 30_000;
/// Up to this many idle agents, each has a connection of its own (the server and this process each
/// hold one file per connection).
const OWN_CONNECTIONS_UP_TO: usize = 15_000;

impl Args {
    fn runs(&self, phase: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == phase)
    }
}

const USAGE: &str =
    "usage: relay-bench [--fsync-off] [--seconds N] [--rate-seconds N] [--idle N,N] [--idle-shared] [--unread N] [--stored N]
  --fsync-off       a fast, non-durable cluster (figures not comparable to production)
  --seconds N       length of each throughput phase, 1-60 (default 5)
  --rate-seconds N  length of each fixed-rate phase, 1-120 (default 20)
  --idle N,N        idle push streams to hold open, each at most 30000 (default 1000,10000); each
                    agent on a connection of its own up to 15000, a hundred to a connection beyond
  --idle-shared     idle agents a hundred to a connection at every step
  --unread N        unread messages for the inbox phase, at most 1000000 (default 100000)
  --stored N        sends already stored when the ids phase writes random and time-ordered message
                    ids, and messages the search phase searches, at most 5000000 (default 1000000)
  --only P,P        run only these phases (redact, serial, throughput, nats, mcp, rate, idle, inbox, ids,
                    search); the floor
                    always runs, except for redact alone";

/// The arguments, or why they are wrong.
fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        durable: true,
        seconds: 5,
        rate_seconds: 20,
        idle: vec![1000, 10_000],
        idle_shared: false,
        unread: 100_000,
        stored: 1_000_000,
        only: Vec::new(),
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} takes a value"));
        let number =
            |text: String| text.trim().parse::<u64>().map_err(|_| format!("{flag} takes a whole number, not {text:?}"));
        match flag.as_str() {
            "--fsync-off" => args.durable = false,
            "--seconds" => args.seconds = number(value()?)?.clamp(1, 60),
            "--rate-seconds" => args.rate_seconds = number(value()?)?.clamp(1, 120),
            "--idle" => {
                args.idle = value()?
                    .split(',')
                    .map(|n| number(n.to_owned()).map(|n| (n as usize).min(MAX_IDLE)))
                    .collect::<Result<_, _>>()?
            }
            "--idle-shared" => args.idle_shared = true,
            "--unread" => args.unread = number(value()?)?.min(1_000_000) as i64,
            "--stored" => args.stored = number(value()?)?.min(5_000_000) as i64,
            "--only" => {
                args.only = value()?.split(',').map(|p| p.trim().to_owned()).collect();
                if let Some(unknown) = args.only.iter().find(|p| !PHASES.contains(&p.as_str())) {
                    return Err(format!("--only: no phase {unknown:?} (phases: {})", PHASES.join(", ")));
                }
            }
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn args() -> Args {
    match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(why) if why.is_empty() => {
            println!("{USAGE}");
            std::process::exit(0);
        }
        Err(why) => {
            eprintln!("relay-bench: {why}\n{USAGE}");
            std::process::exit(2);
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[derive(Clone, Copy, Default)]
struct Quantiles {
    n: usize,
    p50: f64,
    p99: f64,
    p999: f64,
}

fn quantiles(mut samples: Vec<Duration>) -> Quantiles {
    if samples.is_empty() {
        return Quantiles::default();
    }
    samples.sort();
    let at = |p: f64| ms(samples[((samples.len() as f64 - 1.0) * p).round() as usize]);
    Quantiles { n: samples.len(), p50: at(0.50), p99: at(0.99), p999: at(0.999) }
}

/// CPU time, in seconds, of the server, of every Postgres process, and of this benchmark.
#[derive(Clone, Copy)]
struct Cpu {
    server: f64,
    postgres: f64,
    bench: f64,
    /// Seconds the host's cores were busy, whoever with (the kernel's own work included).
    host: f64,
    /// Seconds the hypervisor gave the host's cores to others while the host had work for them
    /// (steal): a throttled or crowded host, whose figures are not comparable with a free one's.
    stolen: f64,
}

impl Cpu {
    fn now(server: u32) -> Self {
        // utime and stime, the 14th and 15th fields of /proc/PID/stat, and cutime and cstime, the
        // 16th and 17th (its children's that ended), in clock ticks (100 a second). The children's
        // count for Postgres only: a backend whose connection closed is gone from /proc, its CPU
        // added to the postmaster's. The benchmark's own children (the cluster's start script,
        // nats-server) are not its work.
        let ticks = |stat: &str| -> Option<(String, f64, f64)> {
            let (head, tail) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_owned();
            let field = |i: usize| tail.split_whitespace().nth(i).and_then(|f| f.parse::<f64>().ok());
            let own = field(11)? + field(12)?;
            let children = field(13)? + field(14)?;
            Some((comm, own / 100.0, children / 100.0))
        };
        let of = |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| ticks(&s));
        let postgres = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| of(e.file_name().to_str()?))
            .filter(|(comm, ..)| comm == "postgres")
            .map(|(_, own, children)| own + children)
            .sum();
        // The host's line of /proc/stat: user, nice, system, idle, iowait, irq, softirq, steal, in
        // clock ticks; busy is all but idle, iowait and what the hypervisor took.
        let (host, stolen) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|stat| {
                let line = stat.lines().next()?.strip_prefix("cpu ")?.to_owned();
                let t: Vec<f64> = line.split_whitespace().take(8).map(|f| f.parse().unwrap_or(0.0)).collect();
                (t.len() == 8).then(|| ((t[0] + t[1] + t[2] + t[5] + t[6]) / 100.0, t[7] / 100.0))
            })
            .unwrap_or((0.0, 0.0));
        Self {
            server: of(&server.to_string()).map_or(0.0, |(_, own, _)| own),
            postgres,
            bench: of("self").map_or(0.0, |(_, own, _)| own),
            host,
            stolen,
        }
    }

    /// Cores the host kept busy on average since `before`, `seconds` ago.
    fn cores(&self, before: &Cpu, seconds: f64) -> f64 {
        (self.host - before.host) / seconds.max(f64::MIN_POSITIVE)
    }

    /// The share of the host's cores' time the hypervisor took since `before`, `seconds` ago.
    fn stolen_share(&self, before: &Cpu, seconds: f64) -> f64 {
        (self.stolen - before.stolen) / (seconds * host_cores() as f64).max(f64::MIN_POSITIVE)
    }

    /// CPU microseconds per operation of the server, Postgres and the benchmark, since `before`.
    fn per_op(&self, before: &Cpu, ops: f64) -> [f64; 3] {
        let us = |after: f64, before: f64| (after - before) * 1e6 / ops.max(1.0);
        [us(self.server, before.server), us(self.postgres, before.postgres), us(self.bench, before.bench)]
    }

    /// The same, as the table prints it.
    fn per(self, before: Cpu, ops: f64) -> String {
        cpu_row(self.per_op(&before, ops))
    }
}

/// CPU microseconds per operation of the server, Postgres and the benchmark, as the table prints them.
fn cpu_row([server, postgres, bench]: [f64; 3]) -> String {
    format!("{server:.0} / {postgres:.0} / {bench:.0}")
}

/// The host's cores, as the scheduler offers them to this process (one when it cannot tell).
fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The host's load average over the last minute, from /proc/loadavg.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// One line of the summary: Relay's figure, the floor's, their ratio, and the target.
struct Row {
    what: String,
    relay: String,
    floor: String,
    ratio: String,
    target: String,
}

fn row(what: &str, relay: String, floor: Option<f64>, relay_value: f64, target: &str) -> Row {
    let (floor, ratio) = match floor {
        Some(f) if f > 0.0 => (format!("{f:.2}"), format!("{:.1}x", relay_value / f)),
        _ => (String::new(), String::new()),
    };
    Row { what: what.to_owned(), relay, floor, ratio, target: target.to_owned() }
}

/// How late a backend may report its statistics (Postgres' idle flush interval), and a margin.
const STATS_SETTLE: Duration = Duration::from_secs(11);
/// How late a backend's statistics may land at most: one that finds the statistics' lock taken
/// defers its report, until 60 s after its last one (Postgres' `PGSTAT_MAX_INTERVAL`), and a margin.
/// The thousands of commits that open the idle streams were seen landing that late, piecemeal.
const STATS_LAND: Duration = Duration::from_secs(65);

/// Counters of the database the server writes to.
struct Stats {
    client: tokio_postgres::Client,
    statements: bool,
    /// The counters' reads, prepared once: a statement prepared on the spot costs a transaction of
    /// its own (Parse, then Sync), which would count in the figures.
    reads: [tokio_postgres::Statement; 4],
}

impl Stats {
    async fn connect(url: &str) -> Self {
        let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect for statistics");
        tokio::spawn(conn);
        let statements = client.batch_execute("create extension if not exists pg_stat_statements").await.is_ok()
            && client.query_one("select count(*) from pg_stat_statements", &[]).await.is_ok();
        let calls = if statements {
            "select coalesce(sum(calls), 0)::bigint from pg_stat_statements"
        } else {
            "select 0::bigint"
        };
        let mut reads = Vec::new();
        for sql in [
            "select pg_snapshot_xmax(pg_current_snapshot())::text::bigint",
            calls,
            "select wal_sync from pg_stat_wal",
            "select xact_commit from pg_stat_database where datname = current_database()",
        ] {
            reads.push(client.prepare(sql).await.expect("a statistics read"));
        }
        Self { client, statements, reads: reads.try_into().expect("four reads") }
    }

    /// The counters as they stand now (see [`Counters`]).
    async fn counters(&self) -> Counters {
        let _ = self.client.batch_execute("select pg_stat_clear_snapshot()").await;
        let mut values = [0i64; 4];
        for (value, read) in values.iter_mut().zip(&self.reads) {
            // A reading that failed would pass for a counter at zero, and every figure from it for a
            // real one: the run stops instead.
            *value = self.client.query_one(read, &[]).await.expect("a statistics read").get(0);
        }
        let [writes, statements, flushes, commits] = values;
        Counters { writes, statements, flushes, commits }
    }
}

/// What the database has done so far.
#[derive(Clone, Copy)]
struct Counters {
    /// Writing transactions (each takes a transaction id; read-only ones take none). Exact at once,
    /// unlike the statistics backends report up to 10 s late.
    writes: i64,
    /// Statements of every kind run (when pg_stat_statements is loaded).
    statements: i64,
    /// WAL flushes to disk (what a durable commit costs; concurrent commits may share one).
    flushes: i64,
    /// Transactions committed, read-only ones included (`pg_stat_database.xact_commit`): a lone
    /// SELECT is one.
    commits: i64,
}

impl Counters {
    /// Statements and commits one reading of the counters costs itself: the snapshot cleared and
    /// four reads, each its own transaction.
    const OWN: i64 = 5;
}

impl Stats {
    /// Vacuums and analyzes what the earlier phases wrote, as pgbench does before a run, and
    /// checkpoints: a phase then starts on a settled database instead of meeting the autovacuum and
    /// the checkpoint writes the earlier phases' writes set off.
    async fn settle(&self) {
        // One statement a call: vacuum refuses to run inside the transaction a multi-statement query is.
        for statement in ["vacuum (analyze) messages, deliveries, endpoints", "checkpoint"] {
            if let Err(e) = self.client.batch_execute(statement).await {
                let why = e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_owned());
                println!("(could not {statement} before the phase: {why})");
            }
        }
    }

    /// Waits until every backend's statistics of what came before have landed: [`STATS_LAND`], then
    /// until two readings 5 s apart differ by fewer than 25 (an idle replica's few, and this
    /// reading's own), for at most half a minute more. How long it took.
    async fn quiet(&self) -> Duration {
        let start = Instant::now();
        tokio::time::sleep(STATS_LAND).await;
        let mut last = self.counters().await.commits;
        while start.elapsed() < STATS_LAND + Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let now = self.counters().await.commits;
            if now - last < 25 {
                break;
            }
            last = now;
        }
        start.elapsed()
    }

    /// Forgets the statements run so far, so that [`Stats::print_statements`] shows a phase's own.
    async fn reset_statements(&self) {
        if self.statements {
            let _ = self.client.batch_execute("select pg_stat_statements_reset()").await;
        }
    }

    /// The ten statements that took the most time since the last reset, each with its calls per
    /// operation, its mean execution time and the planning it cost per call (a statement whose plan
    /// is cached costs next to none; one planned again on every call shows it here).
    async fn print_statements(&self, phase: &str, op: &str, ops: f64) {
        if !self.statements {
            return;
        }
        let top = self
            .client
            .query(
                "select calls, mean_exec_time, total_plan_time / calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 80)
                 from pg_stat_statements
                 where calls > 0 and query not like '%pg_stat%' and query not like '%pg_snapshot%'
                 order by total_exec_time + total_plan_time desc limit 10",
                &[],
            )
            .await
            .unwrap_or_default();
        println!("{phase}, statements by total time (calls per {op}, mean execution ms, planning ms per call):");
        for r in top {
            let (calls, exec, plan, query): (i64, f64, f64, String) = (r.get(0), r.get(1), r.get(2), r.get(3));
            println!("  {:>5.2} x {exec:>6.3} ms + plan {plan:>6.3} ms  {query}", calls as f64 / ops);
        }
    }
}

async fn db_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect to the bench database");
    tokio::spawn(conn);
    client
}

/// The floor: what Postgres itself does on this machine, in this run.
struct Floor {
    insert: Quantiles,
    shaped: Quantiles,
    commits_per_s: HashMap<usize, f64>,
    /// CPU microseconds a commit at each number of clients: the server (idle), Postgres, the benchmark.
    cpu_per_commit: HashMap<usize, [f64; 3]>,
}

async fn floor(url: &str, seconds: u64, server: u32) -> Floor {
    let c = db_client(url).await;
    c.batch_execute(
        "create table if not exists bench_floor (id bigserial primary key, body text not null);
         create table if not exists bench_head (id bigint primary key, seq bigint not null);
         create table if not exists bench_msg (id bigserial primary key, body text not null);
         create table if not exists bench_delivery (recipient bigint, seq bigint, message bigint, primary key (recipient, seq));
         insert into bench_head values (1, 0) on conflict do nothing;",
    )
    .await
    .expect("floor tables");
    let serial = |sql: &'static str| {
        let c = &c;
        async move {
            let stmt = c.prepare(sql).await.expect("floor statement");
            quantiles(timed_statements(c, &stmt, 1000, Duration::from_secs(seconds * 2)).await)
        }
    };
    let insert = serial(FLOOR_INSERT).await;
    // A relay-shaped send in one round trip: the message, the recipient's seq bumped under its row
    // lock, the delivery, and the notification.
    let shaped = serial(
        "with m as (insert into bench_msg (body) values ('shaped') returning id),
              h as (update bench_head set seq = seq + 1 where id = 1 returning seq),
              d as (insert into bench_delivery select 1, h.seq, m.id from m, h returning seq)
         select pg_notify('bench_floor', (select seq from d)::text)",
    )
    .await;
    let (mut commits_per_s, mut cpu_per_commit) = (HashMap::new(), HashMap::new());
    for clients in [1usize, 8, 32] {
        let run = floor_commits(url, clients, seconds, server).await;
        commits_per_s.insert(clients, run.rate);
        cpu_per_commit.insert(clients, run.cpu);
    }
    Floor { insert, shaped, commits_per_s, cpu_per_commit }
}

/// The floor's single-row commit.
const FLOOR_INSERT: &str = "insert into bench_floor (body) values ('floor probe')";

/// Up to 1,000 plain sends from `from` to `to` (addresses) written by the statement the server
/// writes a lone plain send with (`SEND_PLAIN`, its argument as the server encodes it), called
/// from the benchmark's connection one at a time for at most `limit`, each timed to its answer: a
/// Relay send's database round trip without the server.
async fn send_statements(url: &str, from: &str, to: &str, limit: Duration) -> Vec<Duration> {
    let c = db_client(url).await;
    let agents = c
        .query_one(
            "select s.id, s.account_id, r.id from endpoint_addresses s, endpoint_addresses r
             where s.address = $1 and r.address = $2",
            &[&from, &to],
        )
        .await
        .expect("the agents' endpoints");
    let stmt = c.prepare(write::SEND_PLAIN).await.expect("the send statement");
    let mut lat = Vec::with_capacity(1000);
    let start = Instant::now();
    while lat.len() < 1000 && start.elapsed() < limit {
        let id = new_message_id();
        let send = write::NewMessage {
            client_id: Some(format!("bench-{id}")),
            thread: id.to_string(),
            id,
            sender: EndpointId(agents.get(0)),
            account: AccountId(agents.get(1)),
            kind: Kind::Message.to_db(),
            body: format!("latency probe {}", lat.len()),
            reply_to: None,
            private: false,
            require_reply: false,
            recipients: vec![EndpointId(agents.get(2))],
            contacts: Vec::new(),
            read_by: None,
        };
        let t = Instant::now();
        let row = c.query_one(&stmt, &[&send, &i32::MAX, &ReplicaId(0)]).await.expect("the send statement");
        lat.push(t.elapsed());
        assert_eq!(row.get::<_, &str>("outcome"), "stored", "the send statement stored nothing");
    }
    lat
}

/// Up to `count` runs of `stmt`, one at a time, for at most `limit`: each timed to its answer.
async fn timed_statements(
    c: &tokio_postgres::Client,
    stmt: &tokio_postgres::Statement,
    count: usize,
    limit: Duration,
) -> Vec<Duration> {
    let mut lat = Vec::with_capacity(count);
    let start = Instant::now();
    while lat.len() < count && start.elapsed() < limit {
        let t = Instant::now();
        c.execute(stmt, &[]).await.expect("floor statement");
        lat.push(t.elapsed());
    }
    lat
}

/// The floor's single-row commits per second from `clients` connections for `seconds`, what its
/// timed window cost the server (`pid`, idle meanwhile), Postgres and the benchmark in CPU
/// microseconds a commit, and how many of the host's cores were busy. The connections are made
/// before the clock starts, as Relay's senders are.
async fn floor_commits(url: &str, clients: usize, seconds: u64, pid: u32) -> FloorRun {
    let mut connected = Vec::with_capacity(clients);
    for _ in 0..clients {
        let c = db_client(url).await;
        let stmt = c.prepare(FLOOR_INSERT).await.expect("floor statement");
        connected.push((c, stmt));
    }
    let before = Cpu::now(pid);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for (c, stmt) in connected {
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                c.execute(&stmt, &[]).await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let after = Cpu::now(pid);
    FloorRun {
        rate: total as f64 / seconds as f64,
        cpu: after.per_op(&before, total as f64),
        cores: after.cores(&before, seconds as f64),
    }
}

/// One run of the floor's commits: commits a second, CPU microseconds a commit (server, Postgres,
/// benchmark), and the host's cores busy.
struct FloorRun {
    rate: f64,
    cpu: [f64; 3],
    cores: f64,
}

/// Adds one turn's CPU a operation (`per_op`), weighted by its operations a second, to `sum`.
fn add_cpu(sum: &mut [f64; 3], per_op: [f64; 3], rate: f64) {
    for (s, us) in sum.iter_mut().zip(per_op) {
        *s += us * rate;
    }
}

/// Endpoints claimed on one machine, each with its own session.
async fn agents(url: &str, token: &str, prefix: &str, n: usize) -> Vec<Agent> {
    let mut out = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(32) {
        let hellos = chunk.iter().map(|i| {
            let (url, token, handle) = (url.to_owned(), token.to_owned(), format!("{prefix}{i}"));
            async move { Agent::hello(&url, &token, &handle).await.expect("hello") }
        });
        out.extend(futures_join(hellos).await);
    }
    out
}

async fn futures_join<T: Send + 'static>(
    futures: impl IntoIterator<Item = impl Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

async fn next_message(stream: &mut Streaming<Push>) -> Option<relay_proto::v1::Message> {
    loop {
        match stream.message().await {
            Ok(Some(Push { event: Some(push::Event::Message(m)) })) => return Some(m),
            Ok(Some(_)) => continue,
            _ => return None,
        }
    }
}

fn send_request(to: &str, body: String) -> SendRequest {
    SendRequest { to: vec![to.to_owned()], body, ..Default::default() }
}

/// Sends for `seconds` from `senders` tasks, each to its own recipient or all to one; messages per second.
async fn throughput(senders: &[Client], recipients: &[String], hot: bool, seconds: u64) -> (f64, u64) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for (i, rpc) in senders.iter().enumerate() {
        let mut rpc = rpc.clone();
        let to = if hot { recipients[0].clone() } else { recipients[i % recipients.len()].clone() };
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut shed) = (0u64, 0u64);
            while Instant::now() < deadline {
                match rpc.send(send_request(&to, format!("throughput {i}/{ok}"))).await {
                    Ok(_) => ok += 1,
                    Err(s) if s.code() == Code::ResourceExhausted => shed += 1,
                    Err(s) => panic!("send failed: {s}"),
                }
            }
            (ok, shed)
        }));
    }
    let (mut ok, mut shed) = (0, 0);
    for t in tasks {
        let (o, s) = t.await.unwrap();
        ok += o;
        shed += s;
    }
    (ok as f64 / seconds as f64, shed)
}

/// Up to 1,000 sends from `alice` to `to`, one at a time, for at most `seconds`: each timed to
/// its answer and, given the recipient's stream, to its push, which it waits for before the next.
async fn serial_sends(
    alice: &mut Agent,
    to: &str,
    stream: Option<&mut Streaming<Push>>,
    seconds: u64,
) -> (Vec<Duration>, Vec<Duration>) {
    serial_sends_up_to(alice, to, stream, 1000, Duration::from_secs(seconds)).await
}

/// As [`serial_sends`], up to `count` sends for at most `limit`.
async fn serial_sends_up_to(
    alice: &mut Agent,
    to: &str,
    mut stream: Option<&mut Streaming<Push>>,
    count: usize,
    limit: Duration,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut sent, mut pushed) = (Vec::with_capacity(count), Vec::new());
    let phase = Instant::now();
    while sent.len() < count && phase.elapsed() < limit {
        let start = Instant::now();
        alice.send(&[to], &format!("latency probe {}", sent.len())).await.unwrap();
        sent.push(start.elapsed());
        if let Some(stream) = stream.as_deref_mut() {
            tokio::time::timeout(PHASE_LIMIT, next_message(stream)).await.expect("push").expect("push");
            pushed.push(start.elapsed());
        }
    }
    (sent, pushed)
}

/// Sends in a serial turn, and the floor's commits in its turn.
const SERIAL_TURN: usize = 50;
/// Turns each of Relay's 32 senders and the floor's 32 clients take, of `--seconds` apiece.
const THROUGHPUT_TURNS: usize = 3;

/// Serial sends from `alice` to `to` (each waiting for its push on `stream`) and the floor's
/// INSERT+COMMIT, in turns of [`SERIAL_TURN`], until 1,000 sends or `seconds`: each timed to its
/// answer.
async fn serial_in_turns(
    alice: &mut Agent,
    to: &str,
    stream: &mut Streaming<Push>,
    url: &str,
    seconds: u64,
) -> (Vec<Duration>, Vec<Duration>) {
    let c = db_client(url).await;
    let stmt = c.prepare(FLOOR_INSERT).await.expect("floor statement");
    let (mut relay, mut floor) = (Vec::with_capacity(1000), Vec::with_capacity(1000));
    let (start, limit) = (Instant::now(), Duration::from_secs(seconds));
    while relay.len() < 1000 && start.elapsed() < limit {
        floor.extend(timed_statements(&c, &stmt, SERIAL_TURN, limit.saturating_sub(start.elapsed())).await);
        let turn =
            serial_sends_up_to(alice, to, Some(&mut *stream), SERIAL_TURN, limit.saturating_sub(start.elapsed()));
        relay.extend(turn.await.0);
    }
    (relay, floor)
}

/// Health checks for `seconds` from `callers` tasks, each on its own connection; calls per second.
async fn health_calls(url: &str, callers: usize, seconds: u64) -> f64 {
    let mut clients = Vec::with_capacity(callers);
    for _ in 0..callers {
        clients.push(HealthClient::new(client::channel(url).await));
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut health| {
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    health.check(HealthCheckRequest { service: String::new() }).await.expect("health check");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("health task");
    }
    total as f64 / seconds as f64
}

struct Offered {
    send: Quantiles,
    push: Quantiles,
    shed: u64,
    failed: u64,
    offered: u64,
    pushed: usize,
}

/// An open loop: `rate` sends a second for `seconds`, spread over sender/recipient pairs whatever
/// the answers take; send latency, push lag (send start to the recipient's stream) and sheds.
async fn offered_rate(pairs: &[(Client, String)], streams: Vec<Streaming<Push>>, rate: u64, seconds: u64) -> Offered {
    let started: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let total = rate * seconds;
    let lags = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let mut receivers = Vec::new();
    for mut stream in streams {
        let (started, lags) = (started.clone(), lags.clone());
        receivers.push(tokio::spawn(async move {
            while let Ok(Some(m)) =
                tokio::time::timeout(Duration::from_secs(seconds + 30), next_message(&mut stream)).await
            {
                let at = Instant::now();
                if let Some(t0) = started.lock().await.remove(&m.body) {
                    lags.lock().await.push(at - t0);
                }
            }
        }));
    }
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let begin = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for i in 0..total {
        tokio::time::sleep_until((begin + interval * i as u32).into()).await;
        if in_flight.load(std::sync::atomic::Ordering::Relaxed) >= MAX_IN_FLIGHT {
            break;
        }
        let (rpc, to) = &pairs[i as usize % pairs.len()];
        let (mut rpc, to, started, in_flight) = (rpc.clone(), to.clone(), started.clone(), in_flight.clone());
        in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tasks.push(tokio::spawn(async move {
            let body = format!("rate {i}");
            let t0 = Instant::now();
            started.lock().await.insert(body.clone(), t0);
            let outcome = rpc.send(send_request(&to, body.clone())).await;
            in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            match outcome {
                Ok(_) => (Some(t0.elapsed()), false),
                Err(s) => {
                    started.lock().await.remove(&body);
                    static SAID: std::sync::Once = std::sync::Once::new();
                    if s.code() != Code::ResourceExhausted {
                        SAID.call_once(|| {
                            eprintln!("a send failed (counted, not repeated): {} {}", s.code(), s.message())
                        });
                    }
                    (None, s.code() == Code::ResourceExhausted)
                }
            }
        }));
    }
    let offered = tasks.len() as u64;
    let (mut send, mut shed, mut failed) = (Vec::new(), 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            (Some(lat), _) => send.push(lat),
            (None, true) => shed += 1,
            (None, false) => failed += 1,
        }
    }
    // Every accepted send's push, or the limit.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !started.lock().await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for r in receivers {
        r.abort();
    }
    let lags = std::mem::take(&mut *lags.lock().await);
    Offered { send: quantiles(send), pushed: lags.len(), push: quantiles(lags), shed, failed, offered }
}

#[tokio::main]
pub async fn main() {
    let args = args();
    if args.runs("redact") {
        let (first, costs) = redaction::measure(REDACT_RUNS);
        println!("redaction: the first call (the rules compiled) {:.1} ms", ms(first));
        for cost in costs {
            println!(
                "redaction of a 64 KiB body, {} ({} found): p50 {:.3} ms p99 {:.3} ms ({} runs)",
                cost.kind, cost.found, cost.times.p50, cost.times.p99, cost.times.n
            );
        }
        if args.only == ["redact"] {
            return;
        }
    }
    if args.durable {
        pg::durable_cluster();
    }
    let db = TestDb::new().await;
    let port = relay_tests::free_port();
    // The bench is one account offering far more than an agent would: its quotas are off.
    let unlimited = [
        ("RELAY_MAX_UNREAD", "100000000"),
        ("RELAY_SEND_RATE_PER_ENDPOINT", "0"),
        ("RELAY_SEND_RATE_PER_ACCOUNT", "0"),
        ("RELAY_DELIVERY_RATE_PER_ACCOUNT", "0"),
        ("RELAY_MAX_ENDPOINTS", "1000000"),
        ("RELAY_MAX_ENDPOINTS_PER_MACHINE", "1000000"),
        ("RELAY_HELLO_RATE_PER_MACHINE", "0"),
        ("RELAY_CALL_RATE_PER_CREDENTIAL", "0"),
        ("RELAY_CALL_RATE_PER_ACCOUNT", "0"),
        ("RELAY_MAX_CALLS_PER_ACCOUNT", "1024"),
        ("RELAY_MAX_CALLS_PER_ADDRESS", "40000"),
        ("RELAY_MAX_STREAMS_PER_ACCOUNT", "40000"),
        // Every idle stream is a connection of its own, all from this one address.
        ("RELAY_MAX_CONNECTIONS", "20000"),
        ("RELAY_MAX_CONNECTIONS_PER_ADDRESS", "20000"),
        ("RELAY_MAX_CONNECTIONS_PER_ACCOUNT", "20000"),
        ("RELAY_MAX_CONNECTIONS_PER_CREDENTIAL", "20000"),
        ("RELAY_MAX_WAITING_CALLS", "40000"),
    ];
    let mcp = format!("127.0.0.1:{}", relay_tests::free_port());
    let mut env = unlimited.to_vec();
    env.push(("RELAY_MCP_LISTEN", mcp.as_str()));
    let server = Server::start_with_env(&db, port, &env).await;
    let pid = server.pid();
    let stats = Stats::connect(&db.url).await;
    let fsync: String = stats.client.query_one("show fsync", &[]).await.map(|r| r.get(0)).unwrap_or_default();
    let sync: String =
        stats.client.query_one("show synchronous_commit", &[]).await.map(|r| r.get(0)).unwrap_or_default();
    let load = load_average().map_or("unknown".to_owned(), |l| format!("{l:.2}"));
    println!(
        "relay-bench: server pid {pid}; postgres fsync={fsync} synchronous_commit={sync}; {} cores, load average {load} at the start",
        host_cores()
    );
    let (started, at_start) = (Instant::now(), Cpu::now(pid));
    let mut rows = Vec::new();
    // Relay's durable figures the nats phase sets beside JetStream's: send -> push, and msgs/s @32.
    let (mut durable_push, mut durable_at32) = (None, None);

    // The floor, on the same cluster, before Relay loads it.
    let f = floor(&db.url, args.seconds, server.pid()).await;
    println!(
        "floor: INSERT+COMMIT p50 {:.2} ms p99 {:.2} ms; relay-shaped send in one round trip p50 {:.2} ms p99 {:.2} ms; \
         commits/s @1 {:.0} @8 {:.0} @32 {:.0}",
        f.insert.p50,
        f.insert.p99,
        f.shaped.p50,
        f.shaped.p99,
        f.commits_per_s[&1],
        f.commits_per_s[&8],
        f.commits_per_s[&32]
    );

    let laptop = server.machine("bench", "laptop");
    let ci = server.machine("bench", "ci");

    // Serial send and send -> push, with the database work each send costs.
    if args.runs("serial") {
        let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
        let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
        let mut stream = bob.subscribe(0).await;
        stats.reset_statements().await;
        // WAL flushes are reported by backends up to 10 s late: the setup's are counted before the
        // phase, and the phase's own before its end is read.
        tokio::time::sleep(STATS_SETTLE).await;
        let before = stats.counters().await;
        let (send_lat, push_lat) = serial_sends(&mut alice, "ci/bob", Some(&mut stream), args.seconds * 4).await;
        tokio::time::sleep(STATS_SETTLE).await;
        let after = stats.counters().await;
        let n = send_lat.len() as f64;
        // The counter reads write nothing; they are statements (four per read).
        let commits = (after.writes - before.writes) as f64 / n;
        let flushes = (after.flushes - before.flushes) as f64 / n;
        let statements = if stats.statements {
            format!("{:.1}", (after.statements - before.statements - Counters::OWN) as f64 / n)
        } else {
            "n/a".into()
        };
        let (send, push) = (quantiles(send_lat), quantiles(push_lat));
        durable_push = Some(push);
        // Where a serial send's database time goes.
        stats.print_statements("serial phase", "send", n).await;
        rows.push(row("serial send p50 (ms)", format!("{:.2}", send.p50), Some(f.insert.p50), send.p50, "<= 1.0"));
        rows.push(row("serial send p99 (ms)", format!("{:.2}", send.p99), Some(f.insert.p99), send.p99, ""));
        rows.push(row("send -> push p50 (ms)", format!("{:.2}", push.p50), Some(f.shaped.p50), push.p50, "<= 1.5"));
        rows.push(row("send -> push p99 (ms)", format!("{:.2}", push.p99), Some(f.shaped.p99), push.p99, ""));
        rows.push(Row {
            what: "per send: write transactions / flushes / statements".into(),
            relay: format!("{commits:.1} / {flushes:.1} / {statements}"),
            floor: "1 / 1 / 1".into(),
            ratio: String::new(),
            target: "1 round trip".into(),
        });

        // The same sends and the floor's raw commit again, taken in turns: the host's speed drifts
        // within a run, and a ratio of figures taken half a minute apart carries the drift.
        let (relay_turns, floor_turns) =
            serial_in_turns(&mut alice, "ci/bob", &mut stream, &db.url, args.seconds * 4).await;
        let (relay_turns, floor_turns) = (quantiles(relay_turns), quantiles(floor_turns));
        rows.push(row(
            "serial send p50 (ms), in turns with INSERT+COMMIT",
            format!("{:.2}", relay_turns.p50),
            Some(floor_turns.p50),
            relay_turns.p50,
            "<= 2.0",
        ));
        drop(stream);

        // The same sends with no stream open for the recipient: above, the push each send waits
        // for is made at the same moment as the send's answer, on the same cores.
        let unwatched = quantiles(serial_sends(&mut alice, "ci/bob", None, args.seconds * 4).await.0);
        rows.push(row(
            "serial send p50 (ms), no stream pushing",
            format!("{:.2}", unwatched.p50),
            Some(f.insert.p50),
            unwatched.p50,
            "",
        ));

        // The database's share: the server's own statement for such a send, from the benchmark's
        // connection, to an inbox nobody streams (its notification wakes no stream here).
        let carol = Agent::hello(&server.url, &ci, "carol").await.unwrap();
        let statement = quantiles(
            send_statements(&db.url, "bench/laptop/alice", "bench/ci/carol", Duration::from_secs(args.seconds * 4))
                .await,
        );
        drop(carol);
        rows.push(row(
            "send's statement alone, in one round trip p50 (ms)",
            format!("{:.2}", statement.p50),
            Some(f.shaped.p50),
            statement.p50,
            "",
        ));

        // The transport's share: a call through the same listener and layers that asks no database
        // (the health check), on a connection of its own, in the same run.
        let mut health = HealthClient::new(client::channel(&server.url).await);
        let mut call_lat = Vec::with_capacity(1000);
        for _ in 0..1000 {
            let start = Instant::now();
            health.check(HealthCheckRequest { service: String::new() }).await.expect("health check");
            call_lat.push(start.elapsed());
        }
        let call = quantiles(call_lat);
        rows.push(row("grpc call, no database p50 (ms)", format!("{:.2}", call.p50), None, call.p50, ""));
        // A serial send, and a send until its push, is at least a bare call and then its statement's
        // round trip, one after the other: their sum against each row's floor says what the
        // targets leave the server, on this host, for everything else a send does.
        let bound = call.p50 + statement.p50;
        rows.push(row(
            "  bound: a bare call, then the send's statement p50 (ms)",
            format!("{bound:.2}"),
            Some(f.insert.p50),
            bound,
            "",
        ));
        rows.push(row(
            "  the same bound, against the relay-shaped round trip (ms)",
            format!("{bound:.2}"),
            Some(f.shaped.p50),
            bound,
            "",
        ));
    }

    // The floor's commits/s and its CPU a commit in the turns below, for the ceiling after them.
    let mut floor_in_turns: Option<(f64, [f64; 3])> = None;
    // Throughput at 1, 8 and 32 senders: to distinct recipients, and all into one inbox.
    if args.runs("throughput") {
        let senders: Vec<Client> = agents(&server.url, &laptop, "s", 32).await.into_iter().map(|a| a.rpc).collect();
        let recipients: Vec<String> = agents(&server.url, &ci, "r", 32).await.into_iter().map(|a| a.address).collect();
        for n in [1usize, 8, 32] {
            for hot in [false, true] {
                // The statements of the target's phase, to show what a batched send costs the database.
                let shown = n == 32 && !hot;
                if shown {
                    stats.reset_statements().await;
                }
                let before = Cpu::now(pid);
                let (rate, shed) = throughput(&senders[..n], &recipients, hot, args.seconds).await;
                if n == 32 && !hot {
                    durable_at32 = Some(rate);
                }
                let cpu = Cpu::now(pid).per(before, rate * args.seconds as f64);
                if shown {
                    stats.print_statements("throughput @32 distinct", "send", rate * args.seconds as f64).await;
                }
                let what = format!("throughput @{n} {} (msg/s)", if hot { "one inbox" } else { "distinct" });
                let target = if n == 32 && !hot { ">= 10000" } else { "" };
                let floor = f.commits_per_s.get(&n).copied();
                let mut r = row(
                    &what,
                    format!("{rate:.0}{}", if shed > 0 { format!(" ({shed} shed)") } else { String::new() }),
                    floor,
                    rate,
                    target,
                );
                r.ratio = floor.map_or(String::new(), |fl| format!("{:.2}x", rate / fl));
                rows.push(r);
                // Beside it, what the floor's commit at as many clients cost.
                let floor_cpu = f
                    .cpu_per_commit
                    .get(&n)
                    .filter(|_| !hot)
                    .map_or(String::new(), |[_, pg, bench]| format!("{pg:.0} / {bench:.0}"));
                rows.push(Row {
                    what: "  cpu us per send: server / postgres / bench".into(),
                    relay: cpu,
                    floor: floor_cpu,
                    ratio: String::new(),
                    target: String::new(),
                });
            }
        }

        // 32 senders to distinct inboxes and the floor's 32 clients again, in turns, so that both
        // meet the host's drift alike (the floor above was measured minutes before).
        // Each side's CPU a message over its turns: per turn weighted by its rate, divided at the end.
        let (mut relay_sum, mut floor_sum, mut shed_sum) = (0.0, 0.0, 0);
        let (mut relay_cpu, mut floor_cpu) = ([0.0; 3], [0.0; 3]);
        let (mut relay_cores, mut floor_cores) = (0.0, 0.0);
        for _ in 0..THROUGHPUT_TURNS {
            let run = floor_commits(&db.url, 32, args.seconds, pid).await;
            floor_sum += run.rate;
            floor_cores += run.cores / THROUGHPUT_TURNS as f64;
            add_cpu(&mut floor_cpu, run.cpu, run.rate);
            let before = Cpu::now(pid);
            let (rate, shed) = throughput(&senders, &recipients, false, args.seconds).await;
            let after = Cpu::now(pid);
            add_cpu(&mut relay_cpu, after.per_op(&before, rate * args.seconds as f64), rate);
            relay_cores += after.cores(&before, args.seconds as f64) / THROUGHPUT_TURNS as f64;
            relay_sum += rate;
            shed_sum += shed;
        }
        let (relay_cpu, floor_cpu) = (relay_cpu.map(|us| us / relay_sum), floor_cpu.map(|us| us / floor_sum));
        let (relay, floor) = (relay_sum / THROUGHPUT_TURNS as f64, floor_sum / THROUGHPUT_TURNS as f64);
        floor_in_turns = Some((floor, floor_cpu));
        let shed = if shed_sum > 0 { format!(" ({shed_sum} shed)") } else { String::new() };
        let mut r = row(
            "throughput @32 distinct (msg/s), in turns with the floor",
            format!("{relay:.0}{shed}"),
            Some(floor),
            relay,
            ">= 1.0x",
        );
        r.ratio = format!("{:.2}x", relay / floor);
        rows.push(r);
        rows.push(Row {
            what: "  cpu us per send, in turns: server / postgres / bench".into(),
            relay: cpu_row(relay_cpu),
            floor: String::new(),
            ratio: String::new(),
            target: String::new(),
        });
        rows.push(Row {
            what: "  the floor's cpu us per commit, in turns: server / postgres / bench".into(),
            relay: cpu_row(floor_cpu),
            floor: String::new(),
            ratio: String::new(),
            target: String::new(),
        });
        // Whether a side was bound by the cores (all of them busy) or by waiting (for flushes, for
        // its turn at a lock or a connection). The processes' own CPU above misses the kernel's
        // work on their behalf done elsewhere (interrupts, the disk's flushes); the host's does not.
        rows.push(Row {
            what: "  host cores busy, in turns: relay / the floor".into(),
            relay: format!("{relay_cores:.2} / {floor_cores:.2}"),
            floor: String::new(),
            ratio: String::new(),
            target: format!("of {}", host_cores()),
        });
        // Postgres's CPU is what a deployment cannot spread over more machines: what a message asks
        // of it, against what the floor's single-row commit asks.
        let mut r = row(
            "postgres cpu us per send @32, in turns with the floor",
            format!("{:.0}", relay_cpu[1]),
            Some(floor_cpu[1]),
            relay_cpu[1],
            "<= 1.0x",
        );
        if floor_cpu[1] > 0.0 {
            r.ratio = format!("{:.2}x", relay_cpu[1] / floor_cpu[1]);
        }
        rows.push(r);
    }

    // The transport's ceiling at 32 callers: the call through the same listener and layers that
    // asks no database (the health check), each caller on a connection of its own as the senders
    // are. What it costs the server and the benchmark per call bounds what any send can reach here.
    if args.runs("throughput") {
        let before = Cpu::now(pid);
        let rate = health_calls(&server.url, 32, args.seconds).await;
        let call = Cpu::now(pid).per_op(&before, rate * args.seconds as f64);
        rows.push(row("grpc calls @32, no database (calls/s)", format!("{rate:.0}"), None, rate, ""));
        rows.push(Row {
            what: "  cpu us per call: server / postgres / bench".into(),
            relay: cpu_row(call),
            floor: String::new(),
            ratio: String::new(),
            target: String::new(),
        });
        // What 32 senders could reach on this host's cores, all of them busy, if a send cost the
        // server and its client no more than this bare call and Postgres no more than the floor's
        // single-row commit. Below the floor's rate, reaching it here takes a send that costs
        // Postgres well under a commit or the transport less than a bare call.
        if let Some((floor, floor_cpu)) = floor_in_turns {
            let ceiling = host_cores() as f64 * 1e6 / (call[0] + call[2] + floor_cpu[1]).max(1.0);
            let mut r = row(
                "  ceiling @32: a bare call and the floor's postgres cpu (msg/s)",
                format!("{ceiling:.0}"),
                Some(floor),
                ceiling,
                "",
            );
            r.ratio = format!("{:.2}x", ceiling / floor);
            rows.push(r);
        }
    }

    // NATS JetStream beside Relay, durable and with synchronous_commit=off.
    if args.runs("nats") {
        match nats::Nats::start().await {
            None => println!("(nats phase skipped: no nats-server on PATH; Debian's package is nats-server)"),
            Some(nats) => {
                let mut relay = RelayPair::new(&server, &laptop, &ci).await;
                let (durable_push, durable_at32) = match (durable_push, durable_at32) {
                    (Some(push), Some(at32)) => (push, at32),
                    _ => (relay.serial(args.seconds).await, relay.throughput(args.seconds).await),
                };
                let (published, delivered) = nats::serial(&nats, args.seconds * 4).await;
                let before = Cpu::now(nats.pid());
                let nats_at32 = nats::throughput(&nats, 32, args.seconds).await;
                let nats_cpu = Cpu::now(nats.pid()).per(before, nats_at32 * args.seconds as f64);
                let relaxed = match ClusterSetting::set(&db.url, "synchronous_commit", "off").await {
                    Ok(off) => {
                        let figures = (relay.serial(args.seconds).await, relay.throughput(args.seconds).await);
                        off.reset().await;
                        Some(figures)
                    }
                    Err(why) => {
                        println!("(relay with synchronous_commit=off not measured: {why})");
                        None
                    }
                };
                let info = |what: String, relay: String, ratio: String| Row {
                    what,
                    relay,
                    floor: String::new(),
                    ratio,
                    target: String::new(),
                };
                rows.push(info(
                    "nats: publish acknowledged p50/p99 (ms)".into(),
                    format!("{:.2} / {:.2}", published.p50, published.p99),
                    String::new(),
                ));
                rows.push(info(
                    "nats: publish -> deliver p50/p99 (ms)".into(),
                    format!("{:.2} / {:.2}", delivered.p50, delivered.p99),
                    String::new(),
                ));
                rows.push(info("nats: msgs/s @32 publishers".into(), format!("{nats_at32:.0}"), String::new()));
                rows.push(info("  cpu us per publish: nats-server / postgres / bench".into(), nats_cpu, String::new()));
                let mut compare = |how: &str, push: Quantiles, at32: f64| {
                    rows.push(Row {
                        what: format!("relay {how}: send -> push p50 (ms) / nats"),
                        relay: format!("{:.2}", push.p50),
                        floor: format!("{:.2}", delivered.p50),
                        ratio: format!("{:.2}x", push.p50 / delivered.p50),
                        target: "<= 1.5x".into(),
                    });
                    rows.push(Row {
                        what: format!("relay {how}: msgs/s @32 / nats"),
                        relay: format!("{at32:.0}"),
                        floor: format!("{nats_at32:.0}"),
                        ratio: format!("{:.2}x", at32 / nats_at32),
                        target: ">= 1.0x".into(),
                    });
                };
                compare("durable", durable_push, durable_at32);
                if let Some((push, at32)) = relaxed {
                    compare("synchronous_commit=off", push, at32);
                }
            }
        }
    }

    // The MCP endpoint beside the bridge: a tool call's round trip through each, serially, and
    // sends from 32 agents over HTTP, each on a connection it keeps.
    if args.runs("mcp") {
        let cloud = server.machine("bench", "cloud");
        let _sink = Agent::hello(&server.url, &ci, "mcp-sink").await.unwrap();
        let send = |i: usize| serde_json::json!({ "to": "ci/mcp-sink", "body": format!("tool call {i}") });
        let calls = (args.seconds * 100) as usize;
        let spec = BridgeSpec { server: &server.url, token: &laptop, handle: Some("via-bridge"), channels: false };
        let mut bridged = Bridge::start(spec);
        bridged.initialize("2025-06-18").await;
        bridged.tool_ok("relay_whoami", serde_json::json!({})).await;
        let mut lat = Vec::with_capacity(calls);
        for i in 0..calls {
            let start = Instant::now();
            bridged.tool_ok("relay_send", send(i)).await;
            lat.push(start.elapsed());
        }
        let via_bridge = quantiles(lat);
        let mut http = Http::connect(&mcp, &cloud, "via-http").await;
        http.call("relay_whoami", serde_json::json!({})).await;
        let mut lat = Vec::with_capacity(calls);
        for i in 0..calls {
            let start = Instant::now();
            http.call("relay_send", send(i)).await;
            lat.push(start.elapsed());
        }
        let via_http = quantiles(lat);
        for (what, bridge, http) in [("p50", via_bridge.p50, via_http.p50), ("p99", via_bridge.p99, via_http.p99)] {
            rows.push(Row {
                what: format!("tool call relay_send {what} (ms): bridge / http"),
                relay: format!("{bridge:.2} / {http:.2}"),
                floor: String::new(),
                ratio: format!("{:.2}x", http / bridge),
                target: String::new(),
            });
        }

        // Stateless calls answered in JSON, then calls in 2025 sessions, whose answers stream and
        // are kept for their clients to resume.
        for (session, prefix, label) in [(false, "mh", ""), (true, "ms", " in 2025 sessions")] {
            let recipients: Vec<String> =
                agents(&server.url, &ci, &format!("{prefix}r"), 32).await.into_iter().map(|a| a.address).collect();
            let mut senders = Vec::new();
            for i in 0..32 {
                let handle = format!("{prefix}{i}");
                let mut sender = if session {
                    Http::session(&mcp, &cloud, &handle).await
                } else {
                    Http::connect(&mcp, &cloud, &handle).await
                };
                sender.call("relay_whoami", serde_json::json!({})).await;
                senders.push(sender);
            }
            stats.reset_statements().await;
            let before = Cpu::now(pid);
            let deadline = Instant::now() + Duration::from_secs(args.seconds);
            let sent = futures_join(senders.into_iter().zip(recipients).map(|(mut sender, to)| async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    sender.call("relay_send", serde_json::json!({ "to": to, "body": format!("m{n}") })).await;
                    n += 1;
                }
                n
            }))
            .await;
            let total: u64 = sent.iter().sum();
            let rate = total as f64 / args.seconds as f64;
            let cpu = Cpu::now(pid).per(before, total as f64);
            let phase = format!("throughput @32 over http /mcp{label}");
            stats.print_statements(&phase, "send", total as f64).await;
            let floor = f.commits_per_s.get(&32).copied();
            let mut r = row(&format!("{phase} (msg/s)"), format!("{rate:.0}"), floor, rate, "");
            r.ratio = floor.map_or(String::new(), |fl| format!("{:.2}x", rate / fl));
            rows.push(r);
            rows.push(Row {
                what: "  cpu us per send: server / postgres / bench".into(),
                relay: cpu,
                floor: String::new(),
                ratio: String::new(),
                target: String::new(),
            });
        }
    }

    // A fixed offered rate, open loop, over 50 pairs.
    if args.runs("rate") {
        stats.settle().await;
        let pair_senders = agents(&server.url, &laptop, "p", 50).await;
        let mut pair_recipients = agents(&server.url, &ci, "q", 50).await;
        for rate in [500u64, 2000] {
            let mut streams = Vec::new();
            // Nothing is unread in these inboxes, so each stream carries only this phase's messages.
            for r in &mut pair_recipients {
                streams.push(r.subscribe(0).await);
            }
            let pairs: Vec<(Client, String)> =
                pair_senders.iter().zip(&pair_recipients).map(|(s, r)| (s.rpc.clone(), r.address.clone())).collect();
            let o = offered_rate(&pairs, streams, rate, args.rate_seconds).await;
            let what = |m: &str| format!("@{rate}/s offered: {m}");
            let target = if rate == 2000 { "<= 50" } else { "" };
            rows.push(Row {
                what: what("send p50/p99/p999 (ms)"),
                relay: format!("{:.1}/{:.1}/{:.1}", o.send.p50, o.send.p99, o.send.p999),
                floor: String::new(),
                ratio: String::new(),
                target: if rate == 2000 { "p99 <= 50".into() } else { String::new() },
            });
            rows.push(Row {
                what: what("push lag p50/p99/p999 (ms)"),
                relay: format!("{:.1}/{:.1}/{:.1}", o.push.p50, o.push.p99, o.push.p999),
                floor: String::new(),
                ratio: String::new(),
                target: target.replace("<=", "p99 <="),
            });
            rows.push(Row {
                what: what("accepted/shed/failed/pushed"),
                relay: format!("{}/{}/{}/{} of {}", o.send.n, o.shed, o.failed, o.pushed, o.offered),
                floor: String::new(),
                ratio: String::new(),
                target: String::new(),
            });
        }
    }

    // Idle push streams: what holding them open costs the database and the server.
    if args.runs("idle") {
        stats.settle().await;
        for &n in &args.idle {
            // Each agent on a connection of its own, as bridges are; past what a process's file
            // limit allows here, a hundred to a connection, and the rows say so.
            let per = if n <= OWN_CONNECTIONS_UP_TO && !args.idle_shared { 1 } else { 100 };
            let label =
                if per == 1 { format!("{n} idle streams") } else { format!("{n} idle streams, {per} to a connection") };
            let mut channels = Vec::new();
            for _ in 0..n.div_ceil(per) {
                channels.push(client::channel(&server.url).await);
            }
            let mut idle = Vec::with_capacity(n);
            for chunk in (0..n).collect::<Vec<_>>().chunks(32) {
                let hellos = chunk.iter().map(|&i| {
                    let (ch, token) = (channels[i / per].clone(), laptop.clone());
                    let request =
                        HelloRequest { handle: format!("idle{n}x{i}"), harness: "claude".into(), ..Default::default() };
                    async move { Agent::hello_on(ch, &token, request).await.expect("hello") }
                });
                idle.extend(futures_join(hellos).await);
            }
            let mut streams = Vec::with_capacity(n);
            for agent in &mut idle {
                streams.push(agent.subscribe(0).await);
            }
            // Each stream is open once its first heartbeat arrived.
            for s in &mut streams {
                let _ = tokio::time::timeout(Duration::from_secs(30), s.message()).await;
            }
            // Backends report their counters up to 10 s after their last transaction, and up to a
            // minute when another holds the statistics' lock (the thousands of commits opening the
            // streams took were seen landing piecemeal, 10 to 50 s on): the window opens after that.
            let settled = stats.quiet().await;
            println!("idle phase, {label}: the window opened {:.0} s after the streams", settled.as_secs_f64());
            // Read every 5 s for 30 s. Commits are taken as the median of the six steps: a backlog
            // reported later still puts itself into one step, while what idling costs is in every one.
            let step = Duration::from_secs(5);
            let (before, cpu_before) = (stats.counters().await, Cpu::now(pid));
            let mut readings = vec![before];
            for _ in 0..6 {
                tokio::time::sleep(step).await;
                readings.push(stats.counters().await);
            }
            let (after, cpu_after) = (readings[6], Cpu::now(pid));
            let window = step * 6;
            // The bench's own reads of the counters are left out.
            let per_s = |d: i64, own: i64| (d - own).max(0) as f64 / window.as_secs_f64();
            let (tx, statements, flushes) = (
                per_s(after.writes - before.writes, 0),
                per_s(after.statements - before.statements, 6 * Counters::OWN),
                per_s(after.flushes - before.flushes, 0),
            );
            let mut steps: Vec<i64> =
                readings.windows(2).map(|w| (w[1].commits - w[0].commits - Counters::OWN).max(0)).collect();
            steps.sort_unstable();
            let commits = (steps[2] + steps[3]) as f64 / 2.0 / step.as_secs_f64();
            println!("idle phase, {label}: commits in each 5 s step, sorted: {steps:?}");
            rows.push(row(
                &format!("{label}: write transactions / statements / flushes per s"),
                format!("{tx:.1} / {statements:.1} / {flushes:.1}"),
                None,
                tx,
                "<= 5",
            ));
            rows.push(row(
                &format!("{label}: commits of any kind per s"),
                format!("{commits:.2}"),
                None,
                commits,
                "<= 1 per replica",
            ));
            rows.push(row(
                &format!("{label}: server RSS (MiB)"),
                format!("{:.0}", rss_mib(pid)),
                None,
                0.0,
                "<= 150 @10000",
            ));
            rows.push(row(
                &format!("{label}: server cpu (% of a core)"),
                format!("{:.2}", (cpu_after.server - cpu_before.server) * 100.0 / window.as_secs_f64()),
                None,
                0.0,
                "",
            ));
            drop(streams);
            drop(idle);
            drop(channels);
        }
    }

    // Inbox and whoami with nothing unread, then with many unread.
    if args.runs("inbox") {
        stats.settle().await;
        let mut reader = Agent::hello(&server.url, &ci, "reader").await.unwrap();
        let timed = |rpc: Client| async move {
            let (mut inbox, mut whoami) = (Vec::new(), Vec::new());
            for _ in 0..200 {
                let mut r = rpc.clone();
                let t = Instant::now();
                r.inbox(InboxRequest { wait_s: 0, ack: false, limit: 0 }).await.expect("inbox");
                inbox.push(t.elapsed());
                let t = Instant::now();
                r.who_am_i(WhoAmIRequest {}).await.expect("whoami");
                whoami.push(t.elapsed());
            }
            (quantiles(inbox), quantiles(whoami))
        };
        let (inbox_empty, whoami_empty) = timed(reader.rpc.clone()).await;
        // One page unread: the same 50 messages answered as from the full inbox below, so the two
        // differ only in what waits behind them.
        let page = Agent::hello(&server.url, &ci, "page-reader").await.unwrap();
        seed_unread(&db.url, &page.address, "page", i64::from(limits::DEFAULT_INBOX_BATCH)).await;
        let (inbox_page, _) = timed(page.rpc.clone()).await;
        seed_unread(&db.url, &reader.address, "seed", args.unread).await;
        let unread = reader.rpc.who_am_i(WhoAmIRequest {}).await.unwrap().into_inner().unread;
        stats.reset_statements().await;
        let (inbox_full, whoami_full) = timed(reader.rpc.clone()).await;
        stats.print_statements("inbox phase with many unread", "inbox and whoami", 200.0).await;
        rows.push(row(
            &format!("inbox p50 (ms), {unread} unread"),
            format!("{:.2}", inbox_full.p50),
            Some(inbox_empty.p50),
            inbox_full.p50,
            "<= 1.5x empty",
        ));
        rows.push(row(
            &format!("inbox p50 (ms), {unread} unread, beside one page"),
            format!("{:.2}", inbox_full.p50),
            Some(inbox_page.p50),
            inbox_full.p50,
            "flat",
        ));
        rows.push(row(
            &format!("whoami p50 (ms), {unread} unread"),
            format!("{:.2}", whoami_full.p50),
            Some(whoami_empty.p50),
            whoami_full.p50,
            "<= 1.5x empty",
        ));
    }

    if args.runs("ids") {
        stats.settle().await;
        let c = ids::compare(&db.url, pid, args.stored, args.seconds).await;
        let stored = args.stored;
        rows.push(row(
            &format!("ids in order: sends/s, {stored} stored"),
            format!("{:.0}", c.ordered.sends_per_s),
            Some(c.random.sends_per_s),
            c.ordered.sends_per_s,
            ">= 1.0x random",
        ));
        rows.push(row(
            "ids in order: postgres cpu us per send",
            format!("{:.1}", c.ordered.postgres_us),
            Some(c.random.postgres_us),
            c.ordered.postgres_us,
            "<= 1.0x random",
        ));
        rows.push(row(
            "ids in order: wal bytes per send",
            format!("{:.0}", c.ordered.wal_bytes),
            Some(c.random.wal_bytes),
            c.ordered.wal_bytes,
            "<= 1.0x random",
        ));
    }

    if args.runs("search") {
        stats.settle().await;
        let stored = args.stored;
        for t in search::measure(&db.url, stored).await {
            rows.push(row(
                &format!("search p95 (ms), {} ({} found), {stored} stored", t.what, t.found),
                format!("{:.2} (p50 {:.2})", t.p95_ms, t.p50_ms),
                None,
                t.p95_ms,
                "<= 10",
            ));
        }
    }

    if args.runs("topics") {
        stats.settle().await;
        let f = topics::measure(&server.url, &laptop, &ci, TOPIC_FOLLOWERS, pid).await;
        let total = |cpu: [f64; 3]| cpu[0] + cpu[1];
        println!(
            "topics: a post to {} followers, server / postgres / bench µs of CPU: written {}, with every follower's push {}; a direct send and its push: {}",
            f.followers,
            cpu_row(f.written),
            cpu_row(f.post),
            cpu_row(f.send)
        );
        rows.push(row(
            &format!("topic post to {} followers, written: server+pg µs", f.followers),
            format!("{:.0}", total(f.written)),
            Some(total(f.send)),
            total(f.written),
            "<= 5x a direct send",
        ));
        let per_follower = total(f.post) / f.followers as f64;
        rows.push(row(
            "topic post, pushed: server+pg µs per follower",
            format!("{per_follower:.1}"),
            Some(total(f.send)),
            per_follower,
            "floor: a direct send and its push",
        ));
        rows.push(row(
            &format!("topic post to {} followers delivered p99 (ms)", f.followers),
            format!("{:.2} (p50 {:.2})", f.delivered.p99, f.delivered.p50),
            Some(f.direct.p99),
            f.delivered.p99,
            "floor: a direct send's push p99",
        ));
    }

    println!();
    println!("{:<56} {:>16} {:>12} {:>8}  target", "", "relay", "floor", "ratio");
    for r in rows {
        println!("{:<56} {:>16} {:>12} {:>8}  {}", r.what, r.relay, r.floor, r.ratio, r.target);
    }
    println!(
        "\n(the floor of a latency row is the same-run INSERT+COMMIT or relay-shaped statement; of inbox/whoami, the empty inbox, or the inbox holding one page of unread; \
         of an ids row, the same sends written with random ids)"
    );
    println!("server rss at end: {:.0} MiB", rss_mib(pid));
    // A host whose hypervisor takes its cores away (a throttled or crowded virtual machine) slows
    // every figure unevenly: say so, so that such a run is not set beside a free one's.
    let stolen = Cpu::now(pid).stolen_share(&at_start, started.elapsed().as_secs_f64());
    println!(
        "host cores' time taken by the hypervisor (steal) over the run: {:.1}%{}",
        stolen * 100.0,
        if stolen > STEAL_COMPARABLE { "; the figures are not comparable with a run on a free host" } else { "" }
    );
}

/// The steal above which a run's figures are not set beside other runs' (at rest this host shows
/// under 1%).
const STEAL_COMPARABLE: f64 = 0.05;

/// Agents of their own for the nats phase's Relay figures: a serial pair, and 32 senders to 32
/// distinct inboxes, as the serial and throughput phases measure them.
struct RelayPair {
    alice: Agent,
    bob: Agent,
    senders: Vec<Client>,
    recipients: Vec<String>,
}

impl RelayPair {
    async fn new(server: &Server, laptop: &str, ci: &str) -> Self {
        Self {
            alice: Agent::hello(&server.url, laptop, "nats-alice").await.expect("hello"),
            bob: Agent::hello(&server.url, ci, "nats-bob").await.expect("hello"),
            senders: agents(&server.url, laptop, "ns", 32).await.into_iter().map(|a| a.rpc).collect(),
            recipients: agents(&server.url, ci, "nr", 32).await.into_iter().map(|a| a.address).collect(),
        }
    }

    /// Send -> push, serially.
    async fn serial(&mut self, seconds: u64) -> Quantiles {
        let mut stream = self.bob.subscribe(0).await;
        quantiles(serial_sends(&mut self.alice, &self.bob.address, Some(&mut stream), seconds * 4).await.1)
    }

    /// Msgs/s from 32 senders to distinct inboxes.
    async fn throughput(&self, seconds: u64) -> f64 {
        throughput(&self.senders, &self.recipients, false, seconds).await.0
    }
}

/// A setting changed for the whole cluster, the server's open connections included (a reload
/// reaches every session that has not set it itself), until [`ClusterSetting::reset`].
struct ClusterSetting {
    client: tokio_postgres::Client,
    name: &'static str,
}

impl ClusterSetting {
    /// Refused on a database given by DATABASE_URL: `alter system` outlives this run, and a run
    /// cut short would leave the setting behind on a cluster that is not the benchmark's own.
    async fn set(url: &str, name: &'static str, value: &str) -> Result<Self, String> {
        if std::env::var_os("DATABASE_URL").is_some() {
            return Err("the database is DATABASE_URL's, whose settings this benchmark does not change".into());
        }
        let client = db_client(url).await;
        let why =
            |e: tokio_postgres::Error| e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_owned());
        client.batch_execute(&format!("alter system set {name} = {value}")).await.map_err(why)?;
        client.batch_execute("select pg_reload_conf()").await.map_err(why)?;
        let set = Self { client, name };
        set.wait_for(value).await;
        Ok(set)
    }

    async fn reset(self) {
        let _ = self.client.batch_execute(&format!("alter system reset {}; select pg_reload_conf()", self.name)).await;
    }

    /// Until this session sees `value`: the reload reaches every backend before its next statement,
    /// this one included, once the postmaster has read the configuration again.
    async fn wait_for(&self, value: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now: String = self
                .client
                .query_one(&format!("show {}", self.name), &[])
                .await
                .map_or_else(|_| String::new(), |r| r.get(0));
            if now == value || Instant::now() > deadline {
                assert_eq!(now, value, "{} after the reload", self.name);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Puts `n` unread messages in `address`'s inbox straight through SQL (sending them would take the
/// length of the benchmark), their ids starting with `prefix`. Follows the schema of deliveries:
/// seqs above the inbox head.
async fn seed_unread(url: &str, address: &str, prefix: &str, n: i64) {
    if n == 0 {
        return;
    }
    let c = db_client(url).await;
    let id: i64 =
        c.query_one("select id from endpoint_addresses where address = $1", &[&address]).await.unwrap().get(0);
    c.batch_execute(&format!(
        "begin;
         insert into messages (id, sender_id, thread, kind, body)
           select '{prefix}' || g, {id}, '{prefix}' || g, 1, 'seeded unread message' from generate_series(1, {n}) g;
         insert into deliveries (recipient_id, seq, message_id)
           select {id}, e.head_seq + g, '{prefix}' || g from endpoints e, generate_series(1, {n}) g where e.id = {id};
         update endpoints set head_seq = head_seq + {n} where id = {id};
         commit;"
    ))
    .await
    .expect("seed unread messages");
}

/// A client of the MCP endpoint on one HTTP/1.1 connection it keeps, as an agent's client would:
/// stateless tool calls (2026-07-28), each answered in JSON, or the calls of a 2025-06-18 session,
/// each answered as an event stream.
struct Http {
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
    head: String,
    next_id: u64,
    session: bool,
}

impl Http {
    async fn connect(addr: &str, token: &str, handle: &str) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect to the mcp endpoint");
        let _ = stream.set_nodelay(true);
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nRelay-Handle: {handle}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\n"
        );
        Self { stream: tokio::io::BufReader::new(stream), head, next_id: 1, session: false }
    }

    /// A client that has initialized a 2025-06-18 session.
    async fn session(addr: &str, token: &str, handle: &str) -> Self {
        use tokio::io::AsyncWriteExt;
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect to the mcp endpoint");
        let _ = stream.set_nodelay(true);
        let mut head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nRelay-Handle: {handle}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        );
        let mut http =
            Self { stream: tokio::io::BufReader::new(stream), head: head.clone(), next_id: 2, session: true };
        let initialize = serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "relay-bench", "version": "1" } },
        })
        .to_string();
        let request = format!("{head}Content-Length: {}\r\n\r\n{initialize}", initialize.len());
        http.stream.get_mut().write_all(request.as_bytes()).await.expect("send to the mcp endpoint");
        let (headers, _) = http.read_answer().await;
        let session = headers.get("mcp-session-id").expect("a session id");
        head.push_str(&format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\n"));
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let request = format!("{head}Content-Length: {}\r\n\r\n{initialized}", initialized.len());
        http.stream.get_mut().write_all(request.as_bytes()).await.expect("send to the mcp endpoint");
        http.read_answer().await;
        http.head = head;
        http
    }

    /// Calls tool `name`; its result, which must not be an error.
    async fn call(&mut self, name: &str, arguments: serde_json::Value) -> serde_json::Value {
        use tokio::io::AsyncWriteExt;
        let id = self.next_id;
        self.next_id += 1;
        let mut body = serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": name, "arguments": arguments },
        });
        if !self.session {
            body["params"]["_meta"] = serde_json::json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": { "name": "relay-bench", "version": "1" },
                "io.modelcontextprotocol/clientCapabilities": {},
            });
        }
        let body = body.to_string();
        let request = format!("{}Mcp-Name: {name}\r\nContent-Length: {}\r\n\r\n{body}", self.head, body.len());
        let exchange = async {
            self.stream.get_mut().write_all(request.as_bytes()).await.expect("send to the mcp endpoint");
            self.read_answer().await.1
        };
        let answer = tokio::time::timeout(PHASE_LIMIT, exchange).await.expect("the mcp endpoint answers in time");
        let answer = String::from_utf8(answer).expect("an answer in UTF-8");
        // An event stream's answer is the event whose data is a response.
        let json = answer.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| d.contains("\"id\""));
        let answer: serde_json::Value = serde_json::from_str(json.unwrap_or(&answer)).expect("a JSON answer");
        let result = answer["result"].clone();
        assert!(result.is_object() && result["isError"] != true, "{name}: {answer}");
        result
    }

    /// One answer: its headers (names in lowercase) and its body, by its Content-Length or its
    /// chunks.
    async fn read_answer(&mut self) -> (std::collections::HashMap<String, String>, Vec<u8>) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        let mut headers = std::collections::HashMap::new();
        let mut line = String::new();
        loop {
            line.clear();
            self.stream.read_line(&mut line).await.expect("read the answer's head");
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
            }
        }
        let mut answer = Vec::new();
        if headers.get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
            loop {
                line.clear();
                self.stream.read_line(&mut line).await.expect("read a chunk's size");
                let size = usize::from_str_radix(line.trim(), 16).expect("a chunk size");
                let mut chunk = vec![0; size + 2];
                self.stream.read_exact(&mut chunk).await.expect("read a chunk");
                if size == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..size]);
            }
        } else {
            let length = headers.get("content-length").map_or(0, |l| l.parse().expect("a content length"));
            answer.resize(length, 0);
            self.stream.read_exact(&mut answer).await.expect("read the answer");
        }
        (headers, answer)
    }
}
