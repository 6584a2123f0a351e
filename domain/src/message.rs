//! A message as its recipient reads it, and a delivery as its sender tracks it.

use super::delivery::{Kind, State};
use super::ids::{self, HoldId, MessageId, MessageRef, Seq};
use super::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: MessageId,
    /// The recipient's sequence number of this delivery.
    pub seq: Seq,
    pub from: String,
    pub thread: String,
    pub kind: Kind,
    pub body: String,
    pub reply_to: Option<MessageId>,
    pub sent_at_ms: i64,
    /// parent or child, when sender and recipient are of one spawn tree.
    pub relation: String,
    pub require_reply: bool,
    pub private: bool,
    /// Files it carries.
    pub attachments: Vec<super::artifact::Attached>,
    /// A topic's post, read through its reader's cursor (its `seq` is then 0).
    pub post: Option<super::topic::Posted>,
}

/// A message named to its recipient's model without its body: a hook's notice that mail waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    pub id: MessageId,
    /// The recipient's sequence number of this delivery.
    pub seq: Seq,
    pub from: String,
    pub kind: Kind,
    pub require_reply: bool,
    /// A topic's post: its topic (`seq` is then its number there).
    pub topic: Option<String>,
}

/// What one announcement names, and how many messages wait unread in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announcement {
    pub messages: Vec<Announced>,
    pub unread: u64,
}

#[cfg(any(test, feature = "testing"))]
impl Message {
    /// A plain message at `seq` of an inbox, for tests of what carries messages.
    pub fn at_seq(seq: i64) -> Self {
        Self {
            id: MessageId::new(format!("m{seq}")),
            seq: Seq(seq),
            from: "acme/laptop/alice".into(),
            thread: "t".into(),
            kind: Kind::Message,
            body: "hi".into(),
            reply_to: None,
            sent_at_ms: 0,
            relation: String::new(),
            require_reply: false,
            private: false,
            attachments: Vec::new(),
            post: None,
        }
    }
}

/// One recipient of a message the caller sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    pub address: String,
    /// `None` when it was not sent to this recipient (held for the human, or refused by its rules).
    pub state: Option<State>,
    pub reason: String,
    /// Whether it held a push stream when this was read (the human inbox always counts as
    /// present): a queued delivery to an online recipient is on its way.
    pub online: bool,
}

/// What a send or a reply stored: the message's id and thread, and each recipient's delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub id: MessageId,
    pub thread: String,
    pub recipients: Vec<Recipient>,
    /// It answers a retry of an earlier send with the same client id.
    pub duplicate: bool,
    pub reply_to: Option<MessageId>,
    /// Group members the sender may not message.
    pub skipped: Vec<Recipient>,
    /// The hold that keeps it from everyone until the account's human decides.
    pub hold: Option<HoldId>,
}

/// The text of a reference to a message the caller sent: its id, short id or suffix (what the
/// caller was last shown is a message it received, so `last` names none it sent).
pub fn sent_reference(raw: &str) -> Result<String> {
    match MessageRef::parse(raw)? {
        MessageRef::Text(text) => Ok(text),
        MessageRef::Last => Err(Error::invalid("name the message you sent by its id")),
    }
}

/// The one message `text` names among the ids a lookup found for it. The lookup finds every id
/// that starts or ends with the text; only a whole id, a short id or a suffix names one.
pub fn pick_named(text: &str, mut candidates: Vec<MessageId>) -> Result<MessageId> {
    let reference = MessageRef::Text(text.to_owned());
    candidates.retain(|id| reference.matches(id.as_str()));
    ids::pick_unique(text, &candidates).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sent_message_is_named_by_its_id() {
        assert_eq!(sent_reference(" ABCDEFGH ").unwrap(), "abcdefgh");
        assert!(matches!(sent_reference("last"), Err(Error::Invalid(_))));
    }

    #[test]
    fn a_prefix_names_a_message_only_as_its_short_id() {
        let id = MessageId::new("abcdefgh0000wxyz");
        assert_eq!(pick_named("abcdefgh", vec![id.clone()]).unwrap(), id);
        assert_eq!(pick_named("wxyz", vec![id.clone()]).unwrap(), id);
        assert!(pick_named("abcd", vec![id]).is_err(), "a 4-character prefix is not a short id");
    }
}
