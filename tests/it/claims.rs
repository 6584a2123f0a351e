//! Path claims across machines, through the real bridges and server: clones of one repository on
//! two machines meet in one claim space; a claim in the way is reported with its holder, who hears
//! of it; reach, the end of a session, a replica's death and bad input.

use std::path::Path;
use std::time::Duration;

use relay_tests::mcp::{Bridge, BridgeSpec, text};
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithinAsync};
use relay_tests::server::{Server, TwoMachines};
use serde_json::{Value, json};

/// A clone of `remote` (made with `git init`, only its remote set) in a fresh directory.
fn clone_of(remote: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git").arg("-C").arg(dir.path()).args(args).status().unwrap().success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q"]);
    if let Some(remote) = remote {
        git(&["remote", "add", "origin", remote]);
    }
    std::fs::create_dir_all(dir.path().join("src/auth")).unwrap();
    dir
}

async fn agent_in(server: &str, token: &str, handle: &str, dir: &Path) -> Bridge {
    let mut bridge = Bridge::start_in(BridgeSpec { server, token, handle: Some(handle), channels: false }, dir);
    bridge.initialize("2025-06-18").await;
    bridge
}

fn claim_args(paths: Value, reason: &str) -> Value {
    json!({ "paths": paths, "reason": reason })
}

/// The structured part of a result.
fn data(result: &Value) -> &Value {
    &result["structuredContent"]
}

async fn claim(agent: &mut Bridge, paths: Value, reason: &str) -> Value {
    agent.tool_ok("relay_claim", claim_args(paths, reason)).await
}

/// The one unread message `agent` has, waiting for it.
async fn one_message(agent: &mut Bridge) -> Value {
    let inbox = agent.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    let messages = data(&inbox)["messages"].as_array().unwrap().clone();
    assert_eq!(messages.len(), 1, "{}", text(&inbox));
    messages[0].clone()
}

async fn nothing_unread(agent: &mut Bridge) {
    let inbox = agent.tool_ok("relay_inbox", json!({})).await;
    assert_eq!(data(&inbox)["messages"], json!([]), "{}", text(&inbox));
}

#[tokio::test]
async fn an_agent_on_another_machine_is_told_who_holds_the_paths_and_the_holder_hears_of_it() {
    let w = TwoMachines::start().await;
    // One repository, cloned over https on one machine and over ssh on the other.
    let laptop_clone = clone_of(Some("https://github.com/Acme/API.git"));
    let ci_clone = clone_of(Some("git@github.com:acme/api.git"));
    let mut ann = agent_in(&w.server.url, &w.laptop, "ann", laptop_clone.path()).await;
    let mut bob = agent_in(&w.server.url, &w.ci, "bob", ci_clone.path()).await;

    let granted = claim(&mut ann, json!(["src/auth/**"]), "refactoring login").await;
    let mine = &data(&granted)["claim"];
    assert_eq!(data(&granted)["granted"], true, "{}", text(&granted));
    assert_eq!(mine["repo"], "github.com/acme/api", "both clones are one repository");
    assert_eq!(mine["paths"], json!(["src/auth"]));
    assert_eq!(mine["exclusive"], true, "exclusive unless said otherwise");
    let id = mine["id"].as_str().unwrap().to_owned();
    assert!(text(&granted).starts_with(&format!("granted {id}")), "{}", text(&granted));

    let refused = claim(&mut bob, json!("src/auth/login.rs"), "fixing the session bug").await;
    assert_eq!(data(&refused)["granted"], false, "{}", text(&refused));
    let conflict = &data(&refused)["conflicts"][0];
    assert_eq!(conflict["holder"], "acme/laptop/ann");
    assert_eq!(conflict["id"], id.as_str());
    assert_eq!(conflict["reason"], "refactoring login");
    assert!(conflict["since"].as_str().unwrap().ends_with('Z') && conflict["until"].as_str().unwrap().ends_with('Z'));
    let said = text(&refused);
    assert!(
        said.contains("NOT granted") && said.contains("acme/laptop/ann") && said.contains("refactoring login"),
        "{said}"
    );
    assert!(data(&refused)["untrusted"].is_string(), "the holder's reason is framed as another agent's text");

    // The holder hears who ran into the claim, and with what.
    let told = one_message(&mut ann).await;
    let body = told["body"].as_str().unwrap();
    assert!(body.contains("acme/ci/bob") && body.contains("src/auth/login.rs") && body.contains(&id), "{body}");
    // Once in a while per claimant: asking again does not fill the holder's inbox.
    claim(&mut bob, json!("src/auth/login.rs"), "fixing the session bug").await;
    nothing_unread(&mut ann).await;

    // Other paths, and shared claims side by side.
    let web = claim(&mut bob, json!(["src/web"]), "new page").await;
    assert_eq!(data(&web)["granted"], true);
    let shared = json!({ "paths": ["docs"], "reason": "notes", "exclusive": false });
    assert_eq!(data(&ann.tool_ok("relay_claim", shared.clone()).await)["granted"], true);
    assert_eq!(data(&bob.tool_ok("relay_claim", shared).await)["granted"], true, "shared claims do not collide");

    // Claiming the same paths again renews the claim.
    let again =
        ann.tool_ok("relay_claim", json!({ "paths": ["src/auth/"], "reason": "still at it", "ttl_s": 7200 })).await;
    assert_eq!(data(&again)["claim"]["id"], id.as_str(), "{}", text(&again));
    assert!(text(&again).starts_with("renewed"), "{}", text(&again));

    let all = ann.tool_ok("relay_claims", json!({})).await;
    assert_eq!(data(&all)["claims"].as_array().unwrap().len(), 4, "{}", text(&all));
    let mine = ann.tool_ok("relay_claims", json!({ "mine": true })).await;
    let holders: Vec<&str> =
        data(&mine)["claims"].as_array().unwrap().iter().map(|c| c["holder"].as_str().unwrap()).collect();
    assert_eq!(holders, ["acme/laptop/ann", "acme/laptop/ann"]);
    let by_url = bob.tool_ok("relay_claims", json!({ "repo": "https://github.com/acme/api" })).await;
    assert_eq!(data(&by_url)["claims"].as_array().unwrap().len(), 4, "a remote URL names the same repository");

    // Released, the paths are free.
    let released = ann.tool_ok("relay_release", json!({ "claim": id })).await;
    assert_eq!(data(&released)["claims"][0]["id"], id.as_str());
    let now = claim(&mut bob, json!("src/auth/login.rs"), "fixing the session bug").await;
    assert_eq!(data(&now)["granted"], true, "{}", text(&now));
    // Releasing some paths of a claim keeps the rest.
    let two = claim(&mut ann, json!(["lib/a", "lib/b"]), "two libraries").await;
    let two_id = data(&two)["claim"]["id"].as_str().unwrap().to_owned();
    ann.tool_ok("relay_release", json!({ "paths": ["lib/a"] })).await;
    let left = ann.tool_ok("relay_claims", json!({ "mine": true })).await;
    let kept = data(&left)["claims"].as_array().unwrap().iter().find(|c| c["id"] == two_id.as_str()).cloned();
    assert_eq!(kept.map(|c| c["paths"].clone()), Some(json!(["lib/b"])), "{}", text(&left));
    // Without arguments, all of the caller's claims end.
    let rest = ann.tool_ok("relay_release", json!({})).await;
    assert_eq!(data(&rest)["claims"].as_array().unwrap().len(), 2, "{}", text(&rest));
    let none = ann.tool_ok("relay_release", json!({})).await;
    assert_eq!(text(&none), "you held no claim to release");
}

#[tokio::test]
async fn a_claim_out_of_reach_is_absent_and_a_contacts_is_seen() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let acme = server.machine("acme", "laptop");
    let initech = server.machine("initech", "box");
    let remote = "https://github.com/oss/shared.git";
    let (a, b) = (clone_of(Some(remote)), clone_of(Some(remote)));
    let mut ann = agent_in(&server.url, &acme, "ann", a.path()).await;
    let mut ivan = agent_in(&server.url, &initech, "ivan", b.path()).await;
    claim(&mut ann, json!("src"), "acme's work").await;

    let listed = ivan.tool_ok("relay_claims", json!({})).await;
    assert_eq!(data(&listed)["claims"], json!([]), "another account's claim is not shown: {}", text(&listed));
    let granted = claim(&mut ivan, json!("src"), "initech's work").await;
    assert_eq!(data(&granted)["granted"], true, "a claim out of reach stops nothing");
    nothing_unread(&mut ann).await;
    // Nor can it be released by anyone but its holder.
    let id = data(&ann.tool_ok("relay_claims", json!({ "mine": true })).await)["claims"][0]["id"].clone();
    let theirs = ivan.tool("relay_release", json!({ "claim": id })).await;
    assert_eq!(theirs["isError"], true);
    assert!(text(&theirs).contains("you hold no standing claim"), "{}", text(&theirs));
}

#[tokio::test]
async fn a_claim_ends_with_its_holders_session_and_outlives_a_replicas_death() {
    let db = TestDb::new().await;
    let mut first = Server::start(&db).await;
    let second = Server::start(&db).await;
    let laptop = first.machine("acme", "laptop");
    let ci = first.machine("acme", "ci");
    let (a, b) = (clone_of(None), clone_of(None));
    // Without a remote, a repository is its machine's path: the same path on two machines is two.
    // ann knows both replicas, as a deployment's bridges do.
    let both = format!("{},{}", first.url, second.url);
    let mut ann = agent_in(&both, &laptop, "ann", a.path()).await;
    let granted = claim(&mut ann, json!("src"), "local work").await;
    let key = data(&granted)["claim"]["repo"].as_str().unwrap().to_owned();
    assert!(key.starts_with("local:acme/laptop:") && key.ends_with(&a.path().display().to_string()), "{key}");

    // Another agent names that repository by its key, from the second replica.
    let mut bob = agent_in(&second.url, &ci, "bob", b.path()).await;
    let by_key = json!({ "paths": ["src/x"], "repo": key, "reason": "r" });
    first.crash();
    let refused = bob.tool_ok("relay_claim", by_key.clone()).await;
    assert_eq!(data(&refused)["granted"], false, "the claim outlived the replica: {}", text(&refused));

    // Its session ended (the bridge said goodbye, to the replica still up), the claim stands no more.
    ann.close();
    let status = tokio::time::timeout(Duration::from_secs(20), ann.child.wait()).await.expect("ann's bridge exits");
    assert!(status.unwrap().success());
    // Goodbye is answered before the bridge exits: the claim ended with it, nothing to wait for.
    let answer = bob.tool_ok("relay_claim", by_key).await;
    assert_eq!(data(&answer)["granted"], true, "ann's claim ended with her session: {}", text(&answer));
    assert_eq!(data(&answer)["claim"]["holder"], "acme/ci/bob");
}

#[tokio::test]
async fn bad_claims_are_refused_by_name_and_change_nothing() {
    let w = TwoMachines::start().await;
    let clone = clone_of(Some("https://github.com/acme/api"));
    let not_a_repo = tempfile::tempdir().unwrap();
    let mut ann = agent_in(&w.server.url, &w.laptop, "ann", clone.path()).await;
    let mut lost = agent_in(&w.server.url, &w.ci, "lost", not_a_repo.path()).await;
    let cases = [
        (json!({ "paths": [], "reason": "r" }), "paths must be a path or a list of 1 to 64 paths"),
        (json!({ "paths": ["/etc/passwd"], "reason": "r" }), "is absolute"),
        (json!({ "paths": ["src/../../x"], "reason": "r" }), "leaves the repository"),
        (json!({ "paths": ["src"], "reason": " " }), "reason is required"),
        (json!({ "paths": ["src"], "reason": "r", "ttl_s": 5 }), "ttl_s must be a whole number from 60 to 86400"),
        (json!({ "paths": ["src"], "reason": "r", "repo": "not a remote" }), "is not a git remote"),
        (json!({ "paths": ["a\u{1b}[2J"], "reason": "r" }), "control character"),
        (json!({ "paths": ["src"], "reason": "x".repeat(201) }), "longer than 200 characters"),
    ];
    for (arguments, why) in cases {
        let refused = ann.tool("relay_claim", arguments.clone()).await;
        assert_eq!(refused["isError"], true, "{arguments}");
        assert!(text(&refused).contains(why), "{arguments}: {}", text(&refused));
    }
    let outside = lost.tool("relay_claim", claim_args(json!("src"), "r")).await;
    assert!(text(&outside).contains("not in a git repository"), "{}", text(&outside));
    let unknown = ann.tool("relay_release", json!({ "claim": "claim-999999" })).await;
    assert!(text(&unknown).contains("you hold no standing claim claim-999999"), "{}", text(&unknown));
    let garbled = ann.tool("relay_release", json!({ "claim": "mine" })).await;
    assert!(text(&garbled).contains("is not a claim id"), "{}", text(&garbled));
    let listed = ann.tool_ok("relay_claims", json!({})).await;
    assert_eq!(data(&listed)["claims"], json!([]), "nothing was stored: {}", text(&listed));
}

/// Runs git in `dir` with a committer set; whether it succeeded, and what it said.
async fn git_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut git = tokio::process::Command::new("git");
    git.arg("-C").arg(dir).args(["-c", "user.name=Relay Test", "-c", "user.email=test@relay.invalid"]).args(args);
    for (name, value) in env {
        git.env(name, value);
    }
    // The guard asks as this machine: no agent's session runs the commit.
    git.env("RELAY_CONFIG", "/nonexistent/bridge.toml").env("RELAY_SESSION_DIR", dir.join(".no-sessions"));
    let out = git.output_within(COMMAND_LIMIT).await.expect("run git");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[tokio::test]
async fn the_pre_commit_guard_refuses_a_commit_into_anothers_claim_and_passes_after_release() {
    let w = TwoMachines::start().await;
    let remote = "https://github.com/acme/api.git";
    let (laptop_clone, ci_clone) = (clone_of(Some(remote)), clone_of(Some(remote)));
    let mut ann = agent_in(&w.server.url, &w.laptop, "ann", laptop_clone.path()).await;
    claim(&mut ann, json!("src/auth/**"), "refactoring login").await;

    // The repository's person installs the guard, twice: the second time changes nothing.
    let repo = ci_clone.path();
    for said in ["set the relay guard", "kept the relay guard"] {
        let out = std::process::Command::new(relay_tests::bin("agent-bridge"))
            .args(["install", "--guard"])
            .current_dir(repo)
            .output()
            .unwrap();
        assert!(out.status.success() && String::from_utf8_lossy(&out.stderr).contains(said), "{out:?}");
    }
    std::fs::write(repo.join("src/auth/login.rs"), "fn login() {}\n").unwrap();
    std::fs::write(repo.join("README.md"), "api\n").unwrap();
    let ci = [("RELAY_SERVER", w.server.url.as_str()), ("RELAY_TOKEN", w.ci.as_str())];

    // A commit outside the claim goes through.
    git_in(repo, &["add", "README.md"], &[]).await;
    let (ok, said) = git_in(repo, &["commit", "-q", "-m", "readme"], &ci).await;
    assert!(ok, "{said}");

    git_in(repo, &["add", "src/auth/login.rs"], &[]).await;
    let (ok, said) = git_in(repo, &["commit", "-q", "-m", "login"], &ci).await;
    assert!(!ok, "the commit into ann's claim is refused: {said}");
    assert!(
        said.contains("acme/laptop/ann") && said.contains("src/auth") && said.contains("refactoring login"),
        "{said}"
    );

    // RELAY_GUARD=off passes it (the commit is then taken back, its change staged again).
    let off = [ci[0], ci[1], ("RELAY_GUARD", "off")];
    let (ok, said) = git_in(repo, &["commit", "-q", "-m", "login"], &off).await;
    assert!(ok, "{said}");
    assert!(git_in(repo, &["reset", "-q", "--soft", "HEAD~1"], &[]).await.0);

    // With the relay out of reach, the guard warns and lets the commit through within its bound.
    let nowhere = format!("http://127.0.0.1:{}", relay_tests::free_port());
    let started = std::time::Instant::now();
    let (ok, said) = git_in(repo, &["commit", "-q", "-m", "login"], &[("RELAY_SERVER", &nowhere), ci[1]]).await;
    assert!(ok && said.contains("relay guard") && said.contains("unchecked"), "{said}");
    assert!(started.elapsed() < Duration::from_secs(5), "held the commit {:?}", started.elapsed());
    assert!(git_in(repo, &["reset", "-q", "--soft", "HEAD~1"], &[]).await.0);

    // Released, the same commit goes through.
    ann.tool_ok("relay_release", json!({})).await;
    let (ok, said) = git_in(repo, &["commit", "-q", "-m", "login"], &ci).await;
    assert!(ok, "{said}");

    // A repository's own pre-commit hook is never replaced.
    let other = clone_of(Some(remote));
    let own = other.path().join(".git/hooks/pre-commit");
    std::fs::write(&own, "#!/bin/sh\nexit 0\n").unwrap();
    let out = std::process::Command::new(relay_tests::bin("agent-bridge"))
        .args(["install", "--guard"])
        .current_dir(other.path())
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("hook guard"), "{out:?}");
    assert_eq!(std::fs::read_to_string(&own).unwrap(), "#!/bin/sh\nexit 0\n");
}

#[tokio::test]
async fn what_is_claimed_and_released_is_counted_in_metrics() {
    let db = TestDb::new().await;
    let ops = format!("127.0.0.1:{}", relay_tests::free_port());
    let server = Server::start_with_env(&db, relay_tests::free_port(), &[("RELAY_OPS_LISTEN", &ops)]).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    let remote = "https://github.com/acme/api.git";
    let (a, b) = (clone_of(Some(remote)), clone_of(Some(remote)));
    let mut ann = agent_in(&server.url, &laptop, "ann", a.path()).await;
    let mut bob = agent_in(&server.url, &ci, "bob", b.path()).await;
    claim(&mut ann, json!("src"), "one").await;
    claim(&mut ann, json!("src"), "renewed").await;
    claim(&mut ann, json!("docs"), "two").await;
    claim(&mut bob, json!("src/x"), "refused").await;
    ann.tool_ok("relay_release", json!({ "paths": ["docs"] })).await;

    let (status, text) = relay_tests::http::get(&ops, "/metrics").await.expect("the ops port answers");
    assert_eq!(status, 200);
    let count =
        |series: &str| relay_tests::http::sample(&text, series).unwrap_or_else(|| panic!("no {series}:\n{text}"));
    assert_eq!(count(r#"relay_path_claims_total{step="granted"}"#), 2.0);
    assert_eq!(count(r#"relay_path_claims_total{step="renewed"}"#), 1.0);
    assert_eq!(count(r#"relay_path_claims_total{step="refused"}"#), 1.0);
    assert_eq!(count(r#"relay_path_claims_total{step="released"}"#), 1.0);
    assert_eq!(count("relay_path_claims_standing"), 1.0, "the claims in force, read from the database");
}

/// What the guard asks: as an agent, the exclusive claims of others its files run into (its own do
/// not stop it); as a machine (a person committing), anyone's; shared claims stop no commit.
#[tokio::test]
async fn the_guards_question_leaves_out_the_askers_own_claims_and_shared_ones() {
    use relay_proto::v1::{ClaimPathsRequest, ClaimsTouchingRequest, RepoRef, repo_ref};
    use relay_tests::client::{Agent, channel, worker_client};
    let w = TwoMachines::start().await;
    let repo = || Some(RepoRef { kind: Some(repo_ref::Kind::Remote("https://github.com/acme/api".into())) });
    let mut ann = Agent::hello(&w.server.url, &w.laptop, "ann").await.unwrap();
    let mut bob = Agent::hello(&w.server.url, &w.ci, "bob").await.unwrap();
    let claim = |paths: &[&str], exclusive| ClaimPathsRequest {
        repo: repo(),
        paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        exclusive,
        ttl_s: None,
        reason: "r".into(),
    };
    assert!(ann.rpc.claim_paths(claim(&["src/auth"], true)).await.unwrap().into_inner().granted);
    assert!(ann.rpc.claim_paths(claim(&["docs"], false)).await.unwrap().into_inner().granted);
    let files = || ClaimsTouchingRequest {
        repo: repo(),
        files: vec!["src/auth/login.rs".into(), "docs/readme.md".into(), "web/app.js".into()],
    };
    let holders = |claims: Vec<relay_proto::v1::PathClaim>| -> Vec<(String, Vec<String>)> {
        claims.into_iter().map(|c| (c.holder, c.paths)).collect()
    };
    let own = ann.rpc.claims_touching(files()).await.unwrap().into_inner().claims;
    assert!(own.is_empty(), "the holder's own claims never stop its commit: {own:?}");
    let theirs = holders(bob.rpc.claims_touching(files()).await.unwrap().into_inner().claims);
    assert_eq!(theirs, [("acme/laptop/ann".to_owned(), vec!["src/auth".to_owned()])], "exclusive ones alone");
    let mut machine = worker_client(channel(&w.server.url).await, &w.laptop);
    let by_hand = holders(machine.claims_touching(files()).await.unwrap().into_inner().claims);
    assert_eq!(by_hand, theirs, "a person committing on ann's machine is stopped by her claim too");
    let missing = bob.rpc.claims_touching(ClaimsTouchingRequest { repo: None, files: vec![] }).await.unwrap_err();
    assert_eq!(missing.message(), "repo is required");
}
