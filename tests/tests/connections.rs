//! Connections nobody can hoard: sockets that never speak are closed after the preface time, and
//! past the replica's cap new connections are refused while the ones it holds keep working.

use std::time::{Duration, Instant};

use relay_proto::v1::WhoAmIRequest;
use relay_tests::client::Agent;
use relay_tests::eventually;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn sockets_that_never_speak_are_closed_and_keep_nobody_out() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let addr = server.url.trim_start_matches("http://").to_owned();

    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    // Meanwhile an agent connects and works as if they were not there.
    let mut agent = Agent::hello(&server.url, &laptop, "busy").await.unwrap();
    agent.rpc.who_am_i(WhoAmIRequest {}).await.unwrap();

    // Each silent socket is closed by the server, after the preface time and not long after.
    for socket in &mut silent {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(15), socket.read(&mut byte)).await;
        let ended = matches!(read, Ok(Ok(0)) | Ok(Err(_)));
        assert!(ended, "a silent socket was still open {:?} after it opened", opened.elapsed());
    }
    assert!(opened.elapsed() >= Duration::from_secs(4), "closed before the preface time: {:?}", opened.elapsed());
    agent.rpc.who_am_i(WhoAmIRequest {}).await.expect("the agent's own connection stays");
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

    let refused = Agent::hello(&server.url, &laptop, "fourth").await;
    assert!(refused.is_err(), "a fourth connection is refused while three are held");
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
