//! Sending, the path relay-bench measures: admission (a bounded number of sends under way), the
//! recipients resolved by reads outside any transaction and kept in the resolution cache until
//! scope changes, the hold decision, and the group-commit writer ([`writer`]) that writes a send
//! with whatever else is queued, in a transaction of its own that re-checks what a concurrent change
//! could break (under lock the contacts relied on and room in each inbox, and that no recipient's
//! machine was revoked). A send held for the account's human, and a report the system sends, are
//! written in one transaction each. The SQL is the store's (`store::messages`).

mod limit;
mod resolved;
pub(crate) mod writer;

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::GenericClient;

use crate::domain::caller::Caller;
use crate::domain::delivery::{Kind, State};
use crate::domain::ids::{self, AccountId, EndpointId, MessageId, MessageRef};
use crate::domain::message::{Recipient, Sent};
use crate::domain::redact::RedactedText;
use crate::domain::{EntityKind, Error, Result, limits};
use crate::store::Store;
use crate::store::messages::batch::{BatchedSend, Written};
use crate::store::messages::{
    Outgoing, ReplyTo, Resolved, Target, check_room, check_thread, endpoint_at, hold_contacts, lock_inboxes, mark_read,
    previous_send, reply_to, resolve_addresses, resolve_received, store_message,
};
use crate::store::{from_sqlstate, trust::hold_class};
use limit::SendLimit;
use resolved::{Key, ResolvedCache};
use writer::{Batcher, Waker};

/// The send pipeline of this replica: its admission, its writer, and the inbox cap it enforces.
pub struct Sends {
    store: Store,
    /// Sends under way at most (resolving or waiting to be written), following the rate they are
    /// written at; more are refused at once.
    limit: Arc<SendLimit>,
    /// Sends' allowed recipients, resolved from memory while their changes are heard.
    resolved: ResolvedCache<Resolved>,
    /// Writes resolved sends together, a batch per commit.
    writer: Batcher,
    /// The most unread messages one inbox holds.
    cap: u32,
}

impl Sends {
    /// Starts the replica's writer: its own connection beside `store`'s pool, recipients woken
    /// through `wake`.
    pub fn start(store: Store, wake: Waker) -> Result<Self> {
        let cap = store.max_unread();
        let writer = Batcher::start(store.pool().clone(), store.dedicated_pool(1)?, store.replica_cell(), cap, wake)?;
        Ok(Self { store, limit: Arc::default(), resolved: ResolvedCache::default(), writer, cap })
    }

    /// Something deciding who may message whom changed, here or on another replica: what was
    /// resolved is forgotten.
    pub fn scope_changed(&self) {
        self.resolved.forget_all();
    }

    /// Stores a message once and gives each recipient a delivery with the next gapless seq of its
    /// inbox. A retry with the same client id returns the first result.
    ///
    /// Resolving and allowing the send are reads outside any transaction, skipped when the cache
    /// knows the answer; the writing is one call of the batched writer. A send held for a human
    /// takes the transactional path.
    pub async fn send(&self, caller: &Caller, out: Outgoing<'_>) -> Result<Sent> {
        let _place = self.limit.try_admit().ok_or_else(limits::overloaded)?;
        let key = cache_key(caller, &out);
        let ticket = match key.as_ref().map(|k| self.resolved.get(k)) {
            Some(Ok(known)) => {
                if let Some(thread) = out.thread {
                    check_thread(&self.store.client().await?, caller, thread).await?;
                }
                // A retry is found by the writer (its client id is taken) and answered from the database.
                return self.write_resolved(caller, &out, known).await;
            }
            Some(Err(ticket)) => Some(ticket),
            None => None,
        };
        // The connection goes back to the pool with this statement, before any write takes one.
        let resolution = resolve_send(&self.store.client().await?, caller, &out).await?;
        let known = match resolution {
            Resolution::Retry(sent) => return Ok(sent),
            Resolution::Held(held) => return self.send_held(caller, held, &out).await,
            Resolution::Allowed(known) => known,
        };
        if let (Some(ticket), Some(key)) = (ticket, key) {
            self.resolved.put(ticket, key, known.clone());
        }
        self.write_resolved(caller, &out, known).await
    }

    /// Answers a message the caller received: to its sender, in its thread; the original becomes read.
    pub async fn reply(
        &self,
        caller: &Caller,
        reference: &str,
        body: &RedactedText,
        client_id: Option<&str>,
    ) -> Result<Sent> {
        let _place = self.limit.try_admit().ok_or_else(limits::overloaded)?;
        let reference = MessageRef::parse(reference)?;
        let client = self.store.client().await?;
        // Reads that do not depend on each other are issued together: three round trips in all.
        let (previous, original) = tokio::join!(
            async {
                match client_id {
                    Some(client_id) => previous_send(&client, caller.endpoint_id, client_id).await,
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
        let ReplyTo { thread, target, held } = reply_to(&client, caller, &original).await?;
        drop(client);
        let targets = [target];
        let out = Outgoing {
            to: &[],
            body,
            thread: Some(&thread),
            kind: Kind::Reply,
            client_id,
            private: false,
            require_reply: false,
        };
        if held {
            return self.reply_held(caller, &targets, &out, &original).await;
        }
        let id = ids::new_message_id();
        let write = Write { caller, id: &id, thread: &thread, targets: &targets, out: &out, reply_to: Some(&original) };
        self.write_send(write).await
    }

    /// Sends to one known endpoint without scope rules: for reports the system makes on an
    /// endpoint's behalf (a worker's final result to its parent). One transaction, not batched.
    pub(crate) async fn send_unscoped(&self, sender: &Caller, out: Outgoing<'_>) -> Result<Sent> {
        let mut client = self.store.client().await?;
        if let Some(client_id) = out.client_id
            && let Some(sent) = previous_send(&client, sender.endpoint_id, client_id).await?
        {
            return Ok(sent);
        }
        let tx = client.transaction().await?;
        let address = out.to.first().ok_or_else(|| Error::invalid("no recipient"))?;
        let id = endpoint_at(&tx, address).await?;
        let targets = [Target { id, address: address.clone(), account_id: sender.account_id }];
        let sent = store_message(&tx, sender, &targets, &out, None)
            .await?
            .ok_or_else(|| Error::Unavailable("a concurrent send with this client id is in progress; retry".into()))?;
        tx.commit().await?;
        Ok(sent)
    }

    /// Writes a send whose recipients are resolved and allowed.
    async fn write_resolved(&self, caller: &Caller, out: &Outgoing<'_>, known: Resolved) -> Result<Sent> {
        let id = ids::new_message_id();
        let thread = out.thread.map_or_else(|| id.to_string(), str::to_owned);
        let write = Write { caller, id: &id, thread: &thread, targets: &known.targets, out, reply_to: None };
        let mut sent = self.write_send(write).await?;
        if !sent.duplicate {
            sent.skipped = known.skipped;
        }
        Ok(sent)
    }

    /// Hands a resolved, allowed send to the batched writer and reads its outcome.
    async fn write_send(&self, w: Write<'_>) -> Result<Sent> {
        match self.writer.write(w.batch_entry(), w.caller.address()).await? {
            Written::Stored { offline, .. } => Ok(w.stored(&offline)),
            Written::Duplicate => first_answer(&self.store.client().await?, w.caller, w.out).await,
            Written::Refused { state, message, detail } => {
                Err(w.refusal(&state, &message, detail.as_deref(), self.cap))
            }
        }
    }

    /// A send the account's human must release first: stored with its hold in one transaction.
    async fn send_held(&self, caller: &Caller, held: Resolved, out: &Outgoing<'_>) -> Result<Sent> {
        let mut client = self.store.client().await?;
        let tx = client.transaction().await?;
        hold_contacts(&tx, caller, &held.targets).await?;
        check_room(&tx, &held.targets, self.cap).await?;
        match store_message(&tx, caller, &held.targets, out, None).await? {
            Some(mut sent) => {
                tx.commit().await?;
                sent.skipped = held.skipped;
                Ok(sent)
            }
            None => {
                drop(tx);
                first_answer(&client, caller, out).await
            }
        }
    }

    /// A reply the account's human must release first, stored with its hold in one transaction;
    /// the message it answers becomes read.
    async fn reply_held(
        &self,
        caller: &Caller,
        targets: &[Target],
        out: &Outgoing<'_>,
        original: &MessageId,
    ) -> Result<Sent> {
        let mut client = self.store.client().await?;
        let tx = client.transaction().await?;
        // The replier's inbox with the heads, in id order: inboxes before their deliveries.
        let inboxes: Vec<EndpointId> = targets.iter().map(|t| t.id).chain([caller.endpoint_id]).collect();
        lock_inboxes(&tx, inboxes).await?;
        hold_contacts(&tx, caller, targets).await?;
        check_room(&tx, targets, self.cap).await?;
        let Some(sent) = store_message(&tx, caller, targets, out, Some(original)).await? else {
            drop(tx);
            return first_answer(&client, caller, out).await;
        };
        mark_read(&tx, original, caller.endpoint_id).await?;
        tx.commit().await?;
        Ok(sent)
    }
}

/// The listener keeps what was resolved true.
impl crate::push::listener::Kept for Sends {
    /// Every change to scope is heard from now on: resolved sends may be kept.
    fn changes_heard(&self) {
        self.resolved.trust();
    }

    /// Changes may go unheard (the listener is down): nothing resolved is kept meanwhile.
    fn changes_unheard(&self) {
        self.resolved.distrust();
    }

    fn scope_changed(&self) {
        Sends::scope_changed(self);
    }
}

/// The send's key in the resolution cache. The same words from the same sender resolve alike
/// until scope changes, which every replica hears of; a group's members are read each time, as
/// they come and go, so a send to a group has none.
fn cache_key(caller: &Caller, out: &Outgoing<'_>) -> Option<Key> {
    (!out.to.iter().any(|a| a.trim().starts_with("group:"))).then(|| Key {
        sender: caller.endpoint_id,
        private: out.private,
        to: out.to.to_vec(),
    })
}

/// The result of the earlier send with `out`'s client id, for a send the database found to be a
/// retry of it (a concurrent retry won the insert); unavailable when that send failed meanwhile.
async fn first_answer(c: &impl GenericClient, caller: &Caller, out: &Outgoing<'_>) -> Result<Sent> {
    previous_send(c, caller.endpoint_id, out.client_id.unwrap_or_default())
        .await?
        .ok_or_else(|| Error::Unavailable("a concurrent send with this client id failed; retry".into()))
}

/// What resolving a send found.
enum Resolution {
    /// A retry of an earlier send: its result.
    Retry(Sent),
    /// Recipients the send may reach once the account's human releases it.
    Held(Resolved),
    /// Recipients the send goes to now.
    Allowed(Resolved),
}

/// Resolves a send the cache did not answer, on one connection, outside any transaction.
async fn resolve_send(c: &impl GenericClient, caller: &Caller, out: &Outgoing<'_>) -> Result<Resolution> {
    // A retry is answered with the first result even if resolving would now fail, so the check
    // for one goes first; issued together with resolving, it costs no round trip of its own.
    let (previous, resolved) = tokio::join!(
        async {
            match out.client_id {
                Some(client_id) => previous_send(c, caller.endpoint_id, client_id).await,
                None => Ok(None),
            }
        },
        async {
            if let Some(thread) = out.thread {
                check_thread(c, caller, thread).await?;
            }
            resolve_addresses(c, caller, out.to).await
        },
    );
    if let Some(sent) = previous? {
        return Ok(Resolution::Retry(sent));
    }
    let (targets, skipped) = resolved?;
    let held = hold_class(c, caller, &targets, out.private).await?.is_some();
    let known = Resolved { targets, skipped };
    Ok(if held { Resolution::Held(known) } else { Resolution::Allowed(known) })
}

/// A resolved, allowed send on its way to the batched writer.
struct Write<'a> {
    caller: &'a Caller,
    id: &'a MessageId,
    thread: &'a str,
    targets: &'a [Target],
    out: &'a Outgoing<'a>,
    reply_to: Option<&'a MessageId>,
}

impl Write<'_> {
    /// The send as the batched writer takes it.
    fn batch_entry(&self) -> BatchedSend {
        let mut contacts: Vec<AccountId> =
            self.targets.iter().map(|t| t.account_id).filter(|a| *a != self.caller.account_id).collect();
        contacts.sort_unstable();
        contacts.dedup();
        BatchedSend {
            id: self.id.clone(),
            sender: self.caller.endpoint_id,
            account: self.caller.account_id,
            client_id: self.out.client_id.map(str::to_owned),
            thread: self.thread.to_owned(),
            kind: self.out.kind.to_db(),
            body: self.out.body.as_str().to_owned(),
            reply_to: self.reply_to.cloned(),
            private: self.out.private,
            require_reply: self.out.require_reply,
            recipients: self.targets.iter().map(|t| t.id).collect(),
            contacts,
            // A reply reads the message it answers.
            read_by: self.reply_to.map(|_| self.caller.endpoint_id),
        }
    }

    /// What the sender is told of a send the batch stored.
    fn stored(&self, offline: &HashMap<EndpointId, String>) -> Sent {
        Sent {
            id: self.id.clone(),
            thread: self.thread.to_owned(),
            recipients: self
                .targets
                .iter()
                .map(|t| Recipient {
                    address: t.address.clone(),
                    state: Some(State::Queued),
                    reason: offline.get(&t.id).cloned().unwrap_or_default(),
                    online: !offline.contains_key(&t.id),
                })
                .collect(),
            duplicate: false,
            reply_to: self.reply_to.cloned(),
            skipped: Vec::new(),
            hold: None,
        }
    }

    /// The error for a send the writer refused (`relay_write_send_numbered` and
    /// `relay_write_sends_numbered` say why by SQLSTATE).
    fn refusal(&self, state: &str, message: &str, detail: Option<&str>, cap: u32) -> Error {
        match state {
            // A contact it relied on was dropped.
            "RLY01" => {
                let gone: Vec<&str> = self
                    .targets
                    .iter()
                    .filter(|t| t.account_id != self.caller.account_id)
                    .map(|t| t.address.as_str())
                    .collect();
                Error::not_found(
                    EntityKind::Endpoint,
                    format!("no agent you can reach at {}: nothing was sent", gone.join(", ")),
                )
            }
            // A recipient's machine was revoked since the send was resolved; the detail names it.
            "RLY03" => {
                let gone: Option<EndpointId> = detail.and_then(|d| d.parse().ok()).map(EndpointId);
                let address = self.targets.iter().find(|t| Some(t.id) == gone).map_or("a recipient", |t| &t.address);
                Error::not_found(EntityKind::Endpoint, format!("no agent you can reach at {address}: nothing was sent"))
            }
            // An inbox is full; the detail names it.
            "RLY02" => {
                let full: Option<EndpointId> = detail.and_then(|d| d.parse().ok()).map(EndpointId);
                let address = self.targets.iter().find(|t| Some(t.id) == full).map_or("a recipient", |t| &t.address);
                limits::inbox_full(address, cap)
            }
            _ => from_sqlstate(state, message),
        }
    }
}
