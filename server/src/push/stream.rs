//! One endpoint's push stream: everything unread above the bridge's last seq, then each new delivery.

use tokio_util::sync::CancellationToken;

use super::Hub;
use super::events::{self, Events, Sender, Slot};
use super::hub::StreamClaim;
use crate::domain::caller::Caller;
use crate::domain::ids::Seq;
use crate::domain::message::Message;
use crate::domain::presence::OpenStream;
use crate::domain::{Error, Result};
use crate::metrics::{Step, metrics};
use crate::store::Store;
use crate::store::identity;
use crate::store::messages;
use crate::store::topics;
use std::sync::Arc;

const BATCH: i64 = 100;
/// Small on purpose: a delivery counts as pushed once it is in here, so keep "here" close to the wire.
const BUFFER: usize = 16;

/// What the stream carries: each delivery, and a heartbeat with the inbox head now and then.
/// A delivery is boxed: every open stream's buffer holds slots of this size, idle or not.
#[derive(Debug)]
pub enum Event {
    Message(Box<Message>),
    /// The inbox head, and whether the endpoint is its account's operator.
    Heartbeat {
        head_seq: Seq,
        operator: bool,
    },
}

/// The events of one stream; an error ends it.
pub type PushStream = Events<Event>;

const _: () = assert!(std::mem::size_of::<Slot<Event>>() == 16);

/// Starts the task that feeds the stream; it ends when the client goes away (a send fails), the
/// session ends, or the server shuts down.
pub fn open(store: Store, hub: Hub, caller: Caller, after_seq: Seq, shutdown: CancellationToken) -> PushStream {
    events::open(BUFFER, "push stream", move |tx| async move {
        let address = caller.address();
        tracing::debug!(endpoint = %address, %after_seq, "push stream opened");
        let mut generation = None;
        let _open = OpenGauge::new();
        let outcome = feed(&store, &hub, &caller, after_seq, &tx, &shutdown, &mut generation).await;
        if let Some(generation) = generation
            && let Err(e) = Box::pin(release_presence(&store, &caller, generation)).await
        {
            tracing::warn!(endpoint = %address, error = %e, "cannot release presence");
        }
        tracing::debug!(endpoint = %address, "push stream closed");
        outcome
    })
}

/// Counts a stream in `relay_push_streams` while its task runs.
struct OpenGauge;

impl OpenGauge {
    fn new() -> Self {
        metrics().streams.inc();
        Self
    }
}

impl Drop for OpenGauge {
    fn drop(&mut self) {
        metrics().streams.dec();
    }
}

/// `Ok` when the stream should simply end; `Err` carries the error to end it with.
async fn feed(
    store: &Store,
    hub: &Hub,
    caller: &Caller,
    mut last: Seq,
    tx: &Sender<Event>,
    shutdown: &CancellationToken,
    generation: &mut Option<i64>,
) -> Result<()> {
    // Subscribe before the first read, so nothing committed after that read can go unnoticed.
    let mut waiter = hub.waiter(caller.endpoint_id);
    // One stream per endpoint: opening this one ends an older one here at once.
    let claim = hub.claim_stream(caller.endpoint_id, caller.machine_id);
    // Database calls are boxed: an idle stream's task then holds only what it waits on, not room
    // for the largest query it might make (thousands of streams sit idle at once).
    let opened = Box::pin(open_presence(store, caller)).await?.ok_or_else(gone)?;
    let (stream_gen, mut operator) = (opened.generation, opened.operator);
    *generation = Some(stream_gen);
    if !tx.send(beat(opened.head, operator)).await {
        return Ok(());
    }
    // Presence is the replica's to keep: an idle stream only tells its bridge it is alive, and
    // reads the database only when something changed.
    let mut head = opened.head;
    let mut beats = events::heartbeats();
    // Read what waits, then again only on a wake-up: a heartbeat or a recheck reads no inbox.
    let mut unread_may_wait = true;
    // After the first drain a heartbeat says the backlog is through: the bridge knows at once that
    // what it was pushed is all there is unread, rather than at the next beat.
    let mut caught_up_told = false;
    // The topics followed, each with its newest post pushed: read when the stream opens and when
    // what it follows changes; posts come handed over from then on.
    let mut topics = Topics { me: caller.address(), pushed: std::collections::HashMap::new() };
    let mut topics_read = false;
    // The inbox's change count when it was last read or handed a delivery: a wake-up right after
    // it that hands over what follows `last` needs no read.
    let mut seen = 0;
    loop {
        if std::mem::take(&mut unread_may_wait) {
            // Whatever was announced before this read is in it.
            seen = waiter.seen();
            // The backlog a stream opens with waited for the stream, not for the push: only what
            // arrives live counts towards push lag.
            if !Box::pin(drain(store, caller, &mut last, tx, caught_up_told)).await? {
                return Ok(());
            }
            head = head.max(last);
            if !std::mem::replace(&mut topics_read, true) && !Box::pin(topics.read(store, caller, &claim, tx)).await? {
                return Ok(());
            }
            if !std::mem::replace(&mut caught_up_told, true) && !tx.send(beat(head, operator)).await {
                return Ok(());
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = claim.replaced() => return Err(gone()),
            () = tx.closed() => return Ok(()),
            () = claim.changed() => {
                let now = Box::pin(stream_current(store, caller, stream_gen)).await?.ok_or_else(gone)?;
                // A role change is told at once: the bridge lists its tools again.
                if std::mem::replace(&mut operator, now) != now && !tx.send(beat(head, operator)).await {
                    return Ok(());
                }
            }
            () = claim.posts_arrived() => {
                let (posts, reread) = claim.take_posts();
                let open = if reread {
                    Box::pin(topics.read(store, caller, &claim, tx)).await?
                } else {
                    Box::pin(topics.push_handed(store, caller, &claim, tx, posts)).await?
                };
                if !open {
                    return Ok(());
                }
            }
            _ = beats.tick() => {
                if !tx.send(beat(head, operator)).await {
                    return Ok(());
                }
            }
            () = waiter.changed() => {
                let wake = waiter.seen();
                // Taken whatever comes of it, so the entry never holds what is no longer pushed.
                let handed = claim.take_fresh(wake).filter(|_| wake == seen.wrapping_add(1));
                seen = wake;
                match handed.filter(|messages| follows(last, messages)) {
                    Some(messages) => {
                        metrics().pushes_handed.inc_by(messages.len() as u64);
                        if !push(store, caller, &mut last, tx, messages, true).await {
                            return Ok(());
                        }
                        head = head.max(last);
                    }
                    None => unread_may_wait = true,
                }
            }
        }
    }
}

/// The topics a stream follows, each with the newest post pushed (or read before).
struct Topics {
    /// The endpoint's address: its own posts are not pushed to it.
    me: String,
    pushed: std::collections::HashMap<i64, i64>,
}

impl Topics {
    /// Reads what the endpoint follows and pushes the posts it has not read (and this stream has
    /// not pushed), then takes posts as they are handed over. `false` when the client is gone.
    async fn read(&mut self, store: &Store, caller: &Caller, claim: &StreamClaim, tx: &Sender<Event>) -> Result<bool> {
        let db = store.client().await?;
        let follows = topics::follows_of(&db, caller.endpoint_id).await?;
        let ids: Vec<i64> = follows.iter().map(|(topic, _)| *topic).collect();
        claim.follow_topics(&ids);
        let before = std::mem::take(&mut self.pushed);
        for (topic, read) in follows {
            self.pushed.insert(topic, before.get(&topic).copied().unwrap_or(read).max(read));
        }
        if self.pushed.is_empty() {
            return Ok(true);
        }
        let pushed: Vec<(i64, i64)> = self.pushed.iter().map(|(t, s)| (*t, *s)).collect();
        let (posts, _) = topics::above(&db, caller.endpoint_id, &pushed, BATCH).await?;
        drop(db);
        Ok(self.push(tx, posts.into_iter().map(Arc::new)).await)
    }

    /// Pushes handed-over posts that follow the newest pushed of their topic; one that skips a
    /// number (one was missed) reads the topics instead. `false` when the client is gone.
    async fn push_handed(
        &mut self,
        store: &Store,
        caller: &Caller,
        claim: &StreamClaim,
        tx: &Sender<Event>,
        posts: Vec<Arc<Message>>,
    ) -> Result<bool> {
        // Where each topic stands once the posts before are pushed: the next must follow it.
        let mut next = self.pushed.clone();
        let mut fresh = Vec::new();
        for post in posts {
            let Some(at) = post.post.as_ref() else { continue };
            let Some(reached) = next.get_mut(&at.topic_id) else { continue };
            if at.seq <= *reached {
                continue;
            }
            if at.seq != *reached + 1 {
                // One was missed (it came to another replica's hand first, or was held back).
                if !self.push(tx, fresh.into_iter()).await {
                    return Ok(false);
                }
                return self.read(store, caller, claim, tx).await;
            }
            *reached = at.seq;
            fresh.push(post);
        }
        Ok(self.push(tx, fresh.into_iter()).await)
    }

    /// Pushes the posts not pushed yet, in order; the endpoint's own are passed over (not its
    /// unread). `false` when the client is gone.
    async fn push(&mut self, tx: &Sender<Event>, posts: impl Iterator<Item = Arc<Message>>) -> bool {
        for post in posts {
            let Some(at) = post.post.as_ref() else { continue };
            let Some(pushed) = self.pushed.get_mut(&at.topic_id) else { continue };
            if at.seq <= *pushed {
                continue;
            }
            *pushed = at.seq;
            if post.from == self.me {
                continue;
            }
            let message = Arc::try_unwrap(post).unwrap_or_else(|shared| (*shared).clone());
            if !tx.send(Event::Message(Box::new(message))).await {
                return false;
            }
        }
        true
    }
}

/// The stream becomes its endpoint's newest, and the endpoint stays online while this replica is
/// alive. Returns its generation and the inbox head, or `None` when the session is no longer valid.
async fn open_presence(store: &Store, caller: &Caller) -> Result<Option<OpenStream>> {
    Ok(identity::open_stream(&store.client().await?, caller, store.replica()).await?)
}

/// Whether the endpoint is its account's operator while this stream is still its newest; `None`
/// once it is not. Read only when the endpoint or its machine changed, never on a timer.
async fn stream_current(store: &Store, caller: &Caller, generation: i64) -> Result<Option<bool>> {
    Ok(identity::stream_current(&store.client().await?, caller, generation).await?)
}

/// The stream closed: the endpoint stays online for the reconnect grace if it was the newest.
async fn release_presence(store: &Store, caller: &Caller, generation: i64) -> Result<()> {
    Ok(identity::close_stream(&store.client().await?, caller, generation).await?)
}

fn gone() -> Error {
    Error::Unauthenticated(
        "the session ended, was taken over or the machine was revoked, or a newer stream replaced this one: call Hello again"
            .into(),
    )
}

fn beat(head: Seq, operator: bool) -> Event {
    Event::Heartbeat { head_seq: head, operator }
}

/// Whether `messages` are the deliveries right after seq `last`, one after another: only then may
/// they be pushed as handed over, without a read.
fn follows(last: Seq, messages: &[Message]) -> bool {
    messages.iter().zip(last.0 + 1..).all(|(m, seq)| m.seq.0 == seq) && !messages.is_empty()
}

/// Pushes every unread delivery above `last`, timing each from its send when `live`. `false` when
/// the client is gone.
async fn drain(store: &Store, caller: &Caller, last: &mut Seq, tx: &Sender<Event>, live: bool) -> Result<bool> {
    loop {
        let batch: Vec<Message> =
            messages::unread_after(&store.client().await?, caller.endpoint_id, *last, BATCH).await?;
        if batch.is_empty() {
            return Ok(true);
        }
        // A short batch is all there was: whatever commits after the read wakes the stream again,
        // so reading once more would only find nothing.
        let complete = batch.len() < BATCH as usize;
        if !push(store, caller, last, tx, batch, live).await {
            return Ok(false);
        }
        if complete {
            return Ok(true);
        }
    }
}

/// Pushes `messages` (in seq order) and marks what reached the stream pushed (recorded in the
/// background), timing each from its send when `live`. `false` when the client is gone.
async fn push(
    store: &Store,
    caller: &Caller,
    last: &mut Seq,
    tx: &Sender<Event>,
    messages: Vec<Message>,
    live: bool,
) -> bool {
    let m = metrics();
    let mut pushed = 0;
    let mut open = true;
    for message in messages {
        let (seq, sent_at_ms) = (message.seq, message.sent_at_ms);
        if !tx.send(Event::Message(Box::new(message))).await {
            open = false;
            break;
        }
        if live {
            let lag_ms = chrono::Utc::now().timestamp_millis().saturating_sub(sent_at_ms).max(0);
            m.push_lag_seconds.observe(lag_ms as f64 / 1e3);
        }
        pushed += 1;
        *last = seq;
    }
    if pushed > 0 {
        store.mark_pushed(caller.endpoint_id, *last);
        m.deliveries(Step::pushed, pushed);
    }
    open
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seq: i64) -> Message {
        Message::at_seq(seq)
    }

    #[test]
    fn only_what_follows_the_last_push_without_a_gap_is_pushed_as_handed() {
        assert!(follows(Seq(4), &[at(5)]));
        assert!(follows(Seq(4), &[at(5), at(6)]));
        assert!(!follows(Seq(4), &[at(6)]), "seq 5 is missing");
        assert!(!follows(Seq(4), &[at(5), at(7)]), "a gap inside");
        assert!(!follows(Seq(5), &[at(5)]), "already pushed");
        assert!(!follows(Seq(4), &[]));
    }
}
