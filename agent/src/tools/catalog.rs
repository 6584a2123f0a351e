//! Every tool the bridge offers, each defined once: name, description, input schema (derived from
//! its argument type, which also reads its calls), output schema (derived from the type its result
//! carries), annotations, and who it is listed to.

use serde_json::{Value, json};

use super::args::input_schema;
use super::input;
use super::output::{self, schema};
use crate::Version;

/// Who a tool is listed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    Everyone,
    /// Agents of an account with a repository on its board (the server says so in `WhoAmI`).
    Board,
    /// The account's operator endpoint (the server checks it again on every call).
    Operator,
    /// Agents that edit shared code: all but the account's operator, which steers the board (the
    /// cards it posts claim paths for their agents, `post_job {paths}`).
    Editor,
    /// An agent the board dispatched, which holds a job token.
    BoardAgent,
}

/// The MCP tool annotations, stated for each tool as what it really does.
#[derive(Debug, Clone, Copy)]
pub struct Hints {
    read_only: bool,
    destructive: bool,
    idempotent: bool,
    /// It reaches other agents or people, or shows what they wrote.
    open_world: bool,
}

impl Hints {
    /// Reads what others wrote or do (agents' titles and notes, cards, a title an earlier holder
    /// of the handle left).
    const READ_SHARED: Self = Self { read_only: true, destructive: false, idempotent: true, open_world: true };
    /// Replaces a value of the caller's own (the one before is gone); repeating it changes nothing more.
    const SET: Self = Self { read_only: false, destructive: true, idempotent: true, open_world: false };
    /// Adds to the relay's state; adding what is there already does nothing.
    const ADD: Self = Self { read_only: false, destructive: false, idempotent: true, open_world: false };
    /// Replaces or deletes settings (kept turns).
    const REPLACE: Self = Self { read_only: false, destructive: true, idempotent: true, open_world: false };
    /// Several actions in one tool, from reading to creating and deleting (rules, groups): what
    /// holds for all of them.
    const MANAGE: Self = Self { read_only: false, destructive: true, idempotent: false, open_world: false };
    /// Replaces fields of a card others see and workers act on.
    const EDIT: Self = Self { read_only: false, destructive: true, idempotent: true, open_world: true };
    /// Sends to other agents: each call is a new message.
    const MESSAGE: Self = Self { read_only: false, destructive: false, idempotent: false, open_world: true };
    /// Takes what other agents sent and marks it read.
    const TAKE: Self = Self { read_only: false, destructive: false, idempotent: false, open_world: true };
    /// Reads another agent's turns, and the read is recorded for that agent to see.
    const PEEK: Self = Self { read_only: false, destructive: false, idempotent: false, open_world: true };
    /// Acts on the board, which others see and workers act on.
    const ACT: Self = Self { read_only: false, destructive: false, idempotent: false, open_world: true };
    /// Says something other agents see and are stopped by (a claim); saying it again renews it.
    const CLAIM: Self = Self { read_only: false, destructive: false, idempotent: true, open_world: true };
    /// Ends what the caller said to others (its claims); ending it again changes nothing.
    const WITHDRAW: Self = Self { read_only: false, destructive: true, idempotent: true, open_world: true };
    /// Follows a topic, whose posts others write; following again changes nothing.
    const FOLLOW: Self = Self { read_only: false, destructive: false, idempotent: true, open_world: true };
    /// Stops following a topic; stopping again changes nothing.
    const UNFOLLOW: Self = Self { read_only: false, destructive: true, idempotent: true, open_world: false };
    /// Writes a file another agent sent into the working directory (over one only when asked).
    const FETCH: Self = Self { read_only: false, destructive: true, idempotent: true, open_world: true };
    /// Closes a card for good (Done removes its worktree) or sends it back.
    const DESTROY: Self = Self { read_only: false, destructive: true, idempotent: false, open_world: true };

    fn to_json(self) -> Value {
        json!({
            "readOnlyHint": self.read_only,
            "destructiveHint": self.destructive,
            "idempotentHint": self.idempotent,
            "openWorldHint": self.open_world,
        })
    }
}

pub struct Tool {
    name: &'static str,
    description: String,
    /// The schema of its arguments, derived from their type in `input.rs`.
    input: Value,
    hints: Hints,
    /// The schema of its `structuredContent`; `None` for a tool that answers in text alone.
    output: Option<Value>,
    audience: Audience,
}

impl Tool {
    pub fn name(&self) -> &'static str {
        self.name
    }

    #[cfg(test)]
    fn has_output(&self) -> bool {
        self.output.is_some()
    }

    pub fn audience(&self) -> Audience {
        self.audience
    }

    /// The tool as `tools/list` shows it in `version`: annotations from 2025-03-26, output
    /// schemas from 2025-06-18, as each version defines them.
    pub fn listing(&self, version: Version) -> Value {
        let mut listed = json!({ "name": self.name, "description": self.description, "inputSchema": self.input });
        if version.has_annotations() {
            listed["annotations"] = self.hints.to_json();
        }
        if version.has_structured_content()
            && let Some(output) = &self.output
        {
            listed["outputSchema"] = output.clone();
        }
        listed
    }
}

/// Every tool the bridge knows.
pub fn all() -> &'static [Tool] {
    static TOOLS: std::sync::OnceLock<Vec<Tool>> = std::sync::OnceLock::new();
    TOOLS.get_or_init(build)
}

pub fn find(name: &str) -> Option<&'static Tool> {
    all().iter().find(|t| t.name() == name)
}

/// How long a call of tool `name` with `arguments` may wait for a message, in seconds: `None` for
/// a call that does not wait (or whose arguments are refused anyway).
pub fn wait_of(name: &str, arguments: &serde_json::Map<String, Value>) -> Option<u32> {
    let seconds = match name {
        "relay_inbox" => super::args::parse::<input::Inbox>(arguments).ok()?.wait_s.0,
        "relay_ask" => super::args::parse::<input::Ask>(arguments).ok()?.wait_s.0,
        "relay_ask_wait" => super::args::parse::<input::AskWait>(arguments).ok()?.wait_s.0,
        _ => 0,
    };
    (seconds > 0).then_some(seconds)
}

fn build() -> Vec<Tool> {
    vec![
        Tool {
            name: "relay_whoami",
            description: "Your address (account/machine/handle), status and unread count.".into(),
            input: input_schema::<input::Whoami>(),
            hints: Hints::READ_SHARED,
            output: Some(schema::<output::Whoami>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_list",
            description: "Agents you can message (online unless all).".into(),
            input: input_schema::<input::List>(),
            hints: Hints::READ_SHARED,
            output: None,
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_send",
            description: "Message agents: handle, machine/handle or account/machine/handle; offline ones get it later.".into(),
            input: input_schema::<input::Send>(),
            hints: Hints::MESSAGE,
            output: Some(schema::<output::Sent>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_reply",
            description: "Reply by id, short id or last (the newest shown): to the sender, in its thread; marks it read.".into(),
            input: input_schema::<input::Reply>(),
            hints: Hints::MESSAGE,
            output: Some(schema::<output::Sent>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_inbox",
            description: "Your unread messages, oldest first.".into(),
            input: input_schema::<input::Inbox>(),
            hints: Hints::TAKE,
            output: Some(schema::<output::Inbox>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_subscribe",
            description: "Follow a topic: its recent and new posts come with your mail.".into(),
            input: input_schema::<input::Subscribe>(),
            hints: Hints::FOLLOW,
            output: Some(schema::<output::Followed>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_unsubscribe",
            description: "Stop following a topic.".into(),
            input: input_schema::<input::Unsubscribe>(),
            hints: Hints::UNFOLLOW,
            output: Some(schema::<output::Unfollowed>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_publish",
            description: "Post to a topic's followers; relay_send to \"#topic\" does the same.".into(),
            input: input_schema::<input::Publish>(),
            hints: Hints::MESSAGE,
            output: Some(schema::<output::Posted>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_fetch",
            description: "Save a file a message carries into your working directory.".into(),
            input: input_schema::<input::Fetch>(),
            hints: Hints::FETCH,
            output: Some(schema::<output::Fetched>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_search",
            description: "Messages you received or sent that hold the words, best first.".into(),
            input: input_schema::<input::Search>(),
            hints: Hints::READ_SHARED,
            output: Some(schema::<output::Found>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_ask",
            description: "Ask one agent and wait for its reply; if none in time, relay_ask_wait with the id.".into(),
            input: input_schema::<input::Ask>(),
            hints: Hints::MESSAGE,
            output: Some(schema::<output::Replies>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_ask_wait",
            description: "Keep waiting for replies to a relay_ask, by its id.".into(),
            input: input_schema::<input::AskWait>(),
            hints: Hints::TAKE,
            output: Some(schema::<output::Replies>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_set_status",
            description: "Your status in relay_list, with an optional one-line note.".into(),
            input: input_schema::<input::SetStatus>(),
            hints: Hints::SET,
            output: None,
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_set_now",
            description: "One line on what you are doing now, shown in relay_list.".into(),
            input: input_schema::<input::SetNow>(),
            hints: Hints::SET,
            output: None,
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_rules",
            description: "Who may message you (in), whom you may (out); cap agents you spawned. Selectors: *, ep:<address>, handle:<glob>, group:<name>, tree:parent|children|siblings|self|descendants, fleet:<root>.".into(),
            input: input_schema::<input::Rules>(),
            hints: Hints::MANAGE,
            output: Some(schema::<output::RulesResult>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_group",
            description: "Groups of your account's agents; their rules (as relay_rules', group:self = members) cap members; to: group:<name> sends to them.".into(),
            input: input_schema::<input::Group>(),
            hints: Hints::MANAGE,
            output: Some(schema::<output::Groups>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_peers",
            description: "Everyone you may message now, and what admits each.".into(),
            input: input_schema::<input::Peers>(),
            hints: Hints::READ_SHARED,
            output: Some(schema::<output::Peers>()),
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_peek",
            description: "Another agent's last turns (redacted), if it allows it and you may message it.".into(),
            input: input_schema::<input::Peek>(),
            hints: Hints::PEEK,
            output: None,
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_set_peek",
            description: "on: agents that may message you see your last turns, redacted; off stops and deletes them.".into(),
            input: input_schema::<input::SetPeek>(),
            hints: Hints::REPLACE,
            output: None,
            audience: Audience::Everyone,
        },
        Tool {
            name: "relay_claim",
            description: "Claim paths before changing them; says who holds any already, and why.".into(),
            input: input_schema::<input::Claim>(),
            hints: Hints::CLAIM,
            output: Some(schema::<output::Claimed>()),
            audience: Audience::Editor,
        },
        Tool {
            name: "relay_release",
            description: "End your path claims: one, some paths, or all.".into(),
            input: input_schema::<input::Release>(),
            hints: Hints::WITHDRAW,
            output: Some(schema::<output::Claims>()),
            audience: Audience::Editor,
        },
        Tool {
            name: "relay_claims",
            description: "Path claims you can see.".into(),
            input: input_schema::<input::Claims>(),
            hints: Hints::READ_SHARED,
            output: Some(schema::<output::Claims>()),
            audience: Audience::Editor,
        },
        Tool {
            name: "post_job",
            description: "Queue work for a fresh agent in its own worktree, when your user asks: detail must be all it needs.".into(),
            input: input_schema::<input::PostJob>(),
            hints: Hints::ACT,
            output: Some(schema::<output::Job>()),
            audience: Audience::Board,
        },
        Tool {
            name: "list_jobs",
            description: "Board cards by column, with ids; state done lists finished ones.".into(),
            input: input_schema::<input::ListJobs>(),
            hints: Hints::READ_SHARED,
            output: Some(schema::<output::Jobs>()),
            audience: Audience::Board,
        },
        Tool {
            name: "read_job",
            description: "One board card in full.".into(),
            input: input_schema::<input::ReadJob>(),
            hints: Hints::READ_SHARED,
            output: Some(schema::<output::Job>()),
            audience: Audience::Board,
        },
        Tool {
            name: "edit_job",
            description: "Change a card still in To do; given fields replace the old (an empty schedule: run once).".into(),
            input: input_schema::<input::EditJob>(),
            hints: Hints::EDIT,
            output: Some(schema::<output::Job>()),
            audience: Audience::Board,
        },
        Tool {
            name: "finish_job",
            description: "Report your card done (to Review): the pull request's URL if it requires one, else a summary.".into(),
            input: input_schema::<input::FinishJob>(),
            hints: Hints::ACT,
            output: Some(schema::<output::Job>()),
            audience: Audience::BoardAgent,
        },
        Tool {
            name: "close_job",
            description: "Accept a card in Review as Done, or send it back to To do with a note.".into(),
            input: input_schema::<input::CloseJob>(),
            hints: Hints::DESTROY,
            output: Some(schema::<output::Job>()),
            audience: Audience::Operator,
        },
        Tool {
            name: "add_repo",
            description: "Put a git repository of this machine on the board.".into(),
            input: input_schema::<input::AddRepo>(),
            hints: Hints::ADD,
            output: Some(schema::<output::Repo>()),
            audience: Audience::Operator,
        },
        Tool {
            name: "answer_permission",
            description: "Answer a board agent's permission request ([Approval <id>]); owner leaves it to your human.".into(),
            input: input_schema::<input::AnswerPermission>(),
            hints: Hints::ACT,
            output: Some(schema::<output::Decision>()),
            audience: Audience::Operator,
        },
        Tool {
            name: "relay_permission",
            description: "For a board agent's client: asks the account's operator (then its human) whether a tool may run. Returns {\"behavior\": \"allow\"|\"deny\", …}.".into(),
            input: input_schema::<input::Permission>(),
            hints: Hints::ACT,
            output: None,
            audience: Audience::BoardAgent,
        },
        Tool {
            name: "relay_set_title",
            description: "What you work on, one line, shown in relay_list (empty clears it).".into(),
            input: input_schema::<input::SetTitle>(),
            hints: Hints::SET,
            output: None,
            audience: Audience::Everyone,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calls_that_wait_say_how_long() {
        let args = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(wait_of("relay_inbox", &args(json!({ "wait_s": 40 }))), Some(40));
        assert_eq!(wait_of("relay_inbox", &args(json!({}))), None, "an inbox looks without waiting by default");
        assert_eq!(wait_of("relay_ask", &args(json!({ "to": "bob", "body": "?" }))), Some(30));
        assert_eq!(wait_of("relay_ask_wait", &args(json!({ "id": "abcd", "wait_s": 5 }))), Some(5));
        assert_eq!(wait_of("relay_send", &args(json!({ "to": "bob", "body": "hi" }))), None);
        assert_eq!(wait_of("relay_inbox", &args(json!({ "wait_s": "soon" }))), None);
    }

    #[test]
    fn every_tool_is_complete_and_named_once() {
        let mut names: Vec<&str> = all().iter().map(Tool::name).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a tool is defined twice");
        for tool in all() {
            let listed = tool.listing(Version::LATEST);
            assert!(listed["description"].as_str().is_some_and(|d| !d.is_empty()), "{}", tool.name());
            assert_eq!(listed["inputSchema"]["type"], "object", "{}", tool.name());
            assert!(listed["annotations"]["readOnlyHint"].is_boolean(), "{}", tool.name());
            assert_eq!(listed.get("outputSchema").is_some(), tool.has_output(), "{}", tool.name());
        }
    }

    #[test]
    fn older_versions_see_only_what_they_define() {
        let send = find("relay_send").unwrap();
        let old = send.listing(Version::parse("2024-11-05").unwrap());
        assert!(old.get("annotations").is_none() && old.get("outputSchema").is_none(), "{old}");
        let mid = send.listing(Version::parse("2025-03-26").unwrap());
        assert!(mid.get("annotations").is_some() && mid.get("outputSchema").is_none(), "{mid}");
    }

    #[test]
    fn reading_tools_say_so_and_sending_tools_do_not() {
        let hints = |name: &str| find(name).unwrap().hints;
        assert!(hints("relay_whoami").read_only && hints("list_jobs").read_only);
        assert!(!hints("relay_send").read_only && hints("relay_send").open_world && !hints("relay_send").idempotent);
        assert!(!hints("relay_inbox").read_only, "the inbox marks what it returns read");
        assert!(hints("close_job").destructive);
        assert!(hints("relay_whoami").open_world, "whoami shows a title an earlier holder left");
        for name in ["relay_rules", "relay_group"] {
            let h = hints(name);
            assert!(!h.read_only && h.destructive && !h.idempotent, "{name}: some actions create or delete");
        }
        assert!(hints("edit_job").open_world, "cards are seen and acted on by others");
    }
}
