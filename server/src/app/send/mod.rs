//! Sending, the path relay-bench measures: admission (a bounded number of sends under way), the
//! recipients resolved by reads outside any transaction and kept in the resolution cache until
//! scope changes, the hold decision, and the group-commit writer ([`writer`]) that writes a send
//! with whatever else is queued, in a transaction of its own that re-checks what a concurrent change
//! could break (under lock the contacts relied on and room in each inbox, and that no recipient's
//! machine was revoked). A send held for the account's human, and a report the system sends, are
//! written by the same writer in one transaction each. The SQL is the store's (`store::messages`).

mod limit;
mod resolved;
pub(crate) mod writer;

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::GenericClient;

use crate::domain::address::is_reserved_address;
use crate::domain::artifact;
use crate::domain::caller::Caller;
use crate::domain::delivery::{Kind, State};
use crate::domain::ids::{self, EndpointId, HoldId, MessageId, MessageRef, ReplicaId};
use crate::domain::loops::{self, Trip};
use crate::domain::message::{Recipient, Sent};
use crate::domain::names;
use crate::domain::redact::RedactedText;
use crate::domain::{Error, Result, limits};
use crate::metrics::metrics;
use crate::store;
use crate::store::Store;
use crate::store::messages::write::{self, NewMessage, Written};
use crate::store::messages::{
    Outgoing, ReplyTo, Resolved, Target, check_room, check_thread, endpoint_at, previous_send, reply_to,
    resolve_addresses, resolve_received,
};
use crate::store::trust::{self, hold_class};
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
    /// What files a message may carry.
    files: artifact::Limits,
}

impl Sends {
    /// Starts the replica's writer: its own connection beside `store`'s pool, recipients woken
    /// through `wake`.
    pub fn start(store: Store, wake: Waker, files: artifact::Limits) -> Result<Self> {
        let cap = store.max_unread();
        let writer = Batcher::start(store.pool().clone(), store.dedicated_pool(1)?, store.replica_cell(), cap, wake)?;
        Ok(Self { store, limit: Arc::default(), resolved: ResolvedCache::default(), writer, cap, files })
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
            Resolution::Held(held, class) => return self.send_held(caller, held, &out, class).await,
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
            attach: &[],
        };
        let id = ids::new_message_id();
        let write = Write {
            caller,
            id: &id,
            thread: &thread,
            targets: &targets,
            out: &out,
            reply_to: Some(&original),
            attached: false,
        };
        if let Some(class) = held {
            return self.write_held(write, class, None).await;
        }
        self.write_send(write).await
    }

    /// Sends to one known endpoint without scope rules: for reports the system makes on an
    /// endpoint's behalf (a worker's final result to its parent). One statement of the writer, not
    /// batched.
    pub(crate) async fn send_unscoped(&self, sender: &Caller, out: Outgoing<'_>) -> Result<Sent> {
        let client = self.store.client().await?;
        if let Some(client_id) = out.client_id
            && let Some(sent) = previous_send(&client, sender.endpoint_id, client_id).await?
        {
            return Ok(sent);
        }
        let address = out.to.first().ok_or_else(|| Error::invalid("no recipient"))?;
        let targets = [Target {
            id: endpoint_at(&client, address).await?,
            address: address.clone(),
            account_id: sender.account_id,
        }];
        let (id, thread) = out.new_id_and_thread();
        let w = Write {
            caller: sender,
            id: &id,
            thread: &thread,
            targets: &targets,
            out: &out,
            reply_to: None,
            attached: false,
        };
        // One statement, uncapped: a report on what a worker did is not lost to a full inbox, nor to
        // the loop guard (held for a person instead).
        match write::write_one(&client, &w.message(), i32::MAX, ReplicaId::NONE).await? {
            Written::Stored { offline, .. } => Ok(w.stored(&offline)),
            Written::Duplicate => first_answer(&client, sender, &out).await,
            Written::Refused(why) if why.is_loop() => {
                drop(client);
                self.held_by_the_guard(w, &why).await
            }
            Written::Refused(why) => Err(why.into_error(sender.account_id, &targets, u32::MAX)),
        }
    }

    /// Writes a send whose recipients are resolved and allowed.
    async fn write_resolved(&self, caller: &Caller, out: &Outgoing<'_>, known: Resolved) -> Result<Sent> {
        let (id, thread) = out.new_id_and_thread();
        let attached = self.attach(caller, &id, out).await?;
        let write = Write { caller, id: &id, thread: &thread, targets: &known.targets, out, reply_to: None, attached };
        let mut sent = self.settle(caller, out, &id, attached, self.write_send(write).await).await?;
        if !sent.duplicate {
            sent.skipped = known.skipped;
        }
        Ok(sent)
    }

    /// Hands a resolved, allowed send to the batched writer and reads its outcome; held instead
    /// when it would take two agents answering each other past the loop guard's bounds: in its
    /// thread (read here) or in any (the writer keeps each pair's streak and refuses it).
    async fn write_send(&self, w: Write<'_>) -> Result<Sent> {
        match self.loop_trip(&w).await? {
            Some(Held::Trip(trip, with)) => return self.write_held(w, loops::HOLD_CLASS, Some((trip, with))).await,
            Some(Held::Stopped) => return self.write_held(w, loops::HOLD_CLASS, None).await,
            None => {}
        }
        match self.writer.write(w.message(), w.caller.address(), w.attached).await? {
            Written::Stored { offline, .. } => Ok(w.stored(&offline)),
            Written::Duplicate => first_answer(&self.store.client().await?, w.caller, w.out).await,
            Written::Refused(why) if why.is_loop() => self.held_by_the_guard(w, &why).await,
            Written::Refused(why) => Err(why.into_error(w.caller.account_id, w.targets, self.cap)),
        }
    }

    /// Holds for a person a message the writer refused because it took a pair past the account's
    /// streak bound: the guard trips on the sender and the recipient the writer named.
    async fn held_by_the_guard(&self, w: Write<'_>, why: &write::Refusal) -> Result<Sent> {
        let with = why.recipient().ok_or_else(|| Error::Internal("a loop refusal names no recipient".into()))?;
        let settings = store::loops::settings(&self.store.client().await?, w.caller.account_id).await?;
        let trip = Trip::Rate { messages: settings.max_messages, window_s: settings.window_s };
        self.write_held(w, loops::HOLD_CLASS, Some((trip, with))).await
    }

    /// A send the account's human must release first: resolved like any other, then written with
    /// its hold.
    async fn send_held(
        &self,
        caller: &Caller,
        held: Resolved,
        out: &Outgoing<'_>,
        class: &'static str,
    ) -> Result<Sent> {
        let (id, thread) = out.new_id_and_thread();
        let attached = self.attach(caller, &id, out).await?;
        let write = Write { caller, id: &id, thread: &thread, targets: &held.targets, out, reply_to: None, attached };
        let mut sent = self.settle(caller, out, &id, attached, self.write_held(write, class, None).await).await?;
        if !sent.duplicate {
            sent.skipped = held.skipped;
        }
        Ok(sent)
    }

    /// Links the files a send carries to message `id` before the message is written, so a
    /// recipient never reads it without them: its uploads, checked together against the limits a
    /// message's files have. Whether it carries any.
    async fn attach(&self, caller: &Caller, id: &MessageId, out: &Outgoing<'_>) -> Result<bool> {
        if out.attach.is_empty() {
            return Ok(false);
        }
        let client = self.store.client().await?;
        let files = store::artifacts::uploads(&client, caller.endpoint_id, out.attach).await?;
        artifact::check_message(&files, &self.files)?;
        let linked = store::artifacts::link(&client, id, caller.endpoint_id, out.attach).await?;
        if linked != files.len() as u64 {
            // An upload's hour ran out in between: the send goes whole or not at all.
            store::artifacts::unlink(&client, id).await?;
            return Err(Error::not_found(
                crate::domain::EntityKind::Upload,
                "an upload expired as the message was sent: attach the files again",
            ));
        }
        Ok(true)
    }

    /// After the write: a written message's uploads are spent (its links count now); the links of
    /// a message that was not written (refused, or a retry the first send answers) are taken back.
    /// An answer lost on its way may hide a message that was written: its links stay, as the
    /// database says.
    async fn settle(
        &self,
        caller: &Caller,
        out: &Outgoing<'_>,
        id: &MessageId,
        attached: bool,
        written: Result<Sent>,
    ) -> Result<Sent> {
        if !attached {
            return written;
        }
        let tidied = async {
            let client = self.store.client().await?;
            match &written {
                Ok(sent) if !sent.duplicate => store::artifacts::spend(&client, caller.endpoint_id, out.attach).await?,
                _ => store::artifacts::unlink(&client, id).await?,
            };
            Ok::<_, Error>(())
        };
        if let Err(e) = tidied.await {
            // The purge takes uploads and links nothing needs within the hour.
            tracing::warn!(message = %id, error = %e, "cannot settle the files of a send");
        }
        written
    }

    /// Whether the loop guard holds this send, and why. Only a message from one agent to one other
    /// that goes on a conversation (a reply, or a send into a thread) is weighed, by one read of its
    /// thread and of whether the guard stopped the pair already (then it is held with no new trip):
    /// a loop is agents answering each other, and a send that starts a thread costs nothing here
    /// (a stopped pair's fresh sends are held where their recipients are resolved).
    async fn loop_trip(&self, w: &Write<'_>) -> Result<Option<Held>> {
        let [target] = w.targets else { return Ok(None) };
        let goes_on = w.reply_to.is_some() || w.out.thread.is_some();
        let agents = w.caller.machine != names::HUMAN && !is_reserved_address(&target.address);
        if !goes_on || !agents || target.id == w.caller.endpoint_id {
            return Ok(None);
        }
        let client = self.store.client().await?;
        let (settings, seen, stopped) =
            store::loops::observe(&client, w.caller.account_id, w.caller.endpoint_id, target.id, w.thread).await?;
        if stopped {
            return Ok(Some(Held::Stopped));
        }
        Ok(loops::verdict(settings, seen).map(|trip| Held::Trip(trip, target.id)))
    }

    /// Writes a send or reply the account's human must release first, in one transaction with its
    /// hold: by the writer every send takes, delivered to no one until the hold is released (a
    /// reply's original becomes read now). Refused, as the send would be, when an inbox is full.
    async fn write_held(&self, w: Write<'_>, class: &'static str, trip: Option<(Trip, EndpointId)>) -> Result<Sent> {
        let mut client = self.store.client().await?;
        let tx = store::begin(&mut client).await?;
        check_room(&tx, w.targets, self.cap).await?;
        let message = NewMessage { recipients: Vec::new(), ..w.message() };
        let cap = i32::try_from(self.cap).unwrap_or(i32::MAX);
        match write::write_one(&tx, &message, cap, ReplicaId::NONE).await? {
            Written::Stored { .. } => {
                let hold = trust::hold(&tx, w.caller, w.id, class, w.targets).await?;
                if let Some((trip, with)) = trip
                    && let Some(target) = w.targets.iter().find(|t| t.id == with)
                    && store::loops::trip(&tx, w.caller.endpoint_id, target.id).await?
                {
                    tell_of_loop(&tx, w.caller, target, trip).await?;
                }
                store::commit(tx).await?;
                if class == loops::HOLD_CLASS {
                    metrics().loops_held.inc();
                    tracing::info!(from = %w.caller.address(), to = ?w.targets.first().map(|t| &t.address), "loop guard held a message");
                }
                Ok(w.held(hold))
            }
            Written::Duplicate => {
                drop(tx);
                first_answer(&client, w.caller, w.out).await
            }
            Written::Refused(why) => Err(why.into_error(w.caller.account_id, w.targets, self.cap)),
        }
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
    /// Recipients the send may reach once the account's human releases it, and the hold class
    /// that keeps it.
    Held(Resolved, &'static str),
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
    let mut hold = hold_class(c, caller, &targets, out.private).await?;
    // Two agents the loop guard stopped wait for a person, whatever they send each other: read here,
    // where what is resolved is kept until scope changes (which a trip or a clearing announces).
    if let (None, [target]) = (hold, targets.as_slice())
        && caller.machine != names::HUMAN
        && store::loops::tripped(c, caller.endpoint_id, target.id).await?
    {
        hold = Some(loops::HOLD_CLASS);
    }
    let known = Resolved { targets, skipped };
    Ok(match hold {
        Some(class) => Resolution::Held(known, class),
        None => Resolution::Allowed(known),
    })
}

/// Why the loop guard holds a send.
enum Held {
    /// It takes the conversation past its bounds: the guard trips on the sender and this
    /// recipient now.
    Trip(Trip, EndpointId),
    /// The guard stopped the pair before, and no person let them go on.
    Stopped,
}

/// Tells both agents why the loop guard held their exchange, and the sender's account's operator
/// (else its person): from the account's board sender, in the transaction of the hold.
async fn tell_of_loop(tx: &store::Tx<'_>, from: &Caller, to: &Target, trip: Trip) -> Result<()> {
    let sender = store::notices::board_sender(tx, from.account_id).await?;
    let me = Target { id: from.endpoint_id, address: from.address(), account_id: from.account_id };
    let operator = match store::board::operator(tx, from.account_id).await? {
        Some(op) => store::approvals::operator_target(tx, from.account_id, &op).await?,
        None => None,
    };
    let overseer = match operator.filter(|op| op.id != me.id && op.id != to.id) {
        Some(op) => op,
        None => {
            let person = trust::human_caller(tx, from.account_id).await?;
            Target { id: person.endpoint_id, address: person.address(), account_id: from.account_id }
        }
    };
    let mut inboxes = vec![me.id, to.id, overseer.id];
    inboxes.sort_unstable();
    inboxes.dedup();
    let revoked = store::messages::lock_inboxes(tx, &inboxes).await?;
    let agents = RedactedText::from_agent(&loops::agents_notice(&me.address, &to.address, trip));
    let overseers = RedactedText::from_agent(&loops::operator_notice(&me.address, &to.address, trip));
    for (target, body) in [(me.clone(), &agents), (to.clone(), &agents), (overseer, &overseers)] {
        if revoked.contains(&target.id) {
            continue;
        }
        let out = Outgoing { thread: Some("loop-guard"), ..Outgoing::notice(body) };
        write::write_system(tx, &sender, &[target], &out).await?;
    }
    Ok(())
}

/// A resolved, allowed send on its way to the batched writer.
struct Write<'a> {
    caller: &'a Caller,
    id: &'a MessageId,
    thread: &'a str,
    targets: &'a [Target],
    out: &'a Outgoing<'a>,
    reply_to: Option<&'a MessageId>,
    /// It carries files (linked before it is written).
    attached: bool,
}

impl Write<'_> {
    /// The message as the writer takes it.
    fn message(&self) -> NewMessage {
        NewMessage::new(self.caller, self.id.clone(), self.thread.to_owned(), self.targets, self.out, self.reply_to)
    }

    /// What the sender is told of a send the writer stored: queued for each recipient, with why
    /// one is not online now.
    fn stored(&self, offline: &HashMap<EndpointId, String>) -> Sent {
        self.answer(None, |t| Recipient {
            address: t.address.clone(),
            state: Some(State::Queued),
            reason: offline.get(&t.id).cloned().unwrap_or_default(),
            online: !offline.contains_key(&t.id),
        })
    }

    /// What the sender is told of a send written with hold `hold`: nobody has it yet.
    fn held(&self, hold: HoldId) -> Sent {
        self.answer(Some(hold), |t| Recipient {
            address: t.address.clone(),
            state: None,
            reason: "held for the account's human".to_owned(),
            online: false,
        })
    }

    fn answer(&self, hold: Option<HoldId>, recipient: impl Fn(&Target) -> Recipient) -> Sent {
        Sent {
            id: self.id.clone(),
            thread: self.thread.to_owned(),
            recipients: self.targets.iter().map(recipient).collect(),
            duplicate: false,
            reply_to: self.reply_to.cloned(),
            skipped: Vec::new(),
            hold,
        }
    }
}
