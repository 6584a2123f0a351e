//! The web console: how long a session lasts, the token its forms carry, and what its pages show.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::board::{Job, Repo};
use super::endpoint::Endpoint;
use super::message::Message;
use super::trust::{Approval, Contact, Hold};

/// How long a console session lasts after sign-in; then the person signs in again.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// The token every form of a session carries, derived from the session's own secret: a page of
/// another site can neither read it nor compute it, and it reveals nothing of the session id.
pub fn csrf_token(session: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"relay console csrf\0");
    hash.update(session.as_bytes());
    hex::encode(hash.finalize())
}

/// Whether a form's token is the session's, compared in time that does not depend on where they
/// differ.
pub fn csrf_matches(session: &str, presented: &str) -> bool {
    let expected = csrf_token(session);
    expected.len() == presented.len()
        && expected.bytes().zip(presented.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// The board as a person sees it.
#[derive(Debug, Clone, Default)]
pub struct Board {
    /// Cards in To do, In progress and Review, in column order and then as posted.
    pub open: Vec<Job>,
    /// The newest cards in Done, newest first.
    pub done: Vec<Job>,
    /// All cards in Done, of which `done` shows the newest.
    pub archived: u32,
    /// The repositories a card can be posted to.
    pub repos: Vec<Repo>,
}

/// Newest cards in Done the board shows.
pub const DONE_SHOWN: i64 = 20;
/// Newest messages the inbox page shows.
pub const MESSAGES_SHOWN: i64 = 50;

/// A message to the human, and whether it was read.
#[derive(Debug, Clone)]
pub struct Received {
    pub message: Message,
    pub read: bool,
}

/// What waits on the human: the inbox, holds and permission requests.
#[derive(Debug, Clone, Default)]
pub struct Inbox {
    pub messages: Vec<Received>,
    pub unread: u64,
    pub holds: Vec<Hold>,
    pub approvals: Vec<Approval>,
}

/// Agents of the account (online or not, its reserved inboxes left out), and the online agents of
/// its contacts.
#[derive(Debug, Clone, Default)]
pub struct Agents {
    pub own: Vec<Endpoint>,
    pub contacts: Vec<Endpoint>,
}

/// A contact, a request made or one waiting, as the contacts page lists it.
#[derive(Debug, Clone)]
pub struct ContactRow {
    pub contact: Contact,
    /// Private data may cross it (for a contact made).
    pub private_data: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{TokenKind, new_token, token_hash};

    #[test]
    fn the_form_token_belongs_to_its_session_alone() {
        let (one, two) = (new_token(TokenKind::Console), new_token(TokenKind::Console));
        let token = csrf_token(&one);
        assert_eq!(token.len(), 64);
        assert!(csrf_matches(&one, &token));
        assert!(!csrf_matches(&two, &token), "another session's token is refused");
        assert!(!csrf_matches(&one, "") && !csrf_matches(&one, &token[..63]));
        assert_ne!(token, hex::encode(token_hash(&one).as_bytes()), "it is not what the database keeps of the session");
        assert!(!token.contains(&one[4..]), "it does not carry the session id");
    }
}
