//! Connections nobody can hoard: a socket that does not finish its setup (silent, or dribbling its
//! preface) is closed after the setup time; an address holds only so many that never authenticate,
//! a newcomer taking the place of its oldest; at the replica's cap a newcomer takes the place of the
//! oldest that never authenticated, and connections of agents that work keep theirs; one account,
//! and one credential, hold only their share.

use std::time::{Duration, Instant};

use relay_proto::v1::WhoAmIRequest;
use relay_tests::client::Agent;
use relay_tests::eventually;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// How long the server gives a connection to finish its setup (`protocol::connections::SETUP`).
const SETUP: Duration = Duration::from_secs(5);

/// Whether the server has closed `socket` (its end read, or an error) within `limit`; what it
/// sends meanwhile (its own HTTP/2 settings) is skipped.
async fn closed(socket: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 256];
    let read_to_end = async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, read_to_end).await.is_ok()
}

/// A socket to `addr` from the loopback address `from` (127.0.0.x: one machine, several addresses).
async fn connect_from(addr: &str, from: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(addr.parse().unwrap()).await.unwrap()
}

#[tokio::test]
async fn sockets_that_never_finish_their_setup_are_closed_after_the_setup_time() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let addr = server.url.trim_start_matches("http://").replace("localhost", "127.0.0.1");

    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    // One byte, then nothing: a started preface is no excuse.
    silent[1].write_all(b"P").await.unwrap();
    // The preface a byte at a time, slower than the setup time allows for it.
    let mut dribbling = TcpStream::connect(&addr).await.unwrap();
    let dribble = tokio::spawn(async move {
        for byte in b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" {
            if dribbling.write_all(&[*byte]).await.is_err() {
                return (dribbling, true);
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        (dribbling, false)
    });

    assert!(closed(&mut silent[0], SETUP * 3).await, "a silent socket stayed open {:?}", opened.elapsed());
    assert!(opened.elapsed() >= SETUP - Duration::from_millis(500), "closed early: {:?}", opened.elapsed());
    for socket in &mut silent[1..] {
        assert!(closed(socket, SETUP).await, "every silent socket is closed");
    }
    let (mut dribbling, cut_while_writing) = dribble.await.unwrap();
    assert!(cut_while_writing || closed(&mut dribbling, SETUP).await, "a dribbled preface is cut");
    // Meanwhile, and after, agents get in and work.
    let mut agent = Agent::hello(&server.url, &laptop, "busy").await.unwrap();
    agent.rpc.who_am_i(WhoAmIRequest {}).await.unwrap();
}

#[tokio::test]
async fn at_the_cap_a_newcomer_takes_the_place_of_a_socket_that_never_authenticated() {
    let db = TestDb::new().await;
    let env = [("RELAY_MAX_CONNECTIONS", "3"), ("RELAY_MAX_CONNECTIONS_PER_ACCOUNT", "3")];
    let server = Server::start_with_env(&db, relay_tests::free_port(), &env).await;
    let laptop = server.machine("acme", "laptop");
    let addr = server.url.trim_start_matches("http://").replace("localhost", "127.0.0.1");
    let mut working = Vec::new();
    for i in 0..2 {
        let agent = eventually(Duration::from_secs(10), "a place for an agent", || {
            let (url, token) = (server.url.clone(), laptop.clone());
            async move { Agent::hello(&url, &token, &format!("a{i}")).await.ok() }
        })
        .await;
        working.push(agent);
    }
    // The third place goes to a socket that will never authenticate.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await.unwrap();
    // A newcomer still gets in: the idle socket gives up its place, the working agents keep theirs.
    let mut newcomer = eventually(Duration::from_secs(10), "the newcomer to get in", || {
        let (url, token) = (server.url.clone(), laptop.clone());
        async move { Agent::hello(&url, &token, "newcomer").await.ok() }
    })
    .await;
    newcomer.rpc.who_am_i(WhoAmIRequest {}).await.unwrap();
    assert!(closed(&mut idle, Duration::from_secs(2)).await, "the socket that never authenticated was closed");
    for agent in &mut working {
        agent.rpc.who_am_i(WhoAmIRequest {}).await.expect("the working agents keep their connections");
    }
}

#[tokio::test]
async fn one_address_holds_only_so_many_connections_that_never_authenticate() {
    let db = TestDb::new().await;
    let env = [("RELAY_MAX_CONNECTIONS_PER_ADDRESS", "5")];
    let server = Server::start_with_env(&db, relay_tests::free_port(), &env).await;
    let addr = server.url.trim_start_matches("http://").replace("localhost", "127.0.0.1");
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(connect_from(&addr, "127.0.0.2").await);
    }
    // A sixth from the same address takes the place of the oldest: a neighbour behind the same
    // address (an office, a CI fleet) is not kept out by sockets that never authenticate.
    let mut sixth = connect_from(&addr, "127.0.0.2").await;
    assert!(closed(&mut held[0], Duration::from_secs(2)).await, "the address's oldest is closed at once");
    assert!(!closed(&mut sixth, Duration::from_secs(1)).await, "the newcomer is kept");
    for socket in &mut held[1..] {
        assert!(!closed(socket, Duration::from_millis(200)).await, "the others are kept");
    }
    let mut elsewhere = connect_from(&addr, "127.0.0.3").await;
    assert!(!closed(&mut elsewhere, Duration::from_secs(1)).await, "another address still gets in");
}

#[tokio::test]
async fn one_account_and_one_credential_hold_only_their_share_of_connections() {
    let db = TestDb::new().await;
    let env = [("RELAY_MAX_CONNECTIONS_PER_ACCOUNT", "3"), ("RELAY_MAX_CONNECTIONS_PER_CREDENTIAL", "2")];
    let server = Server::start_with_env(&db, relay_tests::free_port(), &env).await;
    let laptop = server.machine("acme", "laptop");
    let desk = server.machine("acme", "desk");
    let globex = server.machine("globex", "box");
    let over_share = |status: tonic::Status, whose: &str| {
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains(&format!("{whose} holds"))
                && status.message().contains("connections to this server, its share"),
            "{status:?}"
        );
    };

    // One machine's token opens two connections (each Hello is a connection's first call); a third is refused.
    let mut held = vec![
        Agent::hello(&server.url, &laptop, "a1").await.unwrap(),
        Agent::hello(&server.url, &laptop, "a2").await.unwrap(),
    ];
    over_share(Agent::hello(&server.url, &laptop, "a3").await.err().expect("a third for one token"), "this credential");
    // The account's third connection, by another machine, fits; its fourth does not.
    held.push(Agent::hello(&server.url, &desk, "d1").await.unwrap());
    over_share(Agent::hello(&server.url, &desk, "d2").await.err().expect("a fourth for one account"), "the account");
    // Another account is not held back, and the held connections keep working.
    let mut other = Agent::hello(&server.url, &globex, "g1").await.expect("another account connects");
    other.rpc.who_am_i(WhoAmIRequest {}).await.unwrap();
    for agent in &mut held {
        agent.rpc.who_am_i(WhoAmIRequest {}).await.expect("held connections keep working");
    }
    // A connection that closes gives its share back.
    held.remove(0);
    eventually(Duration::from_secs(10), "the freed share taken by a new connection", || {
        let (url, token) = (server.url.clone(), laptop.clone());
        async move { Agent::hello(&url, &token, "a3").await.ok() }
    })
    .await;
}

#[tokio::test]
async fn past_the_cap_new_connections_are_refused_and_held_ones_keep_working() {
    let db = TestDb::new().await;
    let env = [("RELAY_MAX_CONNECTIONS", "3"), ("RELAY_MAX_CONNECTIONS_PER_ACCOUNT", "3")];
    let server = Server::start_with_env(&db, relay_tests::free_port(), &env).await;
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
    // One byte of a hello, then nothing: the handshake never finishes.
    let mut stalled = TcpStream::connect(&addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stalled, &[0x16]).await.unwrap();
    let opened = Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(SETUP * 4, stalled.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "a stalled handshake stayed open {:?}", opened.elapsed());
}
