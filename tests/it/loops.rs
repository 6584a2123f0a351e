//! The loop guard, with two scripted agents answering each other for ever through real bridges:
//! held within the default bound, both agents and the operator told once, a person's release lets
//! them go on, an account's own bounds, and bad bounds refused.

use std::time::{Duration, Instant};

use relay_proto::v1::{HelloRequest, SpawnRequest, SpawnResultRequest};
use relay_tests::client::{Agent, channel, client};
use relay_tests::mcp::{Bridge, bridge, text};
use relay_tests::pg::TestDb;
use relay_tests::server::{Server, human};
use serde_json::{Value, json};

/// An agent whose handle is claimed (its bridge has said Hello) by the time it is returned.
async fn agent(server: &Server, token: &str, handle: &str) -> Bridge {
    let mut agent = bridge(&server.url, token, handle);
    agent.initialize("2025-06-18").await;
    agent.tool_ok("relay_whoami", json!({})).await;
    agent
}

/// The unread messages of `agent`, marked read, waiting up to `wait_s` for the first.
async fn inbox(agent: &mut Bridge, wait_s: u32) -> Vec<Value> {
    let read = agent.tool_ok("relay_inbox", json!({ "wait_s": wait_s })).await;
    read["structuredContent"]["messages"].as_array().cloned().unwrap_or_default()
}

/// `from` reads its newest message and answers it; the answer's result.
async fn answer(from: &mut Bridge, n: usize) -> Value {
    let got = inbox(from, 10).await;
    assert!(!got.is_empty(), "message {n} arrived");
    from.tool_ok("relay_reply", json!({ "id": "last", "body": format!("answer {n}") })).await
}

fn held(result: &Value) -> bool {
    result["structuredContent"]["hold"].as_str().is_some_and(|h| !h.is_empty())
}

fn loop_notices(messages: &[Value]) -> Vec<String> {
    messages.iter().filter_map(|m| m["body"].as_str()).filter(|b| b.contains("loop guard")).map(str::to_owned).collect()
}

#[tokio::test]
async fn two_agents_answering_each_other_for_ever_are_held_within_a_minute_and_a_person_lets_them_go_on() {
    let db = TestDb::new().await;
    let ops = format!("127.0.0.1:{}", relay_tests::free_port());
    let server = Server::start_with_env(&db, relay_tests::free_port(), &[("RELAY_OPS_LISTEN", &ops)]).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    server.admin_ok(&["operator", "acme", "laptop/op"]);
    let person = server.admin_ok(&["human", "add", "acme"]).trim().to_owned();
    let mut op = agent(&server, &laptop, "op").await;
    let mut ann = agent(&server, &laptop, "ann").await;
    let mut bob = agent(&server, &ci, "bob").await;

    let started = Instant::now();
    ann.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "ping" })).await;
    let mut sent = 1;
    let last = loop {
        let result = if sent % 2 == 1 { answer(&mut bob, sent).await } else { answer(&mut ann, sent).await };
        sent += 1;
        if held(&result) {
            break result;
        }
        assert!(sent <= 40, "no message was held after {sent}");
    };
    // The default bound: 30 messages between them within a minute; the 31st is held.
    assert_eq!(sent, 31, "{}", text(&last));
    assert!(started.elapsed() < Duration::from_secs(60), "held after {:?}", started.elapsed());
    assert!(text(&last).contains("held"), "{}", text(&last));

    // Both agents are told why, and so is the operator: once.
    let (to_ann, to_bob, to_op) = (inbox(&mut ann, 5).await, inbox(&mut bob, 5).await, inbox(&mut op, 5).await);
    for (who, got) in [("ann", &to_ann), ("bob", &to_bob)] {
        let told = loop_notices(got);
        assert_eq!(told.len(), 1, "{who}: {got:?}");
        assert!(
            told[0].contains("30 turns answering each other within 60 s") && told[0].contains("no person"),
            "{}",
            told[0]
        );
    }
    let told = loop_notices(&to_op);
    assert_eq!(told.len(), 1, "{to_op:?}");
    assert!(told[0].contains("acme/laptop/ann") && told[0].contains("acme/ci/bob") && told[0].contains("Release"));

    // Whoever goes on is held too, and nobody is told again.
    let again = ann.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "are you there?" })).await;
    assert!(held(&again), "{}", text(&again));
    assert!(loop_notices(&inbox(&mut op, 0).await).is_empty());
    assert!(inbox(&mut bob, 0).await.is_empty(), "nothing held reaches bob");

    // The person releases one: it is delivered, and the count starts over.
    let hold = again["structuredContent"]["hold"].as_str().unwrap().to_owned();
    let (ok, said) = human(&server.url, &person, &["release", &hold]).await;
    assert!(ok, "{said}");
    let got = inbox(&mut bob, 10).await;
    assert!(got.iter().any(|m| m["body"] == "are you there?"), "{got:?}");
    let on = bob.tool_ok("relay_reply", json!({ "id": "last", "body": "yes" })).await;
    assert!(!held(&on), "{}", text(&on));

    let (_, metrics) = relay_tests::http::get(&ops, "/metrics").await.expect("the ops port answers");
    assert_eq!(relay_tests::http::sample(&metrics, "relay_loop_guard_holds_total"), Some(2.0), "{metrics}");
}

#[tokio::test]
async fn an_accounts_own_bounds_hold_a_deep_exchange_and_bad_bounds_change_nothing() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    for bad in [["--messages", "1"], ["--window-s", "5"], ["--depth", "100000"]] {
        let out = server.admin(&[&["loop-guard", "acme"], &bad[..]].concat());
        assert!(!out.status.success(), "{bad:?} was taken");
        assert!(String::from_utf8_lossy(&out.stderr).contains("out of range"), "{out:?}");
    }
    let out = server.admin(&["loop-guard", "nobody"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no account"), "{out:?}");
    server.admin_ok(&["loop-guard", "acme", "--messages", "100", "--depth", "4"]);
    let mut ann = agent(&server, &laptop, "ann").await;
    let mut bob = agent(&server, &ci, "bob").await;

    // Four messages in one thread, then the fifth is held.
    ann.tool_ok("relay_send", json!({ "to": "ci/bob", "body": "ping" })).await;
    for n in 1..4 {
        let result = if n % 2 == 1 { answer(&mut bob, n).await } else { answer(&mut ann, n).await };
        assert!(!held(&result), "message {} was held: {}", n + 1, text(&result));
    }
    let fifth = answer(&mut ann, 4).await;
    assert!(held(&fifth), "{}", text(&fifth));
    let told = loop_notices(&inbox(&mut bob, 5).await);
    assert!(told.len() == 1 && told[0].contains("4 turns answering each other in one thread"), "{told:?}");
    // One agent writing to another however often, in one thread, is no loop.
    let mut carl = agent(&server, &ci, "carl").await;
    let first = ann.tool_ok("relay_send", json!({ "to": "ci/carl", "body": "report 0" })).await;
    let thread = first["structuredContent"]["thread"].as_str().unwrap().to_owned();
    for n in 1..12 {
        let report = json!({ "to": "ci/carl", "body": format!("report {n}"), "thread": thread });
        let sent = ann.tool_ok("relay_send", report).await;
        assert!(!held(&sent), "report {n} was held: {}", text(&sent));
    }
    assert_eq!(inbox(&mut carl, 5).await.len(), 12);

    // A person writing to either is never weighed: it arrives while the pair is held.
    let person = server.admin_ok(&["human", "add", "acme"]).trim().to_owned();
    let (ok, said) = human(&server.url, &person, &["send", "laptop/ann", "take a break"]).await;
    assert!(ok, "{said}");
    assert!(inbox(&mut ann, 10).await.iter().any(|m| m["body"] == "take a break"));
}

/// Sends `body` from `from` to `to` as a fresh message, a thread of its own; its result.
async fn fresh(from: &mut Bridge, to: &str, body: &str) -> Value {
    from.tool_ok("relay_send", json!({ "to": to, "body": body })).await
}

#[tokio::test]
async fn agents_writing_each_other_afresh_are_held_as_answers_are_and_a_person_in_between_starts_the_count_over() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    server.admin_ok(&["loop-guard", "acme", "--messages", "6"]);
    let person = server.admin_ok(&["human", "add", "acme"]).trim().to_owned();
    let mut ann = agent(&server, &laptop, "ann").await;
    let mut bob = agent(&server, &ci, "bob").await;

    // Each message a thread of its own: six turns go, the seventh is held.
    for n in 1..=6 {
        let sent = if n % 2 == 1 {
            fresh(&mut ann, "ci/bob", &format!("ping {n}")).await
        } else {
            fresh(&mut bob, "laptop/ann", &format!("pong {n}")).await
        };
        assert!(!held(&sent), "message {n} was held: {}", text(&sent));
    }
    let seventh = fresh(&mut ann, "ci/bob", "ping 7").await;
    assert!(held(&seventh), "{}", text(&seventh));
    let told = loop_notices(&inbox(&mut bob, 5).await);
    assert!(told.len() == 1 && told[0].contains("6 turns answering each other within 60 s"), "{told:?}");
    let again = fresh(&mut bob, "laptop/ann", "still there?").await;
    assert!(held(&again), "the stopped pair's fresh sends wait too: {}", text(&again));
    let hold = again["structuredContent"]["hold"].as_str().unwrap().to_owned();
    let (ok, said) = human(&server.url, &person, &["release", &hold]).await;
    assert!(ok, "{said}");
    assert!(!held(&fresh(&mut ann, "ci/bob", "back to work").await), "released: the count starts over");

    // A person writing to either of a pair in between starts their count over: written to the one
    // who answers next, it starts over one turn late (the answer to that answer goes to one whose
    // last message came from the person), never early; written to the other, the seventh turn after
    // is held.
    let first_held = |x, y, to_person| first_held_around_a_person(&server, (&laptop, x), (&ci, y), &person, to_person);
    assert_eq!(first_held("carl", "dan", "ci/dan").await, 13);
    assert_eq!(first_held("fay", "gus", "laptop/fay").await, 12);

    // One agent writing to another however often is no loop.
    let mut eve = agent(&server, &ci, "eve").await;
    for n in 0..12 {
        assert!(!held(&fresh(&mut ann, "ci/eve", &format!("report {n}")).await), "report {n}");
    }
    assert_eq!(inbox(&mut eve, 5).await.len(), 12);
}

/// Two new agents, `x` and `y` (each on its machine, by its token), write each other afresh, `x`
/// first: five turns, then the account's person writes to `to_person`, then the turns go on. The
/// number of the first turn held (none of the first five may be).
async fn first_held_around_a_person(
    server: &Server,
    x: (&str, &str),
    y: (&str, &str),
    person: &str,
    to_person: &str,
) -> usize {
    let (mut a, mut b) = (agent(server, x.0, x.1).await, agent(server, y.0, y.1).await);
    let (to_a, to_b) = (format!("laptop/{}", x.1), format!("ci/{}", y.1));
    for n in 1..=20 {
        if n == 6 {
            let (ok, said) = human(&server.url, person, &["send", to_person, "how is it going?"]).await;
            assert!(ok, "{said}");
        }
        let sent = if n % 2 == 1 {
            fresh(&mut a, &to_b, &format!("ping {n}")).await
        } else {
            fresh(&mut b, &to_a, &format!("pong {n}")).await
        };
        if held(&sent) {
            assert!(n > 5, "turn {n} was held before the person spoke");
            return n;
        }
    }
    panic!("nothing was held in twenty turns");
}

/// A worker's report to the agent that spawned it is written by the system on the worker's behalf;
/// when the two have answered each other past the bound, the guard holds it for a person like any
/// other message, and it is not lost.
#[tokio::test]
async fn a_workers_report_the_loop_guard_stops_is_held_for_a_person_not_lost() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let ci = server.machine("acme", "ci");
    server.admin_ok(&["loop-guard", "acme", "--messages", "3"]);
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();
    let grant = bob.rpc.spawn(SpawnRequest { harness: "claude".into(), scope: String::new() }).await.unwrap();
    let grant = grant.into_inner().grant;
    let spawned = HelloRequest { harness: "claude".into(), spawn_grant: grant.clone(), ..Default::default() };
    let mut worker = Agent::hello_with(&server.url, &ci, spawned).await.unwrap();
    bob.send(&[worker.address.as_str()], "build it").await.unwrap();
    worker.send(&[bob.address.as_str()], "building").await.unwrap();
    bob.send(&[worker.address.as_str()], "tell me when it is done").await.unwrap();

    // The report would be the fourth turn between them: held, not refused.
    let report = SpawnResultRequest { exit_code: 0, output: "built".into() };
    let sent = client(channel(&server.url).await, &grant).spawn_result(report).await.unwrap().into_inner();
    assert!(!sent.hold.is_empty(), "{sent:?}");
    let person = server.admin_ok(&["human", "add", "acme"]).trim().to_owned();
    let (ok, said) = human(&server.url, &person, &["release", &sent.hold]).await;
    assert!(ok, "{said}");
    let got = bob.inbox(10, true).await.unwrap().messages;
    assert!(got.iter().any(|m| m.body.contains("built")), "the released report reaches bob: {got:?}");
}
