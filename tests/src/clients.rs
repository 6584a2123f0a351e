//! The real agent CLIs the tests drive: Claude Code, Codex and Gemini CLI at the versions
//! `tests/clients/package.json` pins (`package-lock.json` beside it), installed with `npm ci` into
//! `target/clients` the first time a test asks for one, and not again while the lock file is
//! unchanged. Without npm the test fails and says what to install: it is never skipped.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::bin;
use crate::process::{COMMAND_LIMIT, INSTALL_LIMIT, RunWithin};

/// The installed CLIs' directory of programs (`node_modules/.bin`), installing them first when
/// they are missing or older than the lock file says (`tests/clients`).
pub fn bin_dir() -> PathBuf {
    static READY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    READY
        .get_or_init(|| {
            crate::npm::installed("clients", "the pinned agent CLIs (Claude Code, Codex, Gemini CLI)", |dir| {
                // Install scripts stay off (Gemini CLI's would build a terminal library from
                // source); Claude Code's own one only links its native binary into place, so it is
                // run by name.
                let linked = Command::new("node")
                    .arg(dir.join("node_modules/@anthropic-ai/claude-code/install.cjs"))
                    .current_dir(dir)
                    .stdin(Stdio::null())
                    .status_within(INSTALL_LIMIT)
                    .expect("run node");
                assert!(linked.success(), "Claude Code's install script failed: see its output above");
            })
        })
        .clone()
}

/// One client's program.
pub fn program(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(path.exists(), "{} is missing after npm ci", path.display());
    path
}

/// A program the tests need from the system: its path, or a failure naming the package.
pub fn system(program: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("{program} is not on PATH: the real-client tests need it (apt-get install {package})")
    })
}

/// A home directory logged in to the relay as a machine (`agent-bridge login`, the token on its
/// environment), as a person sets one up before starting an agent.
pub fn logged_in_home(server: &str, token: &str) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(bin("agent-bridge"))
        .args(["login", "--server", server])
        .env("HOME", home.path())
        .env("RELAY_TOKEN", token)
        .env_remove("RELAY_CONFIG")
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .expect("run agent-bridge login");
    assert!(out.status.success(), "login failed: {}", String::from_utf8_lossy(&out.stderr));
    home
}

/// PATH for an agent: the bridge's directory first (so `install` names it bare, as for a person who
/// installed it), then the Node.js the tests run with (`./test` may have brought one newer than the
/// system's), then the system's.
pub fn agent_path() -> String {
    let node = system("node", "nodejs");
    format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        bin("agent-bridge").parent().unwrap().display(),
        node.parent().unwrap().display()
    )
}

/// The person's runtime directory, as a desktop session sets `XDG_RUNTIME_DIR`: every client runs
/// with it, though a client may not pass it on (Codex starts MCP servers with a fixed few
/// variables), so nothing of the relay's may depend on it.
pub fn runtime_dir(home: &Path) -> String {
    let dir = home.join(".run");
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).unwrap();
    dir.display().to_string()
}

/// Runs `agent-bridge install CLIENT` in `cwd` for the person whose home is `home`.
pub fn install(client: &str, home: &Path, cwd: &Path) -> String {
    let out = Command::new(bin("agent-bridge"))
        .args(["install", client])
        .current_dir(cwd)
        .env("HOME", home)
        .env("PATH", agent_path())
        .env_remove("CODEX_HOME")
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .expect("run agent-bridge install");
    assert!(out.status.success(), "install {client} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The API key Claude Code is given: a made-up one, which the scripted Messages API accepts.
const CLAUDE_KEY: &str = "sk-ant-api03-relaytestrelaytestrelaytestrelaytestrelaytestrelaytestrelaytest-AA";

/// A project set up for Claude Code as a person would: logged in, `agent-bridge install claude`
/// run in it, and the once-only approvals given (onboarding done, the API key and the folder
/// trusted, the project's MCP server `relay` enabled).
pub struct ClaudeProject {
    pub home: tempfile::TempDir,
    pub project: tempfile::TempDir,
    api: String,
}

impl ClaudeProject {
    pub fn new(server: &str, token: &str, api: &str) -> Self {
        let home = logged_in_home(server, token);
        let project = tempfile::tempdir().unwrap();
        let dir = project.path().canonicalize().unwrap();
        install("claude", home.path(), &dir);
        let approvals = serde_json::json!({
            "hasCompletedOnboarding": true,
            "theme": "dark",
            "customApiKeyResponses": { "approved": [&CLAUDE_KEY[CLAUDE_KEY.len() - 20..]], "rejected": [] },
            "projects": { dir.display().to_string(): { "hasTrustDialogAccepted": true, "allowedTools": [] } },
        });
        std::fs::write(home.path().join(".claude.json"), approvals.to_string()).unwrap();
        let local = serde_json::json!({ "enableAllProjectMcpServers": true });
        std::fs::write(dir.join(".claude").join("settings.local.json"), local.to_string()).unwrap();
        Self { home, project, api: api.to_owned() }
    }

    /// A project whose Claude Code reaches the relay with no bridge, at the server's MCP endpoint
    /// `mcp_url`, configured as the README says (`claude mcp add --transport http`, the token from
    /// `RELAY_TOKEN` in its environment, the handle in `Relay-Handle`).
    pub fn remote(mcp_url: &str, handle: &str, api: &str) -> Self {
        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        let dir = project.path().canonicalize().unwrap();
        let approvals = serde_json::json!({
            "hasCompletedOnboarding": true,
            "theme": "dark",
            "customApiKeyResponses": { "approved": [&CLAUDE_KEY[CLAUDE_KEY.len() - 20..]], "rejected": [] },
            "projects": { dir.display().to_string(): { "hasTrustDialogAccepted": true, "allowedTools": [] } },
        });
        std::fs::write(home.path().join(".claude.json"), approvals.to_string()).unwrap();
        let out = Command::new(program("claude"))
            .args(["mcp", "add", "--scope", "user", "--transport", "http", "relay", mcp_url])
            .args(["--header", "Authorization: Bearer ${RELAY_TOKEN}", "--header"])
            .arg(format!("Relay-Handle: {handle}"))
            .current_dir(&dir)
            .env("HOME", home.path())
            .env("PATH", agent_path())
            .env("DISABLE_AUTOUPDATER", "1")
            .output_within(COMMAND_LIMIT)
            .expect("run claude mcp add");
        assert!(out.status.success(), "claude mcp add failed: {}", String::from_utf8_lossy(&out.stderr));
        Self { home, project, api: api.to_owned() }
    }

    pub fn dir(&self) -> PathBuf {
        self.project.path().canonicalize().unwrap()
    }

    /// The environment Claude Code runs with; `handle` is the relay handle its bridge claims.
    pub fn env(&self, handle: &str) -> Vec<(&'static str, String)> {
        vec![
            ("HOME", self.home.path().display().to_string()),
            ("XDG_RUNTIME_DIR", runtime_dir(self.home.path())),
            ("PATH", agent_path()),
            ("LANG", "C.UTF-8".into()),
            ("ANTHROPIC_API_KEY", CLAUDE_KEY.into()),
            ("ANTHROPIC_BASE_URL", self.api.clone()),
            ("DISABLE_AUTOUPDATER", "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("RELAY_HANDLE", handle.into()),
        ]
    }
}

/// A home set up for Codex as a person would: logged in, its model provider configured (here the
/// scripted Responses API at `api`), and `agent-bridge install codex` run.
pub struct CodexHome {
    pub home: tempfile::TempDir,
    pub project: tempfile::TempDir,
}

impl CodexHome {
    pub fn new(server: &str, token: &str, api: &str) -> Self {
        let home = logged_in_home(server, token);
        let codex = home.path().join(".codex");
        std::fs::create_dir_all(&codex).unwrap();
        let config = format!(
            "model = \"gpt-5\"\nmodel_provider = \"scripted\"\ncheck_for_update_on_startup = false\n\
             disable_paste_burst = true\n\n[model_providers.scripted]\nname = \"scripted\"\n\
             base_url = \"{api}/v1\"\nwire_api = \"responses\"\nenv_key = \"SCRIPTED_API_KEY\"\n"
        );
        std::fs::write(codex.join("config.toml"), config).unwrap();
        let project = tempfile::tempdir().unwrap();
        install("codex", home.path(), project.path());
        Self { home, project }
    }

    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("HOME", self.home.path().display().to_string()),
            ("XDG_RUNTIME_DIR", runtime_dir(self.home.path())),
            ("PATH", agent_path()),
            ("LANG", "C.UTF-8".into()),
            ("SCRIPTED_API_KEY", "scripted".into()),
        ]
    }
}

impl Drop for CodexHome {
    /// Codex's interactive UI leaves a daemon of its own running, from a copy of itself it keeps
    /// under the home (its threads, their MCP servers and hooks live there): it ends with the test.
    fn drop(&mut self) {
        let home = self.home.path().to_path_buf();
        let Ok(procs) = std::fs::read_dir("/proc") else { return };
        for entry in procs.filter_map(Result::ok) {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
            if std::fs::read_link(entry.path().join("exe")).is_ok_and(|exe| exe.starts_with(&home)) {
                crate::signal(pid, libc::SIGKILL);
            }
        }
    }
}

/// A home set up for Gemini CLI as a person would: logged in, an API key chosen as its way to
/// sign in, and `agent-bridge install gemini` run.
pub struct GeminiHome {
    pub home: tempfile::TempDir,
    pub project: tempfile::TempDir,
    api: String,
}

impl GeminiHome {
    pub fn new(server: &str, token: &str, api: &str) -> Self {
        let home = logged_in_home(server, token);
        let gemini = home.path().join(".gemini");
        std::fs::create_dir_all(&gemini).unwrap();
        let settings = serde_json::json!({ "security": { "auth": { "selectedType": "gemini-api-key" } } });
        std::fs::write(gemini.join("settings.json"), settings.to_string()).unwrap();
        let project = tempfile::tempdir().unwrap();
        install("gemini", home.path(), project.path());
        Self { home, project, api: api.to_owned() }
    }

    /// Gemini CLI's environment; the project folder is trusted as a person trusts it once.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("HOME", self.home.path().display().to_string()),
            ("XDG_RUNTIME_DIR", runtime_dir(self.home.path())),
            ("PATH", agent_path()),
            ("LANG", "C.UTF-8".into()),
            ("GEMINI_API_KEY", "scripted".into()),
            ("GOOGLE_GEMINI_BASE_URL", self.api.clone()),
            ("GEMINI_CLI_TRUST_WORKSPACE", "true".into()),
        ]
    }
}

/// Whether a process runs whose arguments hold `arg` and whose environment holds `env` (a
/// `NAME=value` pair): how a test sees a waiter of one agent's.
pub fn running(arg: &str, env: &str) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else { return false };
    procs.filter_map(Result::ok).any(|p| {
        let read = |what: &str| std::fs::read(p.path().join(what)).unwrap_or_default();
        let has = |bytes: Vec<u8>, needle: &str| bytes.split(|b| *b == 0).any(|w| w == needle.as_bytes());
        has(read("cmdline"), arg) && has(read("environ"), env)
    })
}
