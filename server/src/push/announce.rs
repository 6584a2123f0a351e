//! One announcement of the mail an agent's model has not been shown, waited for when asked: what
//! the hooks that wake an idle agent, or hold the end of its turn, stand on.
//!
//! While it waits it reads nothing: it looks again only when the inbox's wake-up says something
//! changed (a delivery from this replica or, through `LISTEN`, from another), and between wake-ups
//! it only tells its client it is alive and checks the session from memory.

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::Hub;
use super::events::{self, Events, Sender, Slot};
use crate::domain::Result;
use crate::domain::caller::Caller;
use crate::domain::message::Announcement;
use crate::metrics::metrics;
use crate::store::Store;
use crate::store::messages;
use crate::store::topics;

/// Most messages one announcement names (and moves to surfaced); more wait for the next.
const MOST: i64 = 100;

/// What the stream carries: heartbeats while it waits, then its one announcement.
#[derive(Debug)]
pub enum Event {
    Waiting,
    /// Boxed: every waiting stream's buffer holds slots of this size.
    Announced(Box<Announcement>),
}

/// The events of one announcement; an error ends it.
pub type AnnounceStream = Events<Event>;

const _: () = assert!(std::mem::size_of::<Slot<Event>>() == 16);

/// Checks that the caller's session still stands (from memory while it is known).
pub type SessionCheck = Box<dyn Fn() -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// Starts the task that answers one `Announce` call. While the stream waits, `session` is asked at
/// each heartbeat, so a session that ends (its bridge left, its machine was revoked) ends the wait.
pub fn open(
    store: Store,
    hub: Hub,
    caller: Caller,
    wait: bool,
    shutdown: CancellationToken,
    session: SessionCheck,
) -> AnnounceStream {
    events::open(2, "announcement", move |tx| async move {
        feed(&store, &hub, &caller, wait, &session, &tx, &shutdown).await
    })
}

async fn feed(
    store: &Store,
    hub: &Hub,
    caller: &Caller,
    wait: bool,
    session: &SessionCheck,
    tx: &Sender<Event>,
    shutdown: &CancellationToken,
) -> Result<()> {
    // Taken before the first look, so nothing delivered after it goes unnoticed.
    let mut waiter = hub.waiter(caller.endpoint_id);
    // Posts of the topics it follows wake it too (read again after each wake-up, as what it
    // follows may have changed).
    let mut posts = None;
    if wait && !tx.send(Event::Waiting).await {
        return Ok(());
    }
    let mut beats = events::heartbeats();
    let _counted = wait.then(Waiting::new);
    loop {
        waiter.seen();
        if wait {
            // Its place first, then what it follows: a follow in between wakes it.
            let claim = posts.get_or_insert_with(|| hub.announcer(caller.endpoint_id, Vec::new()));
            claim.set_topics(Box::pin(follows(store, caller)).await?);
        }
        let found = Box::pin(look(store, caller)).await?;
        if !found.messages.is_empty() || !wait {
            tx.send(Event::Announced(Box::new(found))).await;
            return Ok(());
        }
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tx.closed() => return Ok(()),
                () = waiter.changed() => break,
                () = async { match &posts { Some(p) => p.woken().await, None => std::future::pending().await } } => break,
                _ = beats.tick() => {
                    // From memory while the session is known: a wait costs the database nothing.
                    session().await?;
                    if !tx.send(Event::Waiting).await {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// Counts a waiting hook in `relay_mail_waiters` while it waits.
struct Waiting;

impl Waiting {
    fn new() -> Self {
        metrics().announcing.inc();
        Self
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        metrics().announcing.dec();
    }
}

/// The deliveries its model was not shown, then the posts of its topics it was not told of; each
/// named once.
async fn look(store: &Store, caller: &Caller) -> Result<Announcement> {
    let mut db = store.client().await?;
    let mut found = messages::announce(&db, caller.endpoint_id, MOST).await?;
    let room = MOST - found.messages.len() as i64;
    let (posts, unread_posts) = topics::announce(&mut db, caller.endpoint_id, room.max(1)).await?;
    if posts.is_empty() {
        return Ok(found);
    }
    if found.messages.is_empty() {
        found.unread = messages::unread_count(&db, caller.endpoint_id).await?;
    }
    found.unread += unread_posts;
    found.messages.extend(posts);
    Ok(found)
}

/// The topics the endpoint follows and may read.
async fn follows(store: &Store, caller: &Caller) -> Result<Vec<i64>> {
    let follows = topics::follows_of(&store.client().await?, caller.endpoint_id).await?;
    Ok(follows.into_iter().map(|(topic, _)| topic).collect())
}
