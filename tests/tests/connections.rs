//! Connections nobody can hoard: sockets that never speak are closed after the preface time, so
//! they free their places for others, and past the replica's cap new connections are refused while
//! the ones it holds keep working.

use std::time::{Duration, Instant};

use relay_proto::v1::WhoAmIRequest;
use relay_tests::client::Agent;
use relay_tests::eventually;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// How long the server lets a connection stay silent (`protocol::connections::PREFACE`).
const PREFACE: Duration = Duration::from_secs(5);

#[tokio::test]
async fn sockets_that_never_speak_are_closed_and_free_their_places() {
    let db = TestDb::new().await;
    let server = Server::start_with_env(&db, relay_tests::free_port(), &[("RELAY_MAX_CONNECTIONS", "100")]).await;
    let laptop = server.machine("acme", "laptop");
    let addr = server.url.trim_start_matches("http://").to_owned();

    // As many silent sockets as the replica takes: they hold every place.
    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    // The first is closed by the server once the preface time has passed, not before.
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(PREFACE * 3, silent[0].read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "a silent socket stayed open {:?}", opened.elapsed());
    assert!(opened.elapsed() >= PREFACE - Duration::from_millis(500), "closed early: {:?}", opened.elapsed());

    // Their places are free again: an agent gets in and works.
    let mut agent = eventually(PREFACE * 2, "an agent to get a place the silent sockets held", || {
        let (url, token) = (server.url.clone(), laptop.clone());
        async move { Agent::hello(&url, &token, "busy").await.ok() }
    })
    .await;
    agent.rpc.who_am_i(WhoAmIRequest {}).await.unwrap();
    for socket in &mut silent[1..] {
        let read = tokio::time::timeout(PREFACE, socket.read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "every silent socket is closed");
    }
}

#[tokio::test]
async fn past_the_cap_new_connections_are_refused_and_held_ones_keep_working() {
    let db = TestDb::new().await;
    let server = Server::start_with_env(&db, relay_tests::free_port(), &[("RELAY_MAX_CONNECTIONS", "3")]).await;
    let laptop = server.machine("acme", "laptop");
    let mut held = Vec::new();
    for i in 0..3 {
        let agent = eventually(Duration::from_secs(10), "a place among the three", || {
            let (url, token) = (server.url.clone(), laptop.clone());
            async move { Agent::hello(&url, &token, &format!("a{i}")).await.ok() }
        })
        .await;
        held.push(agent);
    }

    let refused = Agent::hello(&server.url, &laptop, "fourth").await.err().expect("a fourth connection is refused");
    // The connection is closed before it is served: a transport failure (reset, cancelled or
    // unavailable, as the timing falls), never a status the server answered with.
    let transport = std::error::Error::source(&refused).is_some_and(|e| e.is::<tonic::transport::Error>());
    assert!(transport, "{refused:?}");
    for agent in &mut held {
        agent.rpc.who_am_i(WhoAmIRequest {}).await.expect("the held connections keep working");
    }

    // A connection that closes frees its place.
    held.pop();
    eventually(Duration::from_secs(10), "the freed place taken by a new connection", || {
        let (url, token) = (server.url.clone(), laptop.clone());
        async move { Agent::hello(&url, &token, "fourth").await.ok() }
    })
    .await;
}

/// A self-signed certificate for localhost, written as `name.crt` and `name.key` in `dir`.
fn certificate(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let issued = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert, issued.cert.pem()).unwrap();
    std::fs::write(&key, issued.signing_key.serialize_pem()).unwrap();
    (cert, key, issued.cert.pem())
}

async fn trusted_with(url: &str, ca_pem: &str) -> bool {
    let ca = tonic::transport::Certificate::from_pem(ca_pem);
    let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(ca);
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(url.to_owned()).and_then(|e| e.tls_config(tls)) else {
        return false;
    };
    endpoint.connect().await.is_ok()
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, first) = certificate(dir.path(), "server");
    let db = TestDb::new().await;
    let server = Server::start_tls(&db, &cert, &key).await;
    assert!(trusted_with(&server.url, &first).await);

    // The files are replaced the way tools do it: written aside, then renamed over.
    let (new_cert, new_key, second) = certificate(dir.path(), "renewed");
    std::fs::rename(&new_key, &key).unwrap();
    std::fs::rename(&new_cert, &cert).unwrap();
    eventually(Duration::from_secs(20), "new connections to get the renewed certificate", || async {
        trusted_with(&server.url, &second).await.then_some(())
    })
    .await;
    assert!(!trusted_with(&server.url, &first).await, "the old certificate is no longer served");
}

#[tokio::test]
async fn a_tls_handshake_that_stalls_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = certificate(dir.path(), "server");
    let db = TestDb::new().await;
    let server = Server::start_tls(&db, &cert, &key).await;
    let addr = server.url.trim_start_matches("https://").replace("localhost", "127.0.0.1");
    // One byte passes the preface check; the handshake then waits for a hello that never comes.
    let mut stalled = TcpStream::connect(&addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stalled, &[0x16]).await.unwrap();
    let opened = Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(PREFACE * 4, stalled.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "a stalled handshake stayed open {:?}", opened.elapsed());
}
