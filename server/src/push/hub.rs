//! Local wake-ups per recipient endpoint, and per account for the people watching it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::domain::ids::{AccountId, EndpointId, MachineId};
use crate::domain::message::Message;

/// Wakes the streams and long polls waiting on an endpoint's inbox in this process, and the web
/// consoles waiting on an account's board, holds and permission requests.
///
/// Each key with waiters has a watch channel whose value is a change counter: a waiter that
/// subscribed before reading the database cannot miss a change made after its read.
#[derive(Clone, Default)]
pub struct Hub {
    inner: Arc<Wakes<EndpointId>>,
    accounts: Arc<Wakes<AccountId>>,
    /// The console pages of an account, woken when one of its sessions ended.
    console_sessions: Arc<Wakes<AccountId>>,
    /// The push stream each endpoint holds in this process: a newer one ends the older at once.
    /// (Taken before a wake map's lock where both are held, never after.)
    streams: Arc<Mutex<HashMap<EndpointId, StreamEntry>>>,
    next_stream: Arc<AtomicU64>,
    /// The endpoints whose streams here follow each topic: a post is read once on this replica and
    /// handed to each of them. (Taken after `streams` where both are held, never before.)
    follows: Arc<Mutex<HashMap<i64, Vec<EndpointId>>>>,
    /// Waits here for an endpoint's mail (a hook's announcement, an inbox read that waits), with
    /// the topics it follows: a post of one of them, or a change to what it follows, makes them
    /// look again.
    announcers: Arc<Mutex<Vec<Announcer>>>,
}

struct Announcer {
    id: u64,
    endpoint: EndpointId,
    topics: Vec<i64>,
    woken: Arc<Notify>,
}

/// An announcement's place among those waiting; dropping it leaves.
pub struct AnnouncerClaim {
    hub: Hub,
    id: u64,
    woken: Arc<Notify>,
}

impl AnnouncerClaim {
    /// Resolves when a post of a topic it follows came, or what it follows changed.
    pub async fn woken(&self) {
        self.woken.notified().await;
    }

    /// The topics it follows, as read after it took its place (so a change made meanwhile, which
    /// wakes it, is not missed).
    pub fn set_topics(&self, topics: Vec<i64>) {
        let mut announcers = self.hub.announcers.lock().expect("hub lock poisoned");
        if let Some(a) = announcers.iter_mut().find(|a| a.id == self.id) {
            a.topics = topics;
        }
    }
}

impl Drop for AnnouncerClaim {
    fn drop(&mut self) {
        self.hub.announcers.lock().expect("hub lock poisoned").retain(|a| a.id != self.id);
    }
}

/// What can be waited on: an endpoint's inbox, or an account.
pub trait Key: Copy + Eq + Hash + Send + Sync + 'static {}
impl Key for EndpointId {}
impl Key for AccountId {}

/// The change counters of the keys that have waiters.
struct Wakes<K> {
    map: Mutex<HashMap<K, watch::Sender<u64>>>,
}

impl<K> Default for Wakes<K> {
    fn default() -> Self {
        Self { map: Mutex::default() }
    }
}

impl<K: Key> Wakes<K> {
    fn waiter(self: &Arc<Self>, key: K) -> Waiter<K> {
        let mut map = self.map.lock().expect("hub lock poisoned");
        let tx = map.entry(key).or_insert_with(|| watch::channel(0).0);
        let rx = tx.subscribe();
        Waiter { wakes: self.clone(), key, rx }
    }

    /// The key's new change count, when it has waiters.
    fn wake(&self, key: K) -> Option<u64> {
        let map = self.map.lock().expect("hub lock poisoned");
        let tx = map.get(&key)?;
        tx.send_modify(|n| *n = n.wrapping_add(1));
        Some(*tx.borrow())
    }

    fn wake_all(&self) {
        for tx in self.map.lock().expect("hub lock poisoned").values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

struct StreamEntry {
    id: u64,
    /// The endpoint's machine: revoking it ends the stream.
    machine: MachineId,
    replaced: CancellationToken,
    changed: Arc<Notify>,
    /// Messages just delivered, handed over with the wake-up that announced them.
    fresh: Option<Fresh>,
    /// Posts of the topics it follows, handed over as they come.
    posts: Arc<PostBox>,
    /// The topics it follows.
    topics: Vec<i64>,
}

/// The posts handed to one stream, and whether it should read its topics again instead.
#[derive(Default)]
pub struct PostBox {
    queue: Mutex<Posts>,
    arrived: Notify,
}

#[derive(Default)]
struct Posts {
    posts: Vec<Arc<Message>>,
    /// What the stream follows changed, or more came than are held: it reads them again.
    reread: bool,
}

/// Most posts held for one stream between its turns: past it, the stream reads them instead.
const POSTS_HELD: usize = 256;

/// What one wake-up of an endpoint's inbox delivered, in seq order.
struct Fresh {
    /// The inbox's change count this wake-up set.
    wake: u64,
    handed_at: Instant,
    messages: Vec<Message>,
}

/// Most body bytes handed over with one wake-up (one largest message): a bigger delivery is read by
/// the stream instead, so what a stream's entry holds stays small.
const HANDED_MAX_BYTES: usize = 64 * 1024;
/// How long what was handed over stays good to push as it was: a stream that comes to it later (it
/// was busy with a slow client) reads instead, so a delivery withdrawn or read meanwhile is not pushed.
const HANDED_FOR: Duration = Duration::from_secs(1);

/// An endpoint's push stream in this process; dropping it forgets it unless a newer one took over.
pub struct StreamClaim {
    hub: Hub,
    endpoint: EndpointId,
    id: u64,
    replaced: CancellationToken,
    changed: Arc<Notify>,
    posts: Arc<PostBox>,
}

impl StreamClaim {
    /// Resolves when a newer stream of the same endpoint opens in this process.
    pub async fn replaced(&self) {
        self.replaced.cancelled().await;
    }

    /// Resolves when the endpoint or its machine changed anywhere (its session ended or changed
    /// hands, a stream opened on another replica, the machine was revoked): time to check the
    /// stream is still the endpoint's. A change announced before this is awaited is not lost.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Resolves when posts were handed over, or the stream should read its topics again. A
    /// hand-over made before this is awaited is not lost.
    pub async fn posts_arrived(&self) {
        self.posts.arrived.notified().await;
    }

    /// The posts handed over since the last call, and whether to read the topics again instead.
    pub fn take_posts(&self) -> (Vec<Arc<Message>>, bool) {
        let mut queue = self.posts.queue.lock().expect("hub lock poisoned");
        (std::mem::take(&mut queue.posts), std::mem::take(&mut queue.reread))
    }

    /// The topics this stream follows, from now on.
    pub fn follow_topics(&self, topics: &[i64]) {
        let mut streams = self.hub.streams.lock().expect("hub lock poisoned");
        let Some(entry) = streams.get_mut(&self.endpoint).filter(|entry| entry.id == self.id) else { return };
        let before = std::mem::replace(&mut entry.topics, topics.to_vec());
        let mut follows = self.hub.follows.lock().expect("hub lock poisoned");
        unfollow(&mut follows, self.endpoint, &before);
        for topic in topics {
            follows.entry(*topic).or_default().push(self.endpoint);
        }
    }

    /// The messages delivered with wake-up `wake`, if that wake-up handed any over, is the
    /// inbox's latest and was moments ago; what the entry held is forgotten either way.
    pub fn take_fresh(&self, wake: u64) -> Option<Vec<Message>> {
        let mut streams = self.hub.streams.lock().expect("hub lock poisoned");
        let fresh = streams.get_mut(&self.endpoint).filter(|entry| entry.id == self.id)?.fresh.take()?;
        (fresh.wake == wake && fresh.handed_at.elapsed() < HANDED_FOR).then_some(fresh.messages)
    }
}

impl Drop for StreamClaim {
    fn drop(&mut self) {
        let mut streams = self.hub.streams.lock().expect("hub lock poisoned");
        if streams.get(&self.endpoint).is_some_and(|entry| entry.id == self.id)
            && let Some(entry) = streams.remove(&self.endpoint)
        {
            unfollow(&mut self.hub.follows.lock().expect("hub lock poisoned"), self.endpoint, &entry.topics);
        }
    }
}

/// Takes `endpoint` out of the followers of `topics`.
fn unfollow(follows: &mut HashMap<i64, Vec<EndpointId>>, endpoint: EndpointId, topics: &[i64]) {
    for topic in topics {
        if let Some(followers) = follows.get_mut(topic) {
            followers.retain(|e| *e != endpoint);
            if followers.is_empty() {
                follows.remove(topic);
            }
        }
    }
}

/// A waiter's handle; dropping the last one for a key forgets the key.
pub struct Waiter<K: Key = EndpointId> {
    wakes: Arc<Wakes<K>>,
    key: K,
    rx: watch::Receiver<u64>,
}

impl Hub {
    pub fn waiter(&self, endpoint: EndpointId) -> Waiter {
        self.inner.waiter(endpoint)
    }

    /// Waits on what an account's people see: its board, holds and permission requests.
    pub fn account_waiter(&self, account: AccountId) -> Waiter<AccountId> {
        self.accounts.waiter(account)
    }

    /// Waits for the end of any console session of an account (its pages then check their own).
    pub fn console_sessions_waiter(&self, account: AccountId) -> Waiter<AccountId> {
        self.console_sessions.waiter(account)
    }

    /// Makes a new stream the endpoint's one in this process, ending the one it had. (A stream on
    /// another replica ends when that replica hears the endpoint changed and finds it superseded.)
    pub fn claim_stream(&self, endpoint: EndpointId, machine: MachineId) -> StreamClaim {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let replaced = CancellationToken::new();
        let changed = Arc::new(Notify::new());
        let posts = Arc::new(PostBox::default());
        let entry = StreamEntry {
            id,
            machine,
            replaced: replaced.clone(),
            changed: changed.clone(),
            fresh: None,
            posts: posts.clone(),
            topics: Vec::new(),
        };
        let mut streams = self.streams.lock().expect("hub lock poisoned");
        if let Some(older) = streams.insert(endpoint, entry) {
            older.replaced.cancel();
            unfollow(&mut self.follows.lock().expect("hub lock poisoned"), endpoint, &older.topics);
        }
        drop(streams);
        StreamClaim { hub: self.clone(), endpoint, id, replaced, changed, posts }
    }

    /// The endpoint changed somewhere: its stream here, if any, checks it is still current.
    pub fn endpoint_changed(&self, endpoint: EndpointId) {
        if let Some(entry) = self.streams.lock().expect("hub lock poisoned").get(&endpoint) {
            entry.changed.notify_one();
        }
    }

    /// A machine was revoked or removed: the streams of its endpoints here check, and no others
    /// (each check is a read, and a replica may hold thousands of streams).
    pub fn machine_changed(&self, machine: MachineId) {
        for entry in self.streams.lock().expect("hub lock poisoned").values().filter(|e| e.machine == machine) {
            entry.changed.notify_one();
        }
    }

    /// Changes may have gone unheard: every stream here checks, and reads its topics again.
    pub fn all_changed(&self) {
        for entry in self.streams.lock().expect("hub lock poisoned").values() {
            entry.changed.notify_one();
            entry.posts.queue.lock().expect("hub lock poisoned").reread = true;
            entry.posts.arrived.notify_one();
        }
    }

    /// Whether a stream or an announcement here follows `topic`: only then is a post of it read here.
    pub fn follows_topic(&self, topic: i64) -> bool {
        self.follows.lock().expect("hub lock poisoned").contains_key(&topic)
            || self.announcers.lock().expect("hub lock poisoned").iter().any(|a| a.topics.contains(&topic))
    }

    /// An announcement waits for `endpoint`'s mail, which follows `topics`.
    pub fn announcer(&self, endpoint: EndpointId, topics: Vec<i64>) -> AnnouncerClaim {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let woken = Arc::new(Notify::new());
        let announcer = Announcer { id, endpoint, topics, woken: woken.clone() };
        self.announcers.lock().expect("hub lock poisoned").push(announcer);
        AnnouncerClaim { hub: self.clone(), id, woken }
    }

    /// A post of `topic`, read once: handed to each stream here that follows the topic.
    pub fn posted(&self, topic: i64, post: Arc<Message>) {
        for a in self.announcers.lock().expect("hub lock poisoned").iter().filter(|a| a.topics.contains(&topic)) {
            a.woken.notify_one();
        }
        let followers = self.follows.lock().expect("hub lock poisoned").get(&topic).cloned().unwrap_or_default();
        let streams = self.streams.lock().expect("hub lock poisoned");
        for entry in followers.iter().filter_map(|e| streams.get(e)) {
            let mut queue = entry.posts.queue.lock().expect("hub lock poisoned");
            if queue.posts.len() < POSTS_HELD {
                queue.posts.push(post.clone());
            } else {
                queue.reread = true;
            }
            drop(queue);
            entry.posts.arrived.notify_one();
        }
    }

    /// What `endpoint` follows changed, or a topic it follows was closed: its stream here reads its
    /// topics again. `None`: every stream here following `topic` does.
    pub fn topics_changed(&self, endpoint: Option<EndpointId>, topic: Option<i64>) {
        for a in self.announcers.lock().expect("hub lock poisoned").iter() {
            if endpoint.is_some_and(|e| e == a.endpoint) || topic.is_some_and(|t| a.topics.contains(&t)) {
                a.woken.notify_one();
            }
        }
        let followers = match (endpoint, topic) {
            (Some(endpoint), _) => vec![endpoint],
            (None, Some(topic)) => {
                self.follows.lock().expect("hub lock poisoned").get(&topic).cloned().unwrap_or_default()
            }
            (None, None) => return,
        };
        let streams = self.streams.lock().expect("hub lock poisoned");
        for entry in followers.iter().filter_map(|e| streams.get(e)) {
            entry.posts.queue.lock().expect("hub lock poisoned").reread = true;
            entry.posts.arrived.notify_one();
        }
    }

    /// Something changed in this endpoint's inbox.
    pub fn wake(&self, endpoint: EndpointId) {
        self.inner.wake(endpoint);
    }

    /// Messages were delivered to this endpoint's inbox, by this process: its waiters wake, and
    /// its stream here, if any, is handed what `delivered` builds (called only then), to push
    /// without reading it back. (The stream takes it only when it missed no wake-up and it follows
    /// what the stream pushed last.)
    pub fn deliver(&self, endpoint: EndpointId, delivered: &mut dyn FnMut() -> Vec<Message>) {
        let streaming = self.streams.lock().expect("hub lock poisoned").contains_key(&endpoint);
        let messages = if streaming { delivered() } else { Vec::new() };
        let small = messages.iter().map(|m| m.body.len()).sum::<usize>() <= HANDED_MAX_BYTES;
        // The stream's entry is held while the count moves, so the count a stream sees and the
        // messages it then takes belong to the same wake-up.
        let mut streams = self.streams.lock().expect("hub lock poisoned");
        let wake = self.inner.wake(endpoint);
        if let (Some(wake), Some(entry)) = (wake, streams.get_mut(&endpoint)) {
            entry.fresh = (small && !messages.is_empty()).then(|| Fresh { wake, handed_at: Instant::now(), messages });
        }
    }

    /// Something an account's people see changed.
    pub fn wake_account(&self, account: AccountId) {
        self.accounts.wake(account);
    }

    /// A console session of the account ended somewhere.
    pub fn console_session_ended(&self, account: AccountId) {
        self.console_sessions.wake(account);
    }

    /// Wakes every waiter, after notifications may have been missed.
    pub fn wake_all(&self) {
        self.inner.wake_all();
        self.accounts.wake_all();
        self.console_sessions.wake_all();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.map.lock().unwrap().len()
    }
}

impl<K: Key> Waiter<K> {
    /// Resolves at the next wake-up after the last one seen.
    pub async fn changed(&mut self) {
        // The sender lives in the hub as long as this waiter does, so this cannot fail.
        let _ = self.rx.changed().await;
    }

    /// The key's change count now, which counts as seen: [`Self::changed`] waits for the next.
    pub fn seen(&mut self) -> u64 {
        *self.rx.borrow_and_update()
    }
}

impl<K: Key> Drop for Waiter<K> {
    fn drop(&mut self) {
        let mut map = self.wakes.map.lock().expect("hub lock poisoned");
        // This waiter's receiver still counts until the drop completes.
        if map.get(&self.key).is_some_and(|tx| tx.receiver_count() <= 1) {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::ids::Seq;

    #[tokio::test]
    async fn a_wake_reaches_every_waiter_of_the_endpoint_only() {
        let hub = Hub::default();
        let mut a = hub.waiter(EndpointId(1));
        let mut b = hub.waiter(EndpointId(1));
        let mut other = hub.waiter(EndpointId(2));
        hub.wake(EndpointId(1));
        tokio::time::timeout(Duration::from_secs(1), a.changed()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), b.changed()).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(50), other.changed()).await.is_err());
    }

    #[tokio::test]
    async fn a_wake_before_waiting_is_not_lost() {
        let hub = Hub::default();
        let mut a = hub.waiter(EndpointId(1));
        hub.wake(EndpointId(1));
        tokio::time::timeout(Duration::from_secs(1), a.changed()).await.unwrap();
    }

    #[tokio::test]
    async fn a_newer_stream_ends_the_older_one_of_its_endpoint_only() {
        let hub = Hub::default();
        let first = hub.claim_stream(EndpointId(1), MachineId(1));
        let other = hub.claim_stream(EndpointId(2), MachineId(1));
        let second = hub.claim_stream(EndpointId(1), MachineId(1));
        tokio::time::timeout(Duration::from_secs(1), first.replaced()).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(50), second.replaced()).await.is_err());
        assert!(tokio::time::timeout(Duration::from_millis(50), other.replaced()).await.is_err());
        drop(first);
        assert!(
            hub.streams.lock().unwrap().contains_key(&EndpointId(1)),
            "an ended older stream leaves the newer in place"
        );
        drop(second);
        assert!(!hub.streams.lock().unwrap().contains_key(&EndpointId(1)));
    }

    #[tokio::test]
    async fn a_change_announced_before_the_stream_waits_is_not_lost() {
        let hub = Hub::default();
        let one = hub.claim_stream(EndpointId(1), MachineId(1));
        let two = hub.claim_stream(EndpointId(2), MachineId(1));
        hub.endpoint_changed(EndpointId(1));
        tokio::time::timeout(Duration::from_secs(1), one.changed()).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(50), two.changed()).await.is_err());
        hub.all_changed();
        tokio::time::timeout(Duration::from_secs(1), one.changed()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), two.changed()).await.unwrap();
    }

    #[tokio::test]
    async fn a_console_session_end_wakes_its_accounts_pages_and_no_change_of_what_they_show() {
        let hub = Hub::default();
        let mut shown = hub.account_waiter(AccountId(1));
        let mut ended = hub.console_sessions_waiter(AccountId(1));
        let mut other = hub.console_sessions_waiter(AccountId(2));
        hub.wake_account(AccountId(1));
        tokio::time::timeout(Duration::from_secs(1), shown.changed()).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(50), ended.changed()).await.is_err());
        hub.console_session_ended(AccountId(1));
        tokio::time::timeout(Duration::from_secs(1), ended.changed()).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(50), other.changed()).await.is_err());
        assert!(tokio::time::timeout(Duration::from_millis(50), shown.changed()).await.is_err());
        hub.wake_all();
        tokio::time::timeout(Duration::from_secs(1), other.changed()).await.unwrap();
    }

    #[tokio::test]
    async fn a_machine_change_reaches_the_streams_of_its_endpoints_only() {
        let hub = Hub::default();
        let laptop = hub.claim_stream(EndpointId(1), MachineId(1));
        let also_laptop = hub.claim_stream(EndpointId(2), MachineId(1));
        let ci = hub.claim_stream(EndpointId(3), MachineId(2));
        hub.machine_changed(MachineId(1));
        tokio::time::timeout(Duration::from_secs(1), laptop.changed()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), also_laptop.changed()).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(50), ci.changed()).await.is_err());
    }

    #[tokio::test]
    async fn an_account_wake_reaches_its_consoles_and_wake_all_reaches_them_too() {
        let hub = Hub::default();
        let mut acme = hub.account_waiter(AccountId(1));
        let mut globex = hub.account_waiter(AccountId(2));
        let mut inbox = hub.waiter(EndpointId(1));
        hub.wake_account(AccountId(1));
        tokio::time::timeout(Duration::from_secs(1), acme.changed()).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(50), globex.changed()).await.is_err());
        assert!(tokio::time::timeout(Duration::from_millis(50), inbox.changed()).await.is_err());
        hub.wake_all();
        tokio::time::timeout(Duration::from_secs(1), globex.changed()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), inbox.changed()).await.unwrap();
        drop((acme, globex));
        assert!(hub.accounts.map.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_delivery_is_handed_to_the_stream_with_its_wake_up_only() {
        let hub = Hub::default();
        let mut waiter = hub.waiter(EndpointId(1));
        let claim = hub.claim_stream(EndpointId(1), MachineId(1));
        let seen = waiter.seen();
        hub.deliver(EndpointId(1), &mut || vec![Message::at_seq(1)]);
        tokio::time::timeout(Duration::from_secs(1), waiter.changed()).await.unwrap();
        let wake = waiter.seen();
        assert_eq!(wake, seen + 1);
        assert_eq!(claim.take_fresh(wake).map(|m| m[0].seq), Some(Seq(1)));
        assert!(claim.take_fresh(wake).is_none(), "taken once");

        // A plain wake-up after a delivery: the delivery is no longer the latest, and is not handed.
        hub.deliver(EndpointId(1), &mut || vec![Message::at_seq(2)]);
        hub.wake(EndpointId(1));
        let wake = waiter.seen();
        assert_eq!(claim.take_fresh(wake), None);
        assert_eq!(claim.take_fresh(wake - 1), None, "forgotten once looked at");

        // Too much to hold is not handed: the stream reads it.
        let mut large = Message::at_seq(3);
        large.body = "x".repeat(HANDED_MAX_BYTES + 1);
        hub.deliver(EndpointId(1), &mut || vec![large.clone()]);
        assert_eq!(claim.take_fresh(waiter.seen()), None);

        // An endpoint with no stream here is only woken, and nothing is built for it.
        let mut other = hub.waiter(EndpointId(2));
        hub.deliver(EndpointId(2), &mut || panic!("built for an endpoint with no stream here"));
        tokio::time::timeout(Duration::from_secs(1), other.changed()).await.unwrap();
    }

    #[test]
    fn endpoints_are_forgotten_with_their_last_waiter() {
        let hub = Hub::default();
        let a = hub.waiter(EndpointId(7));
        let b = hub.waiter(EndpointId(7));
        drop(a);
        assert_eq!(hub.len(), 1);
        drop(b);
        assert_eq!(hub.len(), 0);
        hub.wake(EndpointId(7));
    }
}
