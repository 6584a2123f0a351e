//! Messages: sending and replying (limits checked, bodies redacted before they are stored), the
//! inbox and the wait for replies, what a sender tracks, and the push stream.

use std::sync::Arc;

use deadpool_postgres::GenericClient;

use super::quotas::SendRates;
use super::send::Sends;
use super::{Core, optional};
use crate::domain::address::{Address, Origin};
use crate::domain::artifact::{self, Attached};
use crate::domain::caller::Caller;
use crate::domain::delivery::{self, Kind, State};
use crate::domain::ids::{MessageId, Seq};
use crate::domain::message::Sent;
use crate::domain::message::{self, Message, Recipient};
use crate::domain::redact::{Counts, redact};
use crate::domain::search::{Found, Search};
use crate::domain::topic::TopicRef;
use crate::domain::{Error, Result, limits};
use crate::push::announce::{self, AnnounceStream};
use crate::push::stream::{self, PushStream};
use crate::store;
use crate::store::messages::{self, Look, Outgoing};
use crate::store::pages::Page;

/// Messages: sending (through the send pipeline), the inbox, replies waited for, tracking, push and announcements.
#[derive(Clone)]
pub struct MessagingService {
    core: Core,
    identity: super::identity::IdentityService,
    sends: Arc<Sends>,
    rates: Arc<SendRates>,
}

impl MessagingService {
    /// Starts the replica's send writer (a thread of its own), whose committed sends wake their
    /// recipients' waiters in the hub.
    pub(super) fn start(core: Core, identity: super::identity::IdentityService) -> Result<Self> {
        let wake = {
            let hub = core.hub.clone();
            Arc::new(move |endpoint, delivered: &mut dyn FnMut() -> Vec<_>| hub.deliver(endpoint, delivered))
        };
        let sends = Arc::new(Sends::start(core.store.clone(), wake, core.quotas.files)?);
        let rates = Arc::new(SendRates::new(core.quotas));
        Ok(Self { core, identity, sends, rates })
    }

    /// The replica's send pipeline, whose resolution cache the listener keeps true.
    pub fn sends(&self) -> Arc<Sends> {
        self.sends.clone()
    }

    /// Who may reach whom changed here: resolutions kept by the send pipeline are not trusted.
    pub(crate) fn scope_changed(&self) {
        self.sends.scope_changed();
    }

    /// Sends to one known endpoint without scope rules (see [`Sends::send_unscoped`]).
    pub(crate) async fn send_unscoped(&self, sender: &Caller, out: Outgoing<'_>) -> Result<Sent> {
        self.sends.send_unscoped(sender, out).await
    }
}

/// A message to send, as the caller gave it.
pub struct NewMessage<'a> {
    pub to: &'a [String],
    pub body: &'a str,
    /// Empty: a new thread.
    pub thread: &'a str,
    pub kind: Kind,
    /// The caller's idempotency key; empty: none.
    pub client_id: &'a str,
    pub private: bool,
    pub require_reply: bool,
    /// Uploads of the caller's to attach.
    pub attach: &'a [String],
}

/// A post to write, as the caller gave it.
pub struct NewPost<'a> {
    pub topic: &'a str,
    pub body: &'a str,
    /// Empty: a new thread.
    pub thread: &'a str,
    /// Empty: none.
    pub client_id: &'a str,
}

/// What a post stored.
pub struct Published {
    pub id: MessageId,
    /// `account/#name`
    pub topic: String,
    /// Its number in the topic (0 for a retry answered by the first post).
    pub seq: i64,
    pub thread: String,
    /// Endpoints that follow the topic, the poster aside.
    pub followers: u64,
    pub duplicate: bool,
    pub redacted: Counts,
}

/// A topic followed: its name as readers see it, the earlier posts the follower reads first, and
/// whether it followed already.
pub struct Followed {
    pub topic: String,
    pub backlog: u64,
    pub already: bool,
}

/// A file stored for the caller's sends to attach.
pub struct Uploaded {
    pub id: String,
    pub attached: Attached,
    pub redacted: Counts,
}

/// What a send or a reply stored, and what was redacted from its body.
pub struct Delivered {
    pub sent: Sent,
    pub redacted: Counts,
}

impl MessagingService {
    pub async fn send(&self, caller: &Caller, send: NewMessage<'_>) -> Result<Delivered> {
        limits::recipients(send.to.len())?;
        limits::body(send.body)?;
        limits::thread(send.thread)?;
        limits::client_id(send.client_id)?;
        let kind = send.kind.for_send()?;
        if send.require_reply && kind != Kind::Ask {
            return Err(Error::invalid("require_reply goes with a request (ask)"));
        }
        let redacted = redact(send.body);
        let out = Outgoing {
            to: send.to,
            body: &redacted.text,
            thread: optional(send.thread),
            kind,
            client_id: optional(send.client_id),
            private: send.private,
            require_reply: send.require_reply,
            attach: send.attach,
        };
        self.rates.admit(caller)?;
        let sent = self.sends.send(caller, out).await?;
        if !sent.duplicate {
            self.rates.delivered(caller, sent.recipients.len());
        }
        tracing::debug!(
            from = %caller.address(), id = %sent.id, recipients = sent.recipients.len(),
            duplicate = sent.duplicate, redacted = redacted.total(), "sent"
        );
        Ok(Delivered { sent, redacted: redacted.counts })
    }

    /// Answers a message the caller received, named by id, short id, suffix or `last`.
    pub async fn reply(&self, caller: &Caller, id: &str, body: &str, client_id: &str) -> Result<Delivered> {
        limits::body(body)?;
        limits::client_id(client_id)?;
        self.rates.admit(caller)?;
        let redacted = redact(body);
        let sent = self.sends.reply(caller, id, &redacted.text, optional(client_id)).await?;
        if !sent.duplicate {
            self.rates.delivered(caller, sent.recipients.len());
        }
        Ok(Delivered { sent, redacted: redacted.counts })
    }

    /// Unread messages (surfaced, or read when `ack`), waiting up to `wait_s` for one; and how many
    /// remain unread after them.
    pub async fn inbox(&self, caller: &Caller, wait_s: u32, limit: u32, ack: bool) -> Result<(Vec<Message>, u64)> {
        let batch = limits::inbox_batch(limit);
        self.core
            .wait_for_mail(
                caller,
                wait_s,
                |(messages, _): &(Vec<Message>, u64)| !messages.is_empty(),
                || self.take_unread(caller, batch, ack),
            )
            .await
    }

    /// Replies to a request the caller sent, waiting up to `wait_s` for one; with its recipients' states.
    pub async fn ask_wait(
        &self,
        caller: &Caller,
        id: &str,
        wait_s: u32,
    ) -> Result<(MessageId, Vec<Message>, Vec<Recipient>)> {
        self.core
            .wait_for(
                caller,
                wait_s,
                |(_, replies, _): &(MessageId, Vec<Message>, Vec<Recipient>)| !replies.is_empty(),
                || self.take_replies(caller, id),
            )
            .await
    }

    /// Messages the caller may read that hold the words, best first. A sender or recipient named
    /// by an address nobody holds finds nothing, as one the caller never exchanged with does.
    pub async fn search(&self, caller: &Caller, search: &Search) -> Result<Vec<Found>> {
        let db = self.core.store.client().await?;
        let (from, to) = (named(&db, caller, &search.from).await?, named(&db, caller, &search.to).await?);
        if from == Some(None) || to == Some(None) {
            return Ok(Vec::new());
        }
        let asked = store::search::Asked {
            reader: caller.endpoint_id,
            words: &search.words,
            from: from.flatten(),
            to: to.flatten(),
            thread: search.thread.as_deref(),
            since: search.since,
            limit: search.limit,
        };
        match store::search::search(&db, &asked).await? {
            store::search::Searched::Found(found) => Ok(found),
            store::search::Searched::NoWords => {
                Err(Error::invalid(format!("query {:?} holds no words to search for", search.words)))
            }
            store::search::Searched::OnlyExcluded => Err(Error::invalid(format!(
                "query {:?} only leaves words out (-word): say a word to look for",
                search.words
            ))),
        }
    }

    /// Makes the caller a follower of a topic (its account's, made now if new, or a contact's
    /// opened one): how many earlier posts it will read first, and whether it followed already.
    pub async fn follow(&self, caller: &Caller, topic: &str) -> Result<Followed> {
        let named = TopicRef::parse(topic)?;
        let db = self.core.store.client().await?;
        let found = store::topics::find(&db, caller, &named, true).await?;
        let backlog = store::topics::follow(&db, caller.endpoint_id, found.id, self.core.quotas.topic_backlog).await?;
        Ok(Followed { topic: found.shown, backlog: backlog.unwrap_or(0), already: backlog.is_none() })
    }

    /// Stops the caller following a topic; whether it did.
    pub async fn unfollow(&self, caller: &Caller, topic: &str) -> Result<(String, bool)> {
        let named = TopicRef::parse(topic)?;
        let account = named.account.as_deref().unwrap_or(&caller.account);
        let db = self.core.store.client().await?;
        // By name alone: a topic closed since, or a dropped contact's, is left all the same.
        let followed = store::topics::unfollow(&db, caller.endpoint_id, account, &named.name).await?;
        Ok((TopicRef::shown(account, &named.name), followed))
    }

    /// Posts to a topic the caller may follow (its account's, made now if new, or a contact's
    /// opened one): one message, read by each follower through its cursor. Limits, redaction and
    /// the sender's rates as for a send; a retry with the same client id posts nothing new.
    pub async fn publish(&self, caller: &Caller, post: NewPost<'_>) -> Result<Published> {
        limits::body(post.body)?;
        limits::thread(post.thread)?;
        limits::client_id(post.client_id)?;
        let named = TopicRef::parse(post.topic)?;
        self.rates.admit(caller)?;
        let redacted = redact(post.body);
        if named.account.as_deref().is_some_and(|a| a != caller.account) {
            // Whether it exists is not said: an account's own agents post to its topics.
            return Err(Error::not_found(
                crate::domain::EntityKind::Topic,
                format!("no topic {} you may post to: agents post to their own account's topics", post.topic.trim()),
            ));
        }
        let db = self.core.store.client().await?;
        if !post.thread.trim().is_empty() {
            messages::check_thread(&db, caller, post.thread.trim()).await?;
        }
        let topic = store::topics::find(&db, caller, &named, true).await?;
        let id = crate::domain::ids::new_message_id();
        let thread = if post.thread.trim().is_empty() { id.to_string() } else { post.thread.trim().to_owned() };
        let new = store::topics::NewPost {
            id: &id,
            sender: caller.endpoint_id,
            topic: topic.id,
            thread: &thread,
            body: redacted.text.as_str(),
            client_id: optional(post.client_id),
        };
        let published = match store::topics::publish(&db, &new).await? {
            store::topics::Posting::Posted { seq, followers } => Published {
                id,
                topic: topic.shown,
                seq,
                thread,
                followers: followers.max(0) as u64,
                duplicate: false,
                redacted: redacted.counts,
            },
            store::topics::Posting::Duplicate => {
                let first = messages::previous_send(&db, caller.endpoint_id, post.client_id)
                    .await?
                    .ok_or_else(|| Error::Unavailable("a concurrent post with this client id failed; retry".into()))?;
                Published {
                    id: first.id,
                    topic: topic.shown,
                    seq: 0,
                    thread: first.thread,
                    followers: 0,
                    duplicate: true,
                    redacted: redacted.counts,
                }
            }
        };
        tracing::debug!(from = %caller.address(), topic = %published.topic, seq = published.seq, "posted");
        Ok(published)
    }

    /// Stores a file for the caller's next sends to attach: checked against what the caller read
    /// (cut short or changed on its way, it is refused), a text file redacted as a body is, within
    /// the account's room for files. Its upload id, what was stored, and what was redacted.
    pub async fn upload(
        &self,
        caller: &Caller,
        name: &str,
        size: u64,
        sha256: &str,
        data: Vec<u8>,
    ) -> Result<Uploaded> {
        let limits = self.core.quotas.files;
        self.rates.admit(caller)?;
        let file = artifact::prepare(name, size, sha256, data, &limits)?;
        let id = crate::domain::ids::new_upload_id();
        let db = self.core.store.client().await?;
        if !store::artifacts::upload(&db, caller, &id, &file, limits.account_bytes).await? {
            let held = store::artifacts::held(&db, caller).await?;
            return Err(Error::ResourceExhausted(format!(
                "your account's files hold {} of the {} it may keep: {name} ({}) was not stored; files go with their messages' retention",
                artifact::bytes_text(held),
                artifact::bytes_text(limits.account_bytes),
                artifact::bytes_text(file.attached.size),
            )));
        }
        tracing::debug!(from = %caller.address(), upload = %id, size = file.attached.size, binary = file.attached.binary, "uploaded");
        Ok(Uploaded { id, attached: file.attached, redacted: file.redactions })
    }

    /// A file a message the caller may read carries, with its content.
    pub async fn fetch(&self, caller: &Caller, reference: &str, name: &str) -> Result<(MessageId, Attached, Vec<u8>)> {
        let reference = crate::domain::ids::MessageRef::parse(reference)?;
        let db = self.core.store.client().await?;
        let id = store::artifacts::readable(&db, caller, &reference).await?;
        let (attached, content) = store::artifacts::fetch(&db, caller, &id, name.trim()).await?;
        Ok((id, attached, content))
    }

    /// Writes the search entries of one batch of queued messages; how many it took (fewer than a
    /// batch: the queue is empty, or the rest is another replica's to take).
    pub async fn index_for_search(&self) -> Result<u64> {
        let mut db = self.core.store.client().await?;
        Ok(store::search::index_queued(&mut db, crate::domain::search::INDEX_BATCH).await?)
    }

    /// Per-recipient states of a message the caller sent.
    pub async fn track(&self, caller: &Caller, reference: &str) -> Result<Sent> {
        let db = self.core.store.client().await?;
        let id = sent_message(&db, caller, reference).await?;
        let (thread, reply_to) = messages::thread_of(&db, &id).await?;
        let recipients = messages::recipient_states(&db, &id).await?;
        Ok(Sent { id, thread, recipients, duplicate: false, reply_to, skipped: Vec::new(), hold: None })
    }

    /// The bridge put these deliveries in front of the model (surfaced) or the model acknowledged
    /// them (read); a bridge cannot claim less.
    pub async fn confirm(&self, caller: &Caller, seqs: &[u64], state: Option<State>) -> Result<u64> {
        let state = State::confirmable(state)?;
        limits::count("seqs", seqs.len(), limits::MAX_CONFIRM_SEQS)?;
        let seqs = delivery::seqs(seqs)?;
        if seqs.is_empty() {
            return Ok(0);
        }
        let db = self.core.store.client().await?;
        Ok(messages::advance(&db, caller.endpoint_id, &seqs, state).await?.0)
    }

    /// One look at the inbox: unread messages in seq order, which become surfaced (read when `ack`)
    /// in the same call that answers the count left unread; an empty look leaves nothing unread.
    /// A look that moves nothing to read, at an inbox unchanged since the last such look here, is
    /// answered with that look's page: the database is asked only whether the inbox changed.
    async fn take_unread(&self, caller: &Caller, limit: u32, ack: bool) -> Result<(Vec<Message>, u64)> {
        let (mut messages, left) = self.take_deliveries(caller, limit, ack).await?;
        // The posts of the topics it follows come after its deliveries, in the room the page left;
        // with `ack` the cursors move past them (there is no surfaced for a post: it stays unread).
        let room = i64::from(limit) - messages.len() as i64;
        let db = self.core.store.client().await?;
        let (posts, unread_posts) = store::topics::unread(&db, caller.endpoint_id, room).await?;
        if ack {
            let read: Vec<_> = posts.iter().filter_map(|m| m.post.as_ref()).collect();
            store::topics::read(&db, caller.endpoint_id, &read).await?;
        }
        let left = left + unread_posts - posts.len() as u64;
        messages.extend(posts);
        Ok((messages, left))
    }

    /// One look at the inbox's deliveries (see [`Self::take_unread`]).
    async fn take_deliveries(&self, caller: &Caller, limit: u32, ack: bool) -> Result<(Vec<Message>, u64)> {
        let (db, inbox, limit) = (self.core.store.client().await?, caller.endpoint_id, i64::from(limit));
        if ack {
            return Ok(messages::take_unread(&db, inbox, limit, State::Read).await?);
        }
        let held = self.core.store.pages().get(inbox, limit);
        let seen = held.as_ref().and_then(|p| Some((p.version, p.messages.last()?.id.as_str())));
        match messages::look(&db, inbox, limit, seen).await? {
            // Only a held page's version can be found unchanged.
            Look::Unchanged => {
                let page = held.ok_or_else(|| Error::Internal("a look found unchanged a page not held".into()))?;
                Ok((page.messages.clone(), page.left))
            }
            Look::Page { messages, left, version } => {
                let page = version.map(|version| Arc::new(Page { version, messages: messages.clone(), left }));
                self.core.store.pages().keep(inbox, limit, page);
                Ok((messages, left))
            }
        }
    }

    /// One look for replies the caller received to a message it sent; those returned become read.
    async fn take_replies(
        &self,
        caller: &Caller,
        reference: &str,
    ) -> Result<(MessageId, Vec<Message>, Vec<Recipient>)> {
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let id = sent_message(&tx, caller, reference).await?;
        let replies = messages::replies_to(&tx, &id, caller.endpoint_id).await?;
        if !replies.is_empty() {
            // Marks them read and remembers the newest as last shown.
            let seqs: Vec<Seq> = replies.iter().map(|m| m.seq).collect();
            messages::advance(&tx, caller.endpoint_id, &seqs, State::Read).await?;
        }
        let recipients = messages::recipient_states(&tx, &id).await?;
        store::commit(tx).await?;
        Ok((id, replies, recipients))
    }

    /// Names the mail the caller's model has not been shown and marks it surfaced, once; with
    /// `wait`, first waits for some (reading nothing meanwhile). `token` is the caller's session
    /// token: a wait ends when its session does.
    pub fn announce(&self, caller: Caller, token: &str, wait: bool) -> AnnounceStream {
        let (identity, token) = (self.identity.clone(), token.to_owned());
        let session: announce::SessionCheck = Box::new(move || {
            let (identity, token) = (identity.clone(), token.clone());
            Box::pin(async move { identity.caller(&token).await.map(drop) })
        });
        announce::open(
            self.core.store.clone(),
            self.core.hub.clone(),
            caller,
            wait,
            self.core.shutdown.clone(),
            session,
        )
    }

    /// The caller's push stream: everything unread above `after_seq`, then each new delivery.
    pub fn subscribe(&self, caller: Caller, after_seq: Seq) -> PushStream {
        stream::open(self.core.store.clone(), self.core.hub.clone(), caller, after_seq, self.core.shutdown.clone())
    }
}

/// The endpoint a search filter names, as `caller` would address it: `None` when no filter is
/// given, `Some(None)` when nobody holds the address.
async fn named(
    db: &impl GenericClient,
    caller: &Caller,
    address: &Option<String>,
) -> Result<Option<Option<crate::domain::ids::EndpointId>>> {
    let Some(raw) = address else { return Ok(None) };
    let origin = Origin { account: &caller.account, machine: &caller.machine };
    match messages::endpoint_at(db, &Address::parse(raw, origin)?.to_string()).await.map_err(Error::from) {
        Ok(id) => Ok(Some(Some(id))),
        Err(Error::NotFound { .. }) => Ok(Some(None)),
        Err(e) => Err(e),
    }
}

/// The id of a message the caller sent, named by id, short id or suffix.
async fn sent_message(c: &impl GenericClient, caller: &Caller, reference: &str) -> Result<MessageId> {
    let text = message::sent_reference(reference)?;
    let candidates = messages::sent_like(c, caller.endpoint_id, &text).await?;
    message::pick_named(&text, candidates)
}
