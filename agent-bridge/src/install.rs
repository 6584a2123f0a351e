//! `agent-bridge install CLIENT`: adds the bridge to a client's MCP configuration.
//!
//! Idempotent, keeps everything else in the file (comments, key order, layout: JSON files are
//! edited as JSONC through a syntax tree, TOML through toml_edit), and never writes the token:
//! project files such as `.mcp.json` get committed, so the bridge reads its credential from its own
//! 0600 config. Relay's own entries are recognised wherever the binary lived when they were written,
//! so installing again after it moved updates them instead of adding more.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use clap::ValueEnum;
use jsonc_parser::ParseOptions;
use jsonc_parser::cst::{CstInputValue, CstObject, CstRootNode};
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Client {
    Claude,
    Codex,
    Gemini,
    Cursor,
}

const ENTRY: &str = "relay";
/// The program name every Relay entry runs, wherever it is installed.
const PROGRAM: &str = "agent-bridge";

impl Client {
    pub const ALL: [Client; 4] = [Client::Claude, Client::Codex, Client::Gemini, Client::Cursor];

    pub fn name(self) -> &'static str {
        match self {
            Client::Claude => "claude",
            Client::Codex => "codex",
            Client::Gemini => "gemini",
            Client::Cursor => "cursor",
        }
    }

    /// Where this client keeps what `install` writes for it: in project `cwd`, for the person whose
    /// home is `home` (and whose Codex home is `codex_home`).
    pub fn places(self, cwd: &Path, home: &Path, codex_home: &Path) -> Places {
        let hook = |file: PathBuf, kind, sub, what| HookPlace { file, kind, sub, what };
        match self {
            // Project-scoped, and committed: the agent of this repository gets the relay.
            Client::Claude => {
                let settings = cwd.join(".claude").join("settings.json");
                Places {
                    mcp: cwd.join(".mcp.json"),
                    project: true,
                    hooks: vec![
                        hook(settings.clone(), HookKind::Settings("Stop"), "stop", "the relay Stop hook"),
                        hook(settings, HookKind::Settings("Stop"), "wake", "the relay wake hook (asyncRewake)"),
                    ],
                }
            }
            Client::Cursor => Places {
                mcp: cwd.join(".cursor").join("mcp.json"),
                project: true,
                hooks: vec![hook(
                    cwd.join(".cursor").join("hooks.json"),
                    HookKind::CursorStop,
                    "cursor-stop",
                    "the relay stop hook",
                )],
            },
            // User-scoped: these clients keep MCP servers in the user's config.
            Client::Gemini => {
                let settings = home.join(".gemini").join("settings.json");
                Places {
                    mcp: settings.clone(),
                    project: false,
                    hooks: vec![hook(
                        settings,
                        HookKind::Settings("AfterAgent"),
                        "gemini-after-agent",
                        "the relay AfterAgent hook",
                    )],
                }
            }
            Client::Codex => {
                let config = codex_home.join("config.toml");
                Places {
                    mcp: config.clone(),
                    project: false,
                    hooks: vec![
                        hook(config, HookKind::CodexNotify, "codex-notify", "the relay notify program"),
                        hook(
                            codex_home.join("hooks.json"),
                            HookKind::Settings("Stop"),
                            "codex-stop",
                            "the relay Stop hook",
                        ),
                    ],
                }
            }
        }
    }
}

/// Where a client keeps what `install` writes for it.
pub struct Places {
    /// The file holding the `relay` MCP server entry.
    pub mcp: PathBuf,
    /// Whether the files are the project's (found from its folder) rather than the user's.
    pub project: bool,
    pub hooks: Vec<HookPlace>,
}

/// One of Relay's hooks in a client's files.
pub struct HookPlace {
    pub file: PathBuf,
    pub kind: HookKind,
    /// The hook's subcommand, `agent-bridge hook SUB`.
    pub sub: &'static str,
    pub what: &'static str,
}

/// How a client's file lists its hooks.
#[derive(Clone, Copy)]
pub enum HookKind {
    /// `{"hooks": {EVENT: [{"hooks": [HOOK, …]}, …]}}` (Claude Code, Codex's hooks.json, Gemini CLI).
    Settings(&'static str),
    /// Cursor's `{"version": 1, "hooks": {"stop": [{"command": …}]}}`.
    CursorStop,
    /// Codex's `notify = [PROGRAM, "hook", "codex-notify"]` in config.toml.
    CodexNotify,
}

pub fn run(client: Option<Client>, guard: bool) -> anyhow::Result<()> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    if let Some(client) = client {
        run_client(client, &cwd)?;
        if !guard && hooks_dir(&cwd).is_ok() {
            eprintln!(
                "This is a git repository: `agent-bridge install --guard` adds a pre-commit hook that refuses commits \
                 touching paths another agent holds exclusively (relay_claim)."
            );
        }
    }
    if guard {
        let (changed, path) = install_guard(&cwd)?;
        let verb = if changed { "set" } else { "kept" };
        eprintln!("{verb} the relay guard (pre-commit hook) in {}", path.display());
    }
    Ok(())
}

/// What marks a pre-commit hook as the relay guard's own.
const GUARD_MARK: &str = "# relay guard (agent-bridge)";

/// Where git looks for this repository's hooks (`core.hooksPath` honoured).
fn hooks_dir(cwd: &Path) -> anyhow::Result<PathBuf> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(cwd)
        .args(["rev-parse", "--git-path", "hooks"])
        .stderr(std::process::Stdio::null())
        .output()
        .context("cannot run git")?;
    if !out.status.success() {
        bail!("{} is not in a git repository: run install --guard inside the repository to guard", cwd.display());
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    Ok(if dir.is_absolute() { dir } else { cwd.join(dir) })
}

/// The guard's pre-commit hook, written beside no other: a repository's own pre-commit hook is
/// never replaced (its owner is told the line to add). Whether the file changed, and where it is.
fn install_guard(cwd: &Path) -> anyhow::Result<(bool, PathBuf)> {
    let path = hooks_dir(cwd)?.join("pre-commit");
    let program = shell_word(&this_program().map_or_else(|| PROGRAM.to_owned(), |p| p.display().to_string()));
    let script = guard_script(&program);
    match read_existing(&path)? {
        Some(existing) if existing == script => return Ok((false, path)),
        Some(existing) if !existing.contains(GUARD_MARK) => bail!(
            "{} is a pre-commit hook of the repository's own; to guard commits too, add this line to it:\n  {program} hook guard",
            path.display()
        ),
        _ => {}
    }
    write_atomically(&path, &script)?;
    #[cfg(unix)]
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))?;
    Ok((true, path))
}

/// The pre-commit hook: the guard, found where install saw it, else on PATH; a bridge found nowhere
/// (moved, uninstalled) never stops a commit.
fn guard_script(program: &str) -> String {
    format!(
        "#!/bin/sh\n{GUARD_MARK}: refuses a commit that touches paths another agent holds exclusively.\n\
         # RELAY_GUARD=off passes it. Written by `agent-bridge install --guard`.\n\
         bridge={program}\n\
         [ -x \"$bridge\" ] || bridge=$(command -v {PROGRAM}) || {{\n\
         \x20   echo \"relay guard: {PROGRAM} is not found; the commit goes on unchecked\" >&2\n\
         \x20   exit 0\n\
         }}\n\
         exec \"$bridge\" hook guard\n"
    )
}

fn run_client(client: Client, cwd: &Path) -> anyhow::Result<()> {
    let cwd = cwd.to_path_buf();
    let home = dirs::home_dir().context("cannot find the home directory")?;
    let codex_home = crate::codex::home().context("cannot find the home directory")?;
    let places = client.places(&cwd, &home, &codex_home);
    let said = |changed: bool, what: &str, path: &Path| {
        let verb = if changed { "set" } else { "kept" };
        eprintln!("{verb} {what} in {}", path.display());
    };
    let command = if places.project { project_command() } else { user_command() };
    let program = shell_word(&command);
    match client {
        Client::Claude => {
            said(
                install_json(&places.mcp, &command, &["mcp", "--harness", "claude", "--channels"], &[])?,
                "the relay MCP server",
                &places.mcp,
            );
            let (stop, wake) = (&places.hooks[0], &places.hooks[1]);
            let spec = HookSpec::claude("Stop", stop.sub, &program, json!({}));
            said(install_hook(&stop.file, &spec)?, stop.what, &stop.file);
            // In the background after each turn; the hook ends itself before Claude Code would.
            let timeout = crate::hook::WAKE_LIFETIME.as_secs() + 60;
            let spec = HookSpec::claude("Stop", wake.sub, &program, json!({ "asyncRewake": true, "timeout": timeout }));
            said(install_hook(&wake.file, &spec)?, wake.what, &wake.file);
            eprintln!("{CLAUDE_NOTES}");
        }
        Client::Cursor => {
            said(
                install_json(&places.mcp, &command, &["mcp", "--harness", "cursor"], &[])?,
                "the relay MCP server",
                &places.mcp,
            );
            let stop = &places.hooks[0];
            said(install_cursor_stop_hook(&stop.file, &format!("{program} hook {}", stop.sub))?, stop.what, &stop.file);
            eprintln!("{CURSOR_NOTES}");
        }
        Client::Gemini => {
            // `trust` lets `gemini -p` call the relay tools without a confirmation per call.
            let trust = [("trust", json!(true))];
            said(
                install_json(&places.mcp, &command, &["mcp", "--harness", "gemini"], &trust)?,
                "the relay MCP server",
                &places.mcp,
            );
            let after = &places.hooks[0];
            let spec = HookSpec::claude("AfterAgent", after.sub, &program, json!({}));
            said(install_hook(&after.file, &spec)?, after.what, &after.file);
            eprintln!("{GEMINI_NOTES}");
        }
        Client::Codex => {
            said(
                install_codex(&places.mcp, &command)?,
                "the relay MCP server (tools approved without a prompt)",
                &places.mcp,
            );
            let (notify, stop) = (&places.hooks[0], &places.hooks[1]);
            said(install_codex_notify(&notify.file, &command)?, notify.what, &notify.file);
            let spec = HookSpec::claude("Stop", stop.sub, &program, json!({}));
            said(install_hook(&stop.file, &spec)?, stop.what, &stop.file);
            eprintln!("{CODEX_NOTES}");
        }
    }
    Ok(())
}

/// A client file read back as JSON (JSONC); `None` when it does not exist.
pub(crate) fn read_json(path: &Path) -> anyhow::Result<Option<Value>> {
    let Some(text) = read_existing(path)? else { return Ok(None) };
    let root = CstRootNode::parse(&text, &ParseOptions::default())
        .map_err(|e| anyhow!("cannot parse {} as JSON: {e}", path.display()))?;
    Ok(Some(root.value().and_then(|v| v.to_serde_value()).unwrap_or(Value::Null)))
}

/// A client file read back as TOML; `None` when it does not exist.
fn read_toml(path: &Path) -> anyhow::Result<Option<toml_edit::DocumentMut>> {
    let Some(text) = read_existing(path)? else { return Ok(None) };
    text.parse().map(Some).with_context(|| format!("cannot parse {} as TOML", path.display()))
}

/// The command of the relay MCP server entry `install` wrote into `places.mcp`, if there is one.
pub fn installed_command(client: Client, places: &Places) -> anyhow::Result<Option<String>> {
    if let Client::Codex = client {
        let Some(doc) = read_toml(&places.mcp)? else { return Ok(None) };
        let command = doc.get("mcp_servers").and_then(|s| s.get(ENTRY)).and_then(|e| e.get("command"));
        return Ok(command.and_then(|c| c.as_str()).map(str::to_owned));
    }
    let Some(doc) = read_json(&places.mcp)? else { return Ok(None) };
    Ok(doc["mcpServers"][ENTRY]["command"].as_str().map(str::to_owned))
}

/// Whether one of Relay's hooks is in its place.
pub fn hook_installed(place: &HookPlace) -> anyhow::Result<bool> {
    let relay = |command: &Value| command.as_str().is_some_and(|c| is_relay_hook(c, place.sub));
    Ok(match place.kind {
        HookKind::Settings(event) => read_json(&place.file)?.is_some_and(|doc| {
            doc["hooks"][event]
                .as_array()
                .into_iter()
                .flatten()
                .any(|group| group["hooks"].as_array().into_iter().flatten().any(|hook| relay(&hook["command"])))
        }),
        HookKind::CursorStop => read_json(&place.file)?.is_some_and(|doc| {
            doc["hooks"]["stop"].as_array().into_iter().flatten().any(|hook| relay(&hook["command"]))
        }),
        HookKind::CodexNotify => read_toml(&place.file)?.is_some_and(|doc| {
            let words: Vec<&str> = doc
                .get("notify")
                .and_then(|n| n.as_array())
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            matches!(words.as_slice(), [program, "hook", sub] if is_bridge(program) && *sub == place.sub)
        }),
    })
}

/// How new messages reach a Claude Code session, and what the person approves once.
const CLAUDE_NOTES: &str = "\
An idle Claude Code session is woken when relay mail arrives: the wake hook runs in the background
after each turn and hands the model a short notice (who wrote, and to read it with relay_inbox).
In print mode (claude -p) it ends at once and holds nothing. Claude Code asks once to trust this
folder and to use the project's MCP server `relay` from .mcp.json.
New messages can also arrive as channel messages. Channels are a research preview: they need Claude
Code 2.1.80 or later and a claude.ai login (not an API key), Team and Enterprise organisations must
enable them, and a channel not on Anthropic's allowlist is loaded only when Claude Code starts with:
    claude --dangerously-load-development-channels server:relay
Whatever the client does, every relay tool result says how many messages wait unread and from whom.";

const CODEX_NOTES: &str = "\
The relay tools run without an approval prompt per call (default_tools_approval_mode = \"approve\" in
[mcp_servers.relay]), so `codex exec` can use them too. An idle interactive session is woken through
`codex queue` when relay mail arrives, by a waiter the notify program starts after each turn. The
Stop hook delivers mail the model has not seen at the end of a turn, once per message. Codex runs a
new hook only once you trust it: start `codex` in a terminal and choose \"Trust all and continue\" (or
review it under /hooks); until then `codex exec` skips it.";

const GEMINI_NOTES: &str = "\
The relay server is trusted (\"trust\": true), so `gemini -p` offers its tools and calls them without
a confirmation per call. The AfterAgent hook gives the model one more turn for mail it has not seen,
once per message. Gemini CLI cannot be woken from outside: an idle session learns of mail at its next
turn, from the hook or from any relay tool's result.";

const CURSOR_NOTES: &str = "\
The stop hook (.cursor/hooks.json) sends a follow-up message for mail the model has not seen, once
per message. Cursor cannot be woken from outside: an idle agent learns of mail at its next turn.";

/// The `agent-bridge` found on PATH, if any.
fn on_path() -> Option<PathBuf> {
    crate::process::find_program(PROGRAM)
}

fn this_program() -> Option<PathBuf> {
    std::env::current_exe().ok().and_then(|p| dunce::canonicalize(p).ok())
}

/// For files a project commits: the bare name when any `agent-bridge` is on PATH, so the file works
/// for everyone who has it installed; else this program's path, with a note.
fn project_command() -> String {
    if on_path().is_some() {
        return PROGRAM.to_owned();
    }
    let me = this_program().map_or_else(|| PROGRAM.to_owned(), |p| p.display().to_string());
    eprintln!(
        "note: agent-bridge is not on PATH, so the project file names {me}, which is only valid on this computer; \
         install it on PATH (cargo install --path agent-bridge) and run install again"
    );
    me
}

/// For a user's own config: the bare name when PATH finds this very program, else its full path.
fn user_command() -> String {
    let me = this_program();
    match (&me, on_path().and_then(|p| dunce::canonicalize(p).ok())) {
        (Some(me), Some(found)) if *me == found => PROGRAM.to_owned(),
        (Some(me), _) => me.display().to_string(),
        (None, _) => PROGRAM.to_owned(),
    }
}

/// Whether `program` (a command's first word) is some `agent-bridge` (`agent-bridge.exe` on Windows).
fn is_bridge(program: &str) -> bool {
    let name = Path::new(program).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name == PROGRAM || name.strip_suffix(".exe").is_some_and(|stem| stem.eq_ignore_ascii_case(PROGRAM))
}

/// Whether a hook command is Relay's `hook SUB`, whatever path (quoted or not) it was written with.
fn is_relay_hook(command: &str, sub: &str) -> bool {
    command
        .strip_suffix(&format!(" hook {sub}"))
        .is_some_and(|program| is_bridge(program.trim().trim_matches(|c| c == '\'' || c == '"')))
}

/// A program path as one shell word, for a hook's command line.
fn shell_word(program: &str) -> String {
    if program.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c)) {
        program.to_owned()
    } else {
        format!("'{}'", program.replace('\'', "'\\''"))
    }
}

fn read_existing(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Replaces `path` atomically, keeping its permissions; a new file gets the usual ones. A config that
/// is a link (dotfiles kept elsewhere) is written where it points, and stays a link.
fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let resolved = dunce::canonicalize(path).ok();
    let path = resolved.as_deref().unwrap_or(path);
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    // A temporary file is made owner-only; the file it replaces keeps its permissions, and a new one
    // gets the usual ones (on Windows, those of its directory).
    let permissions = match std::fs::metadata(path) {
        Ok(meta) => Some(meta.permissions()),
        #[cfg(unix)]
        Err(_) => Some(std::os::unix::fs::PermissionsExt::from_mode(0o644)),
        #[cfg(not(unix))]
        Err(_) => None,
    };
    if let Some(permissions) = permissions {
        std::fs::set_permissions(tmp.path(), permissions)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    tmp.persist(path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A JSON value as the syntax tree takes it.
fn input(value: &Value) -> CstInputValue {
    match value {
        Value::Null => CstInputValue::Null,
        Value::Bool(b) => CstInputValue::Bool(*b),
        Value::Number(n) => CstInputValue::Number(n.to_string()),
        Value::String(s) => CstInputValue::String(s.clone()),
        Value::Array(items) => CstInputValue::Array(items.iter().map(input).collect()),
        Value::Object(map) => CstInputValue::Object(map.iter().map(|(k, v)| (k.clone(), input(v))).collect()),
    }
}

/// Edits a JSON (or JSONC) file's root object in place; writes only when `edit` says it changed.
fn edit_json(path: &Path, edit: impl FnOnce(&CstObject) -> anyhow::Result<bool>) -> anyhow::Result<bool> {
    let text = read_existing(path)?.unwrap_or_default();
    let root = CstRootNode::parse(&text, &ParseOptions::default())
        .map_err(|e| anyhow!("cannot parse {} as JSON: {e}; fix it and run install again", path.display()))?;
    let object = root.object_value_or_create().ok_or_else(|| anyhow!("{} is not a JSON object", path.display()))?;
    if !edit(&object)? {
        return Ok(false);
    }
    let mut out = root.to_string();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    write_atomically(path, &out)?;
    Ok(true)
}

/// Sets `mcpServers.relay` in a JSON config: its command, arguments and the `extra` fields. Returns
/// whether the file changed.
fn install_json(path: &Path, command: &str, args: &[&str], extra: &[(&str, Value)]) -> anyhow::Result<bool> {
    edit_json(path, |root| {
        let servers = root
            .object_value_or_create("mcpServers")
            .ok_or_else(|| anyhow!("mcpServers in {} is not an object", path.display()))?;
        let mut fields = vec![("command", json!(command)), ("args", json!(args))];
        fields.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
        // An entry of ours is updated field by field: what a user added to it (env, timeouts) stays.
        let Some(entry) = servers.object_value(ENTRY) else {
            if servers.get(ENTRY).is_some() {
                bail!("mcpServers.{ENTRY} in {} is not an object", path.display());
            }
            let entry: serde_json::Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            servers.append(ENTRY, input(&Value::Object(entry)));
            return Ok(true);
        };
        Ok(set_fields(&entry, fields))
    })
}

/// Sets each field of `object` to its value, keeping its place when it is there; whether any
/// changed.
fn set_fields<'a>(object: &CstObject, fields: impl IntoIterator<Item = (&'a str, Value)>) -> bool {
    let mut changed = false;
    for (key, value) in fields {
        match object.get(key) {
            Some(prop) if prop.value().and_then(|v| v.to_serde_value()).as_ref() == Some(&value) => {}
            Some(prop) => {
                prop.set_value(input(&value));
                changed = true;
            }
            None => {
                object.append(key, input(&value));
                changed = true;
            }
        }
    }
    changed
}

/// One of Relay's hooks in a settings file laid out as Claude Code's (Claude Code's settings,
/// Codex's hooks.json, Gemini CLI's settings): `{"hooks": {EVENT: [{"hooks": [HOOK, …]}, …]}}`.
struct HookSpec<'a> {
    event: &'a str,
    /// The hook's subcommand: Relay's hooks are recognised by it, from whatever path.
    sub: &'a str,
    /// The hook's fields, `command` among them.
    fields: serde_json::Map<String, Value>,
}

impl<'a> HookSpec<'a> {
    /// `program hook SUB` as a command hook of `event`, with `extra` fields.
    fn claude(event: &'a str, sub: &'a str, program: &str, extra: Value) -> Self {
        let mut fields = serde_json::Map::new();
        fields.insert("type".into(), json!("command"));
        fields.insert("command".into(), json!(format!("{program} hook {sub}")));
        if let Value::Object(extra) = extra {
            fields.extend(extra);
        }
        Self { event, sub, fields }
    }
}

/// Makes a settings file hold exactly one of Relay's hooks `spec`: one written from another path
/// is updated, extra ones removed, every other hook kept. Returns whether the file changed.
fn install_hook(path: &Path, spec: &HookSpec<'_>) -> anyhow::Result<bool> {
    edit_json(path, |root| {
        let hooks = root
            .object_value_or_create("hooks")
            .ok_or_else(|| anyhow!("hooks in {} is not an object", path.display()))?;
        let groups = hooks
            .array_value_or_create(spec.event)
            .ok_or_else(|| anyhow!("hooks.{} in {} is not a list", spec.event, path.display()))?;
        let mut changed = false;
        let mut kept = false;
        for group in groups.elements() {
            let Some(list) = group.as_object().and_then(|g| g.array_value("hooks")) else { continue };
            let mut emptied = false;
            for hook in list.elements() {
                let Some(object) = hook.as_object() else { continue };
                let command = object.get("command").and_then(|p| p.value()).and_then(|v| v.to_serde_value());
                if !command.as_ref().and_then(Value::as_str).is_some_and(|c| is_relay_hook(c, spec.sub)) {
                    continue;
                }
                if kept {
                    hook.remove();
                    (changed, emptied) = (true, true);
                } else {
                    kept = true;
                    changed |= set_fields(&object, spec.fields.iter().map(|(k, v)| (k.as_str(), v.clone())));
                }
            }
            if emptied && list.elements().is_empty() {
                group.remove();
            }
        }
        if !kept {
            groups.append(input(&json!({ "hooks": [Value::Object(spec.fields.clone())] })));
            changed = true;
        }
        Ok(changed)
    })
}

/// Makes Cursor's hooks file hold exactly one Relay stop hook running `command`:
/// `{"version": 1, "hooks": {"stop": [{"command": …}, …]}}`. Returns whether the file changed.
fn install_cursor_stop_hook(path: &Path, command: &str) -> anyhow::Result<bool> {
    edit_json(path, |root| {
        let mut changed = false;
        if root.get("version").is_none() {
            root.append("version", input(&json!(1)));
            changed = true;
        }
        let hooks = root
            .object_value_or_create("hooks")
            .ok_or_else(|| anyhow!("hooks in {} is not an object", path.display()))?;
        let stop = hooks
            .array_value_or_create("stop")
            .ok_or_else(|| anyhow!("hooks.stop in {} is not a list", path.display()))?;
        let mut kept = false;
        for hook in stop.elements() {
            let Some(object) = hook.as_object() else { continue };
            let current = object.get("command").and_then(|p| p.value()).and_then(|v| v.to_serde_value());
            if !current.as_ref().and_then(Value::as_str).is_some_and(|c| is_relay_hook(c, "cursor-stop")) {
                continue;
            }
            if kept {
                hook.remove();
                changed = true;
            } else {
                kept = true;
                changed |= set_fields(&object, [("command", json!(command))]);
            }
        }
        if !kept {
            stop.append(input(&json!({ "command": command })));
            changed = true;
        }
        Ok(changed)
    })
}

/// Sets `[mcp_servers.relay]` in Codex's TOML config (its command and arguments, and its tools
/// approved), keeping its comments and layout. An entry of
/// ours is updated field by field, so what a user added to it (an `env` table, timeouts, comments)
/// stays.
fn install_codex(path: &Path, command: &str) -> anyhow::Result<bool> {
    const ARGS: [&str; 3] = ["mcp", "--harness", "codex"];
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
    let entry = servers.entry(ENTRY).or_insert_with(|| toml_edit::Item::Table(toml_edit::Table::new()));
    let Some(entry) = entry.as_table_like_mut() else {
        bail!("mcp_servers.{ENTRY} in {} is not a table", path.display())
    };
    let mut changed = false;
    if entry.get("command").and_then(|c| c.as_str()) != Some(command) {
        set_keeping_decor(entry, "command", toml_edit::Value::from(command));
        changed = true;
    }
    let args_same = entry
        .get("args")
        .and_then(|a| a.as_array())
        .is_some_and(|a| a.len() == ARGS.len() && a.iter().map(|v| v.as_str()).eq(ARGS.map(Some)));
    if !args_same {
        set_keeping_decor(entry, "args", toml_edit::Value::Array(ARGS.into_iter().collect()));
        changed = true;
    }
    // Codex asks before each call of a tool that is not read-only, and `codex exec` (which cannot
    // ask) refuses it: the relay's tools are approved for this server instead.
    if entry.get(APPROVAL_KEY).and_then(|c| c.as_str()) != Some(APPROVAL) {
        set_keeping_decor(entry, APPROVAL_KEY, toml_edit::Value::from(APPROVAL));
        changed = true;
    }
    if changed {
        write_atomically(path, &doc.to_string())?;
    }
    Ok(changed)
}

const APPROVAL_KEY: &str = "default_tools_approval_mode";
const APPROVAL: &str = "approve";

/// Sets `key` in a TOML table in place: the key keeps its place and the comments around it.
fn set_keeping_decor(table: &mut dyn toml_edit::TableLike, key: &str, mut value: toml_edit::Value) {
    match table.get_mut(key) {
        Some(item) => {
            if let Some(old) = item.as_value() {
                *value.decor_mut() = old.decor().clone();
            }
            *item = toml_edit::Item::Value(value);
        }
        None => {
            table.insert(key, toml_edit::Item::Value(value));
        }
    }
}

/// Sets Codex's `notify` program to the bridge's hook (it shares turns for peek), or updates it
/// when it is Relay's from another path. A notify program of the user's own is kept, with a note.
/// Returns whether the file changed.
fn install_codex_notify(path: &Path, command: &str) -> anyhow::Result<bool> {
    let text = read_existing(path)?.unwrap_or_default();
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("cannot parse {} as TOML; fix it and run install again", path.display()))?;
    let wanted = [command, "hook", "codex-notify"];
    if let Some(existing) = doc.get("notify") {
        let words: Vec<&str> =
            existing.as_array().map(|a| a.iter().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
        let ours = matches!(words.as_slice(), [program, "hook", "codex-notify"] if is_bridge(program));
        if !ours {
            eprintln!(
                "note: {} already has a notify program of its own, which is kept; for peek in Codex, have it also run `{command} hook codex-notify` with the same argument",
                path.display()
            );
            return Ok(false);
        }
        if words == wanted {
            return Ok(false);
        }
    }
    let mut notify = toml_edit::Array::new();
    notify.extend(wanted);
    // A root key: toml_edit writes it in the root section, before every table.
    doc.insert("notify", toml_edit::value(notify));
    write_atomically(path, &doc.to_string())?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook runs the guard where install saw it; a bridge gone from there and from PATH lets the
    /// commit through.
    #[cfg(unix)]
    #[test]
    fn the_guard_hook_runs_the_bridge_and_never_stops_a_commit_when_it_is_gone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let stub = dir.path().join("stub-bridge");
        std::fs::write(&stub, "#!/bin/sh\necho \"asked: $*\" >&2\nexit 3\n").unwrap();
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
        let run = |program: &str| {
            let hook = dir.path().join("pre-commit");
            std::fs::write(&hook, guard_script(&shell_word(program))).unwrap();
            std::process::Command::new("sh").arg(&hook).env("PATH", "/usr/bin:/bin").output().unwrap()
        };
        let found = run(&stub.display().to_string());
        assert_eq!(found.status.code(), Some(3), "the guard's answer is the hook's");
        assert!(String::from_utf8_lossy(&found.stderr).contains("asked: hook guard"));
        let gone = run(&dir.path().join("moved-away").display().to_string());
        assert!(gone.status.success(), "{gone:?}");
        assert!(String::from_utf8_lossy(&gone.stderr).contains("the commit goes on unchecked"));
    }

    #[test]
    fn json_install_keeps_other_servers_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".mcp.json");
        std::fs::write(&path, r#"{"mcpServers":{"other":{"command":"x"}},"keep":1}"#).unwrap();
        assert!(install_json(&path, "agent-bridge", &["mcp"], &[]).unwrap());
        assert!(!install_json(&path, "agent-bridge", &["mcp"], &[]).unwrap());
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["keep"], 1);
        assert_eq!(doc["mcpServers"]["other"]["command"], "x");
        assert_eq!(doc["mcpServers"]["relay"], json!({"command": "agent-bridge", "args": ["mcp"]}));
        assert!(!std::fs::read_to_string(&path).unwrap().contains("rlm_"), "no token in client config");
    }

    #[cfg(unix)]
    #[test]
    fn a_users_additions_to_the_relay_entry_stay_and_links_stay_links() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.json");
        std::fs::write(
            &real,
            r#"{"mcpServers":{"relay":{"command":"/old/agent-bridge","args":["mcp"],"env":{"RELAY_HANDLE":"x"}}}}"#,
        )
        .unwrap();
        let link = dir.path().join(".mcp.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(install_json(&link, "agent-bridge", &["mcp", "--harness", "claude"], &[]).unwrap());
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays a link");
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&real).unwrap()).unwrap();
        assert_eq!(doc["mcpServers"]["relay"]["command"], "agent-bridge");
        assert_eq!(doc["mcpServers"]["relay"]["env"]["RELAY_HANDLE"], "x", "the user's env stays");
    }

    fn stop_hook(program: &str) -> HookSpec<'static> {
        HookSpec::claude("Stop", "stop", program, json!({}))
    }

    #[test]
    fn a_stop_hook_from_a_path_with_spaces_is_quoted_and_recognised() {
        let program = shell_word("/opt/my tools/agent-bridge");
        assert_eq!(program, "'/opt/my tools/agent-bridge'");
        let command = format!("{program} hook stop");
        assert!(is_relay_hook(&command, "stop") && is_relay_hook("agent-bridge hook stop", "stop"));
        assert!(!is_relay_hook("other-tool hook stop", "stop") && !is_relay_hook("agent-bridge hook stopper", "stop"));
        assert!(!is_relay_hook("agent-bridge hook wake", "stop"), "each hook is told apart by its subcommand");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        assert!(install_hook(&path, &stop_hook(&program)).unwrap());
        assert!(install_hook(&path, &stop_hook("agent-bridge")).unwrap());
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["hooks"]["Stop"].as_array().unwrap().len(), 1, "{doc}");
    }

    #[test]
    fn the_wake_hook_sits_beside_the_stop_hook_and_keeps_its_settings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        let wake =
            |program| HookSpec::claude("Stop", "wake", program, json!({ "asyncRewake": true, "timeout": 86460 }));
        assert!(install_hook(&path, &stop_hook("agent-bridge")).unwrap());
        assert!(install_hook(&path, &wake("/old/agent-bridge")).unwrap());
        assert!(install_hook(&path, &wake("agent-bridge")).unwrap(), "a moved binary updates the hook");
        assert!(
            !install_hook(&path, &wake("agent-bridge")).unwrap()
                && !install_hook(&path, &stop_hook("agent-bridge")).unwrap()
        );
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let hooks: Vec<&Value> = doc["hooks"]["Stop"].as_array().unwrap().iter().map(|g| &g["hooks"][0]).collect();
        assert_eq!(hooks.len(), 2, "{doc}");
        assert_eq!(hooks[0]["command"], "agent-bridge hook stop");
        assert_eq!(
            *hooks[1],
            json!({ "type": "command", "command": "agent-bridge hook wake", "asyncRewake": true, "timeout": 86460 })
        );
        // A wake hook someone made synchronous gets its background mode back.
        let text = std::fs::read_to_string(&path).unwrap().replace("\"asyncRewake\": true", "\"asyncRewake\": false");
        std::fs::write(&path, text).unwrap();
        assert!(install_hook(&path, &wake("agent-bridge")).unwrap());
        assert!(std::fs::read_to_string(&path).unwrap().contains("\"asyncRewake\": true"));
    }

    #[test]
    fn cursors_stop_hook_is_set_once_beside_the_users_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hooks.json");
        std::fs::write(&path, r#"{"version":1,"hooks":{"stop":[{"command":"./mine.sh"}],"afterFileEdit":[]}}"#)
            .unwrap();
        assert!(install_cursor_stop_hook(&path, "/old/agent-bridge hook cursor-stop").unwrap());
        assert!(install_cursor_stop_hook(&path, "agent-bridge hook cursor-stop").unwrap());
        assert!(!install_cursor_stop_hook(&path, "agent-bridge hook cursor-stop").unwrap());
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            doc,
            json!({"version":1,"hooks":{"stop":[{"command":"./mine.sh"},{"command":"agent-bridge hook cursor-stop"}],"afterFileEdit":[]}})
        );
        let fresh = dir.path().join("new.json");
        assert!(install_cursor_stop_hook(&fresh, "agent-bridge hook cursor-stop").unwrap());
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&fresh).unwrap()).unwrap();
        assert_eq!(doc, json!({"version":1,"hooks":{"stop":[{"command":"agent-bridge hook cursor-stop"}]}}));
    }

    #[test]
    fn gemini_trusts_the_relay_server_and_keeps_what_the_user_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        std::fs::write(
            &path,
            r#"{"mcpServers":{"relay":{"command":"/old/agent-bridge","args":["mcp"],"timeout":5000}}}"#,
        )
        .unwrap();
        let trust = [("trust", json!(true))];
        assert!(install_json(&path, "agent-bridge", &["mcp", "--harness", "gemini"], &trust).unwrap());
        assert!(!install_json(&path, "agent-bridge", &["mcp", "--harness", "gemini"], &trust).unwrap());
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            doc["mcpServers"]["relay"],
            json!({"command":"agent-bridge","args":["mcp","--harness","gemini"],"timeout":5000,"trust":true})
        );
    }

    #[test]
    fn json_install_refuses_to_clobber_a_broken_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".mcp.json");
        std::fs::write(&path, "{ not json").unwrap();
        assert!(install_json(&path, "agent-bridge", &["mcp"], &[]).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
    }

    #[test]
    fn the_stop_hook_is_added_once_beside_other_hooks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        std::fs::write(&path, r#"{"hooks":{"Stop":[{"hooks":[{"type":"command","command":"other"}]}]},"model":"x"}"#)
            .unwrap();
        assert!(install_hook(&path, &stop_hook("agent-bridge")).unwrap());
        assert!(!install_hook(&path, &stop_hook("agent-bridge")).unwrap());
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
    fn codex_reinstall_updates_relays_fields_and_keeps_what_the_user_added() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let before = "# my settings\nmodel = \"o3\"\n\n# relay, from the old place\n[mcp_servers.relay]\n# the bridge\ncommand = \"/old/agent-bridge\" # moved since\nargs = [\"mcp\", \"--harness\", \"codex\"]\nstartup_timeout_sec = 20\n\n[mcp_servers.relay.env]\nRELAY_HANDLE = \"reviewer\"\n";
        std::fs::write(&path, before).unwrap();
        assert!(install_codex(&path, "/new/agent-bridge").unwrap());
        assert!(!install_codex(&path, "/new/agent-bridge").unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        let after = before.replace("/old/agent-bridge", "/new/agent-bridge").replace(
            "startup_timeout_sec = 20\n",
            "startup_timeout_sec = 20\ndefault_tools_approval_mode = \"approve\"\n",
        );
        assert_eq!(text, after, "only the command changed, and the tools were approved");
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
                "[mcp_servers.relay]\ncommand = \"agent-bridge\"\nargs = [\"mcp\", \"--harness\", \"codex\"]\ndefault_tools_approval_mode = \"approve\""
            ),
            "{text}"
        );
    }
}
