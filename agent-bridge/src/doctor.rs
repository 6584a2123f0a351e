//! `agent-bridge doctor`: checks what this machine needs for its agents to reach the relay — the
//! config and its token, each server replica (reachable, the token accepted, a release that works
//! with this bridge), the clock, and each client set up here (its MCP entry and hooks present,
//! trusted where the client asks, a version Relay was measured with) — and says what to fix. The
//! exit status is non-zero when anything is wrong.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use relay_proto::bridge_config;
use relay_proto::release;
use relay_proto::v1::CheckMachineRequest;
use relay_proto::v1::relay_client::RelayClient;
use serde_json::Value;
use tonic::Code;

use crate::connection;
use crate::install::{self, Client};
use relay_agent::relay::replicas::Replicas;
use relay_agent::relay::session::authed;

/// Longest one server may take to answer.
const SERVER_DEADLINE: Duration = Duration::from_secs(10);
/// Longest a client's `--version` may take.
const VERSION_DEADLINE: Duration = Duration::from_secs(20);
/// How far this machine's clock may be from the server's.
const MAX_SKEW: Duration = Duration::from_secs(10);

/// The client versions Relay was measured with (tests/clients/package.json pins them); a test
/// holds the two together.
pub const MEASURED: [(Client, &str, &str); 3] = [
    (Client::Claude, "2.1.332", "@anthropic-ai/claude-code"),
    (Client::Codex, "0.171.0", "@openai/codex"),
    (Client::Gemini, "0.61.0", "@google/gemini-cli"),
];

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Note,
    Fail,
}

/// What the checks found, printed as they run.
#[derive(Default)]
struct Report {
    failed: usize,
}

impl Report {
    fn say(&mut self, verdict: Verdict, what: impl AsRef<str>, fix: Option<String>) {
        let label = match verdict {
            Verdict::Ok => "ok  ",
            Verdict::Note => "note",
            Verdict::Fail => {
                self.failed += 1;
                "FAIL"
            }
        };
        println!("{label}  {}", what.as_ref());
        if let Some(fix) = fix {
            println!("      fix: {fix}");
        }
    }

    fn ok(&mut self, what: impl AsRef<str>) {
        self.say(Verdict::Ok, what, None);
    }

    fn note(&mut self, what: impl AsRef<str>) {
        self.say(Verdict::Note, what, None);
    }

    fn fail(&mut self, what: impl AsRef<str>, fix: impl Into<String>) {
        self.say(Verdict::Fail, what, Some(fix.into()));
    }
}

pub async fn run() -> anyhow::Result<ExitCode> {
    let mut report = Report::default();
    println!("agent-bridge {}", release::VERSION);
    if let Some(config) = config(&mut report) {
        server(&mut report, &config).await;
    }
    clients(&mut report).await;
    if report.failed == 0 {
        println!("everything this machine needs is in place");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{} thing{} to fix", report.failed, if report.failed == 1 { "" } else { "s" });
        Ok(ExitCode::FAILURE)
    }
}

/// Where the server and token come from, and whether they can be used.
fn config(report: &mut Report) -> Option<bridge_config::BridgeConfig> {
    let from_env = std::env::var("RELAY_SERVER").is_ok_and(|s| !s.trim().is_empty())
        && std::env::var("RELAY_TOKEN").is_ok_and(|t| !t.trim().is_empty());
    let path = match bridge_config::default_path() {
        Ok(path) => path,
        Err(e) => {
            report.fail(format!("config: {e}"), "set RELAY_CONFIG to the bridge config's path");
            return None;
        }
    };
    let resolved = match connection::resolve() {
        Ok(config) => config,
        Err(connection::ConnectError::NotConfigured) => {
            report.fail(
                format!("config: none at {}, and RELAY_SERVER and RELAY_TOKEN are not set", path.display()),
                "run `agent-bridge login --server URL` (it reads the machine token from stdin)",
            );
            return None;
        }
        Err(connection::ConnectError::Config(bridge_config::ConfigError::Malformed {
            path,
            line,
            column,
            message,
            fix,
        })) => {
            report.fail(
                format!("config: {} cannot be used: line {line}, column {column}: {message}", path.display()),
                fix,
            );
            return None;
        }
        Err(e) => {
            report.fail(format!("config: {e}"), format!("mend or remove {}", path.display()));
            return None;
        }
    };
    if std::env::var("RELAY_JOB_TOKEN").is_ok_and(|t| !t.is_empty()) {
        report.ok(format!("config: a card's job token (RELAY_JOB_TOKEN), server {}", resolved.server));
    } else if from_env {
        report.ok(format!("config: RELAY_SERVER and RELAY_TOKEN, server {}", resolved.server));
    } else {
        report.ok(format!("config: {} (server {})", path.display(), resolved.server));
        private_file(report, &path);
    }
    if let Some(ca) = &resolved.ca
        && !Path::new(ca).is_file()
    {
        report.fail(
            format!("config: the CA certificate {ca} is missing"),
            "put the server's CA certificate there, or log in again with `agent-bridge login --server URL --ca PEM`",
        );
    }
    Some(resolved)
}

/// The config holds the machine's token: nobody else may read it.
#[cfg(unix)]
fn private_file(report: &mut Report, path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(path) else { return };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        report.fail(
            format!(
                "config: {} is readable by other users (mode {mode:o}) and holds the machine's token",
                path.display()
            ),
            format!("chmod 600 {}", shlex::try_quote(&path.to_string_lossy()).unwrap_or_default()),
        );
    }
}

/// On Windows the file lies under the user's profile, which other users cannot read.
#[cfg(not(unix))]
fn private_file(_: &mut Report, _: &Path) {}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Each replica: reachable, the token accepted, its release within this bridge's window, and the
/// clock beside its own.
async fn server(report: &mut Report, config: &bridge_config::BridgeConfig) {
    let replicas = match Replicas::new(&config.server, config.ca.as_deref()) {
        Ok(replicas) => replicas,
        Err(e) => {
            report.fail(format!("server: {e}"), "log in again with `agent-bridge login --server URL`");
            return;
        }
    };
    let login = format!("agent-bridge login --server {}", config.server);
    for index in 0..replicas.count() {
        let url = replicas.url(index).to_owned();
        let channel = replicas.channel(index);
        let request = authed(CheckMachineRequest { client_version: release::VERSION.into() }, &config.token);
        let sent = now_ms();
        let answer = tokio::time::timeout(SERVER_DEADLINE, RelayClient::new(channel).check_machine(request)).await;
        let received = now_ms();
        let reply = match answer {
            Err(_) => {
                report.fail(
                    format!("server {url}: no answer within {} s", SERVER_DEADLINE.as_secs()),
                    "check that the server runs and that this machine reaches it (a firewall, a proxy)",
                );
                continue;
            }
            Ok(Err(status)) => {
                let (what, fix) = match relay_agent::relay::replicas::untrusted_certificate(
                    &status,
                    config.ca.as_deref(),
                ) {
                    Some(why) => (why, format!("give the server's CA certificate: `{login} --ca PEM`")),
                    None => match status.code() {
                        Code::Unauthenticated => (
                            format!("the server refused this machine's token: {}", status.message()),
                            format!(
                                "ask the account's admin for a new token (`relay-server admin machine add ACCOUNT/MACHINE`) and pipe it into `{login}`"
                            ),
                        ),
                        Code::FailedPrecondition => (
                            status.message().to_owned(),
                            "install a bridge of a release the server takes (above)".into(),
                        ),
                        _ => (
                            format!("cannot reach it: {}", status.message()),
                            format!("check that the server runs and the address is right (`{login}` changes it)"),
                        ),
                    },
                };
                report.fail(format!("server {url}: {what}"), fix);
                continue;
            }
            Ok(Ok(reply)) => reply.into_inner(),
        };
        let version = if reply.server_version.is_empty() {
            "of an unstated release".to_owned()
        } else {
            reply.server_version.clone()
        };
        // The server took this bridge's release: it judges the window (a newer server may widen it).
        report.ok(format!("server {url}: relay-server {version}, this machine is {}/{}", reply.account, reply.machine));
        if reply.server_time_ms != 0 {
            clock(report, &url, reply.server_time_ms, sent, received);
        }
    }
}

/// This machine's clock against the server's, taken halfway through the call.
fn clock(report: &mut Report, url: &str, server_ms: i64, sent: i64, received: i64) {
    let skew_ms = server_ms - (sent + received) / 2;
    let skew = Duration::from_millis(skew_ms.unsigned_abs());
    let side = if skew_ms > 0 { "behind" } else { "ahead of" };
    if skew <= MAX_SKEW {
        report.ok(format!("clock: within {:.1} s of {url}'s", skew.as_secs_f64().max(0.1)));
    } else {
        report.fail(
            format!("clock: {:.0} s {side} {url}'s; times shown to agents and people will be off", skew.as_secs_f64()),
            "set the clock from the network (NTP: `timedatectl set-ntp true` on Linux, Date & Time settings on macOS and Windows)",
        );
    }
}

/// Each client set up here (for a project-scoped client, in this folder).
async fn clients(report: &mut Report) {
    let (Ok(cwd), Some(home), Some(codex_home)) = (std::env::current_dir(), dirs::home_dir(), crate::codex::home())
    else {
        report.fail("clients: cannot find the home directory or this folder", "run doctor from a folder of yours");
        return;
    };
    let mut any = false;
    for client in Client::ALL {
        let places = client.places(&cwd, &home, &codex_home);
        let name = client.name();
        let command = match install::installed_command(client, &places) {
            Ok(Some(command)) => command,
            Ok(None) => continue,
            Err(e) => {
                report.fail(format!("{name}: {e:#}"), format!("mend the file, then run `agent-bridge install {name}`"));
                continue;
            }
        };
        any = true;
        let reinstall = match places.project {
            true => format!("run `agent-bridge install {name}` in {}", cwd.display()),
            false => format!("run `agent-bridge install {name}`"),
        };
        let mut whole = true;
        match crate::process::find_program(&command) {
            Some(_) => {}
            None => {
                whole = false;
                report.fail(
                    format!("{name}: the relay entry in {} runs `{command}`, which is not there", places.mcp.display()),
                    format!("put agent-bridge on PATH, then {reinstall}"),
                );
            }
        }
        for hook in &places.hooks {
            match install::hook_installed(hook) {
                Ok(true) => {}
                Ok(false) => {
                    whole = false;
                    report.fail(
                        format!("{name}: {} is missing from {}", hook.what, hook.file.display()),
                        reinstall.clone(),
                    );
                }
                Err(e) => {
                    whole = false;
                    report.fail(format!("{name}: {e:#}"), format!("mend the file, then {reinstall}"));
                }
            }
        }
        if whole {
            report.ok(format!("{name}: the relay MCP server and hooks ({})", places.mcp.display()));
        }
        trusted(report, client, &places, &cwd, &home);
        version(report, client).await;
    }
    if !any {
        report.note(format!(
            "clients: none set up for the relay here ({}); run `agent-bridge install claude|codex|gemini|cursor`",
            cwd.display()
        ));
    }
}

/// The client's own approvals of what `install` added, where the client asks for them and keeps
/// them in a file.
fn trusted(report: &mut Report, client: Client, places: &install::Places, cwd: &Path, home: &Path) {
    match client {
        Client::Claude => claude_trust(report, cwd, home),
        Client::Codex => codex_trust(report, places),
        Client::Gemini => gemini_trust(report, cwd, home),
        Client::Cursor => report.note(
            "cursor: Cursor asks to enable the MCP server and its hooks in its own settings, which doctor cannot read",
        ),
    }
}

/// Codex runs a new hook only once the person trusts it, and keeps that trust in config.toml as
/// `[hooks.state."HOOKS_FILE:EVENT:GROUP:INDEX"] trusted_hash = …`.
fn codex_trust(report: &mut Report, places: &install::Places) {
    let config: toml::Table =
        std::fs::read_to_string(&places.mcp).ok().and_then(|t| toml::from_str(&t).ok()).unwrap_or_default();
    let states = config.get("hooks").and_then(|h| h.get("state")).and_then(|s| s.as_table());
    for hook in &places.hooks {
        let install::HookKind::Settings(event) = hook.kind else { continue };
        let names = [hook.file.clone(), dunce::canonicalize(&hook.file).unwrap_or_else(|_| hook.file.clone())]
            .map(|f| format!("{}:{}:", f.display(), event.to_ascii_lowercase()));
        let trusted = states.into_iter().flatten().any(|(key, state)| {
            names.iter().any(|name| key.starts_with(name.as_str())) && state.get("trusted_hash").is_some()
        });
        if !trusted {
            report.fail(
                format!("codex: {} is not trusted yet, so Codex does not run it", hook.what),
                "start `codex` in a terminal and choose \"Trust all and continue\" (or review it under /hooks)",
            );
        }
    }
}

/// Gemini CLI runs the relay in a folder only once it trusts it (`~/.gemini/trustedFolders.json`),
/// unless folder trust is off.
fn gemini_trust(report: &mut Report, cwd: &Path, home: &Path) {
    let settings = read_json(&home.join(".gemini/settings.json"));
    if settings["security"]["folderTrust"]["enabled"] == false
        || std::env::var("GEMINI_CLI_TRUST_WORKSPACE").is_ok_and(|v| v == "true")
    {
        return;
    }
    let rules = read_json(&home.join(".gemini/trustedFolders.json"));
    let folder = dunce::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
    if gemini_trusts(&rules, &folder) != Some(true) {
        report.fail(
            format!("gemini: this folder ({}) is not trusted, where Gemini CLI leaves the relay off", folder.display()),
            "start `gemini` here once and trust the folder",
        );
    }
}

/// Gemini CLI's verdict on `folder`: the longest rule whose folder holds it decides (`TRUST_PARENT`
/// trusts the rule's parent folder).
fn gemini_trusts(rules: &Value, folder: &Path) -> Option<bool> {
    let mut best: Option<(usize, &str)> = None;
    for (rule, level) in rules.as_object().into_iter().flatten() {
        let Some(level) = level.as_str() else { continue };
        let rule_path = Path::new(rule);
        let holds = if level == "TRUST_PARENT" { rule_path.parent().unwrap_or(rule_path) } else { rule_path };
        let holds = dunce::canonicalize(holds).unwrap_or_else(|_| holds.to_path_buf());
        if folder.starts_with(&holds) && best.is_none_or(|(len, _)| rule.len() > len) {
            best = Some((rule.len(), level));
        }
    }
    match best?.1 {
        "DO_NOT_TRUST" => Some(false),
        "TRUST_FOLDER" | "TRUST_PARENT" => Some(true),
        _ => None,
    }
}

/// Claude Code asks once to trust the folder and once to use the project's MCP server `relay`.
fn claude_trust(report: &mut Report, cwd: &Path, home: &Path) {
    let config_dir = std::env::var_os("CLAUDE_CONFIG_DIR").map(PathBuf::from);
    let state_file = config_dir.map_or_else(|| home.join(".claude.json"), |dir| dir.join(".claude.json"));
    let state = read_json(&state_file);
    let folder = dunce::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
    let project = &state["projects"][folder.display().to_string()];
    if project["hasTrustDialogAccepted"] != Value::Bool(true) {
        report.fail(
            format!("claude: this folder ({}) is not trusted yet", folder.display()),
            "start `claude` here once and trust the folder",
        );
    }
    // The project's MCP servers are approved in the project's state or its settings.
    let settings = [cwd.join(".claude/settings.local.json"), cwd.join(".claude/settings.json")].map(|p| read_json(&p));
    let sources: Vec<&Value> = std::iter::once(project).chain(settings.iter()).collect();
    let lists = |key: &str| sources.iter().any(|s| s[key].as_array().is_some_and(|l| l.iter().any(|v| v == "relay")));
    if lists("disabledMcpjsonServers") {
        report.fail(
            "claude: the project's MCP server `relay` was declined",
            "run `claude mcp reset-project-choices` here, then start `claude` and approve it",
        );
    } else if !lists("enabledMcpjsonServers") && !sources.iter().any(|s| s["enableAllProjectMcpServers"] == true) {
        report.fail(
            "claude: the project's MCP server `relay` is not approved yet",
            "start `claude` here once and approve `relay`",
        );
    }
}

/// A JSON file, or `null` when it is missing or unreadable.
/// A client's JSON file as the installer reads it (comments allowed); `null` when absent or unreadable.
fn read_json(path: &Path) -> Value {
    install::read_json(path).ok().flatten().unwrap_or(Value::Null)
}

/// The client's version against the one Relay was measured with.
async fn version(report: &mut Report, client: Client) {
    let Some((_, measured, package)) = MEASURED.iter().find(|(c, ..)| *c == client) else {
        report.note(format!("{}: not measured with Relay", client.name()));
        return;
    };
    let name = client.name();
    let Some(program) = crate::process::find_program(name) else {
        report.note(format!("{name}: the `{name}` program is not on PATH here"));
        return;
    };
    let asked = tokio::process::Command::new(&program)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let said = match tokio::time::timeout(VERSION_DEADLINE, asked).await {
        Ok(Ok(out)) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => {
            report.note(format!("{name}: `{} --version` did not answer", program.display()));
            return;
        }
    };
    let Some(found) = said.split_whitespace().find_map(semver) else {
        report.note(format!("{name}: cannot read a version in `{}`", said.trim()));
        return;
    };
    let wanted = semver(measured).expect("a measured version");
    let upgrade = format!("npm install -g {package}@{measured} (or newer)");
    match found.cmp(&wanted) {
        std::cmp::Ordering::Less => report.fail(
            format!("{name}: version {} is older than {measured}, the one Relay was measured with", join(found)),
            upgrade,
        ),
        std::cmp::Ordering::Equal => report.ok(format!("{name}: version {measured}, as measured")),
        std::cmp::Ordering::Greater => report
            .ok(format!("{name}: version {}, newer than {measured}, the one Relay was measured with", join(found))),
    }
}

/// `1.2.3` (with a leading `v`, or text after it) as numbers.
fn semver(word: &str) -> Option<(u64, u64, u64)> {
    let word = word.trim_start_matches('v');
    let core = word.split(|c: char| !(c.is_ascii_digit() || c == '.')).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>());
    let version = (parts.next()?.ok()?, parts.next()?.ok()?, parts.next()?.ok()?);
    Some(version)
}

fn join((major, minor, patch): (u64, u64, u64)) -> String {
    format!("{major}.{minor}.{patch}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_measured_versions_are_the_ones_the_client_tests_pin() {
        let pins: Value =
            serde_json::from_str(include_str!("../../tests/clients/package.json")).expect("tests/clients/package.json");
        for (client, version, package) in MEASURED {
            assert_eq!(pins["dependencies"][package], version, "{} ({package})", client.name());
        }
    }

    #[test]
    fn gemini_trust_follows_the_longest_rule() {
        let rules = serde_json::json!({
            "/work": "TRUST_FOLDER",
            "/work/secret": "DO_NOT_TRUST",
            "/other/project/file": "TRUST_PARENT",
        });
        assert_eq!(gemini_trusts(&rules, Path::new("/work/relay")), Some(true));
        assert_eq!(gemini_trusts(&rules, Path::new("/work/secret/x")), Some(false));
        assert_eq!(gemini_trusts(&rules, Path::new("/other/project")), Some(true));
        assert_eq!(gemini_trusts(&rules, Path::new("/elsewhere")), None);
    }

    #[test]
    fn versions_are_read_from_what_clients_print() {
        assert_eq!(semver("2.1.332"), Some((2, 1, 332)));
        assert_eq!("2.1.332 (Claude Code)".split_whitespace().find_map(semver), Some((2, 1, 332)));
        assert_eq!("codex-cli 0.171.0".split_whitespace().find_map(semver), Some((0, 171, 0)));
        assert_eq!(semver("v0.61.0-nightly"), Some((0, 61, 0)));
        assert_eq!(semver("Claude"), None);
        assert_eq!(semver("1.2"), None);
    }
}
