//! NATS JetStream beside Relay: a `nats-server` with JetStream on a temporary store, measured with
//! the Rust client in the shapes of Relay's own figures — a message published to a recipient's
//! subject and received by that recipient's durable consumer.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use tokio_stream::StreamExt;

use super::{PHASE_LIMIT, Quantiles, quantiles};

/// A running `nats-server`, stopped when dropped.
pub struct Nats {
    child: Child,
    _store: tempfile::TempDir,
    pub url: String,
}

impl Nats {
    /// Starts `nats-server` from PATH with JetStream on a store of its own, or `None` when PATH
    /// has none (the phase is then skipped, and says so).
    pub async fn start() -> Option<Self> {
        let store = tempfile::tempdir().expect("a directory for the JetStream store");
        let port = relay_tests::free_port();
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let nats = Self { child, _store: store, url: format!("nats://127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(Instant::now() < deadline, "nats-server did not open port {port} within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some(nats)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A JetStream context on a connection of its own, with the stream every recipient's subject
    /// belongs to, kept in files as Relay keeps its messages in tables.
    pub async fn jetstream(&self) -> jetstream::Context {
        let client = async_nats::connect(&self.url).await.expect("connect to nats-server");
        let js = jetstream::new(client);
        js.get_or_create_stream(stream::Config {
            name: "RELAY".into(),
            subjects: vec!["relay.>".into()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .expect("the JetStream stream");
        js
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A message as Relay stores one: who sent it, to whom, its thread and its body.
fn shaped(from: &str, to: &str, body: &str) -> bytes::Bytes {
    serde_json::json!({ "from": from, "to": to, "thread": "", "kind": "message", "body": body }).to_string().into()
}

/// Up to 1,000 publishes to one recipient for at most `seconds`, one at a time: each timed to its
/// acknowledgement (stored) and to its arrival at the recipient's durable consumer, which it waits
/// for before the next.
pub async fn serial(nats: &Nats, seconds: u64) -> (Quantiles, Quantiles) {
    let js = nats.jetstream().await;
    let stream = js.get_stream("RELAY").await.expect("the stream");
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("bob".into()),
            filter_subject: "relay.bob".into(),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("bob's durable consumer");
    let mut inbox = consumer.messages().await.expect("bob's messages");
    let (mut published, mut delivered) = (Vec::with_capacity(1000), Vec::with_capacity(1000));
    let phase = Instant::now();
    while published.len() < 1000 && phase.elapsed() < Duration::from_secs(seconds) {
        let start = Instant::now();
        let body = format!("latency probe {}", published.len());
        let ack = js.publish("relay.bob", shaped("bench/laptop/alice", "bench/ci/bob", &body)).await.expect("publish");
        ack.await.expect("publish acknowledged");
        published.push(start.elapsed());
        let message = tokio::time::timeout(PHASE_LIMIT, inbox.next())
            .await
            .expect("delivered within the phase limit")
            .expect("the consumer's stream ended")
            .expect("delivery");
        delivered.push(start.elapsed());
        message.ack().await.expect("ack");
    }
    (quantiles(published), quantiles(delivered))
}

/// Publishes for `seconds` from `publishers` tasks, each to its own recipient's subject and each
/// waiting for every acknowledgement as Relay's senders wait for each answer; messages per second.
pub async fn throughput(nats: &Nats, publishers: usize, seconds: u64) -> f64 {
    let mut contexts = Vec::with_capacity(publishers);
    for _ in 0..publishers {
        contexts.push(nats.jetstream().await);
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = contexts
        .into_iter()
        .enumerate()
        .map(|(i, js)| {
            tokio::spawn(async move {
                let (from, to, subject) =
                    (format!("bench/laptop/s{i}"), format!("bench/ci/r{i}"), format!("relay.r{i}"));
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let message = shaped(&from, &to, &format!("throughput {i}/{n}"));
                    js.publish(subject.clone(), message).await.expect("publish").await.expect("acknowledged");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("publisher");
    }
    total as f64 / seconds as f64
}
