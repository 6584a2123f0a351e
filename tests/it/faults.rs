//! The fault suite: an agent sends numbered messages without pause to an agent on another machine
//! while a fault strikes, and the recipient's pushes are counted. Each fault prints its figures
//! (acknowledged, refused, seen, lost, duplicated, out of order, time to resume) and fails on any
//! acknowledged message lost, any message seen twice, or acknowledged messages seen out of order.
//! Bounded: each fault runs for seconds, the partition for 30 s.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use relay_tests::mcp::{Bridge, BridgeSpec, text};
use relay_tests::pg::TestDb;
use relay_tests::pg::controlled::{ControlledCluster, Down};
use relay_tests::process::{COMMAND_LIMIT, RunWithin};
use relay_tests::server::Server;
use serde_json::{Value, json};
use tokio::time::Instant;

/// The pause between two sends: about 15 messages a second, steady, under an agent's default send
/// rate (20/s), so that a refusal means the fault.
const PACE: Duration = Duration::from_millis(60);
/// How long a send may take to be answered, acknowledged or refused, while a fault lasts.
const SEND_LIMIT: Duration = Duration::from_secs(60);
/// How long after the fault ends every acknowledged message has to be seen.
const SETTLE_LIMIT: Duration = Duration::from_secs(90);
/// How long sending goes on before the fault, and after the first acknowledgement that follows it.
const STEADY: Duration = Duration::from_secs(1);
/// The longest a fault may keep sends from being acknowledged once it has ended.
const RESUME_LIMIT: Duration = Duration::from_secs(60);
/// How long the server or the database stays down.
const OUTAGE: Duration = Duration::from_secs(2);

const PUSH: &str = "notifications/claude/channel";

/// One sender, one recipient whose pushes are counted, and what each has seen.
struct Probe {
    sender: Bridge,
    recipient: Bridge,
    to: &'static str,
    next: u64,
    /// Acknowledged sends: sequence number and when the acknowledgement came.
    acked: Vec<(u64, Instant)>,
    /// Refused sends: sequence number and what the sender was told.
    refused: Vec<(u64, String)>,
    /// Pushes, in arrival order: sequence number and arrival time.
    seen: Vec<(u64, Instant)>,
}

impl Probe {
    async fn new(sender: Bridge, mut recipient: Bridge, to: &'static str) -> Self {
        let mut sender = sender;
        sender.initialize("2025-06-18").await;
        recipient.initialize_with_channels().await;
        Self { sender, recipient, to, next: 0, acked: Vec::new(), refused: Vec::new(), seen: Vec::new() }
    }

    /// One numbered send, then whatever the recipient was pushed meanwhile.
    async fn send_one(&mut self) {
        self.next += 1;
        let seq = self.next;
        let body = format!("fault-seq-{seq:06}");
        let result = self.sender.tool_within("relay_send", json!({ "to": self.to, "body": body }), SEND_LIMIT).await;
        if result["isError"] == json!(true) || result.is_null() {
            self.refused.push((seq, text(&result)));
        } else {
            self.acked.push((seq, Instant::now()));
        }
        self.drain();
    }

    fn drain(&mut self) {
        while let Some(message) = self.recipient.try_next() {
            self.note(&message);
        }
    }

    fn note(&mut self, message: &Value) {
        if message["method"] != PUSH {
            return;
        }
        let content = message["params"]["content"].as_str().unwrap_or_default();
        let seq = content.split("fault-seq-").nth(1).and_then(|s| s.get(..6)).and_then(|s| s.parse().ok());
        self.seen.push((seq.unwrap_or_else(|| panic!("a push that is not one of ours: {message}")), Instant::now()));
    }

    /// Sends steadily for `period`.
    async fn send_for(&mut self, period: Duration) {
        let end = Instant::now() + period;
        while Instant::now() < end {
            self.send_one().await;
            tokio::time::sleep(PACE).await;
        }
    }

    /// Sends steadily while `fault` runs (a send may wait in the sender's bridge, which tries it
    /// again while the server or its database is away), then until sends are acknowledged again.
    /// Returns what `fault` gave, how long it lasted, and how long after its end the first
    /// acknowledgement came.
    async fn through<T>(&mut self, fault: impl Future<Output = T>) -> (T, Duration, Duration) {
        let struck = Instant::now();
        let ended = std::cell::Cell::new(None);
        let sends = async {
            while ended.get().is_none() {
                self.send_one().await;
                tokio::time::sleep(PACE).await;
            }
        };
        let fault = async {
            let given = fault.await;
            ended.set(Some(Instant::now()));
            given
        };
        let ((), given) = tokio::join!(sends, fault);
        let ended = ended.get().expect("set as the fault ended");
        let resumed = self.send_until_resumed(ended).await;
        (given, ended - struck, resumed)
    }

    /// Sends until a send made after `since` is acknowledged, then for [`STEADY`] more; how long
    /// after `since` the first acknowledgement came.
    async fn send_until_resumed(&mut self, since: Instant) -> Duration {
        let deadline = since + RESUME_LIMIT;
        loop {
            self.send_one().await;
            if let Some((_, at)) = self.acked.last()
                && *at > since
            {
                let resumed = at.duration_since(since);
                self.send_for(STEADY).await;
                return resumed;
            }
            assert!(Instant::now() < deadline, "no send was acknowledged within {RESUME_LIMIT:?} of the fault");
            tokio::time::sleep(PACE).await;
        }
    }

    /// Waits until every acknowledged send numbered from `from` on has been pushed.
    async fn settle(&mut self, from: u64) {
        let deadline = Instant::now() + SETTLE_LIMIT;
        loop {
            self.drain();
            let seen: std::collections::HashSet<u64> = self.seen.iter().map(|(s, _)| *s).collect();
            let missing = self.acked.iter().filter(|(s, _)| *s >= from && !seen.contains(s)).count();
            if missing == 0 {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return; // The report names what is missing.
            }
            if let Some(message) = self.recipient.next_within(left).await {
                self.note(&message);
            }
        }
    }

    /// Prints the figures of the sends numbered from `from` on and fails on any loss, duplicate or
    /// reordering. `lasted`: how long the fault lasted; `resumed`: how long after it ended sends (or
    /// pushes) went through again.
    fn report(&self, fault: &str, from: u64, lasted: Duration, resumed: Duration) {
        let acked: Vec<u64> = self.acked.iter().map(|(s, _)| *s).filter(|s| *s >= from).collect();
        let refused = self.refused.iter().filter(|(s, _)| *s >= from).count();
        let seen: Vec<u64> = self.seen.iter().map(|(s, _)| *s).filter(|s| *s >= from).collect();
        let mut times: HashMap<u64, usize> = HashMap::new();
        for s in &seen {
            *times.entry(*s).or_default() += 1;
        }
        let lost: Vec<u64> = acked.iter().copied().filter(|s| !times.contains_key(s)).collect();
        let duplicated: Vec<u64> = times.iter().filter(|(_, n)| **n > 1).map(|(s, _)| *s).collect();
        let acked_set: std::collections::HashSet<u64> = acked.iter().copied().collect();
        let in_acked_order: Vec<u64> = seen.iter().copied().filter(|s| acked_set.contains(s)).collect();
        let out_of_order = in_acked_order.windows(2).filter(|w| w[1] < w[0]).count();
        let seen_unacked = times.keys().filter(|s| !acked_set.contains(s)).count();
        println!(
            "fault: {fault}: sent {} (acknowledged {}, refused {refused}); seen {} ({} of them refused sends that \
             went through); lost {}; duplicated {}; out of order {out_of_order}; down {} ms, resumed {} ms after",
            acked.len() + refused,
            acked.len(),
            seen.len(),
            seen_unacked,
            lost.len(),
            duplicated.len(),
            lasted.as_millis(),
            resumed.as_millis(),
        );
        let mut said: Vec<&str> = self.refused.iter().filter(|(s, _)| *s >= from).map(|(_, t)| t.as_str()).collect();
        said.dedup();
        if !said.is_empty() {
            println!("fault: {fault}: the sender was told: {:?}", &said[..said.len().min(3)]);
        }
        assert!(lost.is_empty(), "{fault}: acknowledged and never seen: {lost:?}");
        assert!(duplicated.is_empty(), "{fault}: seen more than once: {duplicated:?}");
        assert_eq!(out_of_order, 0, "{fault}: acknowledged messages seen out of order: {in_acked_order:?}");
        assert!(!acked.is_empty(), "{fault}: nothing was acknowledged; refusals: {said:?}");
    }
}

fn bridge(server: &str, token: &str, handle: &str, channels: bool) -> Bridge {
    Bridge::start(BridgeSpec { server, token, handle: Some(handle), channels })
}

#[tokio::test]
async fn the_server_killed_under_steady_sends_and_restarted_loses_nothing() {
    let db = TestDb::new().await;
    let mut server = Server::start(&db).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    let mut probe =
        Probe::new(bridge(&server.url, &laptop, "alice", false), bridge(&server.url, &ci, "bob", true), "ci/bob").await;

    probe.send_for(STEADY).await;
    let port = server.port;
    let (_restarted, lasted, resumed) = probe
        .through(async {
            server.crash();
            tokio::time::sleep(OUTAGE).await;
            drop(server);
            Server::start_on(&db, port).await
        })
        .await;
    probe.settle(1).await;
    probe.report("relay-server killed (SIGKILL) and restarted", 1, lasted, resumed);
}

#[tokio::test]
async fn postgres_restarted_fast_or_immediate_or_killed_outright_loses_nothing() {
    let mut cluster = ControlledCluster::start().await;
    let db = cluster.database().await;
    let server = Server::start(&db).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    let mut probe =
        Probe::new(bridge(&server.url, &laptop, "alice", false), bridge(&server.url, &ci, "bob", true), "ci/bob").await;

    for (how, fault) in [
        (Down::Fast, "Postgres restarted (fast)"),
        (Down::Immediate, "Postgres restarted (immediate)"),
        (Down::Killed, "Postgres killed (SIGKILL of the postmaster and its children) and started"),
    ] {
        let from = probe.next + 1;
        probe.send_for(STEADY).await;
        let ((), lasted, resumed) = probe
            .through(async {
                cluster.down(how);
                tokio::time::sleep(OUTAGE).await;
                cluster.up().await;
            })
            .await;
        probe.settle(from).await;
        probe.report(fault, from, lasted, resumed);
    }
}

#[tokio::test]
async fn a_bridge_whose_replica_is_killed_resumes_on_the_other_without_a_gap() {
    let db = TestDb::new().await;
    let (mut a, b) = tokio::join!(Server::start(&db), Server::start(&db));
    let (laptop, ci) = (a.machine("acme", "laptop"), a.machine("acme", "ci"));
    let replicas = format!("{},{}", a.url, b.url);
    // Both agents are on the first replica: the sender and the recipient move.
    let mut probe =
        Probe::new(bridge(&replicas, &laptop, "alice", false), bridge(&replicas, &ci, "bob", true), "ci/bob").await;

    probe.send_for(STEADY).await;
    let ((), lasted, resumed) = probe.through(async { a.crash() }).await;
    probe.settle(1).await;
    probe.report("the bridges' replica killed (SIGKILL), the other one up", 1, lasted, resumed);
    let me = probe.recipient.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(me["structuredContent"]["address"], "acme/ci/bob", "{}", text(&me));
}

/// A network namespace with only its loopback, and a forwarder from its loopback to a server
/// outside: cutting the namespace's loopback cuts the bridge in it off, as a dropped network would
/// (packets go nowhere; nothing is closed).
struct Partition {
    name: String,
    forwarder: tokio::task::JoinHandle<()>,
    /// The server's address as seen from inside.
    inside: String,
}

impl Partition {
    async fn new(server: SocketAddr) -> Self {
        let name = format!("relay-fault-{}-{:04x}", std::process::id(), rand::random::<u16>());
        ip(&["netns", "add", &name]);
        let partition = |inside: String, forwarder| Self { name: name.clone(), forwarder, inside };
        ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"]);
        // A listener made by a thread that has entered the namespace lives there; the connections
        // it accepts are forwarded from here, outside.
        let path = PathBuf::from("/run/netns").join(&name);
        let listener = std::thread::spawn(move || {
            let namespace = std::fs::File::open(&path).expect("the namespace");
            // SAFETY: setns on this thread only, with a descriptor we hold open.
            let entered = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&namespace), libc::CLONE_NEWNET) };
            assert_eq!(entered, 0, "enter the namespace: {}", std::io::Error::last_os_error());
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen inside the namespace");
            listener.set_nonblocking(true).unwrap();
            listener
        })
        .join()
        .unwrap();
        let inside = format!("http://{}", listener.local_addr().unwrap());
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let forwarder = tokio::spawn(async move {
            while let Ok((mut from, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut to) = tokio::net::TcpStream::connect(server).await {
                        let _ = tokio::io::copy_bidirectional(&mut from, &mut to).await;
                    }
                });
            }
        });
        partition(inside, forwarder)
    }

    fn netns(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    fn cut(&self) {
        ip(&["netns", "exec", &self.name, "ip", "link", "set", "lo", "down"]);
    }

    fn heal(&self) {
        ip(&["netns", "exec", &self.name, "ip", "link", "set", "lo", "up"]);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.forwarder.abort();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).stdin(Stdio::null()).output_within(COMMAND_LIMIT);
    }
}

fn ip(args: &[&str]) {
    let out =
        Command::new("ip").args(args).stdin(Stdio::null()).output_within(COMMAND_LIMIT).expect("run ip (iproute2)");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn a_bridge_cut_off_for_30s_drains_its_queue_in_order_and_keeps_its_handle() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("fault: network partition NOT RUN: it needs root for `ip netns` (CI runs as root)");
        return;
    }
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    let partition = Partition::new(SocketAddr::from(([127, 0, 0, 1], server.port))).await;
    let spec = BridgeSpec { server: &partition.inside, token: &ci, handle: Some("bob"), channels: true };
    let recipient = Bridge::start_in_netns(spec, &partition.netns());
    let mut probe = Probe::new(bridge(&server.url, &laptop, "alice", false), recipient, "ci/bob").await;

    probe.send_for(STEADY).await;
    probe.settle(1).await;
    let cut = Instant::now();
    partition.cut();
    probe.send_for(Duration::from_secs(30)).await;
    let healed = Instant::now();
    let before = probe.seen.len();
    partition.heal();
    probe.send_for(STEADY).await;
    probe.settle(1).await;
    let resumed = probe.seen.get(before).map_or(Duration::ZERO, |(_, at)| at.saturating_duration_since(healed));
    let lasted = healed - cut;
    probe.report("the recipient's bridge cut off for 30 s (network namespace), then healed", 1, lasted, resumed);
    let me = probe.recipient.tool_ok("relay_whoami", json!({})).await;
    assert_eq!(me["structuredContent"]["address"], "acme/ci/bob", "the handle is kept: {}", text(&me));
}
