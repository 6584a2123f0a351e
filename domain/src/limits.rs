//! Input limits and the validation of free-form fields.

use super::{Error, Result};
use crate::rate::{Rate, whole_seconds};

pub const MAX_BODY_BYTES: usize = 64 * 1024;
pub const MAX_RECIPIENTS: usize = 32;
/// Longest a call may wait (inbox, ask-wait): long enough to be useful, short enough for proxies.
pub const MAX_WAIT_S: u32 = 300;
pub const MAX_NOTE_CHARS: usize = 200;
pub const MAX_TITLE_CHARS: usize = 120;
pub const MAX_THREAD_LEN: usize = 64;
pub const MAX_CLIENT_ID_LEN: usize = 64;
pub const DEFAULT_INBOX_BATCH: u32 = 50;
pub const MAX_INBOX_BATCH: u32 = 200;
/// Deliveries one confirmation names: a bridge confirms what one look showed.
pub const MAX_CONFIRM_SEQS: usize = 1000;
/// Worktrees one report of a worker names.
pub const MAX_CLEANED_IDS: usize = 1000;
/// Tools one peeked turn names.
pub const MAX_TURN_TOOLS: usize = 64;
/// Most unread messages one inbox holds (`RELAY_MAX_UNREAD`): a send beyond it is refused, so an
/// agent that never reads cannot grow the database without bound.
pub const DEFAULT_MAX_UNREAD: u32 = 10_000;

/// What one endpoint and one account may use, whatever others do. Rates are per replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quotas {
    /// Messages one endpoint sends (sends and replies).
    pub endpoint_sends: Rate,
    /// Messages all of an account's endpoints send together.
    pub account_sends: Rate,
    /// Deliveries the account's sends make together (a message to a group of 50 is 50): counted
    /// once a send is written, so a send is refused while the account is past it.
    pub account_deliveries: Rate,
    /// Endpoints an account holds (handles on all its machines, spawned workers included).
    pub max_endpoints: u32,
    /// Of those, the endpoints of one machine's agents (cards' endpoints apart): its share, so one
    /// machine cannot take its whole account's.
    pub max_endpoints_per_machine: u32,
    /// New sessions (`Hello`) one machine opens: a machine cannot make handles as fast as it can.
    pub machine_hellos: Rate,
    /// Calls one credential makes (an agent's session, a machine's token, a person's), reads
    /// included; sends count against their own rates too.
    pub credential_calls: Rate,
    /// Calls all of an account's credentials make together.
    pub account_calls: Rate,
    /// Console sign-ins one client address may fail: past it, its sign-ins wait.
    pub failed_sign_ins: Rate,
    /// Console sessions one account's people may open.
    pub account_sign_ins: Rate,
    /// Groups an account holds.
    pub max_groups: u32,
    /// Files attached to messages: each, a message's together, and what an account's files hold.
    pub files: crate::artifact::Limits,
    /// What a new follower of a topic reads of its past.
    pub topic_backlog: crate::topic::Backlog,
}

impl Default for Quotas {
    fn default() -> Self {
        // An agent sends a message every few seconds at its busiest; these leave it far more.
        Self {
            endpoint_sends: Rate::new(20.0, 100.0),
            account_sends: Rate::new(200.0, 1000.0),
            account_deliveries: Rate::new(2000.0, 10_000.0),
            max_endpoints: 1000,
            max_endpoints_per_machine: 250,
            machine_hellos: Rate::new(5.0, 50.0),
            // A busy agent makes a few calls per tool call; a worker asks every few seconds.
            credential_calls: Rate::new(100.0, 1000.0),
            account_calls: Rate::new(2000.0, 10_000.0),
            // A person mistypes a token now and then; a guesser tries thousands.
            failed_sign_ins: Rate::new(0.1, 10.0),
            account_sign_ins: Rate::new(0.5, 30.0),
            max_groups: 200,
            files: crate::artifact::Limits::default(),
            topic_backlog: crate::topic::Backlog::default(),
        }
    }
}

/// A new endpoint refused because `account` holds `cap` already.
pub fn no_room_for_endpoints(account: &str, cap: u32) -> Error {
    Error::ResourceExhausted(format!(
        "account {account} holds {cap} endpoints, the most it may: no new handle was made; claim one of its existing handles, or ask the operator to raise the limit (RELAY_MAX_ENDPOINTS)"
    ))
}

/// A new endpoint refused because `machine` holds its share of its account's endpoints already.
pub fn no_room_on_machine(machine: &str, cap: u32) -> Error {
    Error::ResourceExhausted(format!(
        "machine {machine} holds {cap} endpoints of its agents, its share of its account's: no new handle was made; claim one of its existing handles, or ask the operator to raise the share (RELAY_MAX_ENDPOINTS_PER_MACHINE)"
    ))
}

/// A new group refused because `account` holds `cap` already.
pub fn no_room_for_groups(account: &str, cap: u32) -> Error {
    Error::ResourceExhausted(format!(
        "account {account} holds {cap} groups, the most it may: the group was not made; drop one you no longer use, or ask the operator to raise the limit (RELAY_MAX_GROUPS)"
    ))
}

/// A send refused because `account`'s sends made more deliveries than its rate allows.
pub fn delivering_too_much(account: &str, rate: Rate, retry_after: std::time::Duration) -> Error {
    let wait = whole_seconds(retry_after);
    Error::Throttled {
        message: format!(
            "account {account} delivers more than the {} messages a second it is allowed (a message counts once per recipient, bursts of {}): nothing was sent; try again in {wait} s",
            rate.per_s, rate.burst
        ),
        retry_after,
    }
}

/// A send refused because `who` went past its send rate.
pub fn sending_too_fast(who: &str, rate: Rate, retry_after: std::time::Duration) -> Error {
    let wait = whole_seconds(retry_after);
    Error::Throttled {
        message: format!(
            "{who} sends faster than the {} messages a second it is allowed (bursts of {}): nothing was sent; try again in {wait} s",
            rate.per_s, rate.burst
        ),
        retry_after,
    }
}

/// A console sign-in refused because its address failed too often, or its account signed in too
/// often.
pub fn signing_in_too_fast(who: &str, retry_after: std::time::Duration) -> Error {
    let wait = whole_seconds(retry_after);
    Error::Throttled { message: format!("{who}: try again in {wait} s"), retry_after }
}

/// A call refused because `who` went past its call rate.
pub fn calling_too_fast(who: &str, rate: Rate, retry_after: std::time::Duration) -> Error {
    let wait = whole_seconds(retry_after);
    Error::Throttled {
        message: format!(
            "{who} makes more than the {} calls a second it is allowed (bursts of {}): this one was refused; try again in {wait} s",
            rate.per_s, rate.burst
        ),
        retry_after,
    }
}

/// Room in a request for its frame and its small fields, beside its largest.
pub const REQUEST_FRAME_BYTES: usize = 16 * 1024;

/// Whether the method at `path` uploads a file: it takes the files' limit, which is a setting
/// (see `RpcLimits::upload_bytes`), rather than [`request_bytes`].
pub fn is_upload(path: &str) -> bool {
    path == "/relay.v1.Relay/Upload"
}

/// The most bytes a request of the method at `path` may take (its gRPC frame included): its
/// largest text fields, with room for the rest. Anything larger is refused before it is read.
pub fn request_bytes(path: &str) -> usize {
    const SMALL: usize = REQUEST_FRAME_BYTES;
    let method = path.rsplit('/').next().unwrap_or_default();
    match method {
        "Send" | "Reply" | "SpawnResult" => MAX_BODY_BYTES + SMALL,
        "PostJob" | "EditJob" | "FinishJob" | "CloseJob" => super::board::MAX_DETAIL_BYTES + SMALL,
        "PutPeekTurns" => super::trust::MAX_PEEK_TURNS * (PEEK_TURN_BYTES + 1024) + SMALL,
        "RequestPermission" => PERMISSION_INPUT_BYTES + SMALL,
        _ => SMALL,
    }
}

/// The most text of one turn a client sends for peek (the server keeps less).
pub const PEEK_TURN_BYTES: usize = 8 * 1024;
/// The most of a permission request's tool input a client sends (the server keeps an excerpt).
pub const PERMISSION_INPUT_BYTES: usize = 64 * 1024;

pub const STATUS_STATES: [&str; 4] = ["idle", "busy", "blocked", "away"];
pub const HARNESSES: [&str; 5] = ["claude", "codex", "gemini", "cursor", "other"];

pub fn body(body: &str) -> Result<()> {
    if body.trim().is_empty() {
        return Err(Error::invalid("body is empty"));
    }
    if body.contains('\0') {
        return Err(Error::invalid("body contains a NUL character, which text cannot hold: remove it"));
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(Error::invalid(format!(
            "body is {} bytes; the limit is {MAX_BODY_BYTES} bytes: send a summary or split it",
            body.len()
        )));
    }
    Ok(())
}

pub fn recipients(count: usize) -> Result<()> {
    match count {
        0 => Err(Error::invalid("no recipient: give at least one address")),
        n if n > MAX_RECIPIENTS => {
            Err(Error::invalid(format!("{n} recipients; one send reaches at most {MAX_RECIPIENTS}")))
        }
        _ => Ok(()),
    }
}

/// A list a request gives, refused with its count when longer than `max`.
pub fn count(what: &str, given: usize, max: usize) -> Result<()> {
    if given > max {
        return Err(Error::invalid(format!("{given} {what} in one request; the limit is {max}: nothing was done")));
    }
    Ok(())
}

pub fn wait_s(wait_s: u32) -> Result<u32> {
    if wait_s > MAX_WAIT_S {
        Err(Error::invalid(format!("wait_s is {wait_s}; the most is {MAX_WAIT_S} seconds")))
    } else {
        Ok(wait_s)
    }
}

/// The refusal of a send to a recipient whose inbox holds `cap` unread messages already.
pub fn inbox_full(address: &str, cap: u32) -> Error {
    Error::ResourceExhausted(format!(
        "{address} has {cap} unread messages, the most an inbox holds: nothing was sent; try again after it reads its inbox"
    ))
}

/// A send refused because the server already has as many under way as it can write promptly.
pub fn overloaded() -> Error {
    Error::Overloaded("the server is at capacity for sends: nothing was sent; try again in a moment".into())
}

pub fn inbox_batch(limit: u32) -> u32 {
    match limit {
        0 => DEFAULT_INBOX_BATCH,
        n => n.min(MAX_INBOX_BATCH),
    }
}

fn token_like(what: &str, value: &str, max: usize) -> Result<()> {
    let ok = value.len() <= max
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("invalid {what} {value:?}: use up to {max} letters, digits, '-', '_', '.' or ':'")))
    }
}

/// A thread id is shown to every recipient and stored as written, so it may not carry a credential:
/// one the redactor would change is refused rather than stored or passed on.
pub fn thread(thread: &str) -> Result<()> {
    token_like("thread", thread, MAX_THREAD_LEN)?;
    no_credential("a thread id", thread, "name the thread by its topic")
}

/// A client id is stored as written (a retry must find it again), so, like a thread id, it may
/// not carry a credential.
pub fn client_id(client_id: &str) -> Result<()> {
    token_like("client id", client_id, MAX_CLIENT_ID_LEN)?;
    no_credential("a client id", client_id, "use a random id, such as a UUID")
}

/// Refuses an identifier that must stay as written (redacting it would change what it names)
/// when it holds a credential: `what` names it, `instead` says what to use.
pub fn no_credential(what: &str, value: &str, instead: &str) -> Result<()> {
    match super::redact::holds_credential(value) {
        None => Ok(()),
        Some(kinds) => Err(Error::invalid(format!(
            "{what} must not contain a credential (it looks like a {} to the redactor): {instead}",
            kinds.join(", ")
        ))),
    }
}

/// Short free text shown to other agents: one line, bounded.
pub fn short_text(what: &str, value: &str, max_chars: usize) -> Result<()> {
    let chars = value.chars().count();
    if chars > max_chars {
        return Err(Error::invalid(format!("{what} is {chars} characters; the limit is {max_chars}")));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(format!("{what} must be one line of text without control characters")));
    }
    Ok(())
}

pub fn status(state: &str) -> Result<()> {
    if STATUS_STATES.contains(&state) {
        Ok(())
    } else {
        Err(Error::invalid(format!("invalid status {state:?}: use one of {}", STATUS_STATES.join(", "))))
    }
}

/// The harness an endpoint runs under; empty means other.
pub fn harness(harness: &str) -> Result<&str> {
    match harness {
        "" => Ok("other"),
        h if HARNESSES.contains(&h) => Ok(h),
        h => Err(Error::invalid(format!("invalid harness {h:?}: use one of {}", HARNESSES.join(", ")))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_limits() {
        body("hi").unwrap();
        body(&"x".repeat(MAX_BODY_BYTES)).unwrap();
        let err = body(&"x".repeat(MAX_BODY_BYTES + 1)).unwrap_err().to_string();
        assert!(err.contains("limit is 65536 bytes"), "{err}");
        assert!(body(" \n").is_err());
        assert!(body("a\0b").unwrap_err().to_string().contains("NUL"));
    }

    #[test]
    fn recipient_and_wait_limits() {
        assert!(recipients(0).is_err());
        recipients(MAX_RECIPIENTS).unwrap();
        assert!(recipients(MAX_RECIPIENTS + 1).is_err());
        assert_eq!(wait_s(MAX_WAIT_S).unwrap(), MAX_WAIT_S);
        assert!(wait_s(MAX_WAIT_S + 1).is_err());
        assert_eq!(inbox_batch(0), DEFAULT_INBOX_BATCH);
        assert_eq!(inbox_batch(10_000), MAX_INBOX_BATCH);
    }

    #[test]
    fn free_text_fields() {
        thread("review:pr-12").unwrap();
        assert!(thread("has space").is_err());
        // Ids and hashes are fine; a token that fits the charset is not.
        thread("0123456789abcdef0123456789abcdef01234567").unwrap();
        thread("550e8400-e29b-41d4-a716-446655440000").unwrap();
        let token = format!("ghp_{}", "A1b2C3d4E5".repeat(4)[..36].to_owned());
        assert_eq!(token.len(), 40);
        let err = thread(&token).unwrap_err().to_string();
        assert!(err.contains("a thread id must not contain a credential") && !err.contains(&token), "{err}");
        assert!(thread(&format!("review:{token}")).is_err());
        assert!(client_id(&"a".repeat(65)).is_err());
        let forge = "ghp_Zr4Kd9Wq2Ly7Hx1Nc6Vb3Mt8Gf5Js0Pa2QeR";
        let refused = client_id(forge).unwrap_err().to_string();
        assert!(refused.contains("must not contain a credential") && refused.contains("github-pat"), "{refused}");
        assert!(!refused.contains(forge), "the refusal does not repeat the credential: {refused}");
        short_text("note", "reading the diff", MAX_NOTE_CHARS).unwrap();
        assert!(short_text("note", "two\nlines", MAX_NOTE_CHARS).is_err());
        assert!(short_text("note", &"é".repeat(MAX_NOTE_CHARS + 1), MAX_NOTE_CHARS).is_err());
        status("busy").unwrap();
        assert!(status("sleeping").is_err());
        assert_eq!(harness("").unwrap(), "other");
        assert!(harness("vim").is_err());
    }

    #[test]
    fn a_full_inbox_says_whose_and_what_to_do() {
        let err = inbox_full("acme/laptop/bob", 10_000);
        assert!(matches!(err, Error::ResourceExhausted(_)));
        assert_eq!(
            err.to_string(),
            "acme/laptop/bob has 10000 unread messages, the most an inbox holds: nothing was sent; try again after it reads its inbox"
        );
    }
}
