//! Message ids in time order beside random ones. The rows of a plain send (a message and its
//! delivery, with every index `messages` and `deliveries` have) are written into copies of those
//! tables that already hold `stored` sends, in batches of 32 a commit, once with random ids and once
//! with ids as the server makes them, each after a checkpoint. A random id lands on a different
//! leaf page of each index keyed by it (the message's, its thread's, its deliveries'): once the
//! indexes outgrow the buffers every insert may read a page, and after every checkpoint the first
//! change to a page puts a full image of it in the WAL.

use std::time::{Duration, Instant};

use relay_server::domain::ids::{MESSAGE_ID_LEN, new_message_id, random_text};

use super::{Cpu, db_client};

/// Sends a batch: as the group-commit writer batches them under load.
const BATCH: usize = 32;
/// Stored sends written per statement while filling the tables.
const FILL_CHUNK: usize = 20_000;
/// Inboxes the deliveries are spread over.
const INBOXES: i64 = 1_000;

/// What writing sends cost with one kind of id.
pub struct Figures {
    pub sends_per_s: f64,
    pub postgres_us: f64,
    pub wal_bytes: f64,
}

/// The two kinds of id, random first.
pub struct Compared {
    pub random: Figures,
    pub ordered: Figures,
}

#[derive(Clone, Copy)]
enum Kind {
    Random,
    Ordered,
}

impl Kind {
    fn id(self) -> String {
        match self {
            Self::Random => random_text(MESSAGE_ID_LEN),
            Self::Ordered => new_message_id().as_str().to_owned(),
        }
    }

    fn tables(self) -> (&'static str, &'static str) {
        match self {
            Self::Random => ("bench_ids_random_messages", "bench_ids_random_deliveries"),
            Self::Ordered => ("bench_ids_ordered_messages", "bench_ids_ordered_deliveries"),
        }
    }
}

/// For each kind, random first: fills a pair of tables with `stored` sends, writes into them for
/// `seconds` and drops them. Each kind is measured right after its own fill, so neither finds its
/// pages pushed out of the buffers by the other's. `server` is the relay-server's pid, for the CPU
/// reading.
pub async fn compare(url: &str, server: u32, stored: i64, seconds: u64) -> Compared {
    let db = db_client(url).await;
    let mut measured = Vec::new();
    for kind in [Kind::Random, Kind::Ordered] {
        let (messages, deliveries) = kind.tables();
        db.batch_execute(&format!(
            "drop table if exists {messages}, {deliveries};
             create table {messages} (like messages including defaults including constraints including indexes);
             create table {deliveries} (like deliveries including defaults including constraints including indexes);"
        ))
        .await
        .expect("create the id tables");
        fill(&db, kind, stored).await;
        db.batch_execute(&format!("vacuum (analyze) {messages}, {deliveries}")).await.expect("vacuum the id tables");
        measured.push(write(&db, server, kind, stored, seconds).await);
        db.batch_execute(&format!("drop table {messages}, {deliveries}")).await.expect("drop the id tables");
    }
    let [random, ordered] = measured.try_into().ok().expect("two kinds");
    Compared { random, ordered }
}

/// One statement a batch: the messages and their deliveries, committed together.
fn insert(kind: Kind) -> String {
    let (messages, deliveries) = kind.tables();
    format!(
        "with m as (insert into {messages} (id, sender_id, client_id, thread, kind, body)
                    select u.id, u.id2 % 64, u.client, u.id, 1, $3 from unnest($1::text[], $2::text[], $4::int8[]) as u(id, client, id2))
         insert into {deliveries} (recipient_id, seq, message_id)
         select u.n % {INBOXES}, u.n, u.id from unnest($1::text[], $4::int8[]) as u(id, n)"
    )
}

const BODY: &str = "a message of the size the throughput phase sends, give or take";

/// The columns of `n` sends numbered from `first`: ids of `kind`, random client ids (the client
/// picks them), and their numbers.
fn sends(kind: Kind, first: i64, n: usize) -> (Vec<String>, Vec<String>, Vec<i64>) {
    let ids = (0..n).map(|_| kind.id()).collect();
    let clients = (0..n).map(|_| random_text(16)).collect();
    let numbers = (first..first + n as i64).collect();
    (ids, clients, numbers)
}

async fn fill(db: &tokio_postgres::Client, kind: Kind, stored: i64) {
    let statement = db.prepare(&insert(kind)).await.expect("prepare the fill");
    let mut n = 0;
    while n < stored {
        let chunk = (stored - n).min(FILL_CHUNK as i64) as usize;
        let (ids, clients, numbers) = sends(kind, n, chunk);
        db.execute(&statement, &[&ids, &clients, &BODY, &numbers]).await.expect("fill the id tables");
        n += chunk as i64;
    }
}

async fn write(db: &tokio_postgres::Client, server: u32, kind: Kind, stored: i64, seconds: u64) -> Figures {
    let statement = db.prepare(&insert(kind)).await.expect("prepare the batch");
    db.batch_execute("checkpoint").await.expect("checkpoint before writing");
    let lsn = "select pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8";
    let wal_before: f64 = db.query_one(lsn, &[]).await.expect("wal position").get(0);
    let cpu_before = Cpu::now(server);
    let start = Instant::now();
    let mut written = 0i64;
    while start.elapsed() < Duration::from_secs(seconds) {
        let (ids, clients, numbers) = sends(kind, stored + written, BATCH);
        db.execute(&statement, &[&ids, &clients, &BODY, &numbers]).await.expect("write a batch");
        written += BATCH as i64;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = Cpu::now(server);
    let wal_after: f64 = db.query_one(lsn, &[]).await.expect("wal position").get(0);
    let n = written as f64;
    Figures {
        sends_per_s: n / elapsed,
        postgres_us: (cpu.postgres - cpu_before.postgres) * 1e6 / n,
        wal_bytes: (wal_after - wal_before) / n,
    }
}
