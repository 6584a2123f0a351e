//! The group-commit writer's statements (see `app::send::writer`): one send written alone, or a
//! batch written as a set, by the SQL functions of `migrations/functions` that write sends. Each
//! answers a row per send: stored (with each recipient's seq), a duplicate of an earlier send, or
//! refused with the SQLSTATE that says why.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use postgres_types::ToSql;

use crate::domain::ids::{AccountId, EndpointId, MessageId, ReplicaId, Seq};
use crate::domain::{Result, presence};
use crate::metrics::metrics;
use crate::store::row::Col;

/// A lone send's answer, from `relay_write_send_plain` (a plain send) or
/// `relay_write_send_numbered` (any). Public so that relay-bench times this very statement.
pub const SEND_PLAIN: &str =
    "select outcome, offline, offline_seen, seqs, relations, sent_at from relay_write_send_plain($1, $2, $3)";
const SEND_NUMBERED: &str =
    "select outcome, offline, offline_seen, seqs, relations, sent_at from relay_write_send_numbered($1, $2, $3)";
/// A batch's answer, one row per send, from `relay_write_sends_plain` (plain sends) or
/// `relay_write_sends_numbered` (any).
const SENDS_PLAIN: &str = "select n, outcome, code, message, detail, offline, offline_seen, seqs, relations, sent_at \
                           from relay_write_sends_plain($1, $2, $3)";
const SENDS_NUMBERED: &str = "select n, outcome, code, message, detail, offline, offline_seen, seqs, relations, sent_at \
                              from relay_write_sends_numbered($1, $2, $3)";

/// What became of one send of a batch.
pub(crate) enum Written {
    /// Stored; recipients not online, with when they were last seen; each recipient's seq and how
    /// it stands to the sender, in the order of the send's recipients; when it was stored.
    Stored { offline: HashMap<EndpointId, String>, seqs: Vec<Seq>, relations: Vec<String>, sent_at: DateTime<Utc> },
    /// A send with the same client id was stored before.
    Duplicate,
    /// Refused by the database: its SQLSTATE, message and detail.
    Refused { state: String, message: String, detail: Option<String> },
}

/// One send as `relay_write_sends_numbered` takes it: the composite type `relay_outgoing` (migration 22).
#[derive(Debug, ToSql)]
#[postgres(name = "relay_outgoing")]
pub struct BatchedSend {
    pub id: MessageId,
    pub sender: EndpointId,
    pub account: AccountId,
    pub client_id: Option<String>,
    pub thread: String,
    pub kind: i16,
    pub body: String,
    pub reply_to: Option<MessageId>,
    pub private: bool,
    pub require_reply: bool,
    /// The endpoints it is delivered to.
    pub recipients: Vec<EndpointId>,
    /// The other accounts whose contact it relies on.
    pub contacts: Vec<AccountId>,
    /// For a reply: the endpoint whose delivery of `reply_to` becomes read.
    pub read_by: Option<EndpointId>,
}

impl BatchedSend {
    /// To one inbox, relying on no contact, reading no message (not a reply): what
    /// `relay_write_send_plain` and `relay_write_sends_plain` write.
    pub(crate) fn is_plain(&self) -> bool {
        self.recipients.len() == 1 && self.contacts.is_empty() && self.read_by.is_none()
    }
}

/// Writes one send alone: one statement (migration 26) instead of a set's handful; a plain one,
/// three short writes (migration 32). `cap` is the most unread messages an inbox holds, `replica`
/// this replica's id (its own streams skip the notification).
pub(crate) async fn write_one(
    client: &impl deadpool_postgres::GenericClient,
    send: &BatchedSend,
    cap: i32,
    replica: ReplicaId,
) -> Result<Written> {
    let stmt = client.prepare_cached(if send.is_plain() { SEND_PLAIN } else { SEND_NUMBERED }).await?;
    match client.query_one(&stmt, &[send, &cap, &replica]).await {
        Ok(row) => written(&row),
        // Refused: it raises, and says why by SQLSTATE.
        Err(e) => match e.as_db_error() {
            Some(db) => Ok(Written::Refused {
                state: db.code().code().to_owned(),
                message: db.message().to_owned(),
                detail: db.detail().map(str::to_owned),
            }),
            None => Err(e.into()),
        },
    }
}

/// Writes a batch of sends in one statement and answers each, in order.
pub(crate) async fn write_set(
    client: &impl deadpool_postgres::GenericClient,
    sends: &[&BatchedSend],
    cap: i32,
    replica: ReplicaId,
) -> Result<Vec<Written>> {
    let set = async |statement: &str| {
        let stmt = client.prepare_cached(statement).await?;
        client.query(&stmt, &[&sends, &cap, &replica]).await
    };
    // Plain sends, the common batch, are written as sets once their inboxes are checked
    // (migration 32). Should the set break a constraint anyway (its sender gone) or meet a
    // deadlock, nothing of it was written, and the numbered writer sorts the failing send from
    // the rest. Any other error (a timeout, the database going away) is the batch's.
    let rows = if sends.iter().all(|s| s.is_plain()) {
        match set(SENDS_PLAIN).await {
            Err(e) if e.code().is_some_and(sorted_send_by_send) => {
                tracing::warn!(error = %e, sends = sends.len(), "a set of plain sends failed; written send by send");
                metrics().send_sets_rewritten.inc();
                set(SENDS_NUMBERED).await?
            }
            rows => rows?,
        }
    } else {
        set(SENDS_NUMBERED).await?
    };
    if rows.len() != sends.len() {
        return Err(crate::domain::Error::Internal(format!(
            "the batch writer answered {} of {} sends",
            rows.len(),
            sends.len()
        )));
    }
    rows.iter().map(written).collect()
}

/// Whether a set of plain sends that failed with `code` is written again send by send: a broken
/// constraint (class 23) belongs to one of its sends, and a deadlock to the moment.
fn sorted_send_by_send(code: &tokio_postgres::error::SqlState) -> bool {
    code.code().starts_with("23") || *code == tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED
}

/// One send's outcome, from its row of any of the writers (`relay_write_send_plain`,
/// `relay_write_send_numbered`, `relay_write_sends_plain`, `relay_write_sends_numbered`).
fn written(row: &tokio_postgres::Row) -> Result<Written> {
    let outcome: String = row.col("outcome")?;
    match outcome.as_str() {
        "stored" => {
            let ids: Vec<EndpointId> = row.col::<Option<Vec<EndpointId>>>("offline")?.unwrap_or_default();
            let seen: Vec<Option<DateTime<Utc>>> =
                row.col::<Option<Vec<Option<DateTime<Utc>>>>>("offline_seen")?.unwrap_or_default();
            let offline = ids.into_iter().zip(seen).map(|(id, seen)| (id, presence::offline_reason(seen))).collect();
            Ok(Written::Stored {
                offline,
                seqs: row.col::<Option<Vec<Seq>>>("seqs")?.unwrap_or_default(),
                relations: row.col::<Option<Vec<String>>>("relations")?.unwrap_or_default(),
                sent_at: row.col("sent_at")?,
            })
        }
        "duplicate" => Ok(Written::Duplicate),
        _ => Ok(Written::Refused {
            state: row.col::<Option<String>>("code")?.unwrap_or_default(),
            message: row.col::<Option<String>>("message")?.unwrap_or_default(),
            detail: row.col("detail")?,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::error::SqlState;

    #[test]
    fn a_failed_set_is_written_send_by_send_only_for_what_one_send_or_the_moment_caused() {
        for code in [SqlState::FOREIGN_KEY_VIOLATION, SqlState::UNIQUE_VIOLATION, SqlState::T_R_DEADLOCK_DETECTED] {
            assert!(sorted_send_by_send(&code), "{code:?} is sorted send by send");
        }
        for code in [SqlState::QUERY_CANCELED, SqlState::LOCK_NOT_AVAILABLE, SqlState::ADMIN_SHUTDOWN] {
            assert!(!sorted_send_by_send(&code), "{code:?} fails the batch: written again it would wait again");
        }
    }
}
