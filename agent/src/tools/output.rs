//! The structured results of the tools that have one. Each type is both what a result carries and,
//! derived from it, the tool's `outputSchema`, so the two cannot drift apart. Text another agent
//! wrote is stored here already neutralised, exactly as the text part shows it.

use relay_proto::v1::{Endpoint, JobView, Message, RecipientState, Redaction};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

use crate::frame;

/// Fields every structured result may carry beside its own.
pub const UNTRUSTED: &str = "untrusted";
pub const NEXT: &str = "next";
pub const HINT: &str = "hint";

fn is_false(b: &bool) -> bool {
    !b
}

/// A tool's `outputSchema`: the derived schema, inlined, with the shared fields added.
pub fn schema<T: JsonSchema>() -> Value {
    let mut schema = derived::<T>();
    let properties = schema["properties"].as_object_mut().expect("an output is an object");
    properties.insert(
        UNTRUSTED.into(),
        json!({ "type": "string", "description": "present when the result holds text other agents wrote: how to treat it" }),
    );
    properties.insert(
        NEXT.into(),
        json!({ "type": "array", "items": { "type": "string" }, "description": "what to do next" }),
    );
    properties.insert(HINT.into(), json!({ "type": "string", "description": "unread relay messages waiting" }));
    schema
}

/// The schema derived from `T`, as every tool's input and output is given: draft-07, subschemas
/// inlined, without the type's own title and doc comment (the tool's description says what it is)
/// and without Rust-sized number formats.
pub(super) fn derived<T: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft07()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    plain_numbers(&mut schema);
    if let Some(object) = schema.as_object_mut() {
        object.remove("title");
        object.remove("description");
    }
    schema
}

/// Drops the Rust-sized number formats (`uint32`, `int64`, …) the derivation writes: they are not
/// formats JSON Schema knows, and clients warn about them at every start. An unsigned field keeps
/// its `minimum: 0`.
fn plain_numbers(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            if object.get("format").and_then(Value::as_str).is_some_and(|f| {
                f.strip_prefix('u')
                    .unwrap_or(f)
                    .strip_prefix("int")
                    .is_some_and(|bits| bits.chars().all(|c| c.is_ascii_digit()))
                    || f == "double"
                    || f == "float"
            }) {
                object.remove("format");
            }
            object.values_mut().for_each(plain_numbers);
        }
        Value::Array(items) => items.iter_mut().for_each(plain_numbers),
        _ => {}
    }
}

pub fn state_name(state: relay_proto::v1::DeliveryState) -> &'static str {
    use relay_proto::v1::DeliveryState;
    match state {
        DeliveryState::Queued => "queued",
        DeliveryState::Pushed => "pushed",
        DeliveryState::Surfaced => "surfaced",
        DeliveryState::Read => "read",
        DeliveryState::Withdrawn => "withdrawn",
        DeliveryState::Unspecified => "not sent",
    }
}

#[derive(Serialize, JsonSchema)]
pub struct Recipient {
    pub address: String,
    /// queued, pushed, surfaced, read, withdrawn, or not sent
    pub state: String,
    /// whether the recipient is connected now (queued for an online recipient: being pushed)
    pub online: bool,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub reason: String,
}

pub fn recipients(list: &[RecipientState]) -> Vec<Recipient> {
    list.iter()
        .map(|r| Recipient {
            address: r.address.clone(),
            state: state_name(r.state()).into(),
            online: r.online,
            reason: r.reason.clone(),
        })
        .collect()
}

#[derive(Serialize, JsonSchema)]
pub struct Redacted {
    pub kind: String,
    pub count: u32,
}

/// A message another agent sent, its body neutralised.
#[derive(Serialize, JsonSchema)]
pub struct MessageOut {
    pub id: String,
    pub short: String,
    pub seq: u64,
    pub from: String,
    pub thread: String,
    /// message, ask or reply
    pub kind: String,
    pub body: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub reply_to: String,
    /// parent or child, when the sender is in your spawn tree
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub relation: String,
    #[serde(skip_serializing_if = "is_false", default)]
    pub require_reply: bool,
    #[serde(skip_serializing_if = "is_false", default)]
    pub private: bool,
    /// files it carries: relay_fetch
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub files: Vec<FileOut>,
    /// a topic's post: the topic
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub topic: String,
}

impl From<&Message> for MessageOut {
    fn from(m: &Message) -> Self {
        Self {
            id: m.id.clone(),
            short: frame::short(&m.id).to_owned(),
            seq: m.seq,
            from: m.from.clone(),
            thread: m.thread.clone(),
            kind: frame::kind_name(m.kind()).to_owned(),
            body: frame::neutralize(&m.body),
            reply_to: m.reply_to.clone(),
            relation: m.relation.clone(),
            require_reply: m.require_reply,
            private: m.private,
            files: m.attachments.iter().map(FileOut::from).collect(),
            topic: m.topic.clone(),
        }
    }
}

/// A topic followed.
#[derive(Serialize, JsonSchema)]
pub struct Followed {
    /// account/#name
    pub topic: String,
    /// earlier posts you read first
    pub backlog: u64,
    #[serde(skip_serializing_if = "is_false", default)]
    pub already: bool,
}

/// A topic no longer followed.
#[derive(Serialize, JsonSchema)]
pub struct Unfollowed {
    pub topic: String,
    /// you followed it until now
    pub followed: bool,
}

/// A post: its id, its topic and its number there, and who follows the topic.
#[derive(Serialize, JsonSchema)]
pub struct Posted {
    pub id: String,
    /// account/#name
    pub topic: String,
    pub seq: u64,
    pub thread: String,
    /// agents following the topic, you aside
    pub followers: u64,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub redacted: Vec<Redacted>,
}

/// A file a message carries; its name, as its sender gave it, neutralised.
#[derive(Serialize, JsonSchema, Clone)]
pub struct FileOut {
    pub name: String,
    pub size: u64,
    #[serde(skip_serializing_if = "is_false", default)]
    pub binary: bool,
    /// credential spans taken out of a text file
    #[serde(skip_serializing_if = "is_zero", default)]
    pub redacted: u32,
    pub sha256: String,
}

impl From<&relay_proto::v1::Attachment> for FileOut {
    fn from(a: &relay_proto::v1::Attachment) -> Self {
        Self {
            name: frame::neutralize(&a.name),
            size: a.size,
            binary: a.binary,
            redacted: a.redacted,
            sha256: a.sha256.clone(),
        }
    }
}

/// What `relay_fetch` got: where it was saved, or (for an agent whose files the server cannot
/// write) the content.
#[derive(Serialize, JsonSchema)]
pub struct Fetched {
    pub message: String,
    pub file: FileOut,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_to: Option<String>,
    /// the content of a text file, neutralised
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct Whoami {
    pub address: String,
    pub account: String,
    pub machine: String,
    pub handle: String,
    pub harness: String,
    pub status: String,
    pub note: String,
    pub now: String,
    pub title: String,
    pub unread: u64,
    pub operator: bool,
    /// what the endpoint's role lets it do, when it has one beyond an agent's
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub role: String,
}

/// What the operator's role gives, as whoami says it.
pub const OPERATOR_ROLE: &str = "your account's operator (close_job, add_repo, answer_permission)";

impl Whoami {
    pub fn new(e: &Endpoint, unread: u64) -> Self {
        Self {
            address: e.address.clone(),
            account: e.account.clone(),
            machine: e.machine.clone(),
            handle: e.handle.clone(),
            harness: e.harness.clone(),
            status: e.status.clone(),
            note: frame::neutralize(&e.note),
            now: frame::neutralize(&e.now),
            title: frame::neutralize(&e.title),
            unread,
            operator: e.operator,
            role: if e.operator { OPERATOR_ROLE.to_owned() } else { String::new() },
        }
    }
}

/// What a send, a reply or an ask stored.
#[derive(Serialize, JsonSchema)]
pub struct Sent {
    /// the files it carries, as stored
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub files: Vec<FileOut>,
    pub id: String,
    pub thread: String,
    pub recipients: Vec<Recipient>,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub reply_to: String,
    /// the hold id, when the message waits for the account's human
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub hold: String,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub redacted: Vec<Redacted>,
    /// group members not sent to, each with the reason
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub skipped: Vec<Recipient>,
}

pub fn redacted(list: &[Redaction]) -> Vec<Redacted> {
    list.iter().map(|r| Redacted { kind: r.kind.clone(), count: r.count }).collect()
}

#[derive(Serialize, JsonSchema)]
pub struct Inbox {
    pub messages: Vec<MessageOut>,
    /// unread messages left after these
    pub remaining: u64,
}

#[derive(Serialize, JsonSchema)]
pub struct Replies {
    /// the request's id
    pub id: String,
    /// the request's thread (given when the request was just sent)
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub thread: String,
    pub recipients: Vec<Recipient>,
    pub replies: Vec<MessageOut>,
}

#[derive(Serialize, JsonSchema)]
pub struct Cap {
    pub id: String,
    pub dir: String,
    pub selectors: Vec<String>,
    pub by: String,
}

#[derive(Serialize, JsonSchema)]
pub struct Rules {
    pub address: String,
    pub parent: String,
    /// selectors of who may message it; null when open
    #[serde(rename = "in")]
    pub rules_in: Option<Vec<String>>,
    /// selectors of whom it may message; null when open
    #[serde(rename = "out")]
    pub rules_out: Option<Vec<String>>,
    pub caps: Vec<Cap>,
    pub groups: Vec<String>,
}

/// relay_rules: the rules of an endpoint (show, set, widen, lift) or a verdict (why).
#[derive(Serialize, JsonSchema)]
pub struct RulesResult {
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Rules>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub why: Option<Why>,
}

#[derive(Serialize, JsonSchema)]
pub struct Why {
    pub from: String,
    pub to: String,
    pub allowed: bool,
    pub reasons: Vec<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct Group {
    pub name: String,
    pub owner: String,
    #[serde(rename = "in")]
    pub rules_in: Option<Vec<String>>,
    #[serde(rename = "out")]
    pub rules_out: Option<Vec<String>>,
    pub members: Vec<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct Groups {
    pub groups: Vec<Group>,
    /// what the action did, when it says more than the groups show
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub note: String,
}

#[derive(Serialize, JsonSchema)]
pub struct Peer {
    pub address: String,
    /// claude, codex, gemini, cursor or other
    pub harness: String,
    pub online: bool,
    /// what it says it works on, written by that agent (neutralised); empty when it set none
    pub title: String,
    /// what admits it
    pub reason: String,
}

#[derive(Serialize, JsonSchema)]
pub struct Peers {
    pub peers: Vec<Peer>,
}

/// A card, its agent-written text neutralised.
#[derive(Serialize, JsonSchema)]
pub struct Job {
    pub id: String,
    /// todo, in-progress, review or done
    pub state: String,
    pub title: String,
    pub detail: String,
    pub repo: String,
    pub repo_path: String,
    pub machine: String,
    pub agent: String,
    pub requires_pr: bool,
    pub attempts: u32,
    pub posted_by: String,
    pub posted_at: String,
    /// whether a worker serves the card's machine now
    pub worker_running: bool,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub schedule: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub time_zone: String,
    /// RFC 3339 in UTC
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub next_run_at: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub next_run_local: String,
    #[serde(skip_serializing_if = "is_zero", default)]
    pub run_count: u32,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub last_run_at: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub last_skip_reason: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub schedule_id: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub edited_by: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub branch: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub worktree: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub pr_url: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub summary: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub last_error: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub agent_state: String,
    /// the fields an edit changed
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub changed: Vec<String>,
    /// paths the work changes, claimed for its agent while it runs
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub paths: Vec<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl From<&JobView> for Job {
    fn from(j: &JobView) -> Self {
        let repo = j.repo.clone().unwrap_or_default();
        let n = |s: &str| frame::neutralize(s);
        Self {
            id: j.id.clone(),
            state: j.state.clone(),
            title: n(&j.title),
            detail: n(&j.detail),
            repo: n(&repo.name),
            repo_path: n(&repo.path),
            machine: repo.machine,
            agent: j.agent.clone(),
            requires_pr: j.requires_pr,
            attempts: j.attempts,
            posted_by: j.posted_by.clone(),
            posted_at: j.posted_at.clone(),
            worker_running: j.dispatcher_running,
            schedule: j.schedule.clone(),
            time_zone: j.time_zone.clone(),
            next_run_at: j.next_run_at.clone(),
            next_run_local: j.next_run_local.clone(),
            run_count: j.run_count,
            last_run_at: j.last_run_at.clone(),
            last_skip_reason: n(&j.last_skip_reason),
            schedule_id: n(&j.schedule_id),
            edited_by: n(&j.edited_by),
            branch: n(&j.branch),
            worktree: n(&j.worktree),
            pr_url: n(&j.pr_url),
            summary: n(&j.summary),
            last_error: n(&j.last_error),
            agent_state: n(&j.agent_state),
            changed: j.changed.clone(),
            paths: j.paths.iter().map(|p| n(p)).collect(),
        }
    }
}

#[derive(Serialize, JsonSchema)]
pub struct Jobs {
    pub jobs: Vec<Job>,
    /// finished cards not listed (state done lists them)
    pub archived: u32,
}

#[derive(Serialize, JsonSchema)]
pub struct Repo {
    pub name: String,
    pub path: String,
    pub machine: String,
}

#[derive(Serialize, JsonSchema)]
pub struct Decision {
    pub id: String,
    /// allow, deny, escalated, …
    pub state: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_are_plain_objects_with_the_shared_fields() {
        let s = schema::<Inbox>();
        assert_eq!(s["type"], "object");
        assert!(s.get("$schema").is_none() && s.get("definitions").is_none(), "{s}");
        assert_eq!(s["properties"]["messages"]["items"]["properties"]["body"]["type"], "string", "{s}");
        for field in [UNTRUSTED, NEXT, HINT] {
            assert!(s["properties"][field].is_object(), "{field} in {s}");
        }
        let required: Vec<&str> = s["properties"]["messages"]["items"]["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(required.contains(&"body") && !required.contains(&"reply_to"), "{required:?}");
        let seq = &s["properties"]["messages"]["items"]["properties"]["seq"];
        assert_eq!(*seq, json!({ "type": "integer", "minimum": 0 }), "no format a client warns about: {seq}");
    }

    #[test]
    fn no_output_schema_names_a_number_format() {
        for tool in crate::tools::catalog::all() {
            let listed = tool.listing(crate::Version::parse("2025-06-18").unwrap()).to_string();
            assert!(!listed.contains("\"format\""), "{listed}");
        }
    }
}

#[derive(Serialize, JsonSchema)]
pub struct PathClaim {
    /// claim-<n>
    pub id: String,
    /// the holder's address
    pub holder: String,
    pub repo: String,
    pub paths: Vec<String>,
    pub exclusive: bool,
    /// written by the holder (neutralised)
    pub reason: String,
    /// RFC 3339, UTC
    pub since: String,
    pub until: String,
}

impl PathClaim {
    pub fn from_wire(c: &relay_proto::v1::PathClaim) -> Self {
        Self {
            id: c.id.clone(),
            holder: c.holder.clone(),
            repo: c.repo.clone(),
            paths: c.paths.clone(),
            exclusive: c.exclusive,
            reason: frame::neutralize(&c.reason),
            since: c.since.clone(),
            until: c.until.clone(),
        }
    }
}

#[derive(Serialize, JsonSchema)]
pub struct Claimed {
    pub granted: bool,
    /// yours, when granted
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<PathClaim>,
    /// when refused: the claims in the way
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<PathClaim>,
}

#[derive(Serialize, JsonSchema)]
pub struct Claims {
    pub claims: Vec<PathClaim>,
}

/// A message found by its words: where they matched, neutralised.
#[derive(Serialize, JsonSchema)]
pub struct FoundOut {
    pub id: String,
    pub short: String,
    pub from: String,
    pub thread: String,
    pub sent_at: String,
    /// the words found between « and »
    pub snippet: String,
}

impl From<&relay_proto::v1::FoundMessage> for FoundOut {
    fn from(f: &relay_proto::v1::FoundMessage) -> Self {
        Self {
            id: f.id.clone(),
            short: frame::short(&f.id).to_owned(),
            from: f.from.clone(),
            thread: f.thread.clone(),
            sent_at: f.sent_at.clone(),
            snippet: frame::neutralize(&f.snippet),
        }
    }
}

#[derive(Serialize, JsonSchema)]
pub struct Found {
    /// best match first
    pub found: Vec<FoundOut>,
}
