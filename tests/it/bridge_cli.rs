//! `agent-bridge login` and `agent-bridge install`, run as a user runs them.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use relay_tests::bin;
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithin};
use relay_tests::server::Server;
use serde_json::Value;

fn bridge_cmd(home: &std::path::Path, args: &[&str]) -> Output {
    bridge_cmd_with(home, args, "", &[])
}

/// Runs the real binary as a user would: in `home`, with `stdin` piped in and only `env` set of
/// the relay's variables.
fn bridge_cmd_with(home: &std::path::Path, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    use std::io::Write;
    let mut child = Command::new(bin("agent-bridge"))
        .args(args)
        .current_dir(home)
        .env("HOME", home)
        .env("PATH", "/usr/bin:/bin")
        .env_remove("RELAY_CONFIG")
        .env_remove("RELAY_SERVER")
        .env_remove("RELAY_TOKEN")
        .env_remove("RELAY_HUMAN_TOKEN")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test]
async fn login_reads_the_token_from_stdin_and_writes_a_private_config() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let token = server.machine("acme", "laptop");
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join(".config/agent-relay/bridge.toml");
    let (url, dir) = (server.url.clone(), home.path().to_path_buf());

    let bad = blocking(move || {
        let wrong = "rlm_0000000000000000000000000000000000000000000000000000000000000000\n";
        bridge_cmd_with(&dir, &["login", "--server", &url], wrong, &[])
    })
    .await;
    assert!(!bad.status.success());
    assert!(said(&bad).contains("refused the token"), "{}", said(&bad));
    assert!(!config.exists(), "a refused token is not stored");

    // A stale temporary file with loose permissions, as an earlier version could leave behind.
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    let stale = config.with_extension("toml.tmp");
    std::fs::write(&stale, "stale").unwrap();
    std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(config.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();

    let (url, dir, t) = (server.url.clone(), home.path().to_path_buf(), token.clone());
    let ok = blocking(move || bridge_cmd_with(&dir, &["login", "--server", &url], &format!("{t}\n"), &[])).await;
    assert!(ok.status.success(), "{}", said(&ok));
    assert!(said(&ok).contains("acme/laptop"));
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains(&token) && text.contains(&server.url), "{text}");
    assert_eq!(std::fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(config.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
    assert!(!stale.exists(), "the stale file is gone");
    assert!(ok.stdout.is_empty(), "login prints nothing on stdout");

    // From the environment works too; a token in argv still works, with a warning.
    let (url, dir, t) = (server.url.clone(), home.path().to_path_buf(), token.clone());
    let from_env =
        blocking(move || bridge_cmd_with(&dir, &["login", "--server", &url], "", &[("RELAY_TOKEN", &t)])).await;
    assert!(from_env.status.success(), "{}", said(&from_env));
    let (url, dir, t) = (server.url.clone(), home.path().to_path_buf(), token.clone());
    let argv = blocking(move || bridge_cmd(&dir, &["login", "--server", &url, "--token", &t])).await;
    assert!(argv.status.success() && said(&argv).contains("visible to every user"), "{}", said(&argv));

    let (dir, t) = (home.path().to_path_buf(), token.clone());
    let unreachable =
        blocking(move || bridge_cmd_with(&dir, &["login", "--server", "http://127.0.0.1:1"], &t, &[])).await;
    assert!(!unreachable.status.success());
    let empty = blocking({
        let (url, dir) = (server.url.clone(), home.path().to_path_buf());
        move || bridge_cmd_with(&dir, &["login", "--server", &url], "", &[])
    })
    .await;
    assert!(!empty.status.success() && said(&empty).contains("no machine token"), "{}", said(&empty));
}

#[tokio::test]
async fn a_person_needs_no_machine_token() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    server.admin_ok(&["account", "create", "acme"]);
    let human = server.admin_ok(&["human", "add", "acme"]);
    let home = tempfile::tempdir().unwrap();

    // Only the server and the human token, from the environment.
    let (url, dir, h) = (server.url.clone(), home.path().to_path_buf(), human.clone());
    let listed = blocking(move || {
        bridge_cmd_with(&dir, &["human", "contact", "list"], "", &[("RELAY_SERVER", &url), ("RELAY_HUMAN_TOKEN", &h)])
    })
    .await;
    assert!(listed.status.success(), "{}", said(&listed));
    assert!(said(&listed).contains("no contacts"), "an empty list says so: {}", said(&listed));

    // human login on a computer with no machine login: the token from stdin, kept in its own file.
    let (url, dir, h) = (server.url.clone(), home.path().to_path_buf(), human.clone());
    let login =
        blocking(move || bridge_cmd_with(&dir, &["human", "login", "--server", &url], &format!("{h}\n"), &[])).await;
    assert!(login.status.success(), "{}", said(&login));
    assert!(said(&login).contains("logged in"), "{}", said(&login));
    let file = home.path().join(".config/agent-relay/human.toml");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(!home.path().join(".config/agent-relay/bridge.toml").exists(), "no machine config is made");

    // The stored token goes only to the server it was stored for.
    let dir = home.path().to_path_buf();
    let elsewhere =
        blocking(move || bridge_cmd_with(&dir, &["human", "holds"], "", &[("RELAY_SERVER", "http://127.0.0.1:1")]))
            .await;
    assert!(!elsewhere.status.success(), "{}", said(&elsewhere));
    assert!(said(&elsewhere).contains("your human token was stored for"), "{}", said(&elsewhere));

    let dir = home.path().to_path_buf();
    let held = blocking(move || bridge_cmd(&dir, &["human", "holds"])).await;
    assert!(held.status.success(), "{}", said(&held));
    assert!(said(&held).contains("no held messages"), "{}", said(&held));
    let dir = home.path().to_path_buf();
    let asked = blocking(move || bridge_cmd(&dir, &["human", "contact", "request", "globex"])).await;
    assert!(!asked.status.success() && said(&asked).contains("globex"), "{}", said(&asked));
    server.admin_ok(&["account", "create", "globex"]);
    let dir = home.path().to_path_buf();
    let asked = blocking(move || bridge_cmd(&dir, &["human", "contact", "request", "globex"])).await;
    assert!(asked.status.success(), "{}", said(&asked));
    assert!(said(&asked).contains("asked globex for a contact"), "a success says so: {}", said(&asked));

    let dir = home.path().to_path_buf();
    let nothing = blocking(move || bridge_cmd(&dir, &["human", "inbox"])).await;
    assert!(nothing.status.success() && said(&nothing).contains("no unread messages"), "{}", said(&nothing));
    let gone = tempfile::tempdir().unwrap();
    let none = bridge_cmd(gone.path(), &["human", "inbox"]);
    assert!(!none.status.success() && said(&none).contains("RELAY_SERVER"), "{}", said(&none));
}

#[tokio::test]
async fn login_and_human_commands_say_the_servers_certificate_was_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let issued = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
    std::fs::write(&cert, issued.cert.pem()).unwrap();
    std::fs::write(&key, issued.signing_key.serialize_pem()).unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let wrong = dir.path().join("other-ca.crt");
    std::fs::write(&wrong, other.cert.pem()).unwrap();
    let db = TestDb::new().await;
    let server = Server::start_tls(&db, &cert, &key).await;
    let token = server.machine("acme", "laptop");
    let human = server.admin_ok(&["human", "add", "acme"]);
    let home = tempfile::tempdir().unwrap();
    let untrusted = |out: &Output| {
        let said = said(out);
        assert!(!out.status.success(), "{said}");
        assert!(said.contains("the server's certificate was not trusted"), "{said}");
        assert!(said.contains(&wrong.display().to_string()), "names the CA used: {said}");
        assert!(!said.contains("try again shortly"), "{said}");
    };
    let run = |args: Vec<String>, stdin: String, env: Vec<(&'static str, String)>| {
        let dir = home.path().to_path_buf();
        blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            bridge_cmd_with(&dir, &args, &stdin, &env)
        })
    };
    let url = server.url.clone();
    let (wrong_ca, right_ca) = (wrong.display().to_string(), cert.display().to_string());
    let args = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();

    // A machine login with the wrong CA, by flag or from RELAY_CA: nothing is stored.
    let out = run(args(&["login", "--server", &url, "--ca", &wrong_ca]), format!("{token}\n"), vec![]).await;
    untrusted(&out);
    let out = run(args(&["login", "--server", &url]), format!("{token}\n"), vec![("RELAY_CA", wrong_ca.clone())]).await;
    untrusted(&out);
    assert!(!home.path().join(".config/agent-relay/bridge.toml").exists());
    let out = run(args(&["login", "--server", &url]), format!("{token}\n"), vec![("RELAY_CA", right_ca.clone())]).await;
    assert!(out.status.success(), "{}", said(&out));

    // A person's commands: the inbox with only RELAY_SERVER, RELAY_HUMAN_TOKEN and the wrong RELAY_CA.
    let person = [("RELAY_SERVER", url.clone()), ("RELAY_HUMAN_TOKEN", human.clone())];
    let with_ca = |ca: &str| person.iter().cloned().chain([("RELAY_CA", ca.to_owned())]).collect::<Vec<_>>();
    untrusted(&run(args(&["human", "inbox"]), String::new(), with_ca(&wrong_ca)).await);
    let out = run(args(&["human", "inbox"]), String::new(), with_ca(&right_ca)).await;
    assert!(out.status.success() && said(&out).contains("no unread messages"), "{}", said(&out));

    // human login --server honours RELAY_CA as RELAY_SERVER does: the wrong one is refused, the
    // right one is used and kept with the login.
    let login = args(&["human", "login", "--server", &url]);
    let out = run(login.clone(), format!("{human}\n"), vec![("RELAY_CA", wrong_ca.clone())]).await;
    untrusted(&out);
    let out = run(login, format!("{human}\n"), vec![("RELAY_CA", right_ca.clone())]).await;
    assert!(out.status.success(), "{}", said(&out));
    let kept = std::fs::read_to_string(home.path().join(".config/agent-relay/human.toml")).unwrap();
    assert!(kept.contains(&right_ca), "{kept}");
    let out = run(args(&["human", "inbox"]), String::new(), vec![]).await;
    assert!(out.status.success() && said(&out).contains("no unread messages"), "{}", said(&out));
}

/// The bridge binary at another path (a hard link: its own path, one copy on disk).
fn bridge_at(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("agent-bridge");
    if std::fs::hard_link(bin("agent-bridge"), &path).is_err() {
        std::fs::copy(bin("agent-bridge"), &path).unwrap();
    }
    path
}

fn run_install(program: &std::path::Path, home: &std::path::Path, client: &str, path_env: &str) -> Output {
    let out = Command::new(program)
        .args(["install", client])
        .current_dir(home)
        .env("HOME", home)
        .env("PATH", path_env)
        .output_within(COMMAND_LIMIT)
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    out
}

fn stop_hooks(settings: &str) -> Vec<String> {
    let doc: Value = serde_json::from_str(settings).unwrap();
    doc["hooks"]["Stop"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["hooks"].as_array().unwrap().iter().map(|h| h["command"].as_str().unwrap().to_owned()))
        .collect()
}

/// `install claude` run again in `dir`, its output.
fn out_of(dir: &std::path::Path) -> Output {
    let out = bridge_cmd(dir, &["install", "claude"]);
    assert!(out.status.success(), "{}", said(&out));
    out
}

/// Inside a git repository, installing a client offers the pre-commit guard (and writes no hook).
#[test]
fn install_inside_a_repository_offers_the_guard() {
    let home = tempfile::tempdir().unwrap();
    let init = Command::new("git").args(["init", "-q"]).current_dir(home.path()).status().unwrap();
    assert!(init.success());
    let out = out_of(home.path());
    assert!(said(&out).contains("`agent-bridge install --guard`"), "{}", said(&out));
    assert!(!home.path().join(".git/hooks/pre-commit").exists(), "offered, not written");
}

#[test]
fn install_writes_client_configs_idempotently_without_the_token() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join(".mcp.json"), r#"{"mcpServers":{"other":{"command":"x"}}}"#).unwrap();
    for _ in 0..2 {
        let out = bridge_cmd(home.path(), &["install", "claude"]);
        assert!(out.status.success(), "{}", said(&out));
        assert!(said(&out).contains("--dangerously-load-development-channels"), "how to turn channels on");
    }
    assert!(!said(&out_of(home.path())).contains("install --guard"), "no guard offered outside a repository");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(home.path().join(".mcp.json")).unwrap()).unwrap();
    assert_eq!(doc["mcpServers"]["other"]["command"], "x", "other servers are kept");
    let settings: Value =
        serde_json::from_str(&std::fs::read_to_string(home.path().join(".claude/settings.json")).unwrap()).unwrap();
    let wake = &settings["hooks"]["Stop"][1]["hooks"][0];
    assert!(wake["command"].as_str().unwrap().ends_with("agent-bridge hook wake"), "{settings}");
    assert_eq!(wake["asyncRewake"], true, "it runs in the background and wakes the session: {settings}");
    assert!(wake["timeout"].as_u64().unwrap() > 24 * 3600, "Claude Code does not end it first: {settings}");
    let relay = &doc["mcpServers"]["relay"];
    assert!(relay["command"].as_str().unwrap().ends_with("agent-bridge"), "{relay}");
    assert_eq!(relay["args"], serde_json::json!(["mcp", "--harness", "claude", "--channels"]));
    assert!(relay.get("env").is_none(), "no credential in a file that gets committed");

    let out = bridge_cmd(home.path(), &["install", "codex"]);
    assert!(out.status.success(), "{}", said(&out));
    let codex = std::fs::read_to_string(home.path().join(".codex/config.toml")).unwrap();
    assert!(codex.contains("[mcp_servers.relay]") && codex.contains("\"--harness\", \"codex\""), "{codex}");
    assert!(!codex.contains("rlm_"));

    assert!(codex.contains("default_tools_approval_mode = \"approve\""), "codex exec may call every tool: {codex}");
    assert!(said(&out).contains("Trust all and continue"), "how to trust the hook: {}", said(&out));
    let hooks: Value =
        serde_json::from_str(&std::fs::read_to_string(home.path().join(".codex/hooks.json")).unwrap()).unwrap();
    assert!(
        hooks["hooks"]["Stop"][0]["hooks"][0]["command"].as_str().unwrap().ends_with("agent-bridge hook codex-stop")
    );

    for client in ["gemini", "cursor"] {
        let out = bridge_cmd(home.path(), &["install", client]);
        assert!(out.status.success(), "{}", said(&out));
        assert!(said(&out).contains("cannot be woken"), "what {client} cannot do is said: {}", said(&out));
    }
    let gemini: Value =
        serde_json::from_str(&std::fs::read_to_string(home.path().join(".gemini/settings.json")).unwrap()).unwrap();
    assert_eq!(gemini["mcpServers"]["relay"]["trust"], true, "gemini -p may call the relay tools: {gemini}");
    let after = gemini["hooks"]["AfterAgent"][0]["hooks"][0]["command"].as_str().unwrap();
    assert!(after.ends_with("agent-bridge hook gemini-after-agent"), "{gemini}");
    assert!(home.path().join(".cursor/mcp.json").exists());
    let cursor: Value =
        serde_json::from_str(&std::fs::read_to_string(home.path().join(".cursor/hooks.json")).unwrap()).unwrap();
    assert!(cursor["hooks"]["stop"][0]["command"].as_str().unwrap().ends_with("agent-bridge hook cursor-stop"));

    let unknown = bridge_cmd(home.path(), &["install", "vim"]);
    assert!(!unknown.status.success());
}

#[test]
fn install_keeps_comments_and_key_order_and_follows_a_moved_binary() {
    let home = tempfile::tempdir().unwrap();
    // Gemini's settings are JSONC: comments and key order must come back as they were.
    let gemini = home.path().join(".gemini/settings.json");
    std::fs::create_dir_all(gemini.parent().unwrap()).unwrap();
    let commented = "{\n  // my theme\n  \"theme\": \"dark\",\n  /* servers */\n  \"mcpServers\": {\n    \"zeta\": { \"command\": \"z\" },\n    \"alpha\": { \"command\": \"a\" }\n  },\n  \"autoAccept\": false\n}\n";
    std::fs::write(&gemini, commented).unwrap();
    // Two installs of the binary, neither on PATH at first.
    let target = bin("agent-bridge").parent().unwrap().to_path_buf();
    let places = tempfile::tempdir_in(&target).unwrap();
    let (first, second) = (bridge_at(&places.path().join("a")), bridge_at(&places.path().join("b")));
    run_install(&first, home.path(), "gemini", "/usr/bin:/bin");
    run_install(&first, home.path(), "gemini", "/usr/bin:/bin");
    let text = std::fs::read_to_string(&gemini).unwrap();
    assert!(text.contains("// my theme") && text.contains("/* servers */"), "comments kept: {text}");
    let order = ["\"theme\"", "\"zeta\"", "\"alpha\"", "\"relay\"", "\"autoAccept\""].map(|k| text.find(k).unwrap());
    assert!(order.windows(2).all(|w| w[0] < w[1]), "key order kept, relay added after the others: {text}");
    let doc: Value = jsonc(&text);
    assert_eq!(doc["mcpServers"]["relay"]["command"], first.display().to_string());

    // Claude Code's project files: an install from the first path, then from the second after the binary moved.
    let out = run_install(&first, home.path(), "claude", "/usr/bin:/bin");
    assert!(said(&out).contains("only valid on this computer"), "{}", said(&out));
    run_install(&second, home.path(), "claude", "/usr/bin:/bin");
    let settings = std::fs::read_to_string(home.path().join(".claude/settings.json")).unwrap();
    let (stop, wake) = (format!("{} hook stop", second.display()), format!("{} hook wake", second.display()));
    assert_eq!(stop_hooks(&settings), [stop, wake], "one hook of each, updated: {settings}");
    // With agent-bridge on PATH, files a project commits name it bare.
    let path_env = format!("{}:/usr/bin:/bin", second.parent().unwrap().display());
    run_install(&second, home.path(), "claude", &path_env);
    let settings = std::fs::read_to_string(home.path().join(".claude/settings.json")).unwrap();
    assert_eq!(stop_hooks(&settings), ["agent-bridge hook stop", "agent-bridge hook wake"], "{settings}");
    let mcp: Value = serde_json::from_str(&std::fs::read_to_string(home.path().join(".mcp.json")).unwrap()).unwrap();
    assert_eq!(mcp["mcpServers"]["relay"]["command"], "agent-bridge");

    // Codex's notify follows a moved binary when it is Relay's, and is left alone when it is not.
    run_install(&first, home.path(), "codex", "/usr/bin:/bin");
    run_install(&second, home.path(), "codex", "/usr/bin:/bin");
    let codex = std::fs::read_to_string(home.path().join(".codex/config.toml")).unwrap();
    let notify = format!("notify = [\"{}\", \"hook\", \"codex-notify\"]", second.display());
    assert!(codex.contains(&notify) && !codex.contains(&first.display().to_string()), "{codex}");
    std::fs::write(home.path().join(".codex/config.toml"), "notify = [\"my-notifier\"]\n").unwrap();
    let out = run_install(&second, home.path(), "codex", "/usr/bin:/bin");
    assert!(said(&out).contains("notify program of its own"), "{}", said(&out));
    let codex = std::fs::read_to_string(home.path().join(".codex/config.toml")).unwrap();
    assert!(codex.starts_with("notify = [\"my-notifier\"]"), "{codex}");
}

/// Where each key first appears in `text`, checked to come in the order given.
fn in_order(text: &str, keys: &[&str]) {
    let at: Vec<usize> = keys
        .iter()
        .map(|k| text.find(&format!("\"{k}\"")).unwrap_or_else(|| panic!("{k} is missing: {text}")))
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "keys not in the order {keys:?}: {text}");
}

#[test]
fn install_keeps_every_clients_file_and_follows_a_moved_binary() {
    let home = tempfile::tempdir().unwrap();
    let target = bin("agent-bridge").parent().unwrap().to_path_buf();
    let places = tempfile::tempdir_in(&target).unwrap();
    let (first, second) = (bridge_at(&places.path().join("a")), bridge_at(&places.path().join("b")));
    let bare_path = format!("{}:/usr/bin:/bin", second.parent().unwrap().display());
    let write = |rel: &str, text: &str| {
        let path = home.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    };

    // Cursor's settings are JSONC too: comments and key order stay; one relay entry follows the binary.
    let cursor = write(
        ".cursor/mcp.json",
        "{\n  // servers of this project\n  \"mcpServers\": {\n    \"zeta\": { \"command\": \"z\" },\n    /* keep alpha */\n    \"alpha\": { \"command\": \"a\" }\n  },\n  \"yolo\": true\n}\n",
    );
    for program in [&first, &second] {
        run_install(program, home.path(), "cursor", "/usr/bin:/bin");
        let text = std::fs::read_to_string(&cursor).unwrap();
        assert!(text.contains("// servers of this project") && text.contains("/* keep alpha */"), "{text}");
        in_order(&text, &["mcpServers", "zeta", "alpha", "relay", "yolo"]);
        assert_eq!(text.matches("\"relay\"").count(), 1, "one entry: {text}");
        assert_eq!(jsonc(&text)["mcpServers"]["relay"]["command"], program.display().to_string(), "{text}");
    }
    // With agent-bridge on PATH, the project file names it bare.
    run_install(&second, home.path(), "cursor", &bare_path);
    let text = std::fs::read_to_string(&cursor).unwrap();
    assert_eq!(jsonc(&text)["mcpServers"]["relay"]["command"], "agent-bridge", "{text}");
    assert_eq!(jsonc(&text)["mcpServers"]["relay"]["args"], serde_json::json!(["mcp", "--harness", "cursor"]));

    // Gemini after the binary moved: the one entry names the new place, comments kept.
    let gemini = write(".gemini/settings.json", "{\n  // mine\n  \"theme\": \"dark\"\n}\n");
    for program in [&first, &second] {
        run_install(program, home.path(), "gemini", "/usr/bin:/bin");
    }
    let text = std::fs::read_to_string(&gemini).unwrap();
    assert!(text.contains("// mine") && text.matches("\"relay\"").count() == 1, "{text}");
    in_order(&text, &["theme", "mcpServers", "relay"]);
    assert_eq!(jsonc(&text)["mcpServers"]["relay"]["command"], second.display().to_string(), "{text}");

    // Claude Code's files with keys in no sorted order and the user's own server and hook: all as it was.
    let mcp = write(
        ".mcp.json",
        r#"{"mcpServers":{"zeta":{"type":"stdio","command":"z","args":["x"]},"alpha":{"command":"a"}},"version":2}"#,
    );
    let settings = write(
        ".claude/settings.json",
        r#"{"permissions":{"deny":[],"allow":["Bash"]},"hooks":{"Stop":[{"hooks":[{"type":"command","command":"other"}]}],"PreToolUse":[]},"model":"opus"}"#,
    );
    run_install(&second, home.path(), "claude", &bare_path);
    let text = std::fs::read_to_string(&mcp).unwrap();
    in_order(&text, &["mcpServers", "zeta", "type", "command", "args", "alpha", "relay", "version"]);
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["mcpServers"]["zeta"], serde_json::json!({"type": "stdio", "command": "z", "args": ["x"]}));
    assert_eq!(doc["mcpServers"]["relay"]["command"], "agent-bridge");
    let text = std::fs::read_to_string(&settings).unwrap();
    in_order(&text, &["permissions", "deny", "allow", "hooks", "Stop", "PreToolUse", "model"]);
    assert_eq!(stop_hooks(&text), ["other", "agent-bridge hook stop", "agent-bridge hook wake"], "{text}");

    // Codex: comments and an env table the user added to Relay's entry survive a reinstall from the new place.
    let codex = write(
        ".codex/config.toml",
        &format!(
            "# my codex\nmodel = \"o3\"\n\n[mcp_servers.relay]\ncommand = \"{}\" # where it was\nargs = [\"mcp\", \"--harness\", \"codex\"]\ntool_timeout_sec = 90\n\n# a handle per project\n[mcp_servers.relay.env]\nRELAY_HANDLE = \"reviewer\"\n",
            first.display()
        ),
    );
    run_install(&second, home.path(), "codex", "/usr/bin:/bin");
    let text = std::fs::read_to_string(&codex).unwrap();
    assert!(text.starts_with("# my codex\nmodel = \"o3\""), "{text}");
    assert!(text.contains("# where it was") && text.contains("# a handle per project"), "comments kept: {text}");
    let doc: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}: {text}"));
    let relay = &doc["mcp_servers"]["relay"];
    assert_eq!(relay["command"].as_str(), Some(second.display().to_string().as_str()), "{text}");
    assert_eq!(relay["tool_timeout_sec"].as_integer(), Some(90), "{text}");
    assert_eq!(relay["env"]["RELAY_HANDLE"].as_str(), Some("reviewer"), "the user's env stays: {text}");
    assert!(!text.contains(&first.display().to_string()), "{text}");
}

/// Reads JSON with comments, as the clients do.
fn jsonc(text: &str) -> Value {
    let plain: String =
        text.lines().filter(|l| !l.trim_start().starts_with("//") && !l.trim_start().starts_with("/*")).collect();
    serde_json::from_str(&plain).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn mcp_without_a_configured_server_says_how_to_set_one_up() {
    let home = tempfile::tempdir().unwrap();
    let out = bridge_cmd(home.path(), &["mcp"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("agent-bridge login"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "nothing but MCP on stdout");

    // A config it cannot use is named for what it is, by every command that reads it.
    let config = home.path().join(".config/agent-relay/bridge.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, "server = \"http://127.0.0.1:7447\"\ntoken = rlm_not_quoted\n").unwrap();
    for args in [&["mcp"][..], &["spawn", "--", "true"], &["worker", "--once"], &["human", "holds"]] {
        let out = bridge_cmd(home.path(), args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            said.contains(&format!("{} cannot be used: line 2, column 9", config.display()))
                && said.contains("agent-bridge login --server URL"),
            "{args:?}: {said}"
        );
    }
}
