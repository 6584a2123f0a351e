//! A message as its recipient reads it, and a delivery as its sender tracks it.

use super::delivery::{Kind, State};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: String,
    /// The recipient's sequence number of this delivery.
    pub seq: u64,
    pub from: String,
    pub thread: String,
    pub kind: Kind,
    pub body: String,
    pub reply_to: String,
    pub sent_at_ms: i64,
    /// parent or child, when sender and recipient are of one spawn tree.
    pub relation: String,
    pub require_reply: bool,
    pub private: bool,
}

/// One recipient of a message the caller sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    pub address: String,
    /// `None` when it was not sent to this recipient (held for the human, or refused by its rules).
    pub state: Option<State>,
    pub reason: String,
}

/// What a send or a reply stored: the message's id and thread, and each recipient's delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub id: String,
    pub thread: String,
    pub recipients: Vec<Recipient>,
    /// It answers a retry of an earlier send with the same client id.
    pub duplicate: bool,
    pub reply_to: Option<String>,
    /// Group members the sender may not message.
    pub skipped: Vec<Recipient>,
    /// The hold that keeps it from everyone until the account's human decides.
    pub hold: Option<String>,
}
