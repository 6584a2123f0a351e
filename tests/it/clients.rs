//! The real agent CLIs (Claude Code, Codex, Gemini CLI at pinned versions, from npm), installed
//! with `agent-bridge install` and nothing else, against a scripted model API: an idle session
//! acts on mail from another machine, once per message; a print-mode run is never held; every
//! relay tool works non-interactively; a frozen relay does not hang a run.

use std::process::Stdio;
use std::time::Duration;

use relay_tests::client::{channel, worker_client};
use relay_tests::clients::{self, ClaudeProject, CodexHome, GeminiHome};
use relay_tests::mcp::{Bridge, bridge};
use relay_tests::model_api::{Api, ModelApi, Reply, Request, ToolCost};
use relay_tests::process::{COMMAND_LIMIT, EXIT_LIMIT, RunWithin, RunWithinAsync, exit_within};
use relay_tests::server::TwoMachines;
use relay_tests::short_id;
use relay_tests::terminal::Terminal;
use serde_json::json;

/// Long enough for a CLI to start, ask its model and run its hooks on a loaded machine.
const TURN: Duration = Duration::from_secs(90);

/// The most tokens Relay's tool definitions may cost a client's model on every turn.
const TOOL_TOKENS: usize = 2_500;

/// Relay's tool definitions in `client`'s model request, printed, and held to [`TOOL_TOKENS`].
fn tool_definitions_fit(client: &str, request: &Request) {
    let cost = request.relay_tools();
    let relay = cost.relay_bytes();
    println!(
        "{client}: Relay's tool definitions in its model request: {relay} bytes, about {} tokens{}",
        ToolCost::tokens(relay),
        if cost.client_added > 0 {
            format!(
                " (the client adds {} bytes, about {} tokens, of its own to them)",
                cost.client_added,
                ToolCost::tokens(cost.client_added)
            )
        } else {
            String::new()
        }
    );
    assert!(relay > 0, "{client}: Relay's tools are in the request");
    assert!(ToolCost::tokens(relay) <= TOOL_TOKENS, "{client}: {relay} bytes of Relay's tool definitions");
}

/// bob, on the other machine, ready to send.
async fn bob(w: &TwoMachines) -> Bridge {
    let mut bob = bridge(&w.server.url, &w.ci, "bob");
    bob.initialize("2025-06-18").await;
    bob
}

/// Sends `body` from bob to `to`; the message's id.
async fn send(bob: &mut Bridge, to: &str, body: &str) -> String {
    let sent = bob.tool_ok("relay_send", json!({ "to": to, "body": body })).await;
    sent["structuredContent"]["id"].as_str().unwrap().to_owned()
}

/// The state of bob's message `id` for its one recipient.
async fn state_of(bob: &mut Bridge, id: &str) -> String {
    let sent = bob.tool_ok("relay_ask_wait", json!({ "id": id, "wait_s": 0 })).await;
    sent["structuredContent"]["recipients"][0]["state"].as_str().unwrap_or_default().to_owned()
}

/// Waits until `address` is online, as bob sees it.
async fn online(bob: &mut Bridge, address: &str) {
    bob.wait_online(address, TURN).await
}

#[tokio::test]
async fn an_idle_claude_code_session_is_woken_by_mail_from_another_machine_once_per_message() {
    let w = TwoMachines::start().await;
    let api = ModelApi::start().await;
    let mut bob = bob(&w).await;
    let project = ClaudeProject::new(&w.server.url, &w.laptop, &api.url);
    let env = project.env("alice");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let term = Terminal::start(&project.dir(), &env, &clients::program("claude"), &[]);
    online(&mut bob, "acme/laptop/alice").await;
    term.wait_for("\u{276f}", TURN).await;

    // A first turn, then the session sits idle at its prompt.
    term.type_line("say hello");
    let (first, _) = api
        .wait_for("the first turn", 0, TURN, |r| r.api == Api::Anthropic && r.last_turn().contains("say hello"))
        .await;

    let one = send(&mut bob, "laptop/alice", "the first build is green").await;
    let (woken, request) = api
        .wait_for("a turn woken by the first message", first + 1, TURN, |r| r.last_turn().contains("<relay-mail>"))
        .await;
    let notice = request.last_turn();
    assert!(notice.contains(short_id(&one)) && notice.contains("from acme/ci/bob"), "{notice}");
    assert!(notice.contains("mcp__relay__relay_inbox"), "the tool as Claude Code lists it: {notice}");
    assert!(!notice.contains("the first build is green"), "never the body in a user-role notice: {notice}");
    assert_eq!(state_of(&mut bob, &one).await, "surfaced", "named to the model: surfaced");

    // The woken turn did not read its inbox; it ended, and the hook waits again without
    // announcing the first message a second time: the next woken turn names the second only.
    let two = send(&mut bob, "laptop/alice", "the second build is green").await;
    let (_, request) = api
        .wait_for("a turn woken by the second message", woken + 1, TURN, |r| r.last_turn().contains("<relay-mail>"))
        .await;
    let notice = request.last_turn();
    assert!(notice.contains(short_id(&two)), "{notice}");
    assert!(!notice.contains(short_id(&one)), "each message is announced once: {notice}");
}

#[tokio::test]
async fn claude_code_in_print_mode_is_not_held_by_the_wake_hook() {
    let w = TwoMachines::start().await;
    let api = ModelApi::start().await;
    let mut bob = bob(&w).await;
    // alice exists and has mail waiting before the run starts.
    let mut alice = bridge(&w.server.url, &w.laptop, "alice");
    alice.initialize("2025-06-18").await;
    alice.tool_ok("relay_whoami", json!({})).await;
    alice.close();
    exit_within(&mut alice.child, EXIT_LIMIT, "the bridge to exit").await;
    let waiting = send(&mut bob, "laptop/alice", "read me when you can").await;

    let project = ClaudeProject::new(&w.server.url, &w.laptop, &api.url);
    let run = tokio::process::Command::new(clients::program("claude"))
        .args(["-p", "say hello"])
        .current_dir(project.dir())
        .env_clear()
        .envs(project.env("alice"))
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(TURN, run).await.expect("claude -p was held").unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let asked = api.requests().into_iter().find(|r| r.last_turn().contains("say hello"));
    let asked = asked.unwrap_or_else(|| panic!("the model was asked: {}", api.summary()));
    tool_definitions_fit("Claude Code", &asked);
    assert!(!api.requests().iter().any(|r| r.contains("<relay-mail>")), "no wake in print mode: {}", api.summary());
    let state = state_of(&mut bob, &waiting).await;
    assert!(state == "queued" || state == "pushed", "the wake hook claimed nothing it did not show: {state}");
}

#[tokio::test]
async fn claude_code_in_print_mode_ends_soon_after_its_last_turn_when_the_relay_freezes() {
    let w = TwoMachines::start().await;
    let api = ModelApi::start().await;
    let mut bob = bob(&w).await;
    let project = ClaudeProject::new(&w.server.url, &w.laptop, &api.url);
    let gate = api.on_held(Api::Anthropic, "say hello", Reply::text("hello"));
    let run = tokio::process::Command::new(clients::program("claude"))
        .args(["-p", "say hello"])
        .current_dir(project.dir())
        .env_clear()
        .envs(project.env("alice"))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let run = tokio::spawn(run);
    api.wait_for("the model request", 0, TURN, |r| r.last_turn().contains("say hello")).await;
    online(&mut bob, "acme/laptop/alice").await;

    // The relay accepts connections and answers nothing from here on.
    let _frozen = relay_tests::Frozen::new(w.server.pid());
    gate.open();
    let answered = tokio::time::Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(60), run).await.expect("claude -p hung").unwrap().unwrap();
    let took = answered.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(took < Duration::from_secs(15), "claude -p ended {took:?} after the model's last turn");
}

/// Runs `codex exec prompt` in `codex`'s project, which must succeed.
async fn codex_exec(codex: &CodexHome, prompt: &str) {
    let run = tokio::process::Command::new(clients::program("codex"))
        .args(["exec", "--skip-git-repo-check", prompt])
        .current_dir(codex.project.path())
        .env_clear()
        .envs(codex.env())
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(TURN, run).await.expect("codex exec hung").unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn codex_exec_uses_the_relay_tools_as_installed() {
    let w = TwoMachines::start().await;
    let api = ModelApi::start().await;
    let mut bob = bob(&w).await;
    let codex = CodexHome::new(&w.server.url, &w.laptop, &api.url);
    // The account's operator, of an account with a board: listed every tool but the board agent's,
    // what its model is sent is the most any agent's is.
    w.server.admin_ok(&["operator", "acme", "laptop/codex-1"]);
    let repo = tempfile::tempdir().unwrap();
    let mut init = std::process::Command::new("git");
    init.args(["init", "-q"]).current_dir(repo.path());
    assert!(init.status_within(COMMAND_LIMIT).unwrap().success(), "git init");
    let path = repo.path().display().to_string();
    let mut worker = worker_client(channel(&w.server.url).await, &w.laptop);
    worker.register_repo(relay_proto::v1::RegisterRepoRequest { path }).await.expect("the repository is on the board");
    // relay_send is neither read-only nor idempotent: without the install's approval mode,
    // `codex exec` (which cannot ask) refuses it.
    let call = Reply::Tool {
        name: "relay_send".into(),
        namespace: Some("mcp__relay".into()),
        input: json!({ "to": "ci/bob", "body": "hello from codex exec" }),
    };
    api.on(Api::OpenAi, "tell bob hello", call);
    codex_exec(&codex, "tell bob hello").await;
    let first = api.requests().first().cloned().expect("codex asked its model");
    let offered = first.tools();
    assert!(offered.iter().any(|t| t == "mcp__relay.relay_inbox"), "the relay tools are offered: {offered:?}");
    for tool in ["mcp__relay.close_job", "mcp__relay.post_job"] {
        assert!(offered.iter().any(|t| t == tool), "the operator's and the board's: {offered:?}");
    }
    tool_definitions_fit("Codex, as the account's operator", &first);
    let operator = first.tools();
    let (_, answered) =
        api.wait_for("the tool's answer", 0, TURN, |r| r.last_turn().contains("function_call_output")).await;
    assert!(answered.last_turn().contains("acme/ci/bob"), "the send went through: {}", answered.last_turn());
    let inbox = bob.tool_ok("relay_inbox", json!({})).await;
    let messages = inbox["structuredContent"]["messages"].as_array().cloned().unwrap_or_default();
    assert!(
        messages.iter().any(|m| m["body"] == "hello from codex exec" && m["from"] == "acme/laptop/codex-1"),
        "{inbox}"
    );

    // Another agent of the account is listed the path claims instead of the operator's tools: the
    // other most an agent's model is sent.
    w.server.admin_ok(&["operator", "acme", "ci/bob"]);
    api.on(Api::OpenAi, "say hello again", Reply::text("hello"));
    codex_exec(&codex, "say hello again").await;
    let (_, second) = api.wait_for("the second run", 1, TURN, |r| r.last_turn().contains("say hello again")).await;
    let offered = second.tools();
    assert!(offered.iter().any(|t| t == "mcp__relay.relay_claim"), "an editor's: {offered:?}");
    assert!(!offered.iter().any(|t| t == "mcp__relay.close_job"), "not the operator's: {offered:?}");
    assert!(!operator.iter().any(|t| t == "mcp__relay.relay_claim"), "the operator steers: {operator:?}");
    tool_definitions_fit("Codex, an agent of an account with a board", &second);
}

#[tokio::test]
async fn an_idle_codex_session_is_woken_through_codex_queue() {
    let w = TwoMachines::start().await;
    let api = ModelApi::start().await;
    let mut bob = bob(&w).await;
    let codex = CodexHome::new(&w.server.url, &w.laptop, &api.url);
    let env = codex.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let term = Terminal::start(codex.project.path(), &env, &clients::program("codex"), &[]);
    // What a person approves once: the folder (Codex asks in a repository), then the hook install
    // added, which Codex asks about once it has loaded its hooks.
    let deadline = tokio::time::Instant::now() + TURN;
    loop {
        let screen = term.screen();
        if screen.contains("Trust this folder?") {
            term.keys(&["Enter"]);
            term.wait_until_gone("Trust this folder?", TURN).await;
        } else if screen.contains("› 2. Trust all and continue") {
            term.keys(&["Enter"]);
            term.wait_until_gone("Trust all and continue", TURN).await;
            break;
        } else if screen.contains("Trust all and continue") {
            // A key sent while the dialog still draws can be lost: the choice is confirmed only once
            // the screen shows it chosen.
            term.keys(&[if screen.contains("› 3.") { "Up" } else { "Down" }]);
        }
        assert!(tokio::time::Instant::now() < deadline, "Codex never asked to trust the relay hook:\n{screen}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    term.wait_for("Ask Codex", TURN).await;
    // What the person approved is what doctor looks for: it finds the hook trusted, the rest whole.
    let doctor = tokio::process::Command::new(relay_tests::bin("agent-bridge"))
        .arg("doctor")
        .current_dir(codex.project.path())
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output_within(relay_tests::process::COMMAND_LIMIT)
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(doctor.status.success(), "doctor after Codex trusted the hook:\n{said}");
    assert!(said.contains("ok    codex: the relay MCP server and hooks"), "{said}");

    term.type_line("say hello");
    term.wait_for("Worked for", TURN).await;
    let (first, _) =
        api.wait_for("the first turn", 0, TURN, |r| r.api == Api::OpenAi && r.last_turn().contains("say hello")).await;
    // The turn ended and its notify program armed the waiter: the session is idle.
    let home = format!("HOME={}", codex.home.path().display());
    relay_tests::eventually(TURN, "the waiter the notify program arms", || {
        let armed = clients::running("codex-wake", &home);
        async move { armed.then_some(()) }
    })
    .await;

    let id = send(&mut bob, "laptop/codex-1", "the deploy finished").await;
    let (_, request) =
        api.wait_for("a turn queued by the waiter", first + 1, TURN, |r| r.last_turn().contains("<relay-mail>")).await;
    let notice = request.last_turn();
    assert!(notice.contains(short_id(&id)) && notice.contains("from acme/ci/bob"), "{notice}");
    assert!(notice.contains("relay_inbox tool of mcp__relay"), "{notice}");
    assert!(!notice.contains("the deploy finished"), "{notice}");
}

#[tokio::test]
async fn gemini_cli_offers_the_relay_tools_and_hands_unseen_mail_over_once_at_the_end_of_a_turn() {
    let w = TwoMachines::start().await;
    let api = ModelApi::start().await;
    let mut bob = bob(&w).await;
    // gemini-1 exists (its agent ran before) and has mail waiting.
    let mut earlier = bridge(&w.server.url, &w.laptop, "gemini-1");
    earlier.initialize("2025-06-18").await;
    earlier.tool_ok("relay_whoami", json!({})).await;
    earlier.close();
    exit_within(&mut earlier.child, EXIT_LIMIT, "the bridge to exit").await;
    let id = send(&mut bob, "laptop/gemini-1", "the review is ready").await;

    let gemini = GeminiHome::new(&w.server.url, &w.laptop, &api.url);
    // Told of the mail at the end of its turn, the model reads it.
    api.on(Api::Gemini, "<relay-mail>", Reply::tool("mcp_relay_relay_inbox", json!({})));
    let run = tokio::process::Command::new(clients::program("gemini"))
        .args(["-p", "say hello"])
        .current_dir(gemini.project.path())
        .env_clear()
        .envs(gemini.env())
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(TURN, run).await.expect("gemini -p hung").unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let requests = api.requests();
    let offered = requests.first().map(|r| r.tools()).unwrap_or_default();
    for tool in ["mcp_relay_relay_inbox", "mcp_relay_relay_send"] {
        assert!(offered.iter().any(|t| t == tool), "{tool} offered to gemini -p: {offered:?}");
    }
    assert!(!offered.iter().any(|t| t == "mcp_relay_post_job"), "no board, no board tools: {offered:?}");
    tool_definitions_fit("Gemini CLI", &requests[0]);
    let told: Vec<_> = requests.iter().filter(|r| r.last_turn().contains("<relay-mail>")).collect();
    assert_eq!(told.len(), 1, "told once: {}", api.summary());
    assert!(told[0].last_turn().contains(short_id(&id)), "{}", told[0].last_turn());
    assert!(
        requests
            .iter()
            .any(|r| r.last_turn().contains("functionResponse") && r.last_turn().contains("the review is ready")),
        "the model read it with the tool: {}",
        api.summary()
    );
    assert_eq!(state_of(&mut bob, &id).await, "read", "read through relay_inbox");
}

/// A Claude Code turn with no bridge: the relay tools come from the server's MCP endpoint, as the
/// README configures it, and the model's relay_send reaches a bridged agent from the cloud agent.
#[tokio::test]
async fn a_claude_code_turn_sends_through_the_mcp_endpoint() {
    let db = relay_tests::pg::TestDb::new().await;
    let mcp = format!("127.0.0.1:{}", relay_tests::free_port());
    let env = [("RELAY_MCP_LISTEN", mcp.as_str())];
    let server = relay_tests::server::Server::start_with_env(&db, relay_tests::free_port(), &env).await;
    let laptop = server.machine("acme", "laptop");
    let cloud = server.machine("acme", "cloud");
    let api = ModelApi::start().await;
    let mut alice = bridge(&server.url, &laptop, "alice");
    alice.initialize("2025-06-18").await;
    alice.tool_ok("relay_whoami", json!({})).await;

    // MCP tools are deferred: the model selects relay_send, then calls it, then answers.
    api.on(
        Api::Anthropic,
        "ToolSearch",
        Reply::tool("ToolSearch", json!({ "query": "select:mcp__relay__relay_send" })),
    );
    let send = json!({ "to": "laptop/alice", "body": "the nightly build is green" });
    api.on(Api::Anthropic, "mcp__relay__relay_send", Reply::tool("mcp__relay__relay_send", send));
    api.on(Api::Anthropic, "(id ", Reply::text("sent"));
    let project = ClaudeProject::remote(&format!("http://{mcp}/mcp"), "cc-cloud", &api.url);
    let run = tokio::process::Command::new(clients::program("claude"))
        .args(["-p", "tell alice the build is green", "--allowedTools", "mcp__relay__relay_send"])
        .current_dir(project.dir())
        .env_clear()
        .envs(project.env("unused"))
        .env("RELAY_TOKEN", &cloud)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(TURN, run).await.expect("claude -p was held").unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), api.summary());

    let read = alice.tool_ok("relay_inbox", json!({})).await;
    let shown = relay_tests::mcp::text(&read);
    assert!(
        shown.contains("the nightly build is green") && shown.contains("acme/cloud/cc-cloud"),
        "{shown}\n{}",
        api.summary()
    );
}

/// Runs `claude -p prompt` in `project`'s directory as `handle`, allowed `tools`; its output.
async fn claude_print(project: &ClaudeProject, handle: &str, prompt: &str, tools: &str) -> std::process::Output {
    let run = tokio::process::Command::new(clients::program("claude"))
        .args(["-p", prompt, "--allowedTools", tools])
        .current_dir(project.dir())
        .env_clear()
        .envs(project.env(handle))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(TURN, run).await.expect("claude -p was held").unwrap()
}

/// Path claims with the real Claude Code: bob, on another machine, holds src/auth; Claude Code's
/// model claims it too and is told who holds it and why; its commit into it is refused by the
/// pre-commit guard (asking as that agent, through its bridge's session), and goes through once
/// bob releases the claim.
#[tokio::test]
async fn claude_code_is_told_whose_claim_it_met_and_its_commit_waits_for_the_release() {
    let w = TwoMachines::start().await;
    let api = ModelApi::start().await;
    let remote = "https://github.com/acme/api.git";
    let bob_clone = tempfile::tempdir().unwrap();
    let git = |dir: &std::path::Path, args: &[&str]| {
        let mut git = std::process::Command::new("git");
        git.arg("-C").arg(dir).args(["-c", "user.name=t", "-c", "user.email=t@relay.invalid"]).args(args);
        assert!(git.status_within(COMMAND_LIMIT).unwrap().success(), "git {args:?}");
    };
    git(bob_clone.path(), &["init", "-q"]);
    git(bob_clone.path(), &["remote", "add", "origin", remote]);
    let mut bob = Bridge::start_in(
        relay_tests::mcp::BridgeSpec { server: &w.server.url, token: &w.ci, handle: Some("bob"), channels: false },
        bob_clone.path(),
    );
    bob.initialize("2025-06-18").await;
    let held = json!({ "paths": ["src/auth/**"], "reason": "rewriting the session store" });
    assert_eq!(bob.tool_ok("relay_claim", held).await["structuredContent"]["granted"], true);

    // alice's project is a clone of the same repository over ssh, guarded, a change staged.
    let project = ClaudeProject::new(&w.server.url, &w.laptop, &api.url);
    let dir = project.dir();
    git(&dir, &["init", "-q"]);
    git(&dir, &["remote", "add", "origin", "git@github.com:acme/api.git"]);
    let install = std::process::Command::new(relay_tests::bin("agent-bridge"))
        .args(["install", "--guard"])
        .current_dir(&dir)
        .output_within(COMMAND_LIMIT)
        .unwrap();
    assert!(install.status.success(), "{install:?}");
    std::fs::create_dir_all(dir.join("src/auth")).unwrap();
    std::fs::write(dir.join("src/auth/session.rs"), "// sessions\n").unwrap();
    git(&dir, &["add", "src/auth/session.rs"]);

    let claim = json!({ "paths": ["src/auth/**"], "reason": "fixing the login bug" });
    let commit = json!({
        "command": "git -c user.name=alice -c user.email=alice@relay.invalid commit -q -m 'fix login'",
        "description": "commit the fix",
    });
    api.on(
        Api::Anthropic,
        "ToolSearch",
        Reply::tool("ToolSearch", json!({ "query": "select:mcp__relay__relay_claim" })),
    );
    api.on(Api::Anthropic, "mcp__relay__relay_claim", Reply::tool("mcp__relay__relay_claim", claim));
    api.on(Api::Anthropic, "rewriting the session store", Reply::tool("Bash", commit.clone()));
    api.on(Api::Anthropic, "relay guard", Reply::text("the commit waits for bob"));
    let out = claude_print(&project, "alice", "fix the login bug", "mcp__relay__relay_claim,Bash").await;
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), api.summary());

    let requests = api.requests();
    let told = requests.iter().find(|r| r.last_turn().contains("rewriting the session store"));
    let told = told.unwrap_or_else(|| panic!("the model saw the claim's answer: {}", api.summary())).last_turn();
    assert!(told.contains("acme/ci/bob") && told.contains("src/auth"), "who holds it: {told}");
    let refused = requests.iter().find(|r| r.last_turn().contains("relay guard"));
    let refused =
        refused.unwrap_or_else(|| panic!("the commit was refused by the guard: {}", api.summary())).last_turn();
    assert!(refused.contains("acme/ci/bob"), "the guard names the holder: {refused}");
    let log = std::process::Command::new("git").arg("-C").arg(&dir).args(["log", "--oneline"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&log.stdout).contains("fix login"), "nothing was committed");
    // bob heard that alice ran into his claim.
    let inbox = bob.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    let heard = inbox["structuredContent"]["messages"][0]["body"].as_str().unwrap_or_default().to_owned();
    assert!(heard.contains("acme/laptop/alice") && heard.contains("fixing the login bug"), "{inbox}");

    // Released, the same commit goes through.
    bob.tool_ok("relay_release", json!({})).await;
    api.on(Api::Anthropic, "commit it again", Reply::tool("Bash", commit));
    let out = claude_print(&project, "alice", "commit it again", "Bash").await;
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), api.summary());
    let log = std::process::Command::new("git").arg("-C").arg(&dir).args(["log", "--oneline"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&log.stdout).contains("fix login"),
        "committed after the release: {}",
        api.summary()
    );
}

/// One of two Claude Code agents that answer each other for ever: it loads the relay tools, sends
/// the first message (`opens_to`) or waits for one, then answers whatever arrives and waits again,
/// until a result says the loop guard held them. Answers only its own conversation (its prompt
/// names it) and only the main loop (the requests that offer ToolSearch).
fn answers_for_ever(who: &'static str, opens_to: Option<&'static str>) -> impl Fn(&Request) -> Option<Reply> {
    const TOOLS: [&str; 3] = ["mcp__relay__relay_send", "mcp__relay__relay_inbox", "mcp__relay__relay_reply"];
    move |r| {
        let first = r.body["messages"].as_array()?.first()?.to_string();
        if r.api != Api::Anthropic || !r.tools().iter().any(|t| t == "ToolSearch") || !first.contains(who) {
            return None;
        }
        let calls = r.tool_calls();
        let searched = calls.iter().filter(|c| *c == "ToolSearch").count();
        if let Some(tool) = TOOLS.get(searched) {
            return Some(Reply::tool("ToolSearch", json!({ "query": format!("select:{tool}") })));
        }
        let wait = Reply::tool(TOOLS[1], json!({ "wait_s": 20 }));
        let last = r.last_turn();
        Some(match calls.last().map(String::as_str) {
            Some("ToolSearch") => match opens_to {
                Some(to) => Reply::tool(TOOLS[0], json!({ "to": to, "body": "ping" })),
                None => wait,
            },
            _ if last.contains("loop guard") || last.contains("for your account's human") => {
                Reply::text("The loop guard holds us; stopping.")
            }
            Some(tool) if tool == TOOLS[1] && !last.contains("no unread messages") => {
                Reply::tool(TOOLS[2], json!({ "id": "last", "body": format!("answer {}", calls.len()) }))
            }
            _ => wait,
        })
    }
}

/// The loop guard with two real Claude Code agents on two machines, scripted to answer each other
/// for ever: the message past the account's bound is held, within a minute, and each model reads why.
#[tokio::test]
async fn two_claude_code_agents_answering_each_other_for_ever_are_held_at_the_bound() {
    let w = TwoMachines::start().await;
    w.server.admin_ok(&["loop-guard", "acme", "--messages", "10"]);
    let api = ModelApi::start().await;
    api.respond(answers_for_ever("you are ann", Some("ci/bob")));
    api.respond(answers_for_ever("you are bob", None));
    let (ann, bob) =
        (ClaudeProject::new(&w.server.url, &w.laptop, &api.url), ClaudeProject::new(&w.server.url, &w.ci, &api.url));
    let tools = "mcp__relay__relay_send,mcp__relay__relay_inbox,mcp__relay__relay_reply";
    let (ann_out, bob_out) = tokio::join!(
        claude_print(&ann, "ann", "you are ann: talk with ci/bob", tools),
        claude_print(&bob, "bob", "you are bob: answer whoever writes", tools),
    );
    for out in [&ann_out, &bob_out] {
        assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), api.summary());
    }

    // Each conversation's last request holds everything its model did and read.
    let requests = api.requests();
    let last_of = |who: &str| {
        let own = requests.iter().filter(|r| r.tools().iter().any(|t| t == "ToolSearch") && r.contains(who));
        own.max_by_key(|r| r.body["messages"].as_array().map_or(0, Vec::len)).cloned().expect("a conversation")
    };
    let (ann_last, bob_last) = (last_of("you are ann"), last_of("you are bob"));
    let sent =
        |r: &Request| r.tool_calls().iter().filter(|c| c.ends_with("relay_send") || c.ends_with("relay_reply")).count();
    // ann opened, so she sends the odd messages: the eleventh is hers, held; ten went through.
    assert_eq!((sent(&ann_last), sent(&bob_last)), (6, 5), "{}", api.summary());
    // ann's model read that its message was held (the hold's id in the result it reads), and
    // both read why, from the loop guard.
    assert_eq!(ann_last.text().matches("\\\"hold\\\":").count(), 1, "one held result: {}", api.summary());
    let why = "Relay's loop guard held a message from acme/laptop/ann to acme/ci/bob: 10 turns";
    for (who, last) in [("ann", &ann_last), ("bob", &bob_last)] {
        assert!(last.last_turn().contains(why), "{who}'s model read why: {}", last.last_turn());
    }
    let first = requests.iter().find(|r| r.contains("you are ann")).expect("ann's first request");
    let held_at = ann_last.at.duration_since(first.at);
    assert!(held_at < Duration::from_secs(60), "held {held_at:?} after the exchange began");
    println!(
        "two Claude Code agents answering each other: held at the 11th message, {held_at:?} after the first request"
    );
}

/// Files with the real Claude Code: bob, on another machine, attaches a patch from his clone;
/// Claude Code's model reads its inbox, sees the file named with the message, and fetches it into
/// its project, where the patch lands as bob wrote it.
#[tokio::test]
async fn claude_code_fetches_a_patch_another_machine_attached() {
    let w = TwoMachines::start().await;
    let api = ModelApi::start().await;
    let project = ClaudeProject::new(&w.server.url, &w.laptop, &api.url);
    // alice's inbox exists before her first session, so bob can write to it.
    let mut alice = relay_tests::client::Agent::hello(&w.server.url, &w.laptop, "alice").await.unwrap();
    alice.rpc.goodbye(relay_proto::v1::GoodbyeRequest {}).await.unwrap();
    let bob_clone = tempfile::tempdir().unwrap();
    let patch = "--- a/src/login.rs\n+++ b/src/login.rs\n@@ -1 +1 @@\n-fn login() {}\n+fn login() { check() }\n";
    std::fs::write(bob_clone.path().join("fix.patch"), patch).unwrap();
    let mut bob = Bridge::start_in(
        relay_tests::mcp::BridgeSpec { server: &w.server.url, token: &w.ci, handle: Some("bob"), channels: false },
        bob_clone.path(),
    );
    bob.initialize("2025-06-18").await;
    let sent = bob
        .tool_ok("relay_send", json!({ "to": "laptop/alice", "body": "the login fix", "attach": ["fix.patch"] }))
        .await;
    let short = short_id(sent["structuredContent"]["id"].as_str().unwrap());

    api.on(
        Api::Anthropic,
        "ToolSearch",
        Reply::tool("ToolSearch", json!({ "query": "select:mcp__relay__relay_inbox,mcp__relay__relay_fetch" })),
    );
    api.on(Api::Anthropic, "mcp__relay__relay_inbox", Reply::tool("mcp__relay__relay_inbox", json!({})));
    let fetch = json!({ "message": short, "name": "fix.patch" });
    api.on(Api::Anthropic, "Save a message's file with relay_fetch", Reply::tool("mcp__relay__relay_fetch", fetch));
    api.on(Api::Anthropic, "Another agent wrote this file", Reply::text("saved bob's patch"));
    let tools = "mcp__relay__relay_inbox,mcp__relay__relay_fetch";
    let out = claude_print(&project, "alice", "bob sent you something: save it here", tools).await;
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), api.summary());

    let requests = api.requests();
    let listed = requests.iter().find(|r| r.last_turn().contains("Save a message's file with relay_fetch"));
    let listed = listed.unwrap_or_else(|| panic!("the model saw the inbox: {}", api.summary())).last_turn();
    assert!(listed.contains("fix.patch"), "the file is named with the message: {listed}");
    assert!(
        requests.iter().any(|r| r.last_turn().contains("Another agent wrote this file")),
        "the model saw the fetch's result: {}",
        api.summary()
    );
    assert_eq!(std::fs::read_to_string(project.dir().join("fix.patch")).unwrap(), patch);
}

/// Topics with the real Claude Code: an idle session whose agent follows a topic is woken by a
/// post another machine makes to it, told who posted in which topic (never what), once.
#[tokio::test]
async fn an_idle_claude_code_session_is_woken_by_a_post_to_a_topic_it_follows() {
    let w = TwoMachines::start().await;
    let api = ModelApi::start().await;
    let mut bob = bob(&w).await;
    let project = ClaudeProject::new(&w.server.url, &w.laptop, &api.url);
    // The person allowed the tool once, as Claude Code asks them to.
    let allowed = json!({
        "enableAllProjectMcpServers": true,
        "permissions": { "allow": ["mcp__relay__relay_subscribe"] },
    });
    std::fs::write(project.dir().join(".claude/settings.local.json"), allowed.to_string()).unwrap();
    let env = project.env("alice");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let term = Terminal::start(&project.dir(), &env, &clients::program("claude"), &[]);
    online(&mut bob, "acme/laptop/alice").await;
    term.wait_for("\u{276f}", TURN).await;

    // A first turn follows the topic; then the session sits idle at its prompt.
    api.on(
        Api::Anthropic,
        "ToolSearch",
        Reply::tool("ToolSearch", json!({ "query": "select:mcp__relay__relay_subscribe" })),
    );
    api.on(
        Api::Anthropic,
        "mcp__relay__relay_subscribe",
        Reply::tool("mcp__relay__relay_subscribe", json!({ "topic": "#deploys" })),
    );
    api.on(Api::Anthropic, "come with your mail", Reply::text("following"));
    term.type_line("follow the deploys topic");
    let (followed, _) =
        api.wait_for("the follow's answer", 0, TURN, |r| r.last_turn().contains("come with your mail")).await;

    let posted = bob.tool_ok("relay_publish", json!({ "topic": "#deploys", "body": "deploy 12 is live" })).await;
    let id = posted["structuredContent"]["id"].as_str().unwrap().to_owned();
    let (woken, request) =
        api.wait_for("a turn woken by the post", followed + 1, TURN, |r| r.last_turn().contains("<relay-mail>")).await;
    let notice = request.last_turn();
    assert!(notice.contains(short_id(&id)) && notice.contains("from acme/ci/bob in acme/#deploys"), "{notice}");
    assert!(!notice.contains("deploy 12 is live"), "never the body in a user-role notice: {notice}");

    // Told once: the next woken turn names the next post only.
    let next = bob.tool_ok("relay_publish", json!({ "topic": "#deploys", "body": "deploy 13 is live" })).await;
    let next = next["structuredContent"]["id"].as_str().unwrap().to_owned();
    let (_, request) = api
        .wait_for("a turn woken by the next post", woken + 1, TURN, |r| r.last_turn().contains("<relay-mail>"))
        .await;
    let notice = request.last_turn();
    assert!(notice.contains(short_id(&next)) && !notice.contains(short_id(&id)), "{notice}");
}
