//! The writer. Every message is written by the SQL functions of `migrations/functions` named
//! `relay_write_*` and by nothing else: a send alone or a batch of sends as a set (the group-commit
//! writer, `app::send::writer`), a message held for a human (written with no recipients yet, then
//! delivered by [`release`]), and what the system sends inside a transaction of its own. All of them
//! lock inboxes in the one order `relay_lock_inboxes` takes them, and keep the unread counters in the
//! same statement. Each answers per message: stored (with each recipient's seq), a duplicate of an
//! earlier send, or refused with the SQLSTATE that says why ([`Refusal`]).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use postgres_types::ToSql;

use super::{Outgoing, Target};
use crate::domain::caller::Caller;
use crate::domain::ids::{AccountId, EndpointId, MessageId, ReplicaId, Seq};
use crate::domain::{EntityKind, Error, limits, presence};
use crate::metrics::metrics;
use crate::store::Result;
use crate::store::Tx;
use crate::store::error::from_sqlstate;
use crate::store::row::Col;

/// A lone message's answer, from `relay_write_send_plain` (a plain send) or
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

/// What the system writes is refused by no inbox cap: a report on what happened is not lost to a
/// full inbox (a board notice checks for room itself and says when it skips one).
const UNCAPPED: i32 = i32::MAX;

/// What became of one message.
pub(crate) enum Written {
    /// Stored; recipients not online, with when they were last seen; each recipient's seq and how
    /// it stands to the sender, in the order of the message's recipients; when it was stored.
    Stored { offline: HashMap<EndpointId, String>, seqs: Vec<Seq>, relations: Vec<String>, sent_at: DateTime<Utc> },
    /// A send with the same client id was stored before.
    Duplicate,
    /// Refused by the writer.
    Refused(Refusal),
}

/// Why the writer refused a message: its SQLSTATE, message and detail.
pub(crate) struct Refusal {
    pub state: String,
    pub message: String,
    pub detail: Option<String>,
}

/// The writers' refusal of a message that would take two agents answering each other past their
/// account's loop guard (migration 44): the send pipeline holds it for a person instead.
const LOOP: &str = "RLY04";

impl Refusal {
    /// Whether the loop guard refused it; the detail names the recipient.
    pub(crate) fn is_loop(&self) -> bool {
        self.state == LOOP
    }

    /// The recipient at fault, where the writer said which.
    pub(crate) fn recipient(&self) -> Option<EndpointId> {
        self.detail.as_deref().and_then(|d| d.parse().ok()).map(EndpointId)
    }

    /// The error its sender reads, naming the recipient at fault where the writer said which.
    pub(crate) fn into_error(self, sender: AccountId, targets: &[Target], cap: u32) -> Error {
        let named = || -> &str {
            let id = self.recipient();
            targets.iter().find(|t| Some(t.id) == id).map_or("a recipient", |t| &t.address)
        };
        match self.state.as_str() {
            // A contact it relied on was dropped.
            "RLY01" => {
                let gone: Vec<&str> =
                    targets.iter().filter(|t| t.account_id != sender).map(|t| t.address.as_str()).collect();
                Error::not_found(
                    EntityKind::Endpoint,
                    format!("no agent you can reach at {}: nothing was sent", gone.join(", ")),
                )
            }
            // An inbox is full; the detail names it.
            "RLY02" => limits::inbox_full(named(), cap),
            // A recipient's machine was revoked since the send was resolved; the detail names it.
            "RLY03" => Error::not_found(
                EntityKind::Endpoint,
                format!("no agent you can reach at {}: nothing was sent", named()),
            ),
            // Past the loop guard: the send pipeline holds such a send; any other writer says so.
            LOOP => Error::FailedPrecondition(format!(
                "the loop guard holds messages between you and {}: a person of the account must let you go on",
                named()
            )),
            _ => from_sqlstate(&self.state, &self.message),
        }
    }
}

/// One message as the writers take it: the composite type `relay_outgoing` (migration 22).
#[derive(Debug, ToSql)]
#[postgres(name = "relay_outgoing")]
pub struct NewMessage {
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
    /// The endpoints it is delivered to now: none for a message held for a human.
    pub recipients: Vec<EndpointId>,
    /// The other accounts whose contact it relies on.
    pub contacts: Vec<AccountId>,
    /// For a reply: the endpoint whose delivery of `reply_to` becomes read.
    pub read_by: Option<EndpointId>,
}

impl NewMessage {
    /// Message `id` in `thread` from `sender` to `targets`; a reply when it answers `reply_to`,
    /// which becomes read.
    pub(crate) fn new(
        sender: &Caller,
        id: MessageId,
        thread: String,
        targets: &[Target],
        out: &Outgoing<'_>,
        reply_to: Option<&MessageId>,
    ) -> Self {
        let mut contacts: Vec<AccountId> =
            targets.iter().map(|t| t.account_id).filter(|a| *a != sender.account_id).collect();
        contacts.sort_unstable();
        contacts.dedup();
        Self {
            id,
            sender: sender.endpoint_id,
            account: sender.account_id,
            client_id: out.client_id.map(str::to_owned),
            thread,
            kind: out.kind.to_db(),
            body: out.body.as_str().to_owned(),
            reply_to: reply_to.cloned(),
            private: out.private,
            require_reply: out.require_reply,
            recipients: targets.iter().map(|t| t.id).collect(),
            contacts,
            read_by: reply_to.map(|_| sender.endpoint_id),
        }
    }

    /// To one inbox, relying on no contact, reading no message (not a reply): what
    /// `relay_write_send_plain` and `relay_write_sends_plain` write.
    pub(crate) fn is_plain(&self) -> bool {
        self.recipients.len() == 1 && self.contacts.is_empty() && self.read_by.is_none()
    }
}

/// Writes one message alone: one statement (migration 26); a plain one, three short writes
/// (migration 32). `cap` is the most unread messages an inbox holds; `replica` the writing
/// replica, whose own streams skip the notification (`ReplicaId::NONE`: every replica hears it).
/// Inside a transaction the client holds, a refusal leaves that transaction failed.
pub(crate) async fn write_one(
    client: &impl GenericClient,
    message: &NewMessage,
    cap: i32,
    replica: ReplicaId,
) -> Result<Written> {
    let stmt = client.prepare_cached(if message.is_plain() { SEND_PLAIN } else { SEND_NUMBERED }).await?;
    match client.query_one(&stmt, &[message, &cap, &replica]).await {
        Ok(row) => written(&row),
        // Refused: it raises, and says why by SQLSTATE.
        Err(e) => match e.as_db_error() {
            Some(db) => Ok(Written::Refused(Refusal {
                state: db.code().code().to_owned(),
                message: db.message().to_owned(),
                detail: db.detail().map(str::to_owned),
            })),
            None => Err(e.into()),
        },
    }
}

/// Writes a batch of sends in one statement and answers each, in order.
pub(crate) async fn write_set(
    client: &impl GenericClient,
    sends: &[&NewMessage],
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
        return Err(
            Error::Internal(format!("the batch writer answered {} of {} sends", rows.len(), sends.len())).into()
        );
    }
    rows.iter().map(written).collect()
}

/// Writes what the system sends (a board notice, a hold's outcome, a permission question) in the
/// caller's transaction: no inbox cap refuses it, and every replica hears of it. The writer counts
/// the deliveries it writes, and so does every writer after it in that transaction
/// (`relay.counted`, see migrations/README.md).
pub(crate) async fn write_system(tx: &Tx<'_>, sender: &Caller, targets: &[Target], out: &Outgoing<'_>) -> Result<()> {
    let (id, thread) = out.new_id_and_thread();
    let message = NewMessage::new(sender, id, thread, targets, out, None);
    match write_one(tx, &message, UNCAPPED, ReplicaId::NONE).await? {
        Written::Stored { .. } | Written::Duplicate => Ok(()),
        Written::Refused(why) => Err(why.into_error(sender.account_id, targets, u32::MAX).into()),
    }
}

/// Delivers a message held for a human, now released, to `recipients`: the next seq of each inbox.
pub(crate) async fn release(tx: &Tx<'_>, message: &MessageId, recipients: &[EndpointId]) -> Result<()> {
    let stmt = tx.prepare_cached("select relay_write_release($1, $2, $3)").await?;
    tx.execute(&stmt, &[message, &recipients, &ReplicaId::NONE]).await?;
    Ok(())
}

/// Locks every inbox a transaction is about to write, in the one order every writer takes them
/// (`relay_lock_inboxes`), before any is written: a transaction that writes several messages one by
/// one would otherwise take them in its own order. Answers those whose machine was revoked, which
/// the writer would refuse.
pub(crate) async fn lock_inboxes(tx: &Tx<'_>, inboxes: &[EndpointId]) -> Result<Vec<EndpointId>> {
    let stmt = tx.prepare_cached("select id from relay_lock_inboxes($1) where revoked").await?;
    tx.query(&stmt, &[&inboxes]).await?.iter().map(|r| r.only()).collect()
}

/// Refuses a send that would take a target's unread messages past `cap`: one read of the
/// inboxes' unread counters.
pub(crate) async fn check_room(c: &impl GenericClient, targets: &[Target], cap: u32) -> Result<()> {
    let ids: Vec<EndpointId> = targets.iter().map(|t| t.id).collect();
    let stmt = c.prepare_cached("select id from endpoints where id = any($1) and unread >= $2").await?;
    let cap_db = i32::try_from(cap).unwrap_or(i32::MAX);
    let full = c.query(&stmt, &[&ids, &cap_db]).await?;
    let Some(row) = full.first() else {
        return Ok(());
    };
    let id: EndpointId = row.only()?;
    match targets.iter().find(|t| t.id == id) {
        Some(target) => Err(limits::inbox_full(&target.address, cap).into()),
        None => Ok(()),
    }
}

/// Whether a set of plain sends that failed with `code` is written again send by send: a broken
/// constraint (class 23) or a pair past the loop guard belongs to one of its sends, and a deadlock
/// to the moment.
fn sorted_send_by_send(code: &tokio_postgres::error::SqlState) -> bool {
    code.code().starts_with("23")
        || code.code() == LOOP
        || *code == tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED
}

/// One message's outcome, from its row of any of the writers.
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
        _ => Ok(Written::Refused(Refusal {
            state: row.col::<Option<String>>("code")?.unwrap_or_default(),
            message: row.col::<Option<String>>("message")?.unwrap_or_default(),
            detail: row.col("detail")?,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::delivery::Kind;
    use crate::domain::ids::MachineId;
    use crate::domain::redact::RedactedText;
    use crate::store::identity::caller_of;
    use crate::store::testing::{self, Db};
    use tokio_postgres::error::SqlState;

    /// Agents `handles` of acme's laptop, each with `unread` counted: the first as a sender, and
    /// every one as a target.
    async fn agents(db: &Db, handles: &[(&str, i32)]) -> (Caller, Vec<Target>, MachineId) {
        let (account, machine) = db.machine("acme", "laptop").await;
        let mut targets = Vec::new();
        for (handle, unread) in handles {
            let id = db.endpoint(machine, handle, *unread).await;
            targets.push(Target { id, address: format!("acme/laptop/{handle}"), account_id: account });
        }
        let c = db.store.client().await.unwrap();
        (caller_of(&c, targets[0].id).await.unwrap(), targets, machine)
    }

    fn message(from: &Caller, to: &[Target], client_id: Option<&str>, reply_to: Option<&MessageId>) -> NewMessage {
        let body = RedactedText::from_agent("the build is green");
        let kind = if reply_to.is_some() { Kind::Reply } else { Kind::Message };
        let out = Outgoing { kind, client_id, ..Outgoing::notice(&body) };
        let (id, thread) = out.new_id_and_thread();
        NewMessage::new(from, id, thread, to, &out, reply_to)
    }

    /// Each inbox's (head seq, unread count), and the seqs it holds of `message`.
    async fn inbox(db: &Db, id: EndpointId, message: &MessageId) -> (i64, i32, Vec<i64>) {
        let sql = db.test.sql().await;
        let row = sql.query_one("select head_seq, unread from endpoints where id = $1", &[&id]).await.unwrap();
        let seqs = sql
            .query(
                "select seq from deliveries where recipient_id = $1 and message_id = $2 order by seq",
                &[&id, message],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        (row.get(0), row.get(1), seqs)
    }

    fn stored_seqs(written: &Written) -> Vec<Seq> {
        match written {
            Written::Stored { seqs, .. } => seqs.clone(),
            Written::Duplicate => panic!("a duplicate, not stored"),
            Written::Refused(why) => panic!("refused: {} {}", why.state, why.message),
        }
    }

    #[tokio::test]
    async fn a_batch_takes_gapless_seqs_in_its_order_and_a_retry_is_answered_as_a_duplicate() {
        let db = testing::db().await;
        let (ann, to, _) = agents(&db, &[("ann", 0), ("bob", 0)]).await;
        let bob = &to[1..];
        let sends = [message(&ann, bob, Some("c1"), None), message(&ann, bob, Some("c2"), None)];
        let c = db.store.client().await.unwrap();
        let written = write_set(&c, &sends.iter().collect::<Vec<_>>(), 10, ReplicaId::NONE).await.unwrap();
        assert_eq!(written.iter().map(stored_seqs).collect::<Vec<_>>(), [vec![Seq(1)], vec![Seq(2)]]);
        assert_eq!(inbox(&db, bob[0].id, &sends[1].id).await, (2, 2, vec![2]));

        let retry = message(&ann, bob, Some("c1"), None);
        assert!(matches!(write_one(&c, &retry, 10, ReplicaId::NONE).await.unwrap(), Written::Duplicate));
        assert_eq!(inbox(&db, bob[0].id, &retry.id).await, (2, 2, vec![]), "a retry writes nothing");
    }

    #[tokio::test]
    async fn a_full_inbox_refuses_the_send_naming_it_and_keeps_nothing_of_it() {
        let db = testing::db().await;
        let (ann, to, _) = agents(&db, &[("ann", 0), ("bob", 3), ("cid", 0)]).await;
        let c = db.store.client().await.unwrap();
        let send = message(&ann, &to[1..], None, None);
        let Written::Refused(why) = write_one(&c, &send, 3, ReplicaId::NONE).await.unwrap() else {
            panic!("bob holds 3 of 3 unread: refused");
        };
        assert_eq!(
            why.into_error(ann.account_id, &to, 3).to_string(),
            limits::inbox_full("acme/laptop/bob", 3).to_string()
        );
        assert_eq!(inbox(&db, to[2].id, &send.id).await, (0, 0, vec![]), "its other recipient got nothing either");
        let stored: i64 = db.test.sql().await.query_one("select count(*) from messages", &[]).await.unwrap().get(0);
        assert_eq!(stored, 0);
    }

    #[tokio::test]
    async fn a_held_reply_reaches_nobody_and_reads_its_original_until_release_delivers_it() {
        let db = testing::db().await;
        let (ann, to, _) = agents(&db, &[("ann", 0), ("bob", 0)]).await;
        let c = db.store.client().await.unwrap();
        let bob = caller_of(&c, to[1].id).await.unwrap();
        let question = message(&bob, &to[..1], None, None);
        stored_seqs(&write_one(&c, &question, 10, ReplicaId::NONE).await.unwrap());
        assert_eq!(inbox(&db, ann.endpoint_id, &question.id).await, (1, 1, vec![1]));

        // Held: written with no recipients, as the send path writes one for its hold.
        let mut c = db.store.client().await.unwrap();
        let tx = c.transaction().await.unwrap();
        let reply = NewMessage { recipients: Vec::new(), ..message(&ann, &to[1..], None, Some(&question.id)) };
        stored_seqs(&write_one(&tx, &reply, 10, ReplicaId::NONE).await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(inbox(&db, to[1].id, &reply.id).await, (0, 0, vec![]), "nobody has a held message");
        assert_eq!(inbox(&db, ann.endpoint_id, &question.id).await, (1, 0, vec![1]), "the question is read");

        let tx = c.transaction().await.unwrap();
        release(&tx, &reply.id, &[to[1].id]).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(inbox(&db, to[1].id, &reply.id).await, (1, 1, vec![1]), "released: bob's next seq");
    }

    #[tokio::test]
    async fn what_the_system_writes_passes_a_full_inbox_but_not_a_revoked_machine() {
        let db = testing::db().await;
        let (ann, to, machine) = agents(&db, &[("ann", 0), ("bob", 500)]).await;
        let body = RedactedText::from_agent("card 7 is done");
        let out = Outgoing::notice(&body);
        let mut c = db.store.client().await.unwrap();
        let tx = c.transaction().await.unwrap();
        write_system(&tx, &ann, &to[1..], &out).await.expect("no cap refuses a notice");
        tx.commit().await.unwrap();
        let unread: i32 = db
            .test
            .sql()
            .await
            .query_one("select unread from endpoints where id = $1", &[&to[1].id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(unread, 501);

        db.test.sql().await.execute("update machines set revoked_at = now() where id = $1", &[&machine]).await.unwrap();
        let tx = c.transaction().await.unwrap();
        let refused = Error::from(write_system(&tx, &ann, &to[1..], &out).await.unwrap_err());
        assert!(matches!(refused, Error::NotFound { kind: EntityKind::Endpoint, .. }), "{refused:?}");
        assert_eq!(refused.to_string(), "no agent you can reach at acme/laptop/bob: nothing was sent");
    }

    #[tokio::test]
    async fn locking_inboxes_holds_them_to_the_end_and_names_those_of_revoked_machines() {
        let db = testing::db().await;
        let (_, to, _) = agents(&db, &[("ann", 0)]).await;
        let (_, gone) = db.machine("acme", "old-laptop").await;
        let old = db.endpoint(gone, "bob", 0).await;
        db.test.sql().await.execute("update machines set revoked_at = now() where id = $1", &[&gone]).await.unwrap();

        let mut c = db.store.client().await.unwrap();
        let tx = c.transaction().await.unwrap();
        assert_eq!(lock_inboxes(&tx, &[old, to[0].id]).await.unwrap(), [old]);
        let other = db.test.sql().await;
        let taken = other.execute("select 1 from endpoints where id = $1 for no key update nowait", &[&to[0].id]).await;
        assert_eq!(taken.unwrap_err().code(), Some(&SqlState::LOCK_NOT_AVAILABLE), "held until the transaction ends");
        tx.commit().await.unwrap();
        other.execute("select 1 from endpoints where id = $1 for no key update nowait", &[&to[0].id]).await.unwrap();
    }

    #[test]
    fn a_failed_set_is_written_send_by_send_only_for_what_one_send_or_the_moment_caused() {
        for code in [SqlState::FOREIGN_KEY_VIOLATION, SqlState::UNIQUE_VIOLATION, SqlState::T_R_DEADLOCK_DETECTED] {
            assert!(sorted_send_by_send(&code), "{code:?} is sorted send by send");
        }
        for code in [SqlState::QUERY_CANCELED, SqlState::LOCK_NOT_AVAILABLE, SqlState::ADMIN_SHUTDOWN] {
            assert!(!sorted_send_by_send(&code), "{code:?} fails the batch: written again it would wait again");
        }
    }

    #[tokio::test]
    async fn a_send_is_refused_when_a_targets_unread_reach_the_cap_and_names_that_target() {
        let db = testing::db().await;
        let (account, machine) = db.machine("acme", "laptop").await;
        let mut targets = Vec::new();
        for (handle, unread) in [("roomy", 2), ("full", 3)] {
            let id = db.endpoint(machine, handle, unread).await;
            targets.push(Target { id, address: format!("acme/laptop/{handle}"), account_id: account });
        }
        let c = db.store.client().await.unwrap();
        check_room(&c, &targets[..1], 3).await.expect("two unread of three: room");
        let refused = check_room(&c, &targets, 3).await.unwrap_err();
        assert_eq!(refused.to_string(), limits::inbox_full("acme/laptop/full", 3).to_string());
        check_room(&c, &targets, 4).await.expect("a higher cap has room for both");
    }

    /// The loop guard's streak (migration 44), kept by every writer: a pair answering each other
    /// in any thread is refused past the account's bound, naming the recipient; one agent writing
    /// however often is no streak; a person clearing the pair starts it over.
    #[tokio::test]
    async fn every_writer_refuses_a_pair_answering_each_other_past_the_bound_and_nothing_else() {
        let db = testing::db().await;
        let (ann, to, _) = agents(&db, &[("ann", 0), ("bob", 0), ("cid", 0)]).await;
        let sql = db.test.sql().await;
        sql.execute("update accounts set loop_max_messages = 3 where name = 'acme'", &[]).await.unwrap();
        let c = db.store.client().await.unwrap();
        let bob = caller_of(&c, to[1].id).await.unwrap();
        let cid = caller_of(&c, to[2].id).await.unwrap();
        let (to_ann, to_bob) = (&to[..1], &to[1..2]);
        let one = async |m: &NewMessage| write_one(&c, m, 100, ReplicaId::NONE).await.unwrap();
        let refused_for = |w: &Written| match w {
            Written::Refused(why) if why.is_loop() => why.recipient(),
            _ => None,
        };

        // Three turns, each a fresh send: the fourth is refused, by the lone writer and the set's.
        for (from, to) in [(&ann, to_bob), (&bob, to_ann), (&ann, to_bob)] {
            stored_seqs(&one(&message(from, to, None, None)).await);
        }
        let fourth = message(&bob, to_ann, None, None);
        assert_eq!(refused_for(&one(&fourth).await), Some(ann.endpoint_id));
        assert_eq!(inbox(&db, ann.endpoint_id, &fourth.id).await, (1, 1, vec![]), "nothing of it was written");
        let both = message(&bob, &[to[0].clone(), to[2].clone()], None, None);
        assert_eq!(
            refused_for(&one(&both).await),
            Some(ann.endpoint_id),
            "a message to several, by the numbered writer"
        );
        let batch = [message(&bob, to_ann, None, None), message(&cid, to_bob, None, None)];
        let written = write_set(&c, &batch.iter().collect::<Vec<_>>(), 100, ReplicaId::NONE).await.unwrap();
        assert_eq!(refused_for(&written[0]), Some(ann.endpoint_id), "the set is sorted send by send");
        assert_eq!(stored_seqs(&written[1]), [Seq(3)], "its batch-mate is stored");

        // One agent writing however often makes no more turns, and the next answer is still refused.
        for _ in 0..6 {
            stored_seqs(&one(&message(&ann, to_bob, None, None)).await);
        }
        let Written::Refused(why) = one(&message(&bob, to_ann, None, None)).await else { panic!("not refused") };
        assert!(why.is_loop());
        let said = why.into_error(bob.account_id, to_ann, 100).to_string();
        assert!(said.contains("loop guard holds messages between you and acme/laptop/ann"), "{said}");

        // A person let the pair go on: the streak starts over.
        crate::store::loops::clear(&c, ann.endpoint_id, bob.endpoint_id, "t").await.unwrap();
        for (from, to) in [(&bob, to_ann), (&ann, to_bob), (&bob, to_ann)] {
            stored_seqs(&one(&message(from, to, None, None)).await);
        }
        assert!(refused_for(&one(&message(&ann, to_bob, None, None)).await).is_some());
    }
}
