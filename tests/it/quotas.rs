//! Quotas that keep one agent or account from degrading the others: send rates per endpoint and
//! per account, and caps on the endpoints and groups an account holds. Refusals say when to retry.

use std::time::Duration;

use relay_proto::v1::*;
use relay_tests::client::Agent;
use relay_tests::mcp::{Bridge, BridgeSpec, text};
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use relay_tests::{eventually, free_port};
use serde_json::json;
use tonic::Code;

async fn server_with(env: &[(&str, &str)]) -> Server {
    Server::start_with_env(&TestDb::new().await, free_port(), env).await
}

fn pushback_ms(status: &tonic::Status) -> u64 {
    let value = status.metadata().get("grpc-retry-pushback-ms").expect("a refusal says when to retry");
    value.to_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn an_endpoint_past_its_send_rate_is_told_when_to_retry_and_others_send_on() {
    // A token every 4 s: the burst and the send past it are well inside one token's time even on
    // a slow machine, and the wait told is below the bridge's own 5 s for a refusal without one.
    let server = server_with(&[
        ("RELAY_SEND_RATE_PER_ENDPOINT", "0.25"),
        ("RELAY_SEND_BURST_PER_ENDPOINT", "3"),
        ("RELAY_SEND_RATE_PER_ACCOUNT", "0"),
    ])
    .await;
    let laptop = server.machine("acme", "laptop");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut carol = Agent::hello(&server.url, &laptop, "carol").await.unwrap();
    let mut bob = Agent::hello(&server.url, &laptop, "bob").await.unwrap();
    for i in 0..3 {
        alice.send(&["laptop/bob"], &format!("burst {i}")).await.unwrap();
    }
    let refused = alice.send(&["laptop/bob"], "one too many").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("acme/laptop/alice sends faster than"), "{}", refused.message());
    assert!(refused.message().contains("nothing was sent; try again in"), "{}", refused.message());
    let wait = pushback_ms(&refused);
    assert!((1..=4000).contains(&wait), "a token comes back within 4 s at 0.25/s: {wait} ms");

    // Another agent of the same account is not held back.
    carol.send(&["laptop/bob"], "from carol").await.unwrap();
    let bodies: Vec<String> = bob.inbox(0, true).await.unwrap().messages.into_iter().map(|m| m.body).collect();
    assert_eq!(bodies, ["burst 0", "burst 1", "burst 2", "from carol"], "the refused send stored nothing");

    // Through the bridge, the tool error says the same and when to try again.
    let spec = BridgeSpec { server: &server.url, token: &laptop, handle: Some("dave"), channels: false };
    let mut dave = Bridge::start(spec);
    dave.initialize("2025-06-18").await;
    // Its burst is three; a fourth send within 4 s is refused (a few more allow for a slow machine).
    let mut busy = None;
    for _ in 0..8 {
        let result = dave.tool("relay_send", json!({ "to": ["laptop/bob"], "body": "from dave" })).await;
        if result["isError"] == json!(true) {
            busy = Some(result);
            break;
        }
    }
    let busy = busy.expect("the bridge is refused past its burst");
    let said = text(&busy);
    assert!(said.contains("sends faster than"), "{said}");
    // The bridge's own word, last, in whole seconds: the server's wait rounded up.
    let seconds = said.rsplit("try again in ").next().and_then(|rest| rest.strip_suffix(" s")).map(str::parse::<u64>);
    assert!(matches!(seconds, Some(Ok(1..=4))), "the tool error says when to try again: {said}");

    // Once the wait has passed, the endpoint sends again.
    eventually(Duration::from_secs(10), "alice to be allowed again", || {
        let mut rpc = alice.rpc.clone();
        async move {
            let request = SendRequest { to: vec!["laptop/bob".into()], body: "later".into(), ..Default::default() };
            rpc.send(request).await.ok()
        }
    })
    .await;
}

#[tokio::test]
async fn an_account_past_its_send_rate_is_refused_while_another_account_is_not() {
    let server = server_with(&[
        ("RELAY_SEND_RATE_PER_ENDPOINT", "0"),
        ("RELAY_SEND_RATE_PER_ACCOUNT", "0.5"),
        ("RELAY_SEND_BURST_PER_ACCOUNT", "2"),
    ])
    .await;
    let laptop = server.machine("acme", "laptop");
    let other = server.machine("globex", "box");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut carol = Agent::hello(&server.url, &laptop, "carol").await.unwrap();
    let mut gina = Agent::hello(&server.url, &other, "gina").await.unwrap();
    let _henry = Agent::hello(&server.url, &other, "henry").await.unwrap();
    alice.send(&["laptop/carol"], "one").await.unwrap();
    carol.send(&["laptop/alice"], "two").await.unwrap();
    let refused = alice.send(&["laptop/carol"], "three").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().starts_with("account acme sends faster than"), "{}", refused.message());
    assert!(pushback_ms(&refused) > 0);
    // globex has its own burst, untouched by what acme spent.
    for i in 0..2 {
        gina.send(&["box/henry"], &format!("globex {i}")).await.expect("another account is unaffected");
    }
}

#[tokio::test]
async fn an_account_holds_at_most_its_endpoints_and_groups() {
    let server = server_with(&[("RELAY_MAX_ENDPOINTS", "2"), ("RELAY_MAX_GROUPS", "1")]).await;
    let laptop = server.machine("acme", "laptop");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let _bob = Agent::hello(&server.url, &laptop, "bob").await.unwrap();
    for handle in ["carol", ""] {
        let refused = Agent::hello(&server.url, &laptop, handle).await.err().expect("a third endpoint is refused");
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert!(refused.message().contains("account acme holds 2 endpoints"), "{}", refused.message());
    }
    // An existing handle is claimed again at the cap: a restarted agent gets its inbox back.
    alice.rpc.goodbye(GoodbyeRequest {}).await.unwrap();
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.expect("a known handle is not a new endpoint");
    let refused = alice.rpc.spawn(SpawnRequest { harness: "claude".into(), ..Default::default() }).await;
    assert_eq!(refused.map(|_| ()).unwrap_err().code(), Code::ResourceExhausted, "a spawned worker is an endpoint too");

    let group =
        |name: &str| GroupRequest { action: GroupAction::Create as i32, name: name.into(), ..Default::default() };
    alice.rpc.group(group("ops")).await.unwrap();
    let refused = alice.rpc.group(group("dev")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("account acme holds 1 groups"), "{}", refused.message());
}

#[tokio::test]
async fn an_account_past_its_delivery_rate_waits_whatever_its_message_count() {
    let server = server_with(&[
        ("RELAY_SEND_RATE_PER_ENDPOINT", "0"),
        ("RELAY_SEND_RATE_PER_ACCOUNT", "0"),
        ("RELAY_DELIVERY_RATE_PER_ACCOUNT", "1"),
        ("RELAY_DELIVERY_BURST_PER_ACCOUNT", "3"),
    ])
    .await;
    let laptop = server.machine("acme", "laptop");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut readers = Vec::new();
    for handle in ["b1", "b2", "b3", "b4"] {
        readers.push(Agent::hello(&server.url, &laptop, handle).await.unwrap());
    }
    // One message to four makes four deliveries: past the burst of three, so the next send waits.
    alice.send(&["laptop/b1", "laptop/b2", "laptop/b3", "laptop/b4"], "to all").await.unwrap();
    let refused = alice.send(&["laptop/b1"], "one more").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().starts_with("account acme delivers more than the 1 messages"), "{}", refused.message());
    let wait = pushback_ms(&refused);
    assert!((1000..=2000).contains(&wait), "one delivery in debt and one more needed at 1/s: {wait} ms");
    for reader in &mut readers {
        assert_eq!(reader.inbox(0, true).await.unwrap().messages.len(), 1, "the refused send stored nothing");
    }
}
