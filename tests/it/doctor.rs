//! `agent-bridge doctor` on a machine set up as a person would (logged in, Claude Code installed in
//! a project and approved there, Codex installed and its hook trusted), then with each thing broken
//! in turn: it names what is wrong and the fix, and exits non-zero.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use relay_proto::release::{Release, VERSION};
use relay_tests::clients;
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithin};
use relay_tests::server::Server;
use relay_tests::{bin, fake_relay};

/// A person's machine: a home logged in to the relay, and a project with Claude Code set up.
struct Machine {
    home: tempfile::TempDir,
    project: PathBuf,
    /// Directories put before the usual PATH (a stand-in client program, say).
    path_first: Vec<PathBuf>,
    /// RELAY_CONFIG, when not the default file.
    config: Option<PathBuf>,
}

impl Machine {
    fn new(server: &str, token: &str) -> Self {
        let home = clients::logged_in_home(server, token);
        let project = home.path().join("project");
        std::fs::create_dir(&project).unwrap();
        let project = project.canonicalize().unwrap();
        let machine = Self { home, project, path_first: Vec::new(), config: None };
        for client in ["claude", "codex"] {
            let out = machine.bridge(&["install", client]);
            assert!(out.status.success(), "install {client}: {}", said(&out));
        }
        // What the person approves once in each client (as Claude Code and Codex write it).
        let folder = machine.project.display().to_string();
        let state = serde_json::json!({ "projects": { folder: { "hasTrustDialogAccepted": true } } });
        std::fs::write(machine.home.path().join(".claude.json"), state.to_string()).unwrap();
        std::fs::write(machine.local_settings(), r#"{"enabledMcpjsonServers": ["relay"]}"#).unwrap();
        let codex = machine.codex_config();
        let trusted = format!(
            "{}\n[hooks.state.\"{}:stop:0:0\"]\ntrusted_hash = \"sha256:00\"\n",
            std::fs::read_to_string(&codex).unwrap(),
            machine.home.path().join(".codex/hooks.json").display()
        );
        std::fs::write(&codex, trusted).unwrap();
        machine
    }

    fn config_file(&self) -> PathBuf {
        self.home.path().join(".config/agent-relay/bridge.toml")
    }

    fn local_settings(&self) -> PathBuf {
        self.project.join(".claude/settings.local.json")
    }

    fn codex_config(&self) -> PathBuf {
        self.home.path().join(".codex/config.toml")
    }

    fn path(&self) -> String {
        let mut dirs = self.path_first.clone();
        dirs.push(bin("agent-bridge").parent().unwrap().to_path_buf());
        dirs.push(clients::bin_dir());
        let mut path = std::env::join_paths(dirs).unwrap().into_string().unwrap();
        path.push_str(&format!(":{}", clients::agent_path()));
        path
    }

    /// `agent-bridge ARGS` in the project, as this person.
    fn bridge(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin("agent-bridge"));
        cmd.args(args)
            .current_dir(&self.project)
            .env("HOME", self.home.path())
            .env("PATH", self.path())
            .env_remove("RELAY_SERVER")
            .env_remove("RELAY_TOKEN")
            .env_remove("RELAY_JOB_TOKEN")
            .env_remove("RELAY_CA")
            .env_remove("CODEX_HOME")
            .env_remove("CLAUDE_CONFIG_DIR")
            .stdin(Stdio::null());
        match &self.config {
            Some(config) => cmd.env("RELAY_CONFIG", config),
            None => cmd.env_remove("RELAY_CONFIG"),
        };
        cmd.output_within(COMMAND_LIMIT).expect("run agent-bridge")
    }

    async fn doctor(&self) -> (bool, String) {
        let out = tokio::task::block_in_place(|| self.bridge(&["doctor"]));
        (out.status.success(), said(&out))
    }

    /// Runs doctor with one thing broken by `break_it`, mended by `mend` after.
    async fn broken(
        &mut self,
        what: &str,
        fails: &[&str],
        break_it: impl FnOnce(&mut Self),
        mend: impl FnOnce(&mut Self),
    ) {
        break_it(self);
        let (ok, said) = self.doctor().await;
        assert!(!ok, "{what}: doctor passed:\n{said}");
        for line in fails {
            assert!(said.contains(line), "{what}: doctor did not say {line:?}:\n{said}");
        }
        assert_eq!(said.matches("\nFAIL").count(), 1, "{what}: one failure:\n{said}");
        mend(self);
    }
}

fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A version `steps` releases from this build's.
fn release(steps: u64) -> String {
    let this = Release::parse(VERSION).unwrap();
    format!("{}.{}.0", this.major, this.minor + steps)
}

/// A config like `original` that points at `server` with `token`.
fn config_for(dir: &Path, original: &Path, server: &str, token: Option<&str>) -> PathBuf {
    let mut config: toml::Table = toml::from_str(&std::fs::read_to_string(original).unwrap()).unwrap();
    config.insert("server".into(), server.into());
    if let Some(token) = token {
        config.insert("token".into(), token.into());
    }
    let path = dir.join(format!("bridge-{}.toml", rand::random::<u32>()));
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A stand-in for a client's program that prints `version`.
fn stand_in(dir: &Path, name: &str, version: &str) -> PathBuf {
    let bin = dir.join(format!("stand-in-{name}"));
    std::fs::create_dir_all(&bin).unwrap();
    let program = bin.join(name);
    std::fs::write(&program, format!("#!/bin/sh\necho '{version}'\n")).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_passes_a_machine_set_up_and_names_each_thing_broken_in_turn() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let token = server.machine("acme", "laptop");
    let mut m = Machine::new(&server.url, &token);
    let scratch = tempfile::tempdir().unwrap();

    let (ok, said) = m.doctor().await;
    assert!(ok, "a machine set up passes:\n{said}");
    for line in [
        &format!("ok    config: {}", m.config_file().display()),
        &format!("ok    server {}: relay-server {VERSION}, this machine is acme/laptop", server.url),
        "ok    clock: within",
        "ok    claude: the relay MCP server and hooks",
        "ok    claude: version 2.1.332, as measured",
        "ok    codex: the relay MCP server and hooks",
        "ok    codex: version 0.171.0, as measured",
        "everything this machine needs is in place",
    ] {
        assert!(said.contains(line), "{line:?} missing:\n{said}");
    }

    let config = m.config_file();
    let text = std::fs::read_to_string(&config).unwrap();
    let write_config = |text: &str| std::fs::write(&config, text).unwrap();
    m.broken(
        "no config",
        &["FAIL  config: none at", "fix: run `agent-bridge login --server URL`"],
        |_| std::fs::remove_file(&config).unwrap(),
        |_| write_config(&text),
    )
    .await;
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    m.broken(
        "a malformed config",
        &[
            &format!("{} cannot be used: line 1, column 10", config.display()),
            "fix: fix that line, or write the file anew with `agent-bridge login --server URL`",
        ],
        |_| write_config("server = http://nowhere\n"),
        |_| write_config(&text),
    )
    .await;
    m.broken(
        "a config others can read",
        &["is readable by other users (mode 644)", &format!("fix: chmod 600 {}", config.display())],
        |_| std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap(),
        |_| std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap(),
    )
    .await;

    let closed = format!("http://127.0.0.1:{}", relay_tests::free_port());
    let unreachable = config_for(scratch.path(), &config, &closed, None);
    m.broken(
        "the server out of reach",
        &[&format!("FAIL  server {closed}: cannot reach it"), "check that the server runs"],
        |m| m.config = Some(unreachable),
        |m| m.config = None,
    )
    .await;
    let wrong_token = "rlm_0000000000000000000000000000000000000000000000000000000000000000";
    let refused = config_for(scratch.path(), &config, &server.url, Some(wrong_token));
    m.broken(
        "a token the server refuses",
        &["the server refused this machine's token", "relay-server admin machine add ACCOUNT/MACHINE"],
        |m| m.config = Some(refused),
        |m| m.config = None,
    )
    .await;
    let newer = release(2);
    let too_new = config_for(scratch.path(), &config, &fake_relay::serve(&newer).await, None);
    m.broken(
        "a server two releases on",
        &[&format!("agent-bridge {VERSION} is too old for relay-server {newer}"), "agent-bridge-installer.sh | sh"],
        |m| m.config = Some(too_new),
        |m| m.config = None,
    )
    .await;
    let skewed = config_for(scratch.path(), &config, &fake_relay::serve_with_clock(VERSION, 300_000).await, None);
    m.broken(
        "a clock five minutes slow",
        &["clock: 300 s behind", "NTP"],
        |m| m.config = Some(skewed),
        |m| m.config = None,
    )
    .await;

    let settings = m.project.join(".claude/settings.json");
    let hooks = std::fs::read_to_string(&settings).unwrap();
    m.broken(
        "Claude Code's Stop hook removed",
        &["claude: the relay Stop hook is missing from", "fix: run `agent-bridge install claude` in"],
        |_| std::fs::write(&settings, hooks.replace(" hook stop\"", " hook gone\"")).unwrap(),
        |_| std::fs::write(&settings, &hooks).unwrap(),
    )
    .await;
    let mcp = m.project.join(".mcp.json");
    let entry = std::fs::read_to_string(&mcp).unwrap();
    m.broken(
        "the entry's program gone",
        &["runs `/opt/gone/agent-bridge`, which is not there"],
        |_| std::fs::write(&mcp, entry.replace("\"agent-bridge\"", "\"/opt/gone/agent-bridge\"")).unwrap(),
        |_| std::fs::write(&mcp, &entry).unwrap(),
    )
    .await;
    let state = m.home.path().join(".claude.json");
    let approvals = std::fs::read_to_string(&state).unwrap();
    m.broken(
        "the folder not trusted",
        &["claude: this folder", "is not trusted yet", "start `claude` here once"],
        |_| std::fs::write(&state, "{}").unwrap(),
        |_| std::fs::write(&state, &approvals).unwrap(),
    )
    .await;
    let local = m.local_settings();
    m.broken(
        "the MCP server not approved",
        &["the project's MCP server `relay` is not approved yet"],
        |_| std::fs::remove_file(&local).unwrap(),
        |m| std::fs::write(m.local_settings(), r#"{"enabledMcpjsonServers": ["relay"]}"#).unwrap(),
    )
    .await;
    let codex = m.codex_config();
    let trusted = std::fs::read_to_string(&codex).unwrap();
    m.broken(
        "Codex's hook not trusted",
        &["codex: the relay Stop hook is not trusted yet", "Trust all and continue"],
        |_| std::fs::write(&codex, trusted.split("\n[hooks.state").next().unwrap()).unwrap(),
        |_| std::fs::write(&codex, &trusted).unwrap(),
    )
    .await;
    let old_claude = stand_in(scratch.path(), "claude", "2.0.14 (Claude Code)");
    m.broken(
        "Claude Code older than measured",
        &["claude: version 2.0.14 is older than 2.1.332", "npm install -g @anthropic-ai/claude-code@2.1.332"],
        |m| m.path_first.push(old_claude),
        |m| m.path_first.clear(),
    )
    .await;

    let (ok, said) = m.doctor().await;
    assert!(ok, "mended, it passes again:\n{said}");
}
