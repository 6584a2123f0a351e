//! One hostile client against a server at its defaults, while another account's agent sends: the
//! attacks a client on the open internet can make with a token of its own or none (half-open calls,
//! silent and preface-only sockets, stalled TLS handshakes, huge requests, read floods, PING and
//! SETTINGS floods, endpoints made as fast as it can). Each test measures the other agent's sends
//! before and during the attack: none may fail, and they stay within a few times their own latency
//! (the figures are printed).
//!
//! Every attack runs twice: from another address (the attacker at 127.0.0.2, the agent at
//! 127.0.0.1), and from the agent's own address, as a neighbour behind one office NAT, proxy or CI
//! fleet would (both at 127.0.0.1). Against the sockets attacks the agent opens a new connection
//! for every send, so what is measured is whether it can still get in.
//!
//! The agent sends for 4 s under attack (40 sends: the p99 printed is the slowest). The bulk of
//! them (p90) must stay within ten times the agent's own p99, and the slowest within a second and a
//! half of it: a denial costs seconds on many sends, while one send slowed by a busy two-core
//! machine is not a denial. For figures, `RELAY_ATTACK_MEASURE_S` measures longer, e.g. 30 for 300
//! sends.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::{ConfirmRequest, DeliveryState, HelloRequest, ListRequest, SendRequest};
use relay_tests::client::{Agent, Bearer, client};
use relay_tests::free_port;
use relay_tests::http::{get, sample};
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The address the agent speaks from; a neighbour's attacks come from it too.
const AGENTS_ADDRESS: &str = "127.0.0.1";
/// Another address.
const ELSEWHERE: &str = "127.0.0.2";

/// Each attack, from another address and from the agent's own.
macro_rules! from_both_addresses {
    ($($attack:ident),* $(,)?) => {$(
        mod $attack {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn from_another_address() {
                super::$attack(super::ELSEWHERE).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn from_the_agents_own_address() {
                super::$attack(super::AGENTS_ADDRESS).await
            }
        }
    )*};
}

from_both_addresses!(
    half_open_calls_with_a_valid_token_take_nothing_from_another_account,
    half_open_calls_with_an_unknown_token_take_nothing_either,
    silent_and_preface_only_sockets_take_no_place_from_agents,
    stalled_tls_handshakes_take_no_place_from_agents,
    huge_requests_are_refused_unread_and_memory_stays_bounded,
    a_read_flood_is_held_to_its_rate_and_told_when_to_retry,
    ping_and_settings_floods_end_their_connection_and_nobody_elses,
    one_machine_cannot_take_its_accounts_endpoints,
);

/// Each attack runs alone, as the figures are meant: two at once on a small machine would measure
/// each other. (`cargo test` runs this file's tests as threads of one process; nextest, which runs
/// each in a process of its own, keeps them apart by the test group in `.config/nextest.toml`.)
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A server at its defaults (with an ops port, to read what it refused); acme is the attacker's
/// account, globex the other agent's.
struct World {
    server: Server,
    ops: String,
    acme: String,
    globex: String,
    /// The address the attacker speaks from.
    attacker: &'static str,
    /// The certificate to trust, when the server speaks TLS.
    ca: Option<String>,
    _db: TestDb,
    _certificates: Option<tempfile::TempDir>,
    /// Last, so it is let go once the server and its database are gone.
    _alone: tokio::sync::MutexGuard<'static, ()>,
}

async fn world(attacker: &'static str) -> World {
    start(attacker, false).await
}

/// A server that speaks TLS.
async fn tls_world(attacker: &'static str) -> World {
    start(attacker, true).await
}

async fn start(attacker: &'static str, tls: bool) -> World {
    let alone = ONE_AT_A_TIME.lock().await;
    let db = TestDb::new().await;
    let ops = format!("127.0.0.1:{}", free_port());
    let env = [("RELAY_OPS_LISTEN", ops.as_str())];
    let (server, ca, certificates) = if tls {
        let dir = tempfile::tempdir().unwrap();
        let issued = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let (cert, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
        std::fs::write(&cert, issued.cert.pem()).unwrap();
        std::fs::write(&key, issued.signing_key.serialize_pem()).unwrap();
        (Server::start_tls_with_env(&db, &cert, &key, &env).await, Some(issued.cert.pem()), Some(dir))
    } else {
        (Server::start_with_env(&db, free_port(), &env).await, None, None)
    };
    let acme = server.machine("acme", "laptop");
    let globex = server.machine("globex", "box");
    World { _alone: alone, server, ops, acme, globex, attacker, ca, _db: db, _certificates: certificates }
}

impl World {
    /// A series of the server's metrics, 0 when it has none yet.
    async fn metric(&self, series: &str) -> f64 {
        let (status, text) = get(&self.ops, "/metrics").await.expect("the ops port answers");
        assert_eq!(status, 200);
        sample(&text, series).unwrap_or(0.0)
    }

    /// The server's address, for sockets.
    fn target(&self) -> std::net::SocketAddr {
        let host_port = self.server.url.split_once("://").map_or(self.server.url.as_str(), |(_, rest)| rest);
        host_port.replace("localhost", "127.0.0.1").parse().unwrap()
    }

    /// A new connection of the agent's, from its address.
    async fn agents_connection(&self) -> Result<Channel, tonic::transport::Error> {
        let mut endpoint = tonic::transport::Endpoint::from_shared(self.server.url.clone())
            .unwrap()
            .local_address(Some(AGENTS_ADDRESS.parse::<IpAddr>().unwrap()))
            .connect_timeout(Duration::from_secs(5));
        if let Some(ca) = &self.ca {
            let tls =
                tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(ca));
            endpoint = endpoint.tls_config(tls).unwrap();
        }
        endpoint.connect().await
    }
}

/// What the other agent's sends saw.
#[derive(Debug)]
struct Sends {
    made: usize,
    failed: Vec<String>,
    p50: Duration,
    p90: Duration,
    p99: Duration,
}

/// How the agent sends.
#[derive(Clone, Copy, PartialEq)]
enum Connection {
    /// Every send on the connection it opened first.
    Kept,
    /// Every send on a new connection, opened for it.
    New,
}

/// globex's agent sends to its colleague for `length`, ten a second: a busy agent, well within
/// its send rate.
async fn sends(w: &World, length: Duration, handle: &str, connection: Connection) -> Sends {
    let hello = |handle: String| HelloRequest { handle, harness: "claude".into(), ..Default::default() };
    let channel = w.agents_connection().await.expect("the agent connects");
    let mut agent =
        Agent::hello_on(channel.clone(), &w.globex, hello(handle.to_owned())).await.expect("the agent says hello");
    let _colleague = Agent::hello_on(channel, &w.globex, hello(format!("{handle}-peer"))).await.unwrap();
    let to = format!("box/{handle}-peer");
    // The first send, which opens the connection, is not one of those measured.
    agent.send(&[&to], "starting").await.expect("the first send");
    let (mut times, mut failed) = (Vec::new(), Vec::new());
    let until = Instant::now() + length;
    while Instant::now() < until {
        let started = Instant::now();
        let send = async {
            if connection == Connection::New {
                let channel = w.agents_connection().await.map_err(|e| format!("no connection: {e}"))?;
                agent.rpc = client(channel, &agent.session_token);
            }
            agent.send(&[&to], "still working").await.map_err(|s| format!("{:?}: {}", s.code(), s.message()))
        };
        match tokio::time::timeout(Duration::from_secs(10), send).await {
            Ok(Ok(_)) => times.push(started.elapsed()),
            Ok(Err(why)) => failed.push(why),
            Err(_) => failed.push("no answer in 10 s".into()),
        }
        tokio::time::sleep_until(started + Duration::from_millis(100)).await;
    }
    times.sort();
    let at = |q: f64| times.get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1))).copied();
    Sends {
        made: times.len() + failed.len(),
        p50: at(0.5).unwrap_or_default(),
        p90: at(0.9).unwrap_or_default(),
        p99: at(0.99).unwrap_or_default(),
        failed,
    }
}

/// Runs `attack` while the other agent sends, after measuring the agent alone; asserts the agent
/// saw no failure and stayed within a few times its own latency.
async fn under_attack<F: Future<Output = ()> + Send + 'static>(w: &World, name: &str, attack: F) {
    under_attack_with(w, name, Connection::Kept, attack).await
}

async fn under_attack_with<F: Future<Output = ()> + Send + 'static>(
    w: &World,
    name: &str,
    connection: Connection,
    attack: F,
) {
    let name =
        format!("{name} from {}", if w.attacker == AGENTS_ADDRESS { "the agent's address" } else { "another address" });
    let measure = std::env::var("RELAY_ATTACK_MEASURE_S").ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or(4);
    let alone = sends(w, Duration::from_secs(measure.div_ceil(2)), "alone", connection).await;
    let attacking = tokio::spawn(attack);
    // The attack takes hold first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = sends(w, Duration::from_secs(measure), "during", connection).await;
    attacking.abort();
    eprintln!(
        "{name}: the other agent's sends alone p50 {:?} p90 {:?} p99 {:?} ({} sends); under attack p50 {:?} p90 {:?} p99 {:?} ({} sends)",
        alone.p50, alone.p90, alone.p99, alone.made, during.p50, during.p90, during.p99, during.made
    );
    assert!(
        during.failed.is_empty(),
        "{name}: {} of the other agent's {} sends failed, the first: {:?}",
        during.failed.len(),
        during.made,
        during.failed.first()
    );
    assert!(during.made > 10, "{name}: the other agent made only {} sends", during.made);
    // Three times its own latency is the aim (the printed figures, from a release build run
    // alone); the bounds leave room for a test machine of two cores that also runs the attacker
    // and a debug build, and still fail a denial, which costs seconds.
    let bound = (alone.p99 * 10).max(alone.p99 + Duration::from_millis(250));
    assert!(during.p90 <= bound, "{name}: p90 {:?} against a p99 of {:?} alone", during.p90, alone.p99);
    let slowest = alone.p99 + Duration::from_millis(1500);
    assert!(
        during.p99 <= slowest,
        "{name}: the slowest send took {:?} against a p99 of {:?} alone",
        during.p99,
        alone.p99
    );
}

/// A TCP connection to `target` from `from`.
async fn socket_from(from: &str, target: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse().unwrap())?;
    socket.connect(target).await
}

/// Where the attacker speaks from and to: what an attack's task takes with it.
#[derive(Clone)]
struct Attacker {
    from: &'static str,
    target: std::net::SocketAddr,
    url: String,
}

impl World {
    fn attacker(&self) -> Attacker {
        Attacker { from: self.attacker, target: self.target(), url: self.server.url.clone() }
    }
}

/// A TCP connection to the server from the attacker's address.
async fn attacker_socket(at: &Attacker) -> TcpStream {
    socket_from(at.from, at.target).await.unwrap()
}

/// A gRPC client of the attacker's, speaking from its address with `token`.
async fn attacker_client(w: &World, token: &str) -> RelayClient<InterceptedService<Channel, Bearer>> {
    let channel = tonic::transport::Endpoint::from_shared(w.server.url.clone())
        .unwrap()
        .local_address(Some(w.attacker.parse::<IpAddr>().unwrap()))
        .connect()
        .await
        .unwrap();
    RelayClient::with_interceptor(channel, Bearer::new(token))
}

/// Opens `calls` Send calls with `token` that send their headers and never their message, a
/// hundred to a connection, and holds them open; every second it opens as many again, on new
/// connections, keeping the last five rounds, so calls the server ends are replaced.
async fn half_open_calls(at: Attacker, token: String, calls: usize) {
    let url = &at.url;
    let mut rounds = VecDeque::new();
    loop {
        let mut held = Vec::new();
        let mut opened = 0;
        while opened < calls {
            let Ok((client, connection)) = h2::client::handshake(attacker_socket(&at).await).await else { continue };
            tokio::spawn(connection);
            let Ok(mut client) = client.ready().await else { continue };
            for _ in 0..100 {
                let request = http::Request::post(format!("{url}/relay.v1.Relay/Send"))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .header("authorization", format!("Bearer {token}"))
                    .body(())
                    .unwrap();
                let Ok(call) = client.send_request(request, false) else { break };
                held.push(call);
                opened += 1;
                client = match client.ready().await {
                    Ok(client) => client,
                    Err(_) => break,
                };
            }
        }
        rounds.push_back(held);
        if rounds.len() > 5 {
            rounds.pop_front();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn half_open_calls_with_a_valid_token_take_nothing_from_another_account(from: &'static str) {
    let w = world(from).await;
    let agent = Agent::hello(&w.server.url, &w.acme, "attacker").await.unwrap();
    under_attack(&w, "half-open calls, valid token", half_open_calls(w.attacker(), agent.session_token, 1100)).await;
    // The attacker was held to its share: past it, its calls were refused.
    assert!(w.metric(r#"relay_shed_total{reason="shares"}"#).await > 0.0, "the attacker's calls were refused");
}

async fn half_open_calls_with_an_unknown_token_take_nothing_either(from: &'static str) {
    let w = world(from).await;
    let unknown = format!("rls_{}", "a".repeat(43));
    under_attack(&w, "half-open calls, unknown token", half_open_calls(w.attacker(), unknown, 1100)).await;
    // Refused as it authenticated, and its address held to its share while it did.
    let refused = w.metric(r#"relay_rpcs_total{method="/relay.v1.Relay/Send",code="UNAUTHENTICATED"}"#).await;
    assert!(refused > 0.0, "the unknown token was refused");
    assert!(w.metric(r#"relay_shed_total{reason="authentication"}"#).await > 0.0, "its address was held back");
}

/// Opens 200 sockets every 200 ms that say `said(n)` of their setup and go silent, letting go of
/// the oldest past 2,000: the server sheds them long before.
async fn silent_sockets(at: Attacker, said: fn(usize) -> &'static [u8]) {
    let mut held = VecDeque::new();
    loop {
        for n in 0..200 {
            let Ok(mut stream) = socket_from(at.from, at.target).await else { continue };
            let _ = stream.write_all(said(n)).await;
            held.push_back(stream);
        }
        while held.len() > 2000 {
            held.pop_front();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn silent_and_preface_only_sockets_take_no_place_from_agents(from: &'static str) {
    let w = world(from).await;
    let said =
        |n: usize| -> &'static [u8] { if n.is_multiple_of(2) { b"P" } else { b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" } };
    under_attack_with(&w, "silent and preface-only sockets", Connection::New, silent_sockets(w.attacker(), said)).await;
    assert!(w.metric(r#"relay_shed_total{reason="shares"}"#).await > 0.0, "the attacker's sockets were shed");
}

async fn stalled_tls_handshakes_take_no_place_from_agents(from: &'static str) {
    let w = tls_world(from).await;
    // The first byte of a TLS record, or a handshake record's whole header: a ClientHello begun.
    let said =
        |n: usize| -> &'static [u8] { if n.is_multiple_of(2) { &[0x16] } else { &[0x16, 0x03, 0x01, 0x02, 0x00] } };
    under_attack_with(&w, "stalled TLS handshakes", Connection::New, silent_sockets(w.attacker(), said)).await;
    assert!(w.metric(r#"relay_shed_total{reason="shares"}"#).await > 0.0, "the attacker's sockets were shed");
}

async fn huge_requests_are_refused_unread_and_memory_stays_bounded(from: &'static str) {
    let w = world(from).await;
    let agent = Agent::hello(&w.server.url, &w.acme, "attacker").await.unwrap();
    let mut client = attacker_client(&w, &agent.session_token).await;
    // A Confirm of a million seqs: refused for its size, before anything is decoded.
    let huge = ConfirmRequest { seqs: (0..1_000_000).collect(), state: DeliveryState::Surfaced as i32 };
    let refused = client.confirm(huge.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{}", refused.message());
    assert!(refused.message().contains("larger than the 16384 bytes this method takes"), "{}", refused.message());
    // Of a size the method takes, but too many seqs: refused by count.
    let many = ConfirmRequest { seqs: (1..=2000).collect(), state: DeliveryState::Surfaced as i32 };
    let refused = client.confirm(many).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("2000 seqs in one request; the limit is 1000"), "{}", refused.message());

    // Sixteen at a time, over and over, made by hand so the attacker's encoding costs nothing.
    let pid = w.server.pid();
    let (at, token) = (w.attacker(), agent.session_token.clone());
    let huge = framed(&prost::Message::encode_to_vec(&huge));
    let attack = async move {
        let url = at.url.clone();
        let mut connection = h2_connection(&at).await;
        loop {
            let calls: Vec<_> = (0..16)
                .map(|_| {
                    let (mut connection, url, token, huge) =
                        (connection.clone(), url.clone(), token.clone(), huge.clone());
                    tokio::spawn(async move { try_raw_call(&mut connection, &url, &token, "Confirm", huge).await })
                })
                .collect();
            // The server ends a connection that keeps sending what it refuses: open another.
            let mut ended = false;
            for call in calls {
                ended |= !matches!(call.await, Ok(Ok(_)));
            }
            if ended {
                connection = h2_connection(&at).await;
            }
        }
    };
    under_attack(&w, "huge Confirm calls", attack).await;
    let refused = w.metric(r#"relay_rpcs_total{method="/relay.v1.Relay/Confirm",code="INVALID_ARGUMENT"}"#).await;
    assert!(refused > 16.0, "the huge calls were made and refused: {refused}");
    let rss_kib: u64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap();
    eprintln!("huge Confirm calls: the server's memory peaked at {} MiB", rss_kib / 1024);
    assert!(rss_kib < 512 * 1024, "the server's memory peaked at {} MiB", rss_kib / 1024);
}

async fn a_read_flood_is_held_to_its_rate_and_told_when_to_retry(from: &'static str) {
    let w = world(from).await;
    let agent = Agent::hello(&w.server.url, &w.acme, "attacker").await.unwrap();
    let client = attacker_client(&w, &agent.session_token).await;
    let flood = client.clone();
    let attack = async move {
        loop {
            let calls: Vec<_> = (0..16)
                .map(|_| {
                    let mut c = flood.clone();
                    tokio::spawn(async move { c.list(ListRequest::default()).await })
                })
                .collect();
            for call in calls {
                let _ = call.await;
            }
        }
    };
    under_attack(&w, "a read flood", attack).await;
    // Past its burst, the flooding credential is refused with a real wait.
    let mut client = client;
    let refused = loop {
        if let Err(status) = client.list(ListRequest::default()).await {
            break status;
        }
    };
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("calls a second it is allowed") && refused.message().contains("try again in"));
    let pushback = refused.metadata().get("grpc-retry-pushback-ms").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    assert!(pushback.is_some_and(|ms| ms > 0), "{refused:?}");
}

/// An HTTP/2 connection of the attacker's.
async fn h2_connection(at: &Attacker) -> h2::client::SendRequest<Bytes> {
    let (client, connection) = h2::client::handshake(attacker_socket(at).await).await.expect("an HTTP/2 connection");
    tokio::spawn(connection);
    client
}

/// `message` as one gRPC frame: uncompressed, its length, itself.
fn framed(message: &[u8]) -> Bytes {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    Bytes::from(framed)
}

/// A unary relay.v1 call made by hand with `token`, its request `framed` as given; the status the
/// server answered with.
async fn raw_call(
    connection: &mut h2::client::SendRequest<Bytes>,
    url: &str,
    token: &str,
    method: &str,
    framed: Bytes,
) -> tonic::Status {
    try_raw_call(connection, url, token, method, framed).await.expect("an answer")
}

/// [`raw_call`], or why no answer came (the server ended the connection).
async fn try_raw_call(
    connection: &mut h2::client::SendRequest<Bytes>,
    url: &str,
    token: &str,
    method: &str,
    framed: Bytes,
) -> Result<tonic::Status, h2::Error> {
    let mut client = connection.clone().ready().await?;
    let request = http::Request::post(format!("{url}/relay.v1.Relay/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(request, false)?;
    // The server may answer before it has read it all; what it did not read is of no matter.
    let _ = body.send_data(framed, true);
    let (head, mut rest) = response.await?.into_parts();
    let trailers = match rest.trailers().await {
        Ok(Some(trailers)) => trailers,
        _ => head.headers,
    };
    Ok(tonic::Status::from_header_map(&trailers).expect("a gRPC status"))
}

/// An HTTP/2 frame header: length, type, flags, stream 0.
fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags, 0, 0, 0, 0];
    out.extend_from_slice(payload);
    out
}

/// Floods one connection with `kind` frames until the server ends it; whether it ended it with
/// GOAWAY ENHANCE_YOUR_CALM (error code 11).
async fn flood_frames(at: &Attacker, kind: u8, payload: &[u8]) -> bool {
    let mut stream = attacker_socket(at).await;
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    stream.write_all(&frame(4, 0, &[])).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let flooding = frame(kind, 0, payload).repeat(100);
    let writer = tokio::spawn(async move { while write.write_all(&flooding).await.is_ok() {} });
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let calmed = loop {
        match tokio::time::timeout(Duration::from_secs(10), read.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => break false,
        }
        // Walk the frames read so far for a GOAWAY (type 7) with ENHANCE_YOUR_CALM.
        let mut at = 0;
        let mut found = false;
        while at + 9 <= seen.len() {
            let len = ((seen[at] as usize) << 16) | ((seen[at + 1] as usize) << 8) | seen[at + 2] as usize;
            if at + 9 + len > seen.len() {
                break;
            }
            if seen[at + 3] == 7 && len >= 8 && seen[at + 9 + 4..at + 9 + 8] == [0, 0, 0, 11] {
                found = true;
            }
            at += 9 + len;
        }
        if found {
            break true;
        }
    };
    writer.abort();
    calmed
}

async fn ping_and_settings_floods_end_their_connection_and_nobody_elses(from: &'static str) {
    let w = world(from).await;
    let at = w.attacker();
    assert!(flood_frames(&at, 6, &[0; 8]).await, "a PING flood ends with GOAWAY ENHANCE_YOUR_CALM");
    assert!(flood_frames(&at, 4, &[]).await, "a SETTINGS flood too");
    let attack = async move {
        loop {
            flood_frames(&at, 6, &[0; 8]).await;
        }
    };
    under_attack(&w, "PING floods", attack).await;
}

async fn one_machine_cannot_take_its_accounts_endpoints(from: &'static str) {
    let w = world(from).await;
    let other = w.server.machine("acme", "desk");
    let mut client = attacker_client(&w, &w.acme).await;
    let (mut made, mut refusal) = (0, None);
    for n in 0..400 {
        let request = HelloRequest { handle: format!("grab-{n}"), harness: "other".into(), ..Default::default() };
        match client.hello(request).await {
            Ok(_) => made += 1,
            Err(status) => {
                refusal = Some(status);
                break;
            }
        }
    }
    let refusal = refusal.expect("a machine making handles as fast as it can is stopped");
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    assert!(made < 250, "made {made} handles before it was stopped");
    assert!(
        refusal.message().contains("try again in") || refusal.message().contains("its share"),
        "{}",
        refusal.message()
    );
    // The account's other machine still has room.
    let desk =
        Agent::hello(&w.server.url, &other, "working").await.expect("another machine of the account claims a handle");
    assert_eq!(desk.address, "acme/desk/working");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_refused_as_invalid_and_change_nothing() {
    let w = world(ELSEWHERE).await;
    let agent = Agent::hello(&w.server.url, &w.acme, "sender").await.unwrap();
    let bob = Agent::hello(&w.server.url, &w.acme, "bob").await.unwrap();
    // Raw gRPC frames: a protobuf that does not parse, a string that is not UTF-8, an unknown enum.
    let malformed: [(&str, Vec<u8>); 3] = [
        ("not protobuf", vec![0xff, 0xff, 0xff, 0xff]),
        ("not utf-8", {
            let mut m = vec![0x0a, 3];
            m.extend_from_slice(b"bob");
            m.extend_from_slice(&[0x12, 2, 0xc3, 0x28]);
            m
        }),
        (
            "unknown kind",
            prost::Message::encode_to_vec(&SendRequest {
                to: vec!["bob".into()],
                body: "odd kind".into(),
                kind: 42,
                ..Default::default()
            }),
        ),
    ];
    for (what, message) in malformed {
        let mut connection = h2_connection(&w.attacker()).await;
        let status = raw_call(&mut connection, &w.server.url, &agent.session_token, "Send", framed(&message)).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    }
    // Nothing was stored: bob's inbox is empty.
    let mut bob = bob;
    assert!(bob.inbox(0, true).await.unwrap().messages.is_empty());
}
