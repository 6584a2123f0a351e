//! Messages and their deliveries.
//!
//! * `resolve`: a send's recipients found and allowed, by reads outside any transaction (the send
//!   pipeline, `app::send`, calls them and keeps what they found).
//! * `write`: the writer, the one way a message is written, whether a send, a batch of them, a
//!   message held for a human or what the system sends.
//! * `inbox`: what a recipient reads, and its deliveries moved forward as they are pushed,
//!   shown and read.
//! * `sent`: what a sender reads about its messages: their recipients' states, the replies they
//!   got, an earlier send with the same client id.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;

use super::row::{Col, FromRow};
use crate::domain::Error;
use crate::domain::artifact::Attached;
use crate::domain::delivery::{Kind, State};
use crate::domain::ids::{AccountId, EndpointId, MessageId, ReplicaId};
use crate::domain::message::{Message, Recipient};
use crate::domain::redact::RedactedText;
use crate::store::Result;

/// What each delivery `d` is joined with: its message `m`, the sender's address `ea`, and both
/// endpoints for the relation.
macro_rules! message_joins {
    () => {
        "join messages m on m.id = d.message_id
         join endpoint_addresses ea on ea.id = m.sender_id
         join endpoints re on re.id = d.recipient_id
         join endpoints se on se.id = m.sender_id"
    };
}

mod inbox;
mod resolve;
mod sent;
pub mod write;

pub(crate) use inbox::{Look, Version, advance, announce, look, recent, take_unread, unread_after, unread_count};
pub(crate) use resolve::{
    ReplyTo, check_thread, endpoint_at, reply_to, resolve_addresses, resolve_received, unknown_addresses,
};
pub(crate) use sent::{previous_send, recipient_states, replies_to, sent_like, thread_of};
pub(crate) use write::{check_room, lock_inboxes, release, write_system};

/// Channel of the LISTEN/NOTIFY fan-out; the payload is a [`DeliveryNotice`].
pub const DELIVERY_CHANNEL: &str = "relay_delivery";

/// Delivery states as SQL text spells them. They are written into the statements rather than
/// bound: the planner can only use the partial index `deliveries_unread` (`state < 4`, migration 1)
/// when the literal is in the text, generic plans of cached statements included.
pub(super) const SURFACED: i16 = State::Surfaced.to_db();
pub(super) const READ: i16 = State::Read.to_db();
pub(super) const WITHDRAWN: i16 = State::Withdrawn.to_db();

/// A message to store, already validated by the send pipeline (`app::send`).
pub struct Outgoing<'a> {
    pub to: &'a [String],
    pub body: &'a RedactedText,
    pub thread: Option<&'a str>,
    pub kind: Kind,
    pub client_id: Option<&'a str>,
    pub private: bool,
    pub require_reply: bool,
    /// The sender's uploads it carries as files.
    pub attach: &'a [String],
}

impl<'a> Outgoing<'a> {
    /// What the system writes to known endpoints (a notice, a question, a report): to no address,
    /// in no thread, with no client id, plain.
    pub fn notice(body: &'a RedactedText) -> Self {
        Self {
            to: &[],
            body,
            thread: None,
            kind: Kind::Message,
            client_id: None,
            private: false,
            require_reply: false,
            attach: &[],
        }
    }

    /// A new message id, and the thread the message goes in: the one it names, else a new thread
    /// named by that id.
    pub fn new_id_and_thread(&self) -> (MessageId, String) {
        let id = crate::domain::ids::new_message_id();
        let thread = self.thread.map_or_else(|| id.to_string(), str::to_owned);
        (id, thread)
    }
}

/// A send's recipients, resolved and allowed, and the group members it skipped: what the
/// resolution cache keeps.
#[derive(Clone)]
pub(crate) struct Resolved {
    pub targets: Vec<Target>,
    pub skipped: Vec<Recipient>,
}

/// A recipient resolved to its endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub id: EndpointId,
    pub address: String,
    pub account_id: AccountId,
}

/// A target from the columns `id, address, account_id`.
impl FromRow for Target {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Target { id: row.col("id")?, address: row.col("address")?, account_id: row.col("account_id")? })
    }
}

/// The column `files`: the files of the message whose id is `$id`, by name, as
/// `[[name, size, binary, redacted, sha256 hex], …]` (null for none) — read in the statement that
/// reads the message, an index probe a row, rather than in a statement of its own.
macro_rules! files_column {
    ($id:literal) => {
        concat!(
            "(select jsonb_agg(jsonb_build_array(a.name, a.size, a.is_binary, a.redacted, encode(a.sha256, 'hex')) \
              order by a.name) from message_artifacts a where a.message_id = ",
            $id,
            ") as files"
        )
    };
}
pub(crate) use files_column;

/// Columns read by [`Message::from_row`], over [`MESSAGE_JOINS`].
const MESSAGE_COLUMNS: &str = concat!(
    "d.seq, m.id, ea.address as sender, m.thread, m.kind, m.body, m.reply_to, m.created_at, \
     m.require_reply, m.private, \
     case when re.parent_id = m.sender_id then 'parent' when se.parent_id = d.recipient_id then 'child' else '' end as relation, ",
    files_column!("m.id")
);

/// Deliveries `d` with what [`message_joins`] adds.
const MESSAGE_JOINS: &str = concat!("deliveries d ", message_joins!());

impl FromRow for Message {
    fn from_row(row: &Row) -> Result<Self> {
        let sent_at: DateTime<Utc> = row.col("created_at")?;
        Ok(Message {
            id: row.col("id")?,
            seq: row.col("seq")?,
            from: row.col("sender")?,
            thread: row.col("thread")?,
            kind: Kind::from_db(row.col("kind")?)?,
            body: row.col("body")?,
            reply_to: row.col("reply_to")?,
            sent_at_ms: sent_at.timestamp_millis(),
            relation: row.col("relation")?,
            require_reply: row.col("require_reply")?,
            private: row.col("private")?,
            attachments: files(row.col("files")?)?,
            post: None,
        })
    }
}

/// A message's files as [`files_column`] answers them.
pub(crate) fn files(column: Option<serde_json::Value>) -> Result<Vec<Attached>> {
    let shape = || Error::Internal("a message's files are not in the shape this binary reads".into());
    let Some(serde_json::Value::Array(files)) = column else { return Ok(Vec::new()) };
    files
        .iter()
        .map(|f| {
            let sha256 = f[4].as_str().and_then(|h| hex::decode(h).ok()).and_then(|b| b.try_into().ok());
            Ok(Attached {
                name: f[0].as_str().ok_or_else(shape)?.to_owned(),
                size: f[1].as_u64().ok_or_else(shape)?,
                binary: f[2].as_bool().ok_or_else(shape)?,
                redacted: f[3].as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(shape)?,
                sha256: sha256.ok_or_else(shape)?,
            })
        })
        .collect()
}

/// A notification on [`DELIVERY_CHANNEL`].
#[derive(Debug, PartialEq, Eq)]
pub enum DeliveryNotice {
    /// `<endpoint>:<seq>`: one endpoint to look at its inbox again: a delivery as the previous
    /// release announced it, or seq 0 for news that is not a delivery (a permission decided).
    One(EndpointId),
    /// `r<replica>:<recipient>,<recipient>,…`: the recipients of what a replica's writer committed
    /// (it woke its own waiters itself; replica 0, `ReplicaId::NONE`: nobody did).
    Batch { replica: ReplicaId, recipients: Vec<EndpointId> },
}

impl DeliveryNotice {
    pub fn parse(payload: &str) -> Option<Self> {
        let (head, tail) = payload.split_once(':')?;
        if let Some(replica) = head.strip_prefix('r') {
            let recipients =
                tail.split(',').map(|r| r.parse().map(EndpointId)).collect::<std::result::Result<Vec<_>, _>>().ok()?;
            return Some(Self::Batch { replica: ReplicaId(replica.parse().ok()?), recipients });
        }
        let _seq: i64 = tail.parse().ok()?;
        Some(Self::One(EndpointId(head.parse().ok()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_payloads_parse() {
        assert_eq!(DeliveryNotice::parse("12:7"), Some(DeliveryNotice::One(EndpointId(12))));
        assert_eq!(
            DeliveryNotice::parse("r3:12,14"),
            Some(DeliveryNotice::Batch { replica: ReplicaId(3), recipients: vec![EndpointId(12), EndpointId(14)] })
        );
        assert_eq!(DeliveryNotice::parse("12"), None);
        assert_eq!(DeliveryNotice::parse("x:1"), None);
        assert_eq!(DeliveryNotice::parse("r3:12,x"), None);
    }
}
