//! Authorization over real processes: who may reach whom across machines and accounts, rules, caps,
//! groups and spawn trees — every allowed outcome and every refusal, and no leak of another
//! account's endpoints or messages.

use std::time::Duration;

use relay_proto::v1::*;
use relay_tests::client::Agent;
use relay_tests::mcp::{Bridge, BridgeSpec, text};
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithinAsync};
use relay_tests::server::{Server, human};
use serde_json::{Value, json};

/// Where the target stands relative to the caller, `acme/laptop/alice`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Relation {
    SameMachine,
    SameAccount,
    Contact,
    NotContact,
    DroppedContact,
    RevokedMachine,
    Ended,
}

struct Target {
    relation: Relation,
    address: &'static str,
    agent: Agent,
    /// The id of a message the target sent alice before its relation changed.
    sent_to_alice: Option<String>,
}

const TARGETS: [(Relation, &str); 7] = [
    (Relation::SameMachine, "acme/laptop/amy"),
    (Relation::SameAccount, "acme/ci/carl"),
    (Relation::Contact, "globex/box/gina"),
    (Relation::NotContact, "initech/box/ivan"),
    (Relation::DroppedContact, "umbrella/box/uma"),
    (Relation::RevokedMachine, "acme/old/olga"),
    (Relation::Ended, "acme/laptop/ed"),
];

/// Whether alice may message the target. An ended session's mail waits for its handle's return.
fn allowed(relation: Relation) -> bool {
    matches!(relation, Relation::SameMachine | Relation::SameAccount | Relation::Contact | Relation::Ended)
}

struct World {
    _db: TestDb,
    server: Server,
    /// The machine token of acme/laptop, where the ended agent comes back.
    laptop: String,
    alice: Bridge,
    targets: Vec<Target>,
}

async fn world() -> World {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let mut tokens = std::collections::HashMap::new();
    for machine in ["acme/laptop", "acme/ci", "acme/old", "globex/box", "initech/box", "umbrella/box"] {
        let (account, name) = machine.split_once('/').unwrap();
        tokens.insert(machine, server.machine(account, name));
    }
    server.admin_ok(&["contact", "add", "acme", "globex"]);
    server.admin_ok(&["contact", "add", "acme", "umbrella"]);

    let mut alice = Bridge::start(BridgeSpec {
        server: &server.url,
        token: &tokens["acme/laptop"],
        handle: Some("alice"),
        channels: false,
    });
    alice.initialize("2025-06-18").await;
    alice.tool_ok("relay_whoami", json!({})).await;

    let mut targets = Vec::new();
    for (relation, address) in TARGETS {
        let (machine, handle) = address.rsplit_once('/').unwrap();
        let mut agent = Agent::hello(&server.url, &tokens[machine], handle).await.unwrap();
        // Everyone who can still write to alice does so before its relation changes.
        let sent_to_alice = if relation == Relation::NotContact {
            None
        } else {
            Some(agent.send(&["acme/laptop/alice"], &format!("hello from {address}")).await.unwrap().id)
        };
        targets.push(Target { relation, address, agent, sent_to_alice });
    }
    server.admin_ok(&["contact", "drop", "acme", "umbrella"]);
    server.admin_ok(&["machine", "revoke", "acme/old"]);
    let ed = targets.iter_mut().find(|t| t.relation == Relation::Ended).unwrap();
    ed.agent.rpc.goodbye(GoodbyeRequest {}).await.unwrap();
    let laptop = tokens["acme/laptop"].clone();
    World { _db: db, server, laptop, alice, targets }
}

fn refused(result: &Value) -> bool {
    result["isError"] == json!(true)
}

#[tokio::test]
async fn every_messaging_tool_against_every_relation() {
    let mut w = world().await;

    // What alice can see: only what she may reach, and nothing of strangers.
    let inbox = w.alice.tool_ok("relay_inbox", json!({})).await;
    let senders: Vec<&str> = inbox["structuredContent"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["from"].as_str().unwrap())
        .collect();
    for (relation, address) in TARGETS {
        let expect = match relation {
            Relation::NotContact => false,
            // Withdrawn when the contact was dropped: never seen.
            Relation::DroppedContact => false,
            // Sent while they could: already stored for alice, so delivered.
            _ => true,
        };
        assert_eq!(senders.contains(&address), expect, "{relation:?}: inbox from {address}: {senders:?}");
    }
    let visible = [
        text(&w.alice.tool_ok("relay_list", json!({ "all": true })).await),
        text(&w.alice.tool_ok("relay_list", json!({ "all": true, "contacts": true })).await),
        text(&w.alice.tool_ok("relay_peers", json!({ "all": true })).await),
    ]
    .join("\n");
    for t in &w.targets {
        let listed = visible.contains(t.address);
        let expect = match t.relation {
            Relation::SameMachine | Relation::SameAccount | Relation::Contact => true,
            // Ended endpoints of one's own account show in relay_list all, marked ended.
            Relation::Ended => true,
            _ => false,
        };
        assert_eq!(listed, expect, "{:?}: {} listed: {visible}", t.relation, t.address);
    }
    assert!(!visible.contains("initech") && !visible.contains("umbrella"), "no stranger's names: {visible}");

    for t in &mut w.targets {
        let ok = allowed(t.relation);
        let what = format!("{:?} {}", t.relation, t.address);

        let sent = w.alice.tool("relay_send", json!({ "to": t.address, "body": "ping" })).await;
        assert_eq!(!refused(&sent), ok, "send to {what}: {}", text(&sent));
        let asked = w.alice.tool("relay_ask", json!({ "to": t.address, "body": "ping?", "wait_s": 0 })).await;
        assert_eq!(!refused(&asked), ok, "ask of {what}: {}", text(&asked));
        if ok {
            let id = asked["structuredContent"]["id"].as_str().unwrap();
            let waited = w.alice.tool("relay_ask_wait", json!({ "id": id, "wait_s": 0 })).await;
            assert!(!refused(&waited), "ask_wait {what}");
            if t.relation == Relation::Ended {
                // The ended agent reads them once its handle is claimed again.
                t.agent = Agent::hello(&w.server.url, &w.laptop, "ed").await.unwrap();
            }
            // The target really got both, from alice as the server knows her.
            let got = t.agent.inbox(5, true).await.unwrap();
            let from: Vec<&str> = got.messages.iter().map(|m| m.from.as_str()).collect();
            assert_eq!(from, ["acme/laptop/alice", "acme/laptop/alice"], "{what}");
        } else {
            let why = text(&sent);
            match t.relation {
                // Strangers, dropped contacts and revoked machines look exactly like addresses that do not exist.
                Relation::NotContact | Relation::DroppedContact | Relation::RevokedMachine => {
                    assert!(why.contains(&format!("no agent you can reach at {}", t.address)), "{what}: {why}");
                    let ghost =
                        w.alice.tool("relay_send", json!({ "to": t.address.replace('/', "/x"), "body": "x" })).await;
                    let ghost_why = text(&ghost).replace(&t.address.replace('/', "/x"), t.address);
                    assert_eq!(why, ghost_why, "the refusal must not tell an existing endpoint from a missing one");
                }
                _ => unreachable!(),
            }
        }

        // Replies go back only where a send could go.
        if let Some(id) = &t.sent_to_alice {
            let reply = w.alice.tool("relay_reply", json!({ "id": id, "body": "got it" })).await;
            assert_eq!(!refused(&reply), ok, "reply to {what}: {}", text(&reply));
        }

        // why explains, and says nothing about endpoints out of reach.
        let why = w.alice.tool("relay_rules", json!({ "action": "why", "to": t.address })).await;
        match t.relation {
            Relation::NotContact | Relation::DroppedContact | Relation::RevokedMachine => {
                assert!(refused(&why) && text(&why).contains("no agent you can reach"), "why {what}: {}", text(&why));
            }
            _ => assert_eq!(why["structuredContent"]["allowed"], json!(true), "why {what}: {}", text(&why)),
        }
    }

    // The revoked machine's own agent is refused on its next call.
    let olga = w.targets.iter_mut().find(|t| t.relation == Relation::RevokedMachine).unwrap();
    assert_eq!(olga.agent.inbox(0, true).await.unwrap_err().code(), tonic::Code::Unauthenticated);
    // The dropped contact's sender sees why its message never arrived.
    let uma = w.targets.iter_mut().find(|t| t.relation == Relation::DroppedContact).unwrap();
    let id = uma.sent_to_alice.clone().unwrap();
    let tracked = uma.agent.rpc.track(TrackRequest { id }).await.unwrap().into_inner();
    assert_eq!(tracked.recipients[0].state(), DeliveryState::Withdrawn);
    assert!(tracked.recipients[0].reason.contains("dropped"), "{:?}", tracked.recipients[0]);
}

#[tokio::test]
async fn rules_refuse_with_the_rule_and_why_explains() {
    let mut w = world().await;
    let set = w.alice.tool_ok("relay_rules", json!({ "action": "set", "in": ["ep:ci/carl", "group:ops"] })).await;
    assert_eq!(set["structuredContent"]["in"], json!(["ep:ci/carl", "group:ops"]));
    assert_eq!(set["structuredContent"]["out"], Value::Null, "out stays open");

    let (mut amy, mut carl) = {
        let mut it = w.targets.drain(..2);
        (it.next().unwrap().agent, it.next().unwrap().agent)
    };
    let refusal = amy.send(&["alice"], "hi").await.unwrap_err();
    assert_eq!(refusal.code(), tonic::Code::PermissionDenied);
    assert!(
        refusal.message().contains("acme/laptop/alice in rule (ep:ci/carl,group:ops) does not admit acme/laptop/amy"),
        "{}",
        refusal.message()
    );
    carl.send(&["laptop/alice"], "hi").await.expect("carl is admitted");

    let why = w.alice.tool_ok("relay_rules", json!({ "action": "why", "from": "amy", "to": "alice" })).await;
    assert_eq!(why["structuredContent"]["allowed"], false);
    assert!(text(&why).starts_with("acme/laptop/amy may not message acme/laptop/alice"), "{}", text(&why));
    let why = w.alice.tool_ok("relay_rules", json!({ "action": "why", "from": "ci/carl", "to": "alice" })).await;
    assert!(text(&why).contains("admits acme/ci/carl by ep:ci/carl"), "{}", text(&why));

    // Presets: none closes, open opens again.
    w.alice.tool_ok("relay_rules", json!({ "action": "set", "scope": "none" })).await;
    assert!(carl.send(&["laptop/alice"], "again").await.is_err());
    let out = w.alice.tool("relay_send", json!({ "to": "ci/carl", "body": "x" })).await;
    assert!(refused(&out) && text(&out).contains("out rule (nobody)"), "{}", text(&out));
    w.alice.tool_ok("relay_rules", json!({ "action": "set", "scope": "open" })).await;
    carl.send(&["laptop/alice"], "open again").await.unwrap();

    // Bad selectors and actions are explained.
    let bad = w.alice.tool("relay_rules", json!({ "action": "set", "in": ["tree:cousins"] })).await;
    assert!(refused(&bad) && text(&bad).contains("invalid selector"), "{}", text(&bad));
    let bad = w.alice.tool("relay_rules", json!({ "action": "shout" })).await;
    assert!(refused(&bad) && text(&bad).contains("action must be one of"), "{}", text(&bad));
    // Nobody changes another agent's rules unless it spawned it.
    let other = w.alice.tool("relay_rules", json!({ "action": "set", "endpoint": "ci/carl", "scope": "none" })).await;
    assert!(refused(&other) && text(&other).contains("not an agent you spawned"), "{}", text(&other));
}

#[tokio::test]
async fn groups_cap_members_and_fan_out() {
    let mut w = world().await;
    let created = w.alice.tool_ok("relay_group", json!({ "action": "create", "name": "ops" })).await;
    assert_eq!(created["structuredContent"]["groups"][0]["members"], json!(["acme/laptop/alice"]));
    w.alice.tool_ok("relay_group", json!({ "action": "add", "name": "ops", "endpoint": "amy" })).await;
    w.alice.tool_ok("relay_group", json!({ "action": "add", "name": "ops", "endpoint": "ci/carl" })).await;
    let foreign =
        w.alice.tool("relay_group", json!({ "action": "add", "name": "ops", "endpoint": "globex/box/gina" })).await;
    assert!(refused(&foreign) && text(&foreign).contains("another account"), "{}", text(&foreign));

    // The group's out rule caps every member: they may message only each other.
    w.alice.tool_ok("relay_group", json!({ "action": "rules", "name": "ops", "out": ["group:self"] })).await;
    let amy = &mut w.targets[0].agent;
    amy.send(&["ci/carl"], "inside").await.expect("members reach members");
    let outside = amy.send(&["globex/box/gina"], "outside").await.unwrap_err();
    assert!(
        outside.message().contains("group:ops on acme/laptop/amy (out cap by group ops: group:self)"),
        "{}",
        outside.message()
    );

    // Sending to the group reaches every member the sender may message.
    let sent = w.alice.tool_ok("relay_send", json!({ "to": "group:ops", "body": "standup" })).await;
    let reached: Vec<&str> = sent["structuredContent"]["recipients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["address"].as_str().unwrap())
        .collect();
    assert_eq!(reached, ["acme/ci/carl", "acme/laptop/amy"]);

    // A member that may not be reached is reported, not silently dropped.
    let carl = &mut w.targets[1].agent;
    carl.rpc
        .set_rules(SetRulesRequest {
            rules_in: Some(Selectors { selectors: vec!["ep:laptop/amy".into()] }),
            ..Default::default()
        })
        .await
        .unwrap();
    let sent = w.alice.tool_ok("relay_send", json!({ "to": "group:ops", "body": "standup 2" })).await;
    assert_eq!(sent["structuredContent"]["recipients"][0]["address"], "acme/laptop/amy", "{sent}");
    assert_eq!(sent["structuredContent"]["skipped"][0]["address"], "acme/ci/carl", "{sent}");
    assert!(text(&sent).contains("Not sent to these group members"), "{}", text(&sent));
    let next = sent["structuredContent"]["next"].as_array().unwrap();
    assert!(next.iter().any(|n| n.as_str().unwrap().starts_with("Not sent to these group members")), "{sent}");

    let ls = w.alice.tool_ok("relay_group", json!({ "action": "ls" })).await;
    assert!(text(&ls).contains("ops  owner acme/laptop/alice  3 members"), "{}", text(&ls));
    let not_owner = carl
        .rpc
        .group(GroupRequest { action: GroupAction::Drop as i32, name: "ops".into(), ..Default::default() })
        .await;
    assert_eq!(not_owner.unwrap_err().code(), tonic::Code::PermissionDenied);
    w.alice.tool_ok("relay_group", json!({ "action": "drop", "name": "ops" })).await;
    w.targets[0].agent.send(&["globex/box/gina"], "free again").await.expect("the group's cap left with it");
}

#[tokio::test]
async fn contacts_are_made_and_dropped_by_the_accounts_humans() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let acme_box = server.machine("acme", "box");
    let globex_box = server.machine("globex", "box");
    let acme_human = server.admin_ok(&["human", "add", "acme"]);
    let globex_human = server.admin_ok(&["human", "add", "globex"]);
    assert!(acme_human.starts_with("rlh_"));
    let mut alice = Agent::hello(&server.url, &acme_box, "alice").await.unwrap();
    let mut gina = Agent::hello(&server.url, &globex_box, "gina").await.unwrap();

    let (ok, out) = human(&server.url, &acme_human, &["contact", "request", "globex"]).await;
    assert!(ok && out.contains("asked globex for a contact"), "{out}");
    assert_eq!(alice.send(&["globex/box/gina"], "too early").await.unwrap_err().code(), tonic::Code::NotFound);
    let (ok, out) = human(&server.url, &globex_human, &["contact", "list"]).await;
    assert!(ok && out.contains("acme\tpending"), "{out}");
    let (ok, out) = human(&server.url, &globex_human, &["contact", "accept", "acme"]).await;
    assert!(ok && out.contains("contact with acme made"), "{out}");

    alice.send(&["globex/box/gina"], "now we can talk").await.unwrap();
    assert_eq!(gina.inbox(5, true).await.unwrap().messages[0].body, "now we can talk");
    let queued = alice.send(&["globex/box/gina"], "queued, never read").await.unwrap();

    let (ok, out) = human(&server.url, &globex_human, &["contact", "drop", "acme"]).await;
    assert!(
        ok && out.contains("contact with acme dropped") && out.contains("1 undelivered messages were withdrawn"),
        "{out}"
    );
    assert!(gina.inbox(0, true).await.unwrap().messages.is_empty(), "a withdrawn message is not delivered");
    let tracked = alice.rpc.track(TrackRequest { id: queued.id }).await.unwrap().into_inner();
    assert_eq!(tracked.recipients[0].state(), DeliveryState::Withdrawn);
    assert_eq!(alice.send(&["globex/box/gina"], "after").await.unwrap_err().code(), tonic::Code::NotFound);

    let (ok, out) = human(&server.url, "rlh_nonsense", &["contact", "list"]).await;
    assert!(!ok && out.contains("malformed human token"), "{out}");
    let (ok, out) = human(&server.url, &acme_human, &["contact", "accept", "initech"]).await;
    assert!(!ok && out.contains("no account initech"), "{out}");
}

/// A stand-in worker: its own bridge claims the child endpoint, messages its parent, tries a
/// peer its cap forbids, and prints what it saw; the supervisor reports that output.
const WORKER: &str = r#"
printf '%s\n' \
 '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"worker","version":"1"}}}' \
 '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"relay_inbox","arguments":{"wait_s":10}}}' \
 '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"relay_send","arguments":{"to":"alice","body":"worker reporting in"}}}' \
 '{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"relay_send","arguments":{"to":"ci/carl","body":"sneaking out"}}}' \
 '{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"relay_rules","arguments":{"action":"set","scope":"open"}}}' \
 | "$BRIDGE" mcp --harness other
echo worker-done
"#;

#[tokio::test]
async fn spawned_workers_are_children_bound_by_their_parents_caps() {
    let w = world().await;
    let session_file = w.alice.home().join("alice-session.toml");
    // Alice's bridge was started without a session file location; start a second alice-like agent
    // on the same machine whose bridge leaves one where spawn can find it.
    let laptop = w.server.machine("acme", "laptop2");
    let spec = BridgeSpec { server: &w.server.url, token: &laptop, handle: Some("alice"), channels: false };
    let mut parent = Bridge::start_with_env(spec, &[("RELAY_SESSION_FILE", session_file.as_os_str())]);
    parent.initialize("2025-06-18").await;
    parent.tool_ok("relay_whoami", json!({})).await;

    let bridge = relay_tests::bin("agent-bridge");
    let out = tokio::process::Command::new(&bridge)
        .args(["spawn", "--scope", "parent", "--", "sh", "-c", WORKER])
        .env("BRIDGE", &bridge)
        .env("RELAY_SESSION_FILE", &session_file)
        .env("RELAY_SERVER", &w.server.url)
        .env("RELAY_TOKEN", &laptop)
        .env("RELAY_CONFIG", "/nonexistent/bridge.toml")
        .output_within(COMMAND_LIMIT)
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("spawned acme/laptop2/alice-1"), "spawn returns at once with the worker's name: {said}");

    // The parent's instruction is waiting for the worker, marked as from its parent.
    parent.tool_ok("relay_send", json!({ "to": "alice-1", "body": "your task: report in" })).await;

    // The worker's message and then its final report arrive, marked as from a child.
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "worker messages did not arrive: {seen:?}");
        let inbox = parent.tool_ok("relay_inbox", json!({ "wait_s": 5 })).await;
        seen.extend(inbox["structuredContent"]["messages"].as_array().unwrap().iter().cloned());
    }
    assert_eq!(seen[0]["from"], "acme/laptop2/alice-1");
    assert_eq!(seen[0]["relation"], "child");
    assert_eq!(seen[0]["body"], "worker reporting in");
    let report = seen[1]["body"].as_str().unwrap();
    assert!(report.starts_with("worker acme/laptop2/alice-1 finished with exit code 0"), "{report}");
    assert!(report.contains("worker-done"), "{report}");
    // Inside the worker: its inbox held the parent's task marked as from the parent; its cap refused
    // the peer even after it opened its own rules.
    assert!(report.contains(r#"relation=\"parent\""#) || report.contains(r#"\"relation\":\"parent\""#), "{report}");
    assert!(report.contains("does not admit acme/ci/carl"), "{report}");

    let rules = parent.tool_ok("relay_rules", json!({ "action": "show", "endpoint": "alice-1" })).await;
    let caps = rules["structuredContent"]["caps"].as_array().unwrap();
    assert_eq!(caps.len(), 2, "{rules}");
    assert!(caps.iter().all(|c| c["by"] == "acme/laptop2/alice" && c["selectors"] == json!(["tree:parent"])));
    let id = caps[0]["id"].as_str().unwrap();
    let widened =
        parent.tool_ok("relay_rules", json!({ "action": "widen", "endpoint": "alice-1", "out": ["ep:ci/carl"] })).await;
    let out_cap =
        widened["structuredContent"]["caps"].as_array().unwrap().iter().find(|c| c["dir"] == "out").unwrap().clone();
    assert_eq!(out_cap["selectors"], json!(["ep:ci/carl", "tree:parent"]), "{widened}");
    let why = parent.tool_ok("relay_rules", json!({ "action": "why", "from": "alice-1", "to": "ci/carl" })).await;
    assert!(text(&why).contains("acme/laptop2/alice-1 may message acme/ci/carl"), "widened: {}", text(&why));
    let back = parent.tool_ok("relay_rules", json!({ "action": "why", "from": "ci/carl", "to": "alice-1" })).await;
    assert!(text(&back).contains("may not message"), "the in cap still binds: {}", text(&back));
    let lifted = parent.tool_ok("relay_rules", json!({ "action": "lift", "endpoint": "alice-1", "cap": id })).await;
    assert_eq!(lifted["structuredContent"]["caps"].as_array().unwrap().len(), 1);
    let bogus =
        parent.tool("relay_rules", json!({ "action": "lift", "endpoint": "alice-1", "cap": "cap-999999" })).await;
    assert!(refused(&bogus) && text(&bogus).contains("no cap cap-999999"), "{}", text(&bogus));
}
