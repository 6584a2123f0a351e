//! The arguments of every tool, one type each. A type is both how a call is read (`args::parse`)
//! and, derived from it, the tool's `inputSchema`: field doc comments are the argument
//! descriptions, and the field types carry their ranges, words and defaults.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::args::{Addresses, Attachments, Count, Flag, NonBlank, OneOf, Paths, Seconds, Selectors, Text, Word, words};
use super::{ASK_WAIT_DEFAULT_S, MAX_RECIPIENTS, MAX_WAIT_S, NOTE_CHARS, TITLE_CHARS};

words!(StatusState: "idle", "busy", "blocked", "away");
words!(RulesAction: "show", "set", "widen", "lift", "why");
words!(ScopePreset: "open", "tree", "parent", "none");
words!(GroupAction: "create", "add", "remove", "rules", "ls", "show", "drop");
words!(AgentCli: "claude", "codex");
words!(Column: "todo", "in-progress", "review", "done");
words!(Decision: "allow", "deny", "owner");

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Whoami {}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct List {
    /// offline and ended too
    pub all: Option<Flag>,
    /// contact accounts' agents instead
    pub contacts: Option<Flag>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Send {
    pub to: Addresses<MAX_RECIPIENTS>,
    /// at most 64 KiB
    pub body: NonBlank,
    /// thread id to continue
    pub thread: Option<Text>,
    /// only recipients allowed private data get it
    pub private: Option<Flag>,
    /// files: paths, or {name, text|base64}
    pub attach: Option<Attachments>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    pub id: NonBlank,
    pub body: NonBlank,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Inbox {
    #[serde(default)]
    pub wait_s: Seconds<0, MAX_WAIT_S>,
    /// default true: mark read
    pub ack: Option<Flag>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ask {
    /// one address
    pub to: NonBlank,
    pub body: NonBlank,
    #[serde(default)]
    pub wait_s: Seconds<ASK_WAIT_DEFAULT_S, MAX_WAIT_S>,
    /// it must reply before it stops
    pub require_reply: Option<Flag>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskWait {
    pub id: NonBlank,
    #[serde(default)]
    pub wait_s: Seconds<ASK_WAIT_DEFAULT_S, MAX_WAIT_S>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetStatus {
    pub state: OneOf<StatusState>,
    #[schemars(length(max = NOTE_CHARS))]
    pub note: Option<Text>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetNow {
    #[schemars(length(max = NOTE_CHARS))]
    pub now: Text,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTitle {
    #[schemars(length(max = TITLE_CHARS))]
    pub title: Text,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    pub action: OneOf<RulesAction>,
    /// an agent you spawned (default: you)
    pub endpoint: Option<Text>,
    #[serde(rename = "in")]
    pub rules_in: Option<Selectors>,
    #[serde(rename = "out")]
    pub rules_out: Option<Selectors>,
    /// preset for in and out
    pub scope: Option<Word<ScopePreset>>,
    pub allow: Option<Selectors>,
    /// cap-<n>
    pub cap: Option<NonBlank>,
    pub from: Option<Text>,
    pub to: Option<NonBlank>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Group {
    pub action: OneOf<GroupAction>,
    pub name: Option<Text>,
    /// for add, remove (default: you)
    pub endpoint: Option<Text>,
    pub rules: Option<Selectors>,
    #[serde(rename = "in")]
    pub rules_in: Option<Selectors>,
    #[serde(rename = "out")]
    pub rules_out: Option<Selectors>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Peers {
    /// offline too
    pub all: Option<Flag>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Peek {
    pub endpoint: Option<NonBlank>,
    pub turns: Option<Count<1, 10>>,
    /// up to 10 turns
    pub full: Option<Flag>,
    /// who peeked at you
    pub who: Option<Flag>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPeek {
    pub on: Flag,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostJob {
    /// one line
    pub title: NonBlank,
    /// context, files, how to tell it is done
    pub detail: Option<Text>,
    /// path or folder (default: yours)
    pub repo: Option<Text>,
    /// cron (local time) or @daily, @weekly…
    pub schedule: Option<Text>,
    /// default: yours
    pub agent: Option<Word<AgentCli>>,
    /// default true (false if scheduled)
    pub requires_pr: Option<Flag>,
    /// claimed while it runs
    pub paths: Option<Paths<MAX_CLAIM_PATHS>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListJobs {
    pub state: Option<Word<Column>>,
    /// path or folder name
    pub repo: Option<Text>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadJob {
    pub id: NonBlank,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditJob {
    pub id: NonBlank,
    pub title: Option<Text>,
    pub detail: Option<Text>,
    pub repo: Option<Text>,
    pub schedule: Option<Text>,
    pub requires_pr: Option<Flag>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishJob {
    pub pr_url: Option<Text>,
    pub summary: Option<Text>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseJob {
    pub id: NonBlank,
    pub accept: Flag,
    /// required to send it back
    pub note: Option<Text>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddRepo {
    /// absolute path (~/ allowed)
    pub path: NonBlank,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerPermission {
    pub id: NonBlank,
    pub decision: OneOf<Decision>,
    pub reason: Option<Text>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Permission {
    pub tool_name: NonBlank,
    /// the tool's input, as the client gave it
    #[schemars(with = "Option<Map<String, Value>>")]
    pub input: Option<Value>,
    /// the client's id of the call
    #[allow(dead_code, reason = "Claude Code sends it; the request is known by its card and tool")]
    pub tool_use_id: Option<Text>,
}

/// The value of an optional text argument, empty when not given.
pub fn text(value: Option<Text>) -> String {
    value.map(|t| t.0).unwrap_or_default()
}

/// The value of an optional word, empty when not given.
pub fn word<W: super::args::Words>(value: Option<Word<W>>) -> String {
    value.map(|w| w.0).unwrap_or_default()
}

/// Paths one claim names; the server holds the same bound.
pub const MAX_CLAIM_PATHS: usize = 64;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// from the repo root; a folder covers all below
    pub paths: Paths<MAX_CLAIM_PATHS>,
    /// URL or path (default: here)
    pub repo: Option<NonBlank>,
    pub exclusive: Option<Flag>,
    /// claim again to renew
    pub ttl_s: Option<Count<60, 86400>>,
    pub reason: NonBlank,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// claim-<n>
    pub claim: Option<NonBlank>,
    pub paths: Option<Paths<MAX_CLAIM_PATHS>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    pub repo: Option<NonBlank>,
    pub mine: Option<Flag>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Subscribe {
    /// #name, or account/#name of a contact's
    pub topic: NonBlank,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Unsubscribe {
    pub topic: NonBlank,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Publish {
    pub topic: NonBlank,
    pub body: NonBlank,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Fetch {
    /// id, short id or last
    pub message: NonBlank,
    pub name: NonBlank,
    /// default: the name
    pub save_to: Option<NonBlank>,
    pub overwrite: Option<Flag>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Search {
    /// words, "a phrase", -word, or
    pub query: NonBlank,
    pub from: Option<NonBlank>,
    pub to: Option<NonBlank>,
    pub thread: Option<NonBlank>,
    /// 30m, 24h, 7d or a time
    pub since: Option<NonBlank>,
    pub limit: Option<Count<1, 50>>,
}
