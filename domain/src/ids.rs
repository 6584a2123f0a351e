//! Row ids, message ids, credentials and the ways an agent may name a message.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;
use sha2::{Digest, Sha256};

use super::{EntityKind, Error, Result};

macro_rules! row_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

row_id!(
    /// An endpoint's row: one `account/machine/handle`, and its inbox.
    EndpointId
);
row_id!(
    /// An account's row.
    AccountId
);
row_id!(
    /// A machine's row.
    MachineId
);
row_id!(
    /// A group's row.
    GroupId
);
row_id!(
    /// A repository on the board: a path on one machine.
    RepoId
);
row_id!(
    /// A running server process's liveness row: the streams it holds are online while it lives.
    ReplicaId
);
impl ReplicaId {
    /// No replica: what it writes is announced to every replica, the writing one's included.
    pub const NONE: Self = Self(0);
}

row_id!(
    /// A cap's row: selectors set on an endpoint by one of its ancestors.
    CapId
);
row_id!(
    /// A path claim's row; agents name it `claim-<n>`.
    ClaimId
);
impl ClaimId {
    /// Reads `claim-<n>` (or `<n>`).
    pub fn parse(given: &str) -> Result<Self> {
        let given = given.trim();
        given.strip_prefix("claim-").unwrap_or(given).parse().map(Self).map_err(|_| {
            Error::invalid(format!("claim {given:?} is not a claim id: they read claim-<n>, as relay_claims shows"))
        })
    }

    pub fn name(self) -> String {
        format!("claim-{}", self.0)
    }
}

row_id!(
    /// A delivery's place in its inbox: each inbox numbers what it receives 1, 2, 3, … .
    Seq
);

macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// An id as stored or as a client gave it; whether it exists is the store's to say.
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                Self(id.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                Self(id)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> Self {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }
    };
}

text_id!(
    /// A message: 24 characters, the first 8 a clock, the rest random ([`new_message_id`]).
    MessageId
);

impl MessageId {
    /// Its short id: the first [`SHORT_ID_LEN`] characters (all of a shorter id).
    pub fn short(&self) -> &str {
        self.0.get(..SHORT_ID_LEN).unwrap_or(&self.0)
    }
}
text_id!(
    /// A card on the board (a job, or a schedule's own card).
    JobId
);
text_id!(
    /// A schedule: the card that posts a run card each time it comes due. A schedule's card id
    /// and its schedule id are the same text; the type says which role a value plays.
    ScheduleId
);
text_id!(
    /// A permission request of a card's agent.
    ApprovalId
);
text_id!(
    /// A message held for the account's human.
    HoldId
);

impl ScheduleId {
    /// The schedule's own card.
    pub fn card(&self) -> JobId {
        JobId(self.0.clone())
    }
}

/// What the database keeps of a credential ([`token_hash`]): its SHA-256. A token is never
/// stored, so a hash is the id by which a machine, session, grant or attempt is found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenHash(Vec<u8>);

impl TokenHash {
    /// A hash as the database returns it.
    pub fn from_stored(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

const ID_ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
/// 24 characters of base 36: about 124 random bits.
pub const MESSAGE_ID_LEN: usize = 24;
pub const SHORT_ID_LEN: usize = relay_proto::timing::SHORT_ID_LEN;
pub const MIN_SUFFIX_LEN: usize = 4;

/// A new message id: its first 8 characters count microseconds (in base 36, so they wrap every
/// 32.6 days), the other 16 are random (about 83 bits).
///
/// Ids in the order they are made are written at one end of each index keyed by them (the
/// message's, its thread's, its deliveries'), where random ids landed on a different leaf page
/// each: a page read, a page split and, after a checkpoint, a full page image in the WAL apiece.
/// The clock part still tells messages apart, so it serves as the short id: one process never
/// makes two with the same, and two replicas only within the same microsecond.
pub fn new_message_id() -> MessageId {
    static LAST_TICK: AtomicU64 = AtomicU64::new(0);
    let micros = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros());
    message_id_at(&LAST_TICK, micros as u64)
}

/// A message id made at `micros` by a process whose last tick is `last_tick`.
fn message_id_at(last_tick: &AtomicU64, micros: u64) -> MessageId {
    let mut id = String::with_capacity(MESSAGE_ID_LEN);
    push_base36(&mut id, next_tick(last_tick, micros) % SHORT_ID_SPAN, SHORT_ID_LEN);
    id.push_str(&random_text(MESSAGE_ID_LEN - SHORT_ID_LEN));
    MessageId(id)
}

/// 36^8: the values the short id's 8 characters can count before they wrap.
const SHORT_ID_SPAN: u64 = 36u64.pow(SHORT_ID_LEN as u32);

/// `now`, or one past the `last` tick handed out when the clock has not passed it (two ids in one
/// microsecond, or a clock stepped back): no two ids of this process share a short id.
fn next_tick(last_tick: &AtomicU64, now: u64) -> u64 {
    let mut last = last_tick.load(Ordering::Relaxed);
    loop {
        let tick = now.max(last + 1);
        match last_tick.compare_exchange_weak(last, tick, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return tick,
            Err(seen) => last = seen,
        }
    }
}

/// `value` in `width` characters of the id alphabet, most significant first.
fn push_base36(out: &mut String, mut value: u64, width: usize) {
    let start = out.len();
    for _ in 0..width {
        out.insert(start, ID_ALPHABET[(value % 36) as usize] as char);
        value /= 36;
    }
}

/// `len` random characters of the id alphabet.
pub fn random_text(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len).map(|_| ID_ALPHABET[rng.random_range(0..ID_ALPHABET.len())] as char).collect()
}

/// Kinds of bearer credential; the prefix lets a person tell them apart and lets scanners find them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Machine,
    Session,
    /// An account's person: manages contacts.
    Human,
    /// One worker's claim on the endpoint reserved for it by a spawn.
    SpawnGrant,
    /// One attempt at a board card: its agent finishes the card with it.
    JobToken,
    /// A person's signed-in web console, held in a cookie.
    Console,
}

impl TokenKind {
    const ALL: [Self; 5] = [Self::Machine, Self::Session, Self::Human, Self::SpawnGrant, Self::JobToken];

    /// The kind a token's prefix claims, before anything checks it.
    pub fn of(token: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| token.starts_with(kind.prefix()))
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Machine => "rlm_",
            Self::Session => "rls_",
            Self::Human => "rlh_",
            Self::SpawnGrant => "rlg_",
            Self::JobToken => "rlj_",
            Self::Console => "rlc_",
        }
    }
}

/// A fresh upload id: 96 random bits behind `up_`. Only its uploader can attach it (the server
/// checks), so it needs to be unique, not secret.
pub fn new_upload_id() -> String {
    let bytes: [u8; 12] = rand::rng().random();
    format!("up_{}", hex::encode(bytes))
}

/// A fresh credential: 256 random bits, hex-encoded behind the kind's prefix.
pub fn new_token(kind: TokenKind) -> String {
    let bytes: [u8; 32] = rand::rng().random();
    format!("{}{}", kind.prefix(), hex::encode(bytes))
}

/// The session token of an agent served over HTTP, derived from its machine token and what the
/// session is for (`purpose`: its harness, and its handle or the MCP session it picks one for).
/// Every replica derives the same token, so any of them resumes the session; only the holder of
/// the machine token can name it.
pub fn derived_session_token(machine_token: &str, purpose: &str) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<Sha256>::new_from_slice(machine_token.as_bytes()).expect("hmac takes a key of any length");
    mac.update(b"relay remote agent session\0");
    mac.update(purpose.as_bytes());
    format!("{}{}", TokenKind::Session.prefix(), hex::encode(mac.finalize().into_bytes()))
}

/// What the database keeps of a credential. Tokens carry 256 random bits, so one unsalted hash suffices.
pub fn token_hash(token: &str) -> TokenHash {
    TokenHash(Sha256::digest(token.as_bytes()).to_vec())
}

/// Checks a presented token's shape before it costs a database lookup.
pub fn check_token(kind: TokenKind, token: &str) -> Result<()> {
    let well_formed = token
        .strip_prefix(kind.prefix())
        .is_some_and(|rest| rest.len() == 64 && rest.bytes().all(|b| b.is_ascii_hexdigit()));
    if well_formed {
        Ok(())
    } else {
        let what = match kind {
            TokenKind::Machine => "machine token",
            TokenKind::Session => "session token",
            TokenKind::Human => "human token",
            TokenKind::SpawnGrant => "spawn grant",
            TokenKind::JobToken => "job token",
            TokenKind::Console => "console session",
        };
        Err(Error::Unauthenticated(format!("malformed {what}")))
    }
}

/// How an agent names a message it wants to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageRef {
    /// The newest message the caller was shown.
    Last,
    /// A whole id, its short id, or a suffix of 4 or more characters.
    Text(String),
}

impl MessageRef {
    pub fn parse(raw: &str) -> Result<Self> {
        let text = raw.trim();
        if text.eq_ignore_ascii_case("last") {
            return Ok(Self::Last);
        }
        if text.len() < MIN_SUFFIX_LEN || text.len() > MESSAGE_ID_LEN {
            return Err(Error::invalid(format!(
                "invalid message id {raw:?}: give the id, its first {SHORT_ID_LEN} characters, a unique suffix of {MIN_SUFFIX_LEN} or more, or last"
            )));
        }
        if !text.bytes().all(|b| ID_ALPHABET.contains(&b.to_ascii_lowercase())) {
            return Err(Error::invalid(format!("invalid message id {raw:?}: ids use only letters and digits")));
        }
        Ok(Self::Text(text.to_ascii_lowercase()))
    }

    /// Whether `id` is named by this reference (for a `Text` reference).
    pub fn matches(&self, id: &str) -> bool {
        match self {
            Self::Last => false,
            Self::Text(text) => {
                id == text
                    || (text.len() == SHORT_ID_LEN && id.starts_with(text.as_str()))
                    || id.ends_with(text.as_str())
            }
        }
    }
}

/// Picks the one message a reference names among candidates, or says why it cannot.
pub fn pick_unique<'a>(reference: &str, candidates: &'a [MessageId]) -> Result<&'a MessageId> {
    match candidates {
        [] => Err(Error::not_found(
            EntityKind::Message,
            format!("no message {reference:?} among the messages you received"),
        )),
        [one] => Ok(one),
        many => {
            if let Some(exact) = many.iter().find(|id| id.as_str() == reference) {
                return Ok(exact);
            }
            // Short ids, unless two of them are one (made by two replicas in one microsecond):
            // then the whole ids, so that the caller has something to tell them apart by.
            let mut shown: Vec<&str> = many.iter().take(5).map(MessageId::short).collect();
            if shown.iter().collect::<std::collections::HashSet<_>>().len() < shown.len() {
                shown = many.iter().take(5).map(MessageId::as_str).collect();
            }
            Err(Error::invalid(format!(
                "{reference:?} names {} messages ({}); give more characters",
                many.len(),
                shown.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_session_token_is_a_session_token_of_its_machine_and_purpose_alone() {
        let machine = new_token(TokenKind::Machine);
        let token = derived_session_token(&machine, "claude\0alice");
        check_token(TokenKind::Session, &token).unwrap();
        assert_eq!(token, derived_session_token(&machine, "claude\0alice"), "every replica derives the same");
        assert_ne!(token, derived_session_token(&machine, "claude\0bob"));
        assert_ne!(token, derived_session_token(&new_token(TokenKind::Machine), "claude\0alice"));
    }

    #[test]
    fn message_ids_are_long_lowercase_with_distinct_short_ids() {
        let ids: Vec<MessageId> = (0..1000).map(|_| new_message_id()).collect();
        for id in &ids {
            assert_eq!(id.as_str().len(), MESSAGE_ID_LEN);
            assert!(id.as_str().bytes().all(|c| ID_ALPHABET.contains(&c)), "{id}");
        }
        let short: std::collections::HashSet<&str> = ids.iter().map(MessageId::short).collect();
        assert_eq!(short.len(), ids.len(), "one process never makes two ids with one short id");
        let tails: std::collections::HashSet<&str> = ids.iter().map(|id| &id.as_str()[SHORT_ID_LEN..]).collect();
        assert_eq!(tails.len(), ids.len(), "the random part differs");
    }

    #[test]
    fn message_ids_sort_in_the_order_they_are_made_until_the_clock_part_wraps() {
        let last = AtomicU64::new(0);
        let start = 1_796_000_000_000_000; // December 2026, in microseconds
        let ids: Vec<MessageId> =
            [start, start, start + 1, start + 40, start + 1_000_000].map(|t| message_id_at(&last, t)).into();
        for pair in ids.windows(2) {
            assert!(pair[0].as_str() < pair[1].as_str(), "{} then {}", pair[0], pair[1]);
        }
        // Where the 8 characters wrap, the next ids start again from the bottom, in order.
        let last = AtomicU64::new(0);
        let wrap = SHORT_ID_SPAN * 637;
        let [a, b, c] = [wrap - 1, wrap, wrap + 1].map(|t| message_id_at(&last, t));
        assert_eq!(a.short(), "zzzzzzzz");
        assert_eq!(b.short(), "00000000");
        assert_eq!(c.short(), "00000001");
    }

    #[test]
    fn the_clock_part_counts_microseconds_in_base_36_and_never_repeats() {
        let mut text = String::new();
        push_base36(&mut text, 36 * 36 + 35, 4);
        assert_eq!(text, "010z");
        push_base36(&mut text, SHORT_ID_SPAN - 1, SHORT_ID_LEN);
        assert_eq!(&text[4..], "zzzzzzzz");
        // A clock that stands still or steps back still gets a new tick.
        let last = AtomicU64::new(0);
        assert_eq!(next_tick(&last, 1_000), 1_000);
        assert_eq!(next_tick(&last, 1_000), 1_001);
        assert_eq!(next_tick(&last, 5), 1_002);
        assert_eq!(next_tick(&last, 2_000), 2_000);
    }

    #[test]
    fn two_replicas_in_one_microsecond_share_a_short_id_and_a_reference_to_it_says_so() {
        let at = 1_796_000_000_000_000;
        let (one, other) = (message_id_at(&AtomicU64::new(0), at), message_id_at(&AtomicU64::new(0), at));
        assert_eq!(one.short(), other.short());
        assert_ne!(one, other, "the random part tells them apart");
        let both = vec![one.clone(), other.clone()];
        let err = crate::message::pick_named(one.short(), both.clone()).unwrap_err();
        assert!(err.to_string().contains("names 2 messages"), "{err}");
        assert!(err.to_string().contains(one.as_str()) && err.to_string().contains(other.as_str()), "{err}");
        // The whole id, or a suffix of its random part, still names one.
        assert_eq!(crate::message::pick_named(one.as_str(), both.clone()).unwrap(), one);
        let suffix = &other.as_str()[MESSAGE_ID_LEN - 8..];
        assert_eq!(crate::message::pick_named(suffix, both).unwrap(), other);
    }

    #[test]
    fn tokens_have_their_kind_and_check_by_shape() {
        let machine = new_token(TokenKind::Machine);
        assert!(machine.starts_with("rlm_"));
        check_token(TokenKind::Machine, &machine).unwrap();
        assert!(check_token(TokenKind::Session, &machine).is_err());
        assert!(check_token(TokenKind::Machine, "rlm_short").is_err());
        assert_eq!(TokenKind::of(&new_token(TokenKind::JobToken)), Some(TokenKind::JobToken));
        assert_eq!(TokenKind::of(&machine), Some(TokenKind::Machine));
        assert_eq!(TokenKind::of("bearer"), None);
        assert_eq!(token_hash(&machine), token_hash(&machine));
        assert_ne!(token_hash(&machine), token_hash(&new_token(TokenKind::Machine)));
    }

    #[test]
    fn references_name_by_id_short_id_or_suffix() {
        let id = "abcdefgh0123456789wxyz00";
        assert!(MessageRef::parse(id).unwrap().matches(id));
        assert!(MessageRef::parse("abcdefgh").unwrap().matches(id));
        assert!(MessageRef::parse("ABCDEFGH").unwrap().matches(id));
        assert!(MessageRef::parse("yz00").unwrap().matches(id));
        assert!(!MessageRef::parse("abcd").unwrap().matches(id), "a 4-character prefix is not a short id");
        assert_eq!(MessageRef::parse(" last ").unwrap(), MessageRef::Last);
    }

    #[test]
    fn references_refuse_bad_shapes() {
        for raw in ["", "abc", "ab-cd", &"a".repeat(25)] {
            assert!(matches!(MessageRef::parse(raw), Err(Error::Invalid(_))), "{raw}");
        }
    }

    #[test]
    fn ambiguity_is_explained() {
        let ids = vec![MessageId::new("aaaaaaaa00001111"), MessageId::new("bbbbbbbb00001111")];
        let err = pick_unique("1111", &ids).unwrap_err().to_string();
        assert!(err.contains("names 2 messages") && err.contains("aaaaaaaa"), "{err}");
        assert_eq!(pick_unique("1111", &ids[..1]).unwrap(), &ids[0]);
        assert!(matches!(pick_unique("zzzz", &[]), Err(Error::NotFound { .. })));
    }
}
