//! Sends' resolved and allowed recipients held in memory, so a repeated send reads nothing before
//! it is written.
//!
//! An entry is what resolving a sender's `to` list gave: the recipients and the group members
//! skipped, allowed by scope and held by no hold class. It is trusted only while this replica
//! hears every change that could make it wrong: the database announces changes to names, rules,
//! caps, groups, contacts and hold classes (`scope`, migration 11) and machine revocations on
//! `relay_control`, and the listener forgets everything on either. The replica making a change also
//! forgets at once, not waiting for its own notification. While the listener is down nothing is
//! kept. What a concurrent change could still break in the window before a notification arrives,
//! the batched writer re-checks: a dropped contact and a full inbox under lock, and a revoked machine.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::domain::ids::EndpointId;
use crate::store::heard::{self, Heard, Ticket};

/// Bounds memory whatever the traffic: past it, the oldest half is dropped.
const MAX_ENTRIES: usize = 50_000;

/// What a send was addressed to, by whom: the same words from the same endpoint resolve alike.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub sender: EndpointId,
    pub private: bool,
    pub to: Vec<String>,
}

pub struct ResolvedCache<V> {
    inner: Mutex<Inner<V>>,
}

struct Inner<V> {
    heard: Heard,
    entries: HashMap<Key, (V, Instant)>,
}

impl<V> Default for ResolvedCache<V> {
    fn default() -> Self {
        Self { inner: Mutex::new(Inner { heard: Heard::default(), entries: HashMap::new() }) }
    }
}

impl<V: Clone> ResolvedCache<V> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        self.inner.lock().expect("resolved cache lock poisoned")
    }

    /// The recipients resolved for `key`, if known and fresh; otherwise a ticket for keeping them.
    pub fn get(&self, key: &Key) -> Result<V, Ticket> {
        let inner = self.lock();
        match inner.entries.get(key) {
            Some((value, at)) if inner.heard.serves(*at) => Ok(value.clone()),
            _ => Err(inner.heard.ticket()),
        }
    }

    /// Keeps a resolve, unless something was forgotten since it began.
    pub fn put(&self, ticket: Ticket, key: Key, value: V) {
        let mut inner = self.lock();
        if !inner.heard.admits(ticket) {
            return;
        }
        heard::make_room(&mut inner.entries, MAX_ENTRIES);
        inner.entries.insert(key, (value, Instant::now()));
    }

    /// Something that decides who may message whom changed: every entry may be wrong.
    pub fn forget_all(&self) {
        let mut inner = self.lock();
        inner.heard.forgot();
        inner.entries.clear();
    }

    /// Changes may go unheard from now on (the listener is down): forget everything, keep nothing.
    pub fn distrust(&self) {
        let mut inner = self.lock();
        inner.heard.distrust();
        inner.entries.clear();
    }

    /// Every change is heard from now on; a resolve that began before is not kept.
    pub fn trust(&self) {
        self.lock().heard.trust();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sender: i64, to: &str) -> Key {
        Key { sender: EndpointId(sender), private: false, to: vec![to.to_owned()] }
    }

    fn kept(cache: &ResolvedCache<u32>, k: Key, v: u32) {
        let ticket = cache.get(&k).expect_err("not kept yet");
        cache.put(ticket, k, v);
    }

    #[test]
    fn nothing_is_kept_until_changes_are_heard() {
        let cache = ResolvedCache::default();
        kept(&cache, key(1, "a"), 7);
        assert!(cache.get(&key(1, "a")).is_err());
        cache.trust();
        kept(&cache, key(1, "a"), 7);
        assert_eq!(cache.get(&key(1, "a")), Ok(7));
        cache.distrust();
        assert!(cache.get(&key(1, "a")).is_err());
    }

    #[test]
    fn the_same_words_from_another_sender_or_privacy_are_another_entry() {
        let cache = ResolvedCache::default();
        cache.trust();
        kept(&cache, key(1, "a"), 7);
        assert!(cache.get(&key(2, "a")).is_err());
        assert!(cache.get(&Key { private: true, ..key(1, "a") }).is_err());
    }

    #[test]
    fn a_change_forgets_everything_and_a_resolve_that_raced_it_is_not_kept() {
        let cache = ResolvedCache::default();
        cache.trust();
        kept(&cache, key(1, "a"), 7);
        let ticket = cache.get(&key(1, "b")).unwrap_err();
        cache.forget_all();
        assert!(cache.get(&key(1, "a")).is_err());
        cache.put(ticket, key(1, "b"), 8);
        assert!(cache.get(&key(1, "b")).is_err());
    }

    #[test]
    fn a_full_cache_drops_its_older_half() {
        let cache = ResolvedCache::default();
        cache.trust();
        for i in 0..MAX_ENTRIES as i64 {
            kept(&cache, key(i, "a"), 1);
        }
        kept(&cache, key(-1, "a"), 2);
        let len = cache.lock().entries.len();
        assert!(len <= MAX_ENTRIES / 2 + 1, "{len} entries kept");
        assert_eq!(cache.get(&key(-1, "a")), Ok(2));
    }
}
