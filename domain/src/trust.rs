//! What the trust features report (holds, peeks, permission requests and contacts) and their rules.

use std::fmt;

use chrono::{DateTime, Utc};

use super::ids::{ApprovalId, EndpointId, HoldId, JobId, MessageId};
use super::{Error, Result};

/// Hold classes an account can turn on.
pub const HOLD_CLASSES: [&str; 2] = ["private-outbound", "contact"];
/// Most turns a peek keeps and returns.
pub const MAX_PEEK_TURNS: usize = 10;

/// Where a held message stands, as `holds.state` stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldState {
    Pending,
    Released,
    Rejected,
}

impl HoldState {
    pub const ALL: [Self; 3] = [Self::Pending, Self::Released, Self::Rejected];

    /// Const, so SQL text can spell a state where a partial index needs the literal.
    pub const fn as_db(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Released => "released",
            Self::Rejected => "rejected",
        }
    }

    pub fn from_db(value: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_db() == value)
            .ok_or_else(|| Error::Internal(format!("unknown hold state {value} in the database")))
    }
}

impl fmt::Display for HoldState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_db())
    }
}

/// Where a permission request stands, as `approvals.state` stores it: open while pending (with the
/// operator) or escalated (with the human), then decided for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalState {
    Pending,
    Escalated,
    Allow,
    Deny,
}

impl ApprovalState {
    pub const ALL: [Self; 4] = [Self::Pending, Self::Escalated, Self::Allow, Self::Deny];

    /// Const, so SQL text can spell a state where a partial index needs the literal.
    pub const fn as_db(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Escalated => "escalated",
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }

    pub fn from_db(value: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_db() == value)
            .ok_or_else(|| Error::Internal(format!("unknown permission request state {value} in the database")))
    }
}

impl fmt::Display for ApprovalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_db())
    }
}

/// Longest piece of a tool's input a permission request keeps and quotes.
const EXCERPT_CHARS: usize = 600;

/// A tool's input as a permission request keeps it: cut short.
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// A decision as the operator (`human` false) or the human spells it. Only the operator can hand
/// a request on to the human (`owner`).
pub fn decision(decision: &str, human: bool) -> Result<ApprovalState> {
    match (decision.trim(), human) {
        ("allow", _) => Ok(ApprovalState::Allow),
        ("deny", _) => Ok(ApprovalState::Deny),
        ("owner", false) => Ok(ApprovalState::Escalated),
        _ => Err(Error::invalid(if human {
            "decision must be allow or deny"
        } else {
            "decision must be allow, deny or owner"
        })),
    }
}

/// The question put to the operator: `requester`, working card `job_id` titled `title`, asks to
/// use `tool` with `input`.
pub fn approval_question(
    id: &ApprovalId,
    requester: &str,
    job_id: &JobId,
    title: &str,
    tool: &str,
    input: &str,
) -> String {
    format!(
        "[Approval {id}] {requester} working on card {job_id} (\"{title}\") asks to use {}: {}\nAnswer with answer_permission {{id: \"{id}\", decision: allow | deny | owner}}.",
        tool.trim(),
        excerpt(input)
    )
}

/// The question put to the account's human when the operator did not answer (or there is none).
pub fn approval_escalation(id: &ApprovalId, requester: &str, job_id: &JobId, tool: &str, input: &str) -> String {
    format!(
        "[Approval {id}] {requester} working on card {job_id} asks to use {}: {}\nThe operator has not answered. Answer with agent-bridge human approve {id} allow|deny.",
        tool.trim(),
        excerpt(input)
    )
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub id: HoldId,
    pub class: String,
    pub state: HoldState,
    pub reason: String,
    pub from: String,
    pub to: Vec<String>,
    pub body: String,
    pub message_id: MessageId,
    /// The files it carries: its reviewer sees what would go.
    pub files: Vec<crate::artifact::Attached>,
}

/// A held message as its human decides on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldMessage {
    pub message_id: MessageId,
    pub recipients: Vec<EndpointId>,
    pub state: HoldState,
    pub sender_id: EndpointId,
    pub sender: String,
    /// Why it was held: a class the account turned on, or the loop guard's.
    pub class: String,
    /// The thread it was sent in: a release of the loop guard's hold lets that thread go on.
    pub thread: String,
}

/// Refuses a hold class an account cannot turn on.
pub fn check_hold_class(class: &str) -> Result<()> {
    if !HOLD_CLASSES.contains(&class) {
        return Err(Error::invalid(format!("unknown hold class {class:?}: use {}", HOLD_CLASSES.join(" or "))));
    }
    Ok(())
}

/// A hold is decided once; a rejection needs a reason, since the sender reads it.
pub fn check_decision(id: &HoldId, state: HoldState, release: bool, reason: &str) -> Result<()> {
    if state != HoldState::Pending {
        return Err(Error::FailedPrecondition(format!("hold {id} was already {state}")));
    }
    if !release && reason.trim().is_empty() {
        return Err(Error::invalid("rejecting a hold needs a reason: the sender reads it"));
    }
    Ok(())
}

/// What the sender of a held message is told of the human's decision.
pub fn decision_notice(message_id: &MessageId, release: bool, reason: &str) -> String {
    let short = message_id.short();
    if release {
        format!("Your held message {short} was released by your account's human and delivered.")
    } else {
        format!(
            "Your held message {short} was rejected by your account's human and delivered to nobody: {}",
            reason.trim()
        )
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeekTurn {
    pub role: String,
    pub text: String,
    pub tools: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    pub endpoint: String,
    pub turns: Vec<PeekTurn>,
    /// When the turns were kept; `None` when none are.
    pub updated_at: Option<DateTime<Utc>>,
}

/// What an endpoint keeps for peeking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekState {
    pub peek_on: bool,
    /// Oldest first.
    pub turns: Vec<PeekTurn>,
    /// When the turns were kept; `None` when none are.
    pub updated_at: Option<DateTime<Utc>>,
}

/// The last `n` turns, at least 1 and at most [`MAX_PEEK_TURNS`].
pub fn last_turns(turns: &[PeekTurn], n: usize) -> Vec<PeekTurn> {
    turns[turns.len().saturating_sub(n.clamp(1, MAX_PEEK_TURNS))..].to_vec()
}

/// Who peeked, when, at how many turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peeker {
    pub by: String,
    pub at: DateTime<Utc>,
    pub turns: u32,
}

/// A board agent's permission request, as the human lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    pub id: ApprovalId,
    pub state: ApprovalState,
    pub job_id: JobId,
    pub requester: String,
    pub tool: String,
    pub input: String,
}

/// Where a permission request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub id: ApprovalId,
    pub state: ApprovalState,
    pub reason: String,
    pub decided_by: String,
}

/// A contact with another account, from this account's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contact {
    pub account: String,
    pub state: String,
    /// Messages withdrawn when it was dropped.
    pub withdrawn: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_states_round_trip() {
        for state in HoldState::ALL {
            assert_eq!(HoldState::from_db(state.as_db()).unwrap(), state);
            assert_eq!(state.to_string(), state.as_db());
        }
        assert_eq!(HoldState::Pending.as_db(), "pending");
        assert!(HoldState::from_db("Pending").is_err() && HoldState::from_db("").is_err());
    }

    #[test]
    fn hold_decisions_are_checked() {
        assert!(check_hold_class("contact").is_ok() && check_hold_class("private-outbound").is_ok());
        assert!(check_hold_class("Contact").is_err());
        assert!(check_decision(&"h1".into(), HoldState::Pending, true, "").is_ok());
        assert!(check_decision(&"h1".into(), HoldState::Pending, false, "spam").is_ok());
        assert!(matches!(check_decision(&"h1".into(), HoldState::Pending, false, " "), Err(Error::Invalid(_))));
        assert!(matches!(
            check_decision(&"h1".into(), HoldState::Released, true, ""),
            Err(Error::FailedPrecondition(_))
        ));
        let notice = decision_notice(&"0123456789abcdef".into(), false, " spam ");
        assert!(notice.contains("message 01234567 was") && notice.ends_with("nobody: spam"), "{notice}");
    }

    #[test]
    fn peeks_show_the_last_turns() {
        let turns: Vec<PeekTurn> = (0..12).map(|i| PeekTurn { text: i.to_string(), ..PeekTurn::default() }).collect();
        let texts = |shown: Vec<PeekTurn>| shown.into_iter().map(|t| t.text).collect::<Vec<_>>().join(",");
        assert_eq!(texts(last_turns(&turns, 3)), "9,10,11");
        assert_eq!(texts(last_turns(&turns, 0)), "11");
        assert_eq!(last_turns(&turns, 50).len(), MAX_PEEK_TURNS);
        assert!(last_turns(&[], 3).is_empty());
    }

    #[test]
    fn approval_states_round_trip() {
        for state in ApprovalState::ALL {
            assert_eq!(ApprovalState::from_db(state.as_db()).unwrap(), state);
            assert_eq!(state.to_string(), state.as_db());
        }
        assert_eq!(ApprovalState::Escalated.as_db(), "escalated");
        assert!(ApprovalState::from_db("owner").is_err() && ApprovalState::from_db("released").is_err());
    }

    #[test]
    fn only_the_operator_hands_a_request_on() {
        assert_eq!(decision(" allow ", true).unwrap(), ApprovalState::Allow);
        assert_eq!(decision("owner", false).unwrap(), ApprovalState::Escalated);
        assert_eq!(decision("owner", true).unwrap_err().to_string(), "decision must be allow or deny");
        assert_eq!(decision("maybe", false).unwrap_err().to_string(), "decision must be allow, deny or owner");
    }

    #[test]
    fn long_inputs_are_cut() {
        assert_eq!(excerpt("ls"), "ls");
        assert_eq!(excerpt(&"é".repeat(EXCERPT_CHARS + 5)), format!("{}…", "é".repeat(EXCERPT_CHARS)));
    }
}
