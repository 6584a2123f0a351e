//! Each inbox's last page, held in memory, so that a look finding its inbox unchanged reads only the
//! inbox's version rather than the page again (`relay_look`, migration 34).
//!
//! Unlike the session and recipient caches this one needs no notifications: every look asks the
//! database whether the inbox is still at the version of the page held, in the statement that
//! would otherwise read the page. A replica that misses a change, or holds nothing, reads as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::heard;
use super::messages::Version;
use crate::domain::ids::EndpointId;
use crate::domain::message::Message;

/// Inboxes whose page is held at most: past it, the older half is dropped.
const MAX_ENTRIES: usize = 2_048;
/// A page holding more text than this is not kept: memory stays within `MAX_ENTRIES` times it.
const MAX_PAGE_BYTES: usize = 32 * 1024;

/// A page, as a look of at most `limit` messages answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    pub version: Version,
    pub messages: Vec<Message>,
    /// How many the inbox held unread after it.
    pub left: u64,
}

/// Pages by inbox and look size, each with when it was last kept or asked for. Shared, so that
/// asking for a page costs no copy of it until it is answered.
type Entries = HashMap<(EndpointId, i64), (Arc<Page>, Instant)>;

#[derive(Default)]
pub(crate) struct PageCache {
    entries: Mutex<Entries>,
}

impl PageCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().expect("page cache lock poisoned")
    }

    /// The page last answered for `inbox` by a look of at most `limit`, if held. Asked for, it
    /// counts as kept now: the inboxes looked at most are the last dropped.
    pub(crate) fn get(&self, inbox: EndpointId, limit: i64) -> Option<Arc<Page>> {
        self.lock().get_mut(&(inbox, limit)).map(|(page, at)| {
            *at = Instant::now();
            page.clone()
        })
    }

    /// Holds the page a look just answered, if small enough; a page not held is forgotten.
    pub(crate) fn keep(&self, inbox: EndpointId, limit: i64, page: Option<Arc<Page>>) {
        let mut entries = self.lock();
        match page.filter(|p| text_bytes(&p.messages) <= MAX_PAGE_BYTES) {
            Some(page) => {
                if !entries.contains_key(&(inbox, limit)) {
                    heard::make_room(&mut entries, MAX_ENTRIES);
                }
                entries.insert((inbox, limit), (page, Instant::now()));
            }
            None => {
                entries.remove(&(inbox, limit));
            }
        }
    }
}

/// The text a page holds, roughly what keeping it costs.
fn text_bytes(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|m| {
            let reply_to = m.reply_to.as_ref().map_or(0, |r| r.as_str().len());
            m.id.as_str().len() + m.from.len() + m.thread.len() + m.body.len() + reply_to + m.relation.len()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(unread: i32, body: &str) -> Arc<Page> {
        let mut m = Message::at_seq(1);
        m.body = body.to_owned();
        Arc::new(Page { version: Version { head: 1, unread }, messages: vec![m], left: 1 })
    }

    #[test]
    fn a_page_is_held_per_inbox_and_limit_and_replaced_by_the_next() {
        let cache = PageCache::default();
        cache.keep(EndpointId(1), 50, Some(page(1, "a")));
        assert_eq!(cache.get(EndpointId(1), 50), Some(page(1, "a")));
        assert_eq!(cache.get(EndpointId(1), 10), None, "another limit is another page");
        assert_eq!(cache.get(EndpointId(2), 50), None);
        cache.keep(EndpointId(1), 50, Some(page(2, "b")));
        assert_eq!(cache.get(EndpointId(1), 50), Some(page(2, "b")));
        cache.keep(EndpointId(1), 50, None);
        assert_eq!(cache.get(EndpointId(1), 50), None, "an empty look forgets the page");
    }

    #[test]
    fn a_large_page_is_not_held_and_a_full_cache_makes_room() {
        let cache = PageCache::default();
        cache.keep(EndpointId(1), 50, Some(page(1, "a")));
        cache.keep(EndpointId(1), 50, Some(page(2, &"x".repeat(MAX_PAGE_BYTES + 1))));
        assert_eq!(cache.get(EndpointId(1), 50), None, "too large to hold, and the older page is gone");
        for i in 0..MAX_ENTRIES as i64 {
            cache.keep(EndpointId(i), 50, Some(page(1, "a")));
        }
        cache.keep(EndpointId(-1), 50, Some(page(1, "a")));
        assert!(cache.lock().len() <= MAX_ENTRIES / 2 + 1);
        assert!(cache.get(EndpointId(-1), 50).is_some());
    }
}
