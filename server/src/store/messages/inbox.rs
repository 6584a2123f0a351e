//! What a recipient reads: its unread messages, and its deliveries moved forward as they are
//! pushed, shown and read.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::{MESSAGE_COLUMNS, READ, WITHDRAWN};
use crate::domain::delivery::{Kind, State};
use crate::domain::ids::{EndpointId, Seq};
use crate::domain::message::{Announced, Announcement, Message};
use crate::store::Result;
use crate::store::row::{Col, FromRow};

/// The columns of a page of unread messages, as `relay_unread` and `relay_take_unread` answer them
/// and [`Message::from_row`] reads them.
macro_rules! page_columns {
    () => {
        concat!(
            "seq, id, sender, thread, kind, body, reply_to, created_at, require_reply, private, relation, ",
            super::files_column!("id")
        )
    };
}

/// The messages of the first `$3` unread deliveries of inbox `$1` above seq `$2`, in seq order:
/// `relay_unread` (migration 27), whose plan is kept for the connection instead of made again on
/// every call, and cannot read more than it answers.
const UNREAD_AFTER: &str = concat!("select ", page_columns!(), " from relay_unread($1, $2, $3)");

/// The same page of inbox `$1` (from its first unread, at most `$2`) moved to state `$3` in the
/// same statement, with the count left unread on every row (`relay_take_unread`, migration 33).
const TAKE_UNREAD: &str = concat!("select ", page_columns!(), ", left_unread from relay_take_unread($1, $2, $3)");

/// A look at inbox `$1` for a page of at most `$2` moved to state `$3`, given the version `$4`, `$5`
/// and last message `$6` of the page the caller holds (`relay_look`, migration 34).
const LOOK: &str = concat!(
    "select ",
    page_columns!(),
    ", left_unread, head, unread, unchanged from relay_look($1, $2, $3, $4, $5, $6)"
);

/// What every answer of a look at an inbox depends on: its head seq and its unread count, which
/// every change to that answer moves and no change brings back (migration 34).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Version {
    pub head: i64,
    pub unread: i32,
}

/// What a look found.
#[derive(Debug)]
pub(crate) enum Look {
    /// The inbox is at the version whose page the caller holds.
    Unchanged,
    /// Its page, the count left unread after it, and the version read before it (none for an empty
    /// page).
    Page { messages: Vec<Message>, left: u64, version: Option<Version> },
}

/// The messages of the first `limit` deliveries of `inbox` above seq `after` that are not read
/// yet, in seq order. Locks nothing.
pub(crate) async fn unread_after(
    c: &impl GenericClient,
    inbox: EndpointId,
    after: Seq,
    limit: i64,
) -> Result<Vec<Message>> {
    let stmt = c.prepare_cached(UNREAD_AFTER).await?;
    c.query(&stmt, &[&inbox, &after, &limit]).await?.iter().map(Message::from_row).collect()
}

/// One look at `inbox`: the messages of its first `limit` unread deliveries in seq order, moved to
/// `state` (surfaced or read) in the same statement, and how many it has left unread after them
/// (`relay_take_unread`, migration 33). A page already shown writes nothing.
pub(crate) async fn take_unread(
    c: &impl GenericClient,
    inbox: EndpointId,
    limit: i64,
    state: State,
) -> Result<(Vec<Message>, u64)> {
    let stmt = c.prepare_cached(TAKE_UNREAD).await?;
    let rows = c.query(&stmt, &[&inbox, &limit, &state.to_db()]).await?;
    // Every row carries the same count; an empty look leaves nothing unread.
    let left = match rows.first() {
        Some(row) => row.col::<Option<i32>>("left_unread")?.unwrap_or_default().max(0) as u64,
        None => 0,
    };
    Ok((rows.iter().map(Message::from_row).collect::<Result<_>>()?, left))
}

/// One look at `inbox` that moves its page to surfaced, unless it is still at version `seen` with
/// the page's last message (its id) the newest shown (`relay_look`, migration 34): then only the
/// version is read.
pub(crate) async fn look(
    c: &impl GenericClient,
    inbox: EndpointId,
    limit: i64,
    seen: Option<(Version, &str)>,
) -> Result<Look> {
    let stmt = c.prepare_cached(LOOK).await?;
    let (head, unread, last) = (seen.map(|s| s.0.head), seen.map(|s| s.0.unread), seen.map(|s| s.1));
    let rows = c.query(&stmt, &[&inbox, &limit, &State::Surfaced.to_db(), &head, &unread, &last]).await?;
    let Some(first) = rows.first() else {
        return Ok(Look::Page { messages: Vec::new(), left: 0, version: None });
    };
    if first.col::<bool>("unchanged")? {
        return Ok(Look::Unchanged);
    }
    let version = Version { head: first.col("head")?, unread: first.col("unread")? };
    // Every row carries the same count left unread.
    let left = first.col::<Option<i32>>("left_unread")?.unwrap_or_default().max(0) as u64;
    let messages = rows.iter().map(Message::from_row).collect::<Result<_>>()?;
    Ok(Look::Page { messages, left, version: Some(version) })
}

/// The first `limit` deliveries of `inbox` its model has not been shown (queued or pushed), moved
/// to surfaced in the same statement, with how many it holds unread (`relay_announce`, migration
/// 35). Only what this call moved is answered, so each message is announced once whoever asks;
/// finding nothing writes nothing.
pub(crate) async fn announce(c: &impl GenericClient, inbox: EndpointId, limit: i64) -> Result<Announcement> {
    let stmt =
        c.prepare_cached("select seq, id, sender, kind, require_reply, unread from relay_announce($1, $2)").await?;
    let rows = c.query(&stmt, &[&inbox, &limit]).await?;
    let mut announcement = Announcement::default();
    for row in &rows {
        announcement.unread = row.col::<i32>("unread")?.max(0) as u64;
        announcement.messages.push(Announced::from_row(row)?);
    }
    Ok(announcement)
}

impl FromRow for Announced {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Announced {
            id: row.col("id")?,
            seq: row.col("seq")?,
            from: row.col::<Option<String>>("sender")?.unwrap_or_default(),
            kind: Kind::from_db(row.col("kind")?)?,
            require_reply: row.col("require_reply")?,
            topic: None,
        })
    }
}

/// The newest `limit` messages delivered to `inbox` (withdrawn ones left out), newest first, each
/// with whether it was read. Locks nothing.
pub(crate) async fn recent(c: &impl GenericClient, inbox: EndpointId, limit: i64) -> Result<Vec<(Message, bool)>> {
    let sql = format!(
        "select {MESSAGE_COLUMNS}, d.state >= {READ} as read from \
         (select * from deliveries where recipient_id = $1 and state <> {WITHDRAWN} order by seq desc limit $2) d {} \
         order by d.seq desc",
        message_joins!()
    );
    let stmt = c.prepare_cached(&sql).await?;
    c.query(&stmt, &[&inbox, &limit]).await?.iter().map(|row| Ok((Message::from_row(row)?, row.col("read")?))).collect()
}

/// How many messages `inbox` holds unread: its counter, kept by the deliveries' triggers.
pub(crate) async fn unread_count(c: &impl GenericClient, inbox: EndpointId) -> Result<u64> {
    let stmt = c.prepare_cached("select unread from endpoints where id = $1").await?;
    Ok(c.query_one(&stmt, &[&inbox]).await?.only::<i32>()?.max(0) as u64)
}

/// Moves deliveries `seqs` of `inbox` forward to `state`, keeping its unread count and the newest
/// shown (`relay_advance`: what is shown or read locks the inbox first, as a send does). Pushes
/// are recorded apart, as a mark per inbox (`Store::mark_pushed`).
/// Answers how many moved, and (for surfaced and read) how many the inbox has left unread.
pub(crate) async fn advance(
    c: &impl GenericClient,
    inbox: EndpointId,
    seqs: &[Seq],
    state: State,
) -> Result<(u64, Option<u64>)> {
    let stmt = c.prepare_cached("select moved, left_unread from relay_advance($1, $2, $3)").await?;
    let row = c.query_one(&stmt, &[&inbox, &seqs, &state.to_db()]).await?;
    let (moved, left): (i32, Option<i32>) = (row.col("moved")?, row.col("left_unread")?);
    Ok((moved.max(0) as u64, left.map(|n| n.max(0) as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::messages::Target;
    use crate::store::testing;

    fn seqs(messages: &[Message]) -> Vec<i64> {
        messages.iter().map(|m| m.seq.0).collect()
    }

    #[tokio::test]
    async fn an_inbox_is_announced_once_read_in_seq_order_and_looked_at_again_for_nothing() {
        let db = testing::db().await;
        let (account, machine) = db.machine("acme", "laptop").await;
        let (ann, bob) = (db.endpoint(machine, "ann", 0).await, db.endpoint(machine, "bob", 0).await);
        let c = db.store.client().await.unwrap();
        let to = [Target { id: bob, address: "acme/laptop/bob".into(), account_id: account }];
        let send = async |text: &str| db.send(ann, &to, text, None, None).await;
        for text in ["one", "two", "three"] {
            send(text).await;
        }
        assert_eq!(unread_count(&c, bob).await.unwrap(), 3);
        assert_eq!(seqs(&unread_after(&c, bob, Seq(1), 10).await.unwrap()), [2, 3]);

        // Each message is announced once, whoever asks.
        let first = announce(&c, bob, 2).await.unwrap();
        assert_eq!(first.messages.iter().map(|m| m.seq.0).collect::<Vec<_>>(), [1, 2]);
        assert_eq!((first.unread, first.messages[0].from.as_str()), (3, "acme/laptop/ann"));
        assert_eq!(announce(&c, bob, 2).await.unwrap().messages.len(), 1, "only the third is left to announce");
        assert!(announce(&c, bob, 2).await.unwrap().messages.is_empty());

        assert_eq!(advance(&c, bob, &[Seq(1)], State::Read).await.unwrap(), (1, Some(2)));
        assert_eq!(advance(&c, bob, &[Seq(1)], State::Read).await.unwrap().0, 0, "read already: nothing moves");
        let (page, left) = take_unread(&c, bob, 10, State::Read).await.unwrap();
        assert_eq!((seqs(&page), left), (vec![2, 3], 0));
        assert_eq!(unread_count(&c, bob).await.unwrap(), 0);
        let newest: Vec<(i64, bool)> = recent(&c, bob, 10).await.unwrap().iter().map(|(m, r)| (m.seq.0, *r)).collect();
        assert_eq!(newest, [(3, true), (2, true), (1, true)]);

        // A look shows the page and the version it read; the same look at that version reads nothing more.
        let four = send("four").await;
        let Look::Page { messages, left, version } = look(&c, bob, 10, None).await.unwrap() else {
            panic!("a first look shows a page");
        };
        assert_eq!((seqs(&messages), left), (vec![4], 1), "shown, not read");
        let version = version.expect("a page carries its version");
        assert_eq!(version, Version { head: 4, unread: 1 });
        assert!(matches!(look(&c, bob, 10, Some((version, four.as_str()))).await.unwrap(), Look::Unchanged));
    }

    #[test]
    fn unread_reads_spell_the_partial_index_predicate() {
        // The index's predicate is a literal in a checksummed migration: the reads must match it.
        let index = include_str!("../../../migrations/0001_identity_and_messaging.sql");
        assert!(index.contains(&format!("deliveries_unread on deliveries (recipient_id, seq) where state < {READ};")));
        for reader in [
            include_str!("../../../migrations/0027_unread_read_with_a_kept_plan.sql"),
            include_str!("../../../migrations/0033_inbox_look_in_one_statement.sql"),
        ] {
            assert!(reader.contains(&format!("and u.state < {READ}\n")));
        }
    }
}
