//! What every call goes through, seen from outside the real server: the global concurrency limit,
//! and time budgets that stop a stuck call but never a long poll. (A handler's panic becoming
//! INTERNAL is proved on the layer itself, in server/src/protocol/layers.rs: the real handlers have
//! no way to panic on purpose.)

use std::pin::Pin;
use std::time::{Duration, Instant};

use relay_proto::v1::*;
use relay_tests::client::{Agent, channel};
use relay_tests::free_port;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use tokio::task::JoinHandle;
use tonic::codegen::{Body as _, Service as _, http};
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

type Poll = JoinHandle<Result<tonic::Response<InboxResponse>, Status>>;

fn long_poll(agent: &Agent, wait_s: u32) -> Poll {
    let mut rpc = agent.rpc.clone();
    tokio::spawn(async move { rpc.inbox(InboxRequest { wait_s, ack: false, limit: 0 }).await })
}

/// Lists the services through gRPC reflection with a hand-made request (`list_services: ""`), and
/// returns the response bytes and the grpc-status of its trailers.
async fn reflect(url: &str) -> (Vec<u8>, Option<String>) {
    // One gRPC frame: uncompressed, 2 bytes long, field 7 (list_services) as an empty string.
    let frame = String::from_utf8(vec![0, 0, 0, 0, 2, 0x3a, 0]).unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(frame))
        .unwrap();
    let mut channel = channel(url).await;
    std::future::poll_fn(|cx| channel.poll_ready(cx)).await.unwrap();
    let mut body = channel.call(request).await.expect("reflection answers").into_body();
    let (mut data, mut status) = (Vec::new(), None);
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        match frame.expect("reflection body").into_data() {
            Ok(bytes) => data.extend_from_slice(&bytes),
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    status = trailers.get("grpc-status").map(|v| v.to_str().unwrap().to_owned());
                }
            }
        }
    }
    (data, status)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn long_polls_have_their_own_limit_refused_at_once_while_work_health_and_reflection_go_on() {
    let db = TestDb::new().await;
    let env = [("RELAY_MAX_CONCURRENT_RPCS", "1"), ("RELAY_MAX_WAITING_CALLS", "1")];
    let server = Server::start_with_env(&db, free_port(), &env).await;
    let laptop = server.machine("acme", "laptop");
    let alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &laptop, "bob").await.unwrap();

    // Alice's long poll takes the only waiting place for its whole wait. Until it is in flight bob's
    // probe (a poll that does not wait) may still get through, or rarely take the place first and
    // have alice's refused: then she polls again.
    let wait_s = 8;
    let mut held = long_poll(&alice, wait_s);
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        if held.is_finished() {
            held = long_poll(&alice, wait_s);
        }
        let started = Instant::now();
        match bob.inbox(0, false).await {
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(started.elapsed() < Duration::from_secs(2), "refused at once, took {:?}", started.elapsed());
                break status;
            }
            Err(status) => panic!("unexpected refusal {status:?}"),
            Ok(_) => {}
        }
        assert!(Instant::now() < deadline, "alice's long poll never held the waiting place");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(
        refused.message(),
        "the server is at its limit of 1 waiting calls and refused this one: retry after a short backoff"
    );
    assert_eq!(refused.metadata().get("grpc-retry-pushback-ms").unwrap(), "250");

    // Calls doing work are not held back by calls that wait.
    for _ in 0..3 {
        bob.rpc.who_am_i(WhoAmIRequest {}).await.expect("an ordinary call gets its place while alice waits");
    }

    // Readiness does not count against the limit, nor does reflection.
    let health = HealthClient::new(channel(&server.url).await)
        .check(HealthCheckRequest { service: String::new() })
        .await
        .expect("health answers at the limit")
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);
    let (services, status) = reflect(&server.url).await;
    assert_eq!(status.as_deref(), Some("0"));
    assert!(contains(&services, "relay.v1.Relay"), "reflection lists relay.v1.Relay");

    assert!(!held.is_finished(), "the held long poll was still waiting through all of this");
    let ended = held.await.unwrap().expect("the held long poll ends normally").into_inner();
    assert!(ended.messages.is_empty());
    bob.inbox(0, false).await.expect("the waiting place is free again");
}

#[tokio::test]
async fn a_long_poll_outlives_a_short_rpc_timeout_but_a_stuck_send_is_stopped() {
    let db = TestDb::new().await;
    let server = Server::start_with_env(&db, free_port(), &[("RELAY_RPC_TIMEOUT_S", "1")]).await;
    let laptop = server.machine("acme", "laptop");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &laptop, "bob").await.unwrap();

    // An Inbox that waits three times the ordinary budget answers normally when its wait is over.
    let started = Instant::now();
    let waited = bob.inbox(3, false).await.expect("a long poll is not cut by the rpc timeout");
    assert!(waited.messages.is_empty());
    assert!(started.elapsed() >= Duration::from_secs(3), "it waited its full wait: {:?}", started.elapsed());

    // A send that cannot finish (messages locked against writes by another session) is stopped
    // after the ordinary budget.
    let lock = db.sql().await;
    lock.batch_execute("begin; lock table messages in share mode").await.unwrap();
    let request = SendRequest {
        to: vec!["bob".into()],
        body: "stuck behind a lock".into(),
        client_id: "stuck-1".into(),
        ..Default::default()
    };
    let started = Instant::now();
    let stuck = alice.rpc.send(request.clone()).await.expect_err("the stuck send is stopped");
    assert_eq!(stuck.code(), Code::DeadlineExceeded, "{stuck:?}");
    assert!(
        stuck.message().starts_with("relay.v1.Relay/Send took longer than the server allows (1 s) and was stopped"),
        "{}",
        stuck.message()
    );
    assert!(started.elapsed() < Duration::from_secs(10), "stopped near its budget: {:?}", started.elapsed());
    lock.batch_execute("rollback").await.unwrap();

    // The server goes on; the retry with the same client id delivers exactly one copy.
    alice.rpc.send(request).await.expect("the retry goes through");
    let inbox = bob.inbox(0, true).await.unwrap();
    assert_eq!(inbox.messages.iter().filter(|m| m.body == "stuck behind a lock").count(), 1, "{inbox:?}");
}
