//! Messaging benchmark: one relay-server on a throwaway Postgres (or `DATABASE_URL`), agents on two
//! machines, and figures for send latency, end-to-end push latency, throughput and server memory.
//!
//! usage: relay-bench [MESSAGES] [SENDERS]     (defaults 2000 and 8; at most 100000 messages)
//! Build with `cargo build --release --workspace` and run `target/release/relay-bench` for real figures.

use std::time::{Duration, Instant};

use relay_proto::v1::{Push, SendRequest, push};
use relay_tests::client::Agent;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use tonic::Streaming;

/// No phase may run longer than this, whatever the counts.
const PHASE_LIMIT: Duration = Duration::from_secs(120);

fn percentiles(label: &str, mut samples: Vec<Duration>) {
    if samples.is_empty() {
        println!("{label:<28} no samples");
        return;
    }
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{label:<28} n={:<6} p50={:>7.2}ms p95={:>7.2}ms p99={:>7.2}ms max={:>7.2}ms",
        samples.len(),
        ms(at(0.50)),
        ms(at(0.95)),
        ms(at(0.99)),
        ms(*samples.last().unwrap())
    );
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

async fn next_message_seq(stream: &mut Streaming<Push>) -> u64 {
    loop {
        let push = stream.message().await.expect("push stream").expect("push stream open");
        if let Some(push::Event::Message(m)) = push.event {
            return m.seq;
        }
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let messages: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000).clamp(1, 100_000);
    let senders: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8).clamp(1, 64);

    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("bench", "laptop");
    let ci = server.machine("bench", "ci");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let pid = server.pid();
    println!("relay-bench: {messages} messages, {senders} concurrent senders, server pid {pid}");
    println!("server rss at start          {} KiB", rss_kib(pid).unwrap_or(0));

    // 1. Latency: one message at a time, from the send call to the recipient's push stream.
    let mut stream = bob.subscribe(0).await;
    let serial = messages.min(1000);
    let (mut send_lat, mut push_lat) = (Vec::with_capacity(serial), Vec::with_capacity(serial));
    let phase = Instant::now();
    for i in 0..serial {
        if phase.elapsed() > PHASE_LIMIT {
            break;
        }
        let start = Instant::now();
        alice.send(&["ci/bob"], &format!("latency probe {i}")).await.unwrap();
        send_lat.push(start.elapsed());
        next_message_seq(&mut stream).await;
        push_lat.push(start.elapsed());
    }
    percentiles("send (rpc round trip)", send_lat);
    percentiles("send -> push received", push_lat);

    // 2. Throughput: concurrent senders, all to one recipient, until every push has arrived.
    let already = serial as u64;
    let per_sender = messages.div_ceil(senders);
    let total = (per_sender * senders) as u64;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..senders {
        let mut rpc = alice.rpc.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_sender);
            for i in 0..per_sender {
                if start.elapsed() > PHASE_LIMIT {
                    break;
                }
                let t = Instant::now();
                let request =
                    SendRequest { to: vec!["ci/bob".into()], body: format!("load {s}/{i}"), ..Default::default() };
                rpc.send(request).await.unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let receiver = tokio::spawn(async move {
        let mut last = already;
        while last < already + total {
            last = match tokio::time::timeout(PHASE_LIMIT, next_message_seq(&mut stream)).await {
                Ok(seq) => seq,
                Err(_) => break,
            };
        }
        (last - already, Instant::now())
    });
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let sent_done = start.elapsed();
    let (received, done_at) = receiver.await.unwrap();
    let all_done = done_at.duration_since(start);
    percentiles("send under load", lat);
    println!(
        "throughput                   sent {total} in {:.2}s ({:.0}/s); all pushed in {:.2}s ({:.0}/s); received {received}",
        sent_done.as_secs_f64(),
        total as f64 / sent_done.as_secs_f64(),
        all_done.as_secs_f64(),
        received as f64 / all_done.as_secs_f64()
    );
    println!("server rss at end            {} KiB", rss_kib(pid).unwrap_or(0));

    // 3. Catch-up: an offline inbox drained through the inbox call.
    let start = Instant::now();
    let mut drained = 0usize;
    loop {
        let batch = bob.inbox(0, true).await.unwrap();
        drained += batch.messages.len();
        if batch.remaining == 0 || batch.messages.is_empty() {
            break;
        }
    }
    println!(
        "inbox drain (batches of 50)  {drained} messages in {:.2}s ({:.0}/s)",
        start.elapsed().as_secs_f64(),
        drained as f64 / start.elapsed().as_secs_f64()
    );
}
