//! `agent-bridge install CLIENT`: adds the bridge to a client's MCP configuration.
//!
//! Idempotent, keeps everything else in the file, and never writes the token: project files such
//! as `.mcp.json` get committed, so the bridge reads its credential from its own 0600 config.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::ValueEnum;
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Client {
    Claude,
    Codex,
    Gemini,
    Cursor,
}

const ENTRY: &str = "relay";

pub fn run(client: Client) -> anyhow::Result<()> {
    let command = bridge_command();
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let home = || dirs::home_dir().context("cannot find the home directory");
    let (path, changed) = match client {
        // Project-scoped: the agent of this repository gets the relay.
        Client::Claude => {
            let path = cwd.join(".mcp.json");
            let mcp = install_json(&path, &command, &["mcp", "--harness", "claude", "--channels"])?;
            let settings = cwd.join(".claude").join("settings.json");
            let hook = install_stop_hook(&settings, &format!("{command} hook stop"))?;
            if hook {
                eprintln!("added the relay Stop hook to {}", settings.display());
            }
            (path.clone(), mcp)
        }
        Client::Cursor => {
            let path = cwd.join(".cursor").join("mcp.json");
            (path.clone(), install_json(&path, &command, &["mcp", "--harness", "cursor"])?)
        }
        // User-scoped: these clients keep MCP servers in the user's config.
        Client::Gemini => {
            let path = home()?.join(".gemini").join("settings.json");
            (path.clone(), install_json(&path, &command, &["mcp", "--harness", "gemini"])?)
        }
        Client::Codex => {
            let path = home()?.join(".codex").join("config.toml");
            let server = install_codex(&path, &command)?;
            let notify = install_codex_notify(&path, &command)?;
            (path.clone(), server || notify)
        }
    };
    if changed {
        eprintln!("added the relay MCP server to {}", path.display());
    } else {
        eprintln!("{} already has the relay MCP server", path.display());
    }
    if matches!(client, Client::Claude) {
        eprintln!("{CLAUDE_CHANNELS}");
    }
    Ok(())
}

/// How new messages reach a Claude Code session, with channels and without.
const CLAUDE_CHANNELS: &str = "\
New relay messages can reach Claude Code the moment they arrive, as channel messages. Channels are a
research preview: they need Claude Code 2.1.80 or later and a claude.ai login (not an API key), Team and
Enterprise organisations must enable them, and a channel not on Anthropic's allowlist is loaded only when
Claude Code starts with:
    claude --dangerously-load-development-channels server:relay
Without channels nothing is lost: every relay tool result says how many messages wait unread and from
whom, and relay_inbox reads them.";

/// `agent-bridge` when that name on PATH is this program, else this program's full path.
fn bridge_command() -> String {
    let me = std::env::current_exe().ok().and_then(|p| p.canonicalize().ok());
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("agent-bridge"))
            .find(|p| p.is_file())
            .and_then(|p| p.canonicalize().ok())
    });
    match (me, on_path) {
        (Some(me), Some(found)) if me == found => "agent-bridge".to_owned(),
        (Some(me), _) => me.display().to_string(),
        (None, _) => "agent-bridge".to_owned(),
    }
}

fn read_existing(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp: PathBuf = path.with_extension("relay-tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    if let Ok(meta) = std::fs::metadata(path) {
        let _ = std::fs::set_permissions(&tmp, meta.permissions());
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Sets `mcpServers.relay` in a JSON config. Returns whether the file changed.
fn install_json(path: &Path, command: &str, args: &[&str]) -> anyhow::Result<bool> {
    let mut doc = match read_existing(path)? {
        Some(text) if !text.trim().is_empty() => serde_json::from_str::<Value>(&text)
            .with_context(|| format!("cannot parse {} as JSON; fix it and run install again", path.display()))?,
        _ => json!({}),
    };
    let Some(root) = doc.as_object_mut() else { bail!("{} is not a JSON object", path.display()) };
    let servers = root.entry("mcpServers").or_insert_with(|| json!({}));
    let Some(servers) = servers.as_object_mut() else { bail!("mcpServers in {} is not an object", path.display()) };
    let entry = json!({ "command": command, "args": args });
    if servers.get(ENTRY) == Some(&entry) {
        return Ok(false);
    }
    servers.insert(ENTRY.to_owned(), entry);
    let mut text = serde_json::to_string_pretty(&doc)?;
    text.push('\n');
    write_atomically(path, &text)?;
    Ok(true)
}

/// Adds a Stop hook running `command` to Claude Code settings, unless it is there. Returns whether
/// the file changed.
fn install_stop_hook(path: &Path, command: &str) -> anyhow::Result<bool> {
    let mut doc = match read_existing(path)? {
        Some(text) if !text.trim().is_empty() => serde_json::from_str::<Value>(&text)
            .with_context(|| format!("cannot parse {} as JSON; fix it and run install again", path.display()))?,
        _ => json!({}),
    };
    let Some(root) = doc.as_object_mut() else { bail!("{} is not a JSON object", path.display()) };
    let hooks = root.entry("hooks").or_insert_with(|| json!({}));
    let Some(hooks) = hooks.as_object_mut() else { bail!("hooks in {} is not an object", path.display()) };
    let stop = hooks.entry("Stop").or_insert_with(|| json!([]));
    let Some(stop) = stop.as_array_mut() else { bail!("hooks.Stop in {} is not a list", path.display()) };
    let present = stop.iter().any(|group| {
        group["hooks"].as_array().is_some_and(|hs| hs.iter().any(|h| h["command"].as_str() == Some(command)))
    });
    if present {
        return Ok(false);
    }
    stop.push(json!({ "hooks": [{ "type": "command", "command": command }] }));
    let mut text = serde_json::to_string_pretty(&doc)?;
    text.push('\n');
    write_atomically(path, &text)?;
    Ok(true)
}

/// Sets `[mcp_servers.relay]` in Codex's TOML config, keeping its comments and layout.
fn install_codex(path: &Path, command: &str) -> anyhow::Result<bool> {
    let text = read_existing(path)?.unwrap_or_default();
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("cannot parse {} as TOML; fix it and run install again", path.display()))?;
    let servers = doc.entry("mcp_servers").or_insert_with(|| {
        let mut table = toml_edit::Table::new();
        table.set_implicit(true);
        toml_edit::Item::Table(table)
    });
    let Some(servers) = servers.as_table_mut() else { bail!("mcp_servers in {} is not a table", path.display()) };
    let mut entry = toml_edit::Table::new();
    entry["command"] = toml_edit::value(command);
    let mut args = toml_edit::Array::new();
    args.extend(["mcp", "--harness", "codex"]);
    entry["args"] = toml_edit::value(args);
    let same = servers.get(ENTRY).and_then(|e| e.as_table()).is_some_and(|t| {
        t.get("command").and_then(|c| c.as_str()) == Some(command)
            && t.get("args")
                .and_then(|a| a.as_array())
                .is_some_and(|a| a.iter().filter_map(|v| v.as_str()).eq(["mcp", "--harness", "codex"]))
    });
    if same {
        return Ok(false);
    }
    servers.insert(ENTRY, toml_edit::Item::Table(entry));
    write_atomically(path, &doc.to_string())?;
    Ok(true)
}

/// Sets Codex's `notify` program to the bridge's hook (it shares turns for peek), unless the user
/// has a notify program of their own, which is kept. Returns whether the file changed.
fn install_codex_notify(path: &Path, command: &str) -> anyhow::Result<bool> {
    let text = read_existing(path)?.unwrap_or_default();
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("cannot parse {} as TOML; fix it and run install again", path.display()))?;
    if let Some(existing) = doc.get("notify") {
        let ours = existing
            .as_array()
            .is_some_and(|a| a.iter().filter_map(|v| v.as_str()).eq([command, "hook", "codex-notify"]));
        if !ours {
            eprintln!(
                "note: {} already has a notify program; peek for Codex needs `{command} hook codex-notify` there",
                path.display()
            );
        }
        return Ok(false);
    }
    let mut notify = toml_edit::Array::new();
    notify.extend([command, "hook", "codex-notify"]);
    // A root key: toml_edit writes it in the root section, before every table.
    doc.insert("notify", toml_edit::value(notify));
    write_atomically(path, &doc.to_string())?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_install_keeps_other_servers_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".mcp.json");
        std::fs::write(&path, r#"{"mcpServers":{"other":{"command":"x"}},"keep":1}"#).unwrap();
        assert!(install_json(&path, "agent-bridge", &["mcp"]).unwrap());
        assert!(!install_json(&path, "agent-bridge", &["mcp"]).unwrap());
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["keep"], 1);
        assert_eq!(doc["mcpServers"]["other"]["command"], "x");
        assert_eq!(doc["mcpServers"]["relay"], json!({"command": "agent-bridge", "args": ["mcp"]}));
        assert!(!std::fs::read_to_string(&path).unwrap().contains("rlm_"), "no token in client config");
    }

    #[test]
    fn json_install_refuses_to_clobber_a_broken_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".mcp.json");
        std::fs::write(&path, "{ not json").unwrap();
        assert!(install_json(&path, "agent-bridge", &["mcp"]).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
    }

    #[test]
    fn the_stop_hook_is_added_once_beside_other_hooks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        std::fs::write(&path, r#"{"hooks":{"Stop":[{"hooks":[{"type":"command","command":"other"}]}]},"model":"x"}"#)
            .unwrap();
        assert!(install_stop_hook(&path, "agent-bridge hook stop").unwrap());
        assert!(!install_stop_hook(&path, "agent-bridge hook stop").unwrap());
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["model"], "x");
        let stop = doc["hooks"]["Stop"].as_array().unwrap();
        assert_eq!(stop.len(), 2);
        assert_eq!(stop[1]["hooks"][0]["command"], "agent-bridge hook stop");
    }

    #[test]
    fn codex_notify_is_set_once_and_never_over_the_users_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "model = \"o3\"\n\n[mcp_servers.other]\ncommand = \"x\"\n").unwrap();
        assert!(install_codex_notify(&path, "agent-bridge").unwrap());
        assert!(!install_codex_notify(&path, "agent-bridge").unwrap());
        let doc: toml_edit::DocumentMut = std::fs::read_to_string(&path).unwrap().parse().unwrap();
        assert_eq!(doc["notify"].as_array().unwrap().len(), 3);
        assert_eq!(doc["mcp_servers"]["other"]["command"].as_str(), Some("x"));
        let mine = dir.path().join("mine.toml");
        std::fs::write(&mine, "notify = [\"my-notifier\"]\n").unwrap();
        assert!(!install_codex_notify(&mine, "agent-bridge").unwrap());
        assert!(std::fs::read_to_string(&mine).unwrap().contains("my-notifier"));
    }

    #[test]
    fn codex_install_keeps_comments_and_other_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "# my settings\nmodel = \"o3\"\n\n[mcp_servers.other]\ncommand = \"x\"\n").unwrap();
        assert!(install_codex(&path, "agent-bridge").unwrap());
        assert!(!install_codex(&path, "agent-bridge").unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# my settings\nmodel = \"o3\""), "{text}");
        assert!(text.contains("[mcp_servers.other]"));
        assert!(
            text.contains(
                "[mcp_servers.relay]\ncommand = \"agent-bridge\"\nargs = [\"mcp\", \"--harness\", \"codex\"]"
            ),
            "{text}"
        );
    }
}
