//! Messages and their deliveries: sending, the inbox, replies and delivery states.

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::error::Col;
use super::identity::{Caller, ONLINE};
use super::send_batch::Written;
use super::{Store, resolved};
use crate::domain::address::{self, Address, BOARD, HUMAN, Origin};
use crate::domain::delivery::{Kind, State};
use crate::domain::ids::{self, AccountId, EndpointId, MessageRef};
use crate::domain::message::{Message, Recipient};
use crate::domain::redact::RedactedText;
use crate::domain::scope::{Reach, Verdict};
use crate::domain::{EntityKind, Error, Result, limits, presence};
use crate::store::scope;

/// Channel of the LISTEN/NOTIFY fan-out; the payload is `<recipient endpoint id>:<seq>`.
pub const DELIVERY_CHANNEL: &str = "relay_delivery";

/// Delivery states as SQL text spells them. They are written into the statements rather than
/// bound: the planner can only use the partial index `deliveries_unread` (`state < 4`, migration 1)
/// when the literal is in the text, generic plans of cached statements included.
pub(super) const SURFACED: i16 = State::Surfaced.to_db();
pub(super) const READ: i16 = State::Read.to_db();
pub(super) const WITHDRAWN: i16 = State::Withdrawn.to_db();

/// A message to store, already validated by the caller of [`Store::send`].
pub struct Outgoing<'a> {
    pub to: &'a [String],
    pub body: &'a RedactedText,
    pub thread: Option<&'a str>,
    pub kind: Kind,
    pub client_id: Option<&'a str>,
    pub private: bool,
    pub require_reply: bool,
}

pub use crate::domain::message::Sent;

/// A resolved, allowed send on its way to the batched writer.
struct Write<'a> {
    caller: &'a Caller,
    id: &'a str,
    thread: &'a str,
    targets: &'a [Target],
    out: &'a Outgoing<'a>,
    reply_to: Option<&'a str>,
}

/// A send's recipients, resolved and allowed, and the group members it skipped.
#[derive(Clone)]
pub(crate) struct Resolved {
    targets: Vec<Target>,
    skipped: Vec<Recipient>,
}

/// A recipient resolved to its endpoint.
#[derive(Clone)]
pub(crate) struct Target {
    pub id: EndpointId,
    pub address: String,
    pub account_id: AccountId,
}

/// Columns read by [`message_from_row`], over [`MESSAGE_JOINS`].
const MESSAGE_COLUMNS: &str = "d.seq, m.id, ea.address as sender, m.thread, m.kind, m.body, m.reply_to, m.created_at, \
     m.require_reply, m.private, \
     case when re.parent_id = m.sender_id then 'parent' when se.parent_id = d.recipient_id then 'child' else '' end as relation";

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

/// Deliveries `d` with what [`message_joins`] adds.
const MESSAGE_JOINS: &str = concat!("deliveries d ", message_joins!());

/// The messages of the first `$3` unread deliveries of inbox `$1` above seq `$2`, in seq order.
/// The limit is taken before any join: an inbox that grew faster than the planner's statistics
/// cannot make it join everything it holds and sort it. Built once, so every call prepares the
/// same text.
static UNREAD_AFTER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "select {MESSAGE_COLUMNS} from \
         (select * from deliveries where recipient_id = $1 and seq > $2 and state < {READ} order by seq limit $3) d {} \
         order by d.seq",
        message_joins!()
    )
});

fn message_from_row(row: &Row) -> Result<Message> {
    let sent_at: DateTime<Utc> = row.col("created_at")?;
    Ok(Message {
        id: row.col("id")?,
        seq: row.col::<i64>("seq")? as u64,
        from: row.col("sender")?,
        thread: row.col("thread")?,
        kind: Kind::from_db(row.col("kind")?)?,
        body: row.col("body")?,
        reply_to: row.col::<Option<String>>("reply_to")?.unwrap_or_default(),
        sent_at_ms: sent_at.timestamp_millis(),
        relation: row.col("relation")?,
        require_reply: row.col("require_reply")?,
        private: row.col("private")?,
    })
}

fn seqs_to_db(seqs: &[u64]) -> Result<Vec<i64>> {
    seqs.iter().map(|s| i64::try_from(*s).map_err(|_| Error::invalid(format!("seq {s} is out of range")))).collect()
}

impl Store {
    /// Stores a message once and gives each recipient a delivery with the next gapless seq of its
    /// inbox. A retry with the same client id returns the first result.
    ///
    /// Resolving and allowing the send are reads outside any transaction; the writing is one call of
    /// the batched writer, which re-checks under lock what a concurrent change could break (the
    /// contacts relied on, room in each inbox). A send held for a human takes the transactional path.
    pub async fn send(&self, caller: &Caller, out: Outgoing<'_>) -> Result<Sent> {
        let _place = self.send_limit.try_admit().ok_or_else(limits::overloaded)?;
        // The same words from the same sender resolve alike until scope changes, which every
        // replica hears of; a group's members are read each time, as they come and go.
        let key = (!out.to.iter().any(|a| a.trim().starts_with("group:"))).then(|| resolved::Key {
            sender: caller.endpoint_id,
            private: out.private,
            to: out.to.to_vec(),
        });
        let ticket = match key.as_ref().map(|k| self.resolved.get(k)) {
            Some(Ok(known)) => {
                if let Some(thread) = out.thread {
                    check_thread(&self.client().await?, caller, thread).await?;
                }
                // A retry is found by the writer (its client id is taken) and answered from the database.
                return self.write_resolved(caller, &out, known).await;
            }
            Some(Err(ticket)) => Some(ticket),
            None => None,
        };
        let client = self.client().await?;
        // A retry is answered with the first result even if resolving would now fail, so the check
        // for one goes first; issued together with resolving, it costs no round trip of its own.
        let (previous, resolved) = tokio::join!(
            async {
                match out.client_id {
                    Some(client_id) => previous_send(&client, caller, client_id).await,
                    None => Ok(None),
                }
            },
            async {
                if let Some(thread) = out.thread {
                    check_thread(&client, caller, thread).await?;
                }
                resolve_addresses(&client, caller, out.to).await
            },
        );
        if let Some(sent) = previous? {
            return Ok(sent);
        }
        let (targets, skipped) = resolved?;
        if super::trust::hold_class(&client, caller, &targets, out.private).await?.is_some() {
            drop(client);
            return self.send_held(caller, &targets, skipped, &out).await;
        }
        drop(client);
        let known = Resolved { targets, skipped };
        if let (Some(ticket), Some(key)) = (ticket, key) {
            self.resolved.put(ticket, key, known.clone());
        }
        self.write_resolved(caller, &out, known).await
    }

    /// Writes a send whose recipients are resolved and allowed.
    async fn write_resolved(&self, caller: &Caller, out: &Outgoing<'_>, known: Resolved) -> Result<Sent> {
        let id = ids::new_message_id();
        let thread = out.thread.map_or_else(|| id.clone(), str::to_owned);
        let write = Write { caller, id: &id, thread: &thread, targets: &known.targets, out, reply_to: None };
        let mut sent = self.write_send(write).await?;
        if !sent.duplicate {
            sent.skipped = known.skipped;
        }
        Ok(sent)
    }

    /// A send the account's human must release first: stored with its hold in one transaction.
    async fn send_held(
        &self,
        caller: &Caller,
        targets: &[Target],
        skipped: Vec<Recipient>,
        out: &Outgoing<'_>,
    ) -> Result<Sent> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        hold_contacts(&tx, caller, targets).await?;
        check_room(&tx, targets, self.max_unread).await?;
        match store_message(&tx, caller, targets, out, None).await? {
            Some(mut sent) => {
                tx.commit().await?;
                sent.skipped = skipped;
                Ok(sent)
            }
            None => {
                // A concurrent retry with the same client id won the insert; answer with its result.
                drop(tx);
                previous_send(&client, caller, out.client_id.unwrap_or_default())
                    .await?
                    .ok_or_else(|| Error::Unavailable("a concurrent send with this client id failed; retry".into()))
            }
        }
    }

    /// Hands a resolved, allowed send to the batched writer and reads its outcome.
    async fn write_send(&self, w: Write<'_>) -> Result<Sent> {
        let contacts: Vec<AccountId> = {
            let mut others: Vec<AccountId> =
                w.targets.iter().map(|t| t.account_id).filter(|a| *a != w.caller.account_id).collect();
            others.sort_unstable();
            others.dedup();
            others
        };
        let to: Vec<EndpointId> = w.targets.iter().map(|t| t.id).collect();
        let mut send = serde_json::json!({
            "id": w.id,
            "sender": w.caller.endpoint_id,
            "account": w.caller.account_id,
            "client_id": w.out.client_id,
            "thread": w.thread,
            "kind": w.out.kind.to_db(),
            "body": w.out.body.as_str(),
            "reply_to": w.reply_to,
            "private": w.out.private,
            "require_reply": w.out.require_reply,
            "to": to,
            "contacts": contacts,
        });
        if w.reply_to.is_some() {
            // A reply reads the message it answers.
            send["read"] = w.caller.endpoint_id.0.into();
        }
        match self.batcher.write(send, to).await? {
            Written::Stored { offline } => Ok(Sent {
                id: w.id.to_owned(),
                thread: w.thread.to_owned(),
                recipients: w
                    .targets
                    .iter()
                    .map(|t| Recipient {
                        address: t.address.clone(),
                        state: Some(State::Queued),
                        reason: offline.get(&t.id).cloned().unwrap_or_default(),
                    })
                    .collect(),
                duplicate: false,
                reply_to: w.reply_to.map(str::to_owned),
                skipped: Vec::new(),
                hold: None,
            }),
            Written::Duplicate => {
                let client = self.client().await?;
                previous_send(&client, w.caller, w.out.client_id.unwrap_or_default())
                    .await?
                    .ok_or_else(|| Error::Unavailable("a concurrent send with this client id failed; retry".into()))
            }
            Written::Refused { state, message, detail } => Err(match state.as_str() {
                "RLY01" => {
                    let gone: Vec<&str> = w
                        .targets
                        .iter()
                        .filter(|t| t.account_id != w.caller.account_id)
                        .map(|t| t.address.as_str())
                        .collect();
                    Error::not_found(
                        EntityKind::Endpoint,
                        format!("no agent you can reach at {}: nothing was sent", gone.join(", ")),
                    )
                }
                "RLY02" => {
                    let full: Option<EndpointId> = detail.as_deref().and_then(|d| d.parse().ok()).map(EndpointId);
                    let address = w.targets.iter().find(|t| Some(t.id) == full).map_or("a recipient", |t| &t.address);
                    limits::inbox_full(address, self.max_unread)
                }
                _ => super::error::from_sqlstate(&state, &message),
            }),
        }
    }

    /// Sends to one known endpoint without scope rules: for reports the system makes on an
    /// endpoint's behalf (a worker's final result to its parent).
    pub(crate) async fn send_unscoped(&self, sender: &Caller, out: Outgoing<'_>) -> Result<Sent> {
        let mut client = self.client().await?;
        if let Some(client_id) = out.client_id
            && let Some(sent) = previous_send(&client, sender, client_id).await?
        {
            return Ok(sent);
        }
        let tx = client.transaction().await?;
        let address = out.to.first().ok_or_else(|| Error::invalid("no recipient"))?;
        let id: EndpointId = tx
            .query_opt("select id from endpoint_addresses where address = $1", &[address])
            .await?
            .ok_or_else(|| Error::not_found(EntityKind::Endpoint, format!("no agent at {address}")))?
            .col(0)?;
        let targets = [Target { id, address: address.clone(), account_id: sender.account_id }];
        let sent = store_message(&tx, sender, &targets, &out, None)
            .await?
            .ok_or_else(|| Error::Unavailable("a concurrent send with this client id is in progress; retry".into()))?;
        tx.commit().await?;
        Ok(sent)
    }

    /// Answers a message the caller received: to its sender, in its thread; the original becomes read.
    pub async fn reply(
        &self,
        caller: &Caller,
        reference: &str,
        body: &RedactedText,
        client_id: Option<&str>,
    ) -> Result<Sent> {
        let _place = self.send_limit.try_admit().ok_or_else(limits::overloaded)?;
        let reference = MessageRef::parse(reference)?;
        let client = self.client().await?;
        // Reads that do not depend on each other are issued together: three round trips in all.
        let (previous, original) = tokio::join!(
            async {
                match client_id {
                    Some(client_id) => previous_send(&client, caller, client_id).await,
                    None => Ok(None),
                }
            },
            resolve_received(&client, caller, &reference),
        );
        // A retry is answered with the first result even if the reply could not be made now.
        if let Some(sent) = previous? {
            return Ok(sent);
        }
        let original = original?;
        let asked = client
            .prepare_cached(
                "select m.thread, m.sender_id, ea.address, ea.account_id, mc.revoked_at is not null
                 from messages m
                 join endpoint_addresses ea on ea.id = m.sender_id
                 join endpoints e on e.id = m.sender_id
                 join machines mc on mc.id = e.machine_id
                 where m.id = $1",
            )
            .await?;
        let (row, contacts) = tokio::try_join!(
            async { Ok::<_, Error>(client.query_one(&asked, &[&original]).await?) },
            super::identity::contact_accounts(&client, caller.account_id),
        )?;
        let (thread, sender_id, sender_address): (String, EndpointId, String) = (row.col(0)?, row.col(1)?, row.col(2)?);
        if crate::domain::address::is_board_address(&sender_address) {
            return Err(address::board_reads_nothing(&sender_address));
        }
        if scope::reach(caller.account_id, &contacts, row.col(3)?) == Reach::None || row.col::<bool>(4)? {
            return Err(Error::FailedPrecondition(format!(
                "{sender_address} is no longer reachable from your account (its machine was revoked or the contact ended), so the reply was not sent"
            )));
        }
        // An asker that ended its session still gets the reply: it waits in its inbox for its return.
        let targets = vec![Target { id: sender_id, address: sender_address, account_id: row.col(3)? }];
        let out = Outgoing {
            to: &[],
            body,
            thread: Some(&thread),
            kind: Kind::Reply,
            client_id,
            private: false,
            require_reply: false,
        };
        let asker = [sender_id];
        let (verdicts, hold) = tokio::try_join!(
            scope::decide_many(&client, caller, &contacts, &asker),
            super::trust::hold_class(&client, caller, &targets, false),
        )?;
        if let Some(why) = verdicts.get(&sender_id).and_then(Verdict::refusal) {
            return Err(Error::PermissionDenied(format!("not allowed, the reply was not sent: {why}")));
        }
        drop(client);
        if hold.is_some() {
            return self.reply_held(caller, &targets, &out, &original).await;
        }
        let id = ids::new_message_id();
        let write = Write { caller, id: &id, thread: &thread, targets: &targets, out: &out, reply_to: Some(&original) };
        self.write_send(write).await
    }

    /// A reply the account's human must release first, stored with its hold in one transaction;
    /// the message it answers becomes read.
    async fn reply_held(
        &self,
        caller: &Caller,
        targets: &[Target],
        out: &Outgoing<'_>,
        original: &str,
    ) -> Result<Sent> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The replier's inbox with the heads, in id order: inboxes before their deliveries.
        let inboxes: Vec<EndpointId> = targets.iter().map(|t| t.id).chain([caller.endpoint_id]).collect();
        lock_inboxes(&tx, inboxes).await?;
        hold_contacts(&tx, caller, targets).await?;
        check_room(&tx, targets, self.max_unread).await?;
        let Some(sent) = store_message(&tx, caller, targets, out, Some(original)).await? else {
            drop(tx);
            return previous_send(&client, caller, out.client_id.unwrap_or_default())
                .await?
                .ok_or_else(|| Error::Unavailable("a concurrent reply with this client id failed; retry".into()));
        };
        tx.execute(
            &format!(
                "update deliveries set state = {READ}, updated_at = now()
                 where message_id = $1 and recipient_id = $2 and state < {READ}"
            ),
            &[&original, &caller.endpoint_id],
        )
        .await?;
        tx.commit().await?;
        Ok(sent)
    }

    /// Unread messages in seq order. They become surfaced, or read when `ack`, in the same call
    /// that answers the count left unread; an empty read leaves nothing unread.
    pub async fn inbox(&self, caller: &Caller, limit: u32, ack: bool) -> Result<(Vec<Message>, u64)> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(&UNREAD_AFTER).await?;
        let rows = client.query(&stmt, &[&caller.endpoint_id, &0i64, &i64::from(limit)]).await?;
        let messages = rows.iter().map(message_from_row).collect::<Result<Vec<_>>>()?;
        if messages.is_empty() {
            return Ok((messages, 0));
        }
        let seqs: Vec<i64> = messages.iter().map(|m| m.seq as i64).collect();
        let state = if ack { State::Read } else { State::Surfaced };
        let (_, left) = advance(&client, caller, &seqs, state).await?;
        Ok((messages, left.unwrap_or_default()))
    }

    pub async fn unread(&self, caller: &Caller) -> Result<u64> {
        let client = self.client().await?;
        let stmt = client.prepare_cached("select unread from endpoints where id = $1").await?;
        Ok(client.query_one(&stmt, &[&caller.endpoint_id]).await?.col::<i32>(0)?.max(0) as u64)
    }

    /// The bridge put these deliveries in front of the agent, or the agent acknowledged them.
    pub async fn confirm(&self, caller: &Caller, seqs: &[u64], state: State) -> Result<u64> {
        let seqs = seqs_to_db(seqs)?;
        if seqs.is_empty() {
            return Ok(0);
        }
        let client = self.client().await?;
        Ok(advance(&client, caller, &seqs, state).await?.0)
    }

    /// Deliveries above `after` that are not read yet, for the push stream.
    pub async fn pending_after(&self, caller: &Caller, after: i64, limit: i64) -> Result<Vec<Message>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(&UNREAD_AFTER).await?;
        client.query(&stmt, &[&caller.endpoint_id, &after, &limit]).await?.iter().map(message_from_row).collect()
    }

    /// Marks deliveries as having reached the bridge.
    pub async fn mark_pushed(&self, caller: &Caller, seqs: &[i64]) -> Result<()> {
        let client = self.client().await?;
        advance(&client, caller, seqs, State::Pushed).await?;
        Ok(())
    }

    /// Per-recipient states of a message the caller sent.
    pub async fn track(&self, caller: &Caller, reference: &str) -> Result<Sent> {
        let client = self.client().await?;
        let id = resolve_sent(&client, caller, reference).await?;
        let row = client.query_one("select thread, reply_to from messages where id = $1", &[&id]).await?;
        let recipients = recipient_states(&client, &id).await?;
        Ok(Sent {
            id,
            thread: row.col(0)?,
            recipients,
            duplicate: false,
            reply_to: row.col(1)?,
            skipped: Vec::new(),
            hold: None,
        })
    }

    /// Replies the caller received to a message it sent; returned replies become read.
    pub async fn replies(&self, caller: &Caller, reference: &str) -> Result<(String, Vec<Message>, Vec<Recipient>)> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let id = resolve_sent(&tx, caller, reference).await?;
        let sql = format!(
            "select {MESSAGE_COLUMNS} from {MESSAGE_JOINS}
             where m.reply_to = $1 and d.recipient_id = $2 and d.state <> {WITHDRAWN}
             order by d.seq"
        );
        let stmt = tx.prepare_cached(&sql).await?;
        let replies = tx
            .query(&stmt, &[&id, &caller.endpoint_id])
            .await?
            .iter()
            .map(message_from_row)
            .collect::<Result<Vec<_>>>()?;
        if !replies.is_empty() {
            // Marks them read and remembers the newest as last shown.
            let seqs: Vec<i64> = replies.iter().map(|m| m.seq as i64).collect();
            advance(&tx, caller, &seqs, State::Read).await?;
        }
        let recipients = recipient_states(&tx, &id).await?;
        tx.commit().await?;
        Ok((id, replies, recipients))
    }
}

/// The stored result of an earlier send with this client id, if there was one.
async fn previous_send(client: &impl GenericClient, caller: &Caller, client_id: &str) -> Result<Option<Sent>> {
    let stmt = client
        .prepare_cached("select id, thread, reply_to from messages where sender_id = $1 and client_id = $2")
        .await?;
    let Some(row) = client.query_opt(&stmt, &[&caller.endpoint_id, &client_id]).await? else {
        return Ok(None);
    };
    let id: String = row.col(0)?;
    let recipients = recipient_states(client, &id).await?;
    let hold =
        client.query_opt("select id from holds where message_id = $1", &[&id]).await?.map(|r| r.col(0)).transpose()?;
    Ok(Some(Sent {
        id,
        thread: row.col(1)?,
        recipients,
        duplicate: true,
        reply_to: row.col(2)?,
        skipped: Vec::new(),
        hold,
    }))
}

/// A thread continued by a send must be one the caller took part in: it sent or received a
/// message in it. Anything else is refused as not found, whoever else's thread it may be.
async fn check_thread(c: &impl GenericClient, caller: &Caller, thread: &str) -> Result<()> {
    let stmt = c
        .prepare_cached(
            "select exists (select 1 from messages where thread = $1 and sender_id = $2)
                 or exists (select 1 from messages m join deliveries d on d.message_id = m.id
                            where m.thread = $1 and d.recipient_id = $2)",
        )
        .await?;
    if c.query_one(&stmt, &[&thread, &caller.endpoint_id]).await?.col(0)? {
        return Ok(());
    }
    Err(Error::not_found(
        EntityKind::Thread,
        format!(
            "no thread {thread:?} among your messages: leave thread out to start one, or use a thread id from a message you sent or received"
        ),
    ))
}

/// The refusal of a send to `unknown` addresses, each with the nearest address the caller can
/// reach: its own account's endpoints and its contacts', never another account's.
pub(crate) async fn unknown_addresses(
    c: &impl GenericClient,
    caller: &Caller,
    contacts: &[AccountId],
    unknown: &[String],
    sending: bool,
) -> Result<Error> {
    let mut accounts = contacts.to_vec();
    accounts.push(caller.account_id);
    let stmt = c
        .prepare_cached(&format!(
            "select ea.address from endpoint_addresses ea join machines m on m.id = ea.machine_id
             where ea.account_id = any($1) and m.revoked_at is null and ea.id <> $2
               and not (m.name = '{HUMAN}' and ea.handle = '{BOARD}')
             order by ea.address limit 10000"
        ))
        .await?;
    let reachable: Vec<String> =
        c.query(&stmt, &[&accounts, &caller.endpoint_id]).await?.iter().map(|r| r.col(0)).collect::<Result<_>>()?;
    let named: Vec<(String, Option<&str>)> =
        unknown.iter().map(|a| (a.clone(), address::did_you_mean(a, &reachable))).collect();
    Ok(address::unknown(&named, sending))
}

/// Turns addresses into endpoints the caller may message. Every named address must resolve and
/// be allowed, or nothing is sent; `group:<name>` fans out to the members the caller may message,
/// and the others come back as skipped with the reason.
async fn resolve_addresses(
    tx: &impl GenericClient,
    caller: &Caller,
    to: &[String],
) -> Result<(Vec<Target>, Vec<Recipient>)> {
    let origin = Origin { account: &caller.account, machine: &caller.machine };
    let mut wanted: Vec<Address> = Vec::with_capacity(to.len());
    let mut groups: Vec<&str> = Vec::new();
    for raw in to {
        if let Some(name) = raw.trim().strip_prefix("group:") {
            groups.push(name.trim());
            continue;
        }
        let address = Address::parse(raw, origin)?;
        if address.is_board() {
            return Err(address::board_reads_nothing(&address.to_string()));
        }
        if !wanted.contains(&address) {
            wanted.push(address);
        }
    }
    let accounts: Vec<&str> = wanted.iter().map(|a| a.account.as_str()).collect();
    let machines: Vec<&str> = wanted.iter().map(|a| a.machine.as_str()).collect();
    let handles: Vec<&str> = wanted.iter().map(|a| a.handle.as_str()).collect();
    let stmt = tx
        .prepare_cached(
            "select ea.id, ea.address, ea.account_id
             from unnest($1::text[], $2::text[], $3::text[]) as t(account, machine, handle)
             join endpoint_addresses ea
               on ea.account = t.account and ea.machine = t.machine and ea.handle = t.handle
             join endpoints e on e.id = ea.id
             join machines m on m.id = e.machine_id
             where m.revoked_at is null",
        )
        .await?;
    // Issued together: one round trip for both.
    let (contacts, mut rows) = tokio::try_join!(super::identity::contact_accounts(tx, caller.account_id), async {
        Ok(tx.query(&stmt, &[&accounts, &machines, &handles]).await?)
    },)?;
    // A human inbox in reach exists from the first message to it.
    let humans: Vec<&str> = wanted.iter().filter(|a| a.is_human()).map(|a| a.account.as_str()).collect();
    if !humans.is_empty() {
        let mut made = false;
        for row in tx.query("select id from accounts where name = any($1)", &[&humans]).await? {
            let account: AccountId = row.col(0)?;
            if scope::reach(caller.account_id, &contacts, account) != Reach::None {
                super::trust::ensure_human(tx, account).await?;
                made = true;
            }
        }
        if made {
            rows = tx.query(&stmt, &[&accounts, &machines, &handles]).await?;
        }
    }

    // An endpoint that is offline or ended is a target like any other: its mail waits for it.
    let mut targets = Vec::with_capacity(wanted.len());
    let mut unknown = Vec::new();
    for address in &wanted {
        let text = address.to_string();
        // An endpoint outside the caller's reach is reported exactly like one that does not exist.
        let mut row = None;
        for r in &rows {
            if r.col::<&str>("address")? == text
                && scope::reach(caller.account_id, &contacts, r.col("account_id")?) != Reach::None
            {
                row = Some(r);
                break;
            }
        }
        match row {
            None => unknown.push(text),
            Some(row) => {
                let id: EndpointId = row.col("id")?;
                if id == caller.endpoint_id {
                    return Err(Error::invalid("you cannot message yourself"));
                }
                targets.push(Target { id, address: text, account_id: row.col("account_id")? });
            }
        }
    }
    if !unknown.is_empty() {
        return Err(unknown_addresses(tx, caller, &contacts, &unknown, true).await?);
    }

    let mut members: Vec<Target> = Vec::new();
    for name in &groups {
        for (id, address) in super::scope::group_members_for_send(tx, caller, name).await? {
            if !targets.iter().chain(&members).any(|t| t.id == id) {
                members.push(Target { id, address, account_id: caller.account_id });
            }
        }
    }
    let ids: Vec<EndpointId> = targets.iter().chain(&members).map(|t| t.id).collect();
    let verdicts = scope::decide_many(tx, caller, &contacts, &ids).await?;
    let refusal = |t: &Target| verdicts.get(&t.id).and_then(|v| v.refusal().map(str::to_owned));

    let refused: Vec<String> =
        targets.iter().filter_map(|t| refusal(t).map(|why| format!("{}: {why}", t.address))).collect();
    if !refused.is_empty() {
        return Err(Error::PermissionDenied(format!("not allowed, nothing was sent: {}", refused.join("; "))));
    }
    let mut skipped = Vec::new();
    for member in members {
        match refusal(&member) {
            None => targets.push(member),
            Some(reason) => skipped.push(Recipient { address: member.address, state: None, reason }),
        }
    }
    if targets.is_empty() {
        let why: Vec<String> = skipped.iter().map(|s| format!("{}: {}", s.address, s.reason)).collect();
        return Err(Error::FailedPrecondition(if why.is_empty() {
            format!("group:{} has no other live members; nothing was sent", groups.join(", group:"))
        } else {
            format!("no member you may message, nothing was sent: {}", why.join("; "))
        }));
    }
    Ok((targets, skipped))
}

/// Locks the contact rows a send to other accounts relies on (`for key share`, which only a
/// drop conflicts with), so a contact dropped while the send is under way cannot let it through:
/// the drop waits for the send, or the send sees the contact gone and is refused like an unknown
/// address.
async fn hold_contacts(tx: &impl GenericClient, caller: &Caller, targets: &[Target]) -> Result<()> {
    let mut others: Vec<AccountId> = targets.iter().map(|t| t.account_id).filter(|a| *a != caller.account_id).collect();
    if others.is_empty() {
        return Ok(());
    }
    others.sort_unstable();
    others.dedup();
    let stmt = tx
        .prepare_cached(
            "select case when c.account_a = $1 then c.account_b else c.account_a end
             from contacts c
             where (c.account_a = $1 and c.account_b = any($2)) or (c.account_b = $1 and c.account_a = any($2))
             for key share",
        )
        .await?;
    let held: Vec<AccountId> =
        tx.query(&stmt, &[&caller.account_id, &others]).await?.iter().map(|r| r.col(0)).collect::<Result<_>>()?;
    let gone: Vec<&str> = targets
        .iter()
        .filter(|t| t.account_id != caller.account_id && !held.contains(&t.account_id))
        .map(|t| t.address.as_str())
        .collect();
    if !gone.is_empty() {
        return Err(Error::not_found(
            EntityKind::Endpoint,
            format!("no agent you can reach at {}: nothing was sent", gone.join(", ")),
        ));
    }
    Ok(())
}

/// Locks every inbox a transaction is about to write, in id order and before any of their
/// deliveries: the order a send's batch takes them, so the two never wait on each other in
/// opposite orders (a writer that locked one inbox, then another, could deadlock with a batch).
pub(crate) async fn lock_inboxes(tx: &impl GenericClient, mut inboxes: Vec<EndpointId>) -> Result<()> {
    inboxes.sort_unstable();
    inboxes.dedup();
    let stmt = tx.prepare_cached("select 1 from endpoints where id = any($1) order by id for update").await?;
    tx.execute(&stmt, &[&inboxes]).await?;
    Ok(())
}

/// Inserts the message and its deliveries. `None` when a concurrent send with the same client id
/// already stored it.
pub(crate) async fn store_message(
    tx: &deadpool_postgres::Transaction<'_>,
    caller: &Caller,
    targets: &[Target],
    out: &Outgoing<'_>,
    reply_to: Option<&str>,
) -> Result<Option<Sent>> {
    let id = ids::new_message_id();
    let thread = out.thread.map_or_else(|| id.clone(), str::to_owned);
    let insert = tx
        .prepare_cached(
            "insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             on conflict (sender_id, client_id) do nothing",
        )
        .await?;
    let inserted = tx
        .execute(
            &insert,
            &[
                &id,
                &caller.endpoint_id,
                &out.client_id,
                &thread,
                &out.kind.to_db(),
                &out.body.as_str(),
                &reply_to,
                &out.private,
                &out.require_reply,
            ],
        )
        .await?;
    if inserted == 0 {
        return Ok(None);
    }
    let (hold, offline) = match super::trust::hold_class(tx, caller, targets, out.private).await? {
        Some(class) => (Some(super::trust::hold(tx, caller, &id, class, targets).await?), HashMap::new()),
        None => (None, deliver(tx, &id, targets).await?),
    };
    let recipients = targets
        .iter()
        .map(|t| match hold {
            Some(_) => {
                Recipient { address: t.address.clone(), state: None, reason: "held for the account's human".to_owned() }
            }
            None => Recipient {
                address: t.address.clone(),
                state: Some(State::Queued),
                reason: offline.get(&t.id).cloned().unwrap_or_default(),
            },
        })
        .collect();
    Ok(Some(Sent {
        id,
        thread,
        recipients,
        duplicate: false,
        reply_to: reply_to.map(str::to_owned),
        skipped: Vec::new(),
        hold,
    }))
}

/// Gives each target a delivery of the message with the next seq of its inbox, and announces it.
/// Returns, for each recipient that is offline, what its sender is told about that.
pub(crate) async fn deliver(
    tx: &impl GenericClient,
    message_id: &str,
    targets: &[Target],
) -> Result<HashMap<EndpointId, String>> {
    // Lock the recipients' inbox heads in id order (no deadlock between concurrent sends),
    // then take the next seq of each. The same read says who is offline.
    let mut ids: Vec<EndpointId> = targets.iter().map(|t| t.id).collect();
    ids.sort_unstable();
    let lock = tx
        .prepare_cached(&format!(
            "select e.id, {ONLINE} as online, e.last_seen_at, m.name = '{HUMAN}' as system
             from endpoints e join machines m on m.id = e.machine_id
             where e.id = any($1) order by e.id for update of e"
        ))
        .await?;
    let mut offline: HashMap<EndpointId, String> = HashMap::new();
    for r in tx.query(&lock, &[&ids]).await? {
        if !r.col::<bool>("online")? && !r.col::<bool>("system")? {
            offline.insert(r.col("id")?, presence::offline_reason(r.col("last_seen_at")?));
        }
    }
    let bump = tx
        .prepare_cached("update endpoints set head_seq = head_seq + 1 where id = any($1) returning id, head_seq")
        .await?;
    let heads = tx.query(&bump, &[&ids]).await?;
    let (recipients, seqs): (Vec<i64>, Vec<i64>) =
        heads.iter().map(|r| Ok((r.col::<i64>(0)?, r.col::<i64>(1)?))).collect::<Result<Vec<_>>>()?.into_iter().unzip();

    let deliver = tx
        .prepare_cached(
            "insert into deliveries (recipient_id, seq, message_id)
             select r, s, $3 from unnest($1::bigint[], $2::bigint[]) as t(r, s)",
        )
        .await?;
    tx.execute(&deliver, &[&recipients, &seqs, &message_id]).await?;
    // Sent with the transaction: listeners hear of it only once it is committed.
    let notify = tx
        .prepare_cached(&format!(
            "select pg_notify('{DELIVERY_CHANNEL}', r::text || ':' || s::text) from unnest($1::bigint[], $2::bigint[]) as t(r, s)"
        ))
        .await?;
    tx.query(&notify, &[&recipients, &seqs]).await?;
    Ok(offline)
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
    let id: EndpointId = row.col(0)?;
    match targets.iter().find(|t| t.id == id) {
        Some(target) => Err(limits::inbox_full(&target.address, cap)),
        None => Ok(()),
    }
}

async fn recipient_states(client: &impl GenericClient, message_id: &str) -> Result<Vec<Recipient>> {
    let stmt = client
        .prepare_cached(&format!(
            "select ea.address, d.state, coalesce(d.reason, '') as reason, {ONLINE} or m.name = '{HUMAN}' as present,
                    e.last_seen_at
             from deliveries d
             join endpoint_addresses ea on ea.id = d.recipient_id
             join endpoints e on e.id = d.recipient_id
             join machines m on m.id = e.machine_id
             where d.message_id = $1 order by ea.address"
        ))
        .await?;
    client
        .query(&stmt, &[&message_id])
        .await?
        .iter()
        .map(|r| {
            let state = State::from_db(r.col("state")?)?;
            let mut reason: String = r.col("reason")?;
            // A delivery still waiting for an absent recipient says since when it is away.
            if state == State::Queued && reason.is_empty() && !r.col::<bool>("present")? {
                reason = presence::offline_reason(r.col("last_seen_at")?);
            }
            Ok(Recipient { address: r.col("address")?, state: Some(state), reason })
        })
        .collect()
}

/// The id of a message the caller received, named by id, short id, suffix or `last`.
async fn resolve_received(tx: &impl GenericClient, caller: &Caller, reference: &MessageRef) -> Result<String> {
    match reference {
        MessageRef::Last => tx
            .query_one("select last_shown from endpoints where id = $1", &[&caller.endpoint_id])
            .await?
            .col::<Option<String>>(0)?
            .ok_or_else(|| {
                Error::not_found(EntityKind::Message, "no message was shown to you yet, so there is no last one")
            }),
        MessageRef::Text(text) => {
            let stmt = tx
                .prepare_cached(
                    "select message_id from deliveries
                     where recipient_id = $1 and (message_id like $2 || '%' or message_id like '%' || $2)
                     order by seq desc limit 20",
                )
                .await?;
            pick(tx, &stmt, caller, reference, text).await
        }
    }
}

/// The id of a message the caller sent, named by id, short id or suffix.
async fn resolve_sent(tx: &impl GenericClient, caller: &Caller, raw: &str) -> Result<String> {
    let reference = MessageRef::parse(raw)?;
    let MessageRef::Text(text) = &reference else {
        return Err(Error::invalid("name the message you sent by its id"));
    };
    let stmt = tx
        .prepare_cached(
            "select id from messages
             where sender_id = $1 and (id like $2 || '%' or id like '%' || $2)
             order by created_at desc limit 20",
        )
        .await?;
    pick(tx, &stmt, caller, &reference, text).await
}

async fn pick(
    tx: &impl GenericClient,
    stmt: &tokio_postgres::Statement,
    caller: &Caller,
    reference: &MessageRef,
    text: &str,
) -> Result<String> {
    let mut candidates: Vec<String> = tx
        .query(stmt, &[&caller.endpoint_id, &text])
        .await?
        .iter()
        .map(|r| r.col::<String>(0))
        .collect::<Result<_>>()?;
    candidates.retain(|id| reference.matches(id));
    ids::pick_unique(text, &candidates).map(str::to_owned)
}

/// Moves the caller's deliveries forward to `state`, keeping its unread count and the newest
/// shown (`relay_advance`: what is shown or read locks the inbox first, as a send does; a pushed
/// mark does not wait for a flush).
/// Answers how many moved, and (for surfaced and read) how many the inbox has left unread.
async fn advance(tx: &impl GenericClient, caller: &Caller, seqs: &[i64], state: State) -> Result<(u64, Option<u64>)> {
    let stmt = tx.prepare_cached("select moved, left_unread from relay_advance($1, $2, $3)").await?;
    let row = tx.query_one(&stmt, &[&caller.endpoint_id, &seqs, &state.to_db()]).await?;
    let (moved, left): (i32, Option<i32>) = (row.col(0)?, row.col(1)?);
    Ok((moved.max(0) as u64, left.map(|n| n.max(0) as u64)))
}

/// A notification on [`DELIVERY_CHANNEL`].
#[derive(Debug, PartialEq, Eq)]
pub enum DeliveryNotice {
    /// `<recipient>:<seq>`: one delivery.
    One(EndpointId),
    /// `r<replica>:<recipient>,<recipient>,…`: the recipients of a batch of sends a replica
    /// committed together (it woke its own waiters itself).
    Batch { replica: i64, recipients: Vec<EndpointId> },
}

impl DeliveryNotice {
    pub fn parse(payload: &str) -> Option<Self> {
        let (head, tail) = payload.split_once(':')?;
        if let Some(replica) = head.strip_prefix('r') {
            let recipients =
                tail.split(',').map(|r| r.parse().map(EndpointId)).collect::<std::result::Result<Vec<_>, _>>().ok()?;
            return Some(Self::Batch { replica: replica.parse().ok()?, recipients });
        }
        let _seq: i64 = tail.parse().ok()?;
        Some(Self::One(EndpointId(head.parse().ok()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unread_reads_spell_the_partial_index_predicate() {
        // The index's predicate is a literal in a checksummed migration: the reads must match it.
        let index = include_str!("../../migrations/0001_identity_and_messaging.sql");
        assert!(index.contains(&format!("deliveries_unread on deliveries (recipient_id, seq) where state < {READ};")));
        assert!(UNREAD_AFTER.contains(&format!("and state < {READ} order by seq limit $3) d join messages m")));
    }

    #[test]
    fn delivery_payloads_parse() {
        assert_eq!(DeliveryNotice::parse("12:7"), Some(DeliveryNotice::One(EndpointId(12))));
        assert_eq!(
            DeliveryNotice::parse("r3:12,14"),
            Some(DeliveryNotice::Batch { replica: 3, recipients: vec![EndpointId(12), EndpointId(14)] })
        );
        assert_eq!(DeliveryNotice::parse("12"), None);
        assert_eq!(DeliveryNotice::parse("x:1"), None);
        assert_eq!(DeliveryNotice::parse("r3:12,x"), None);
    }
}
