//! Sessions held in memory, so a call is authenticated without a database read.
//!
//! An entry is trusted only while this replica hears every change that could make it wrong: the
//! database announces a session ending or changing hands and a machine revoked or removed (triggers
//! of migration 9, on `relay_control`; a card's attempt ending ends its agent's session, migration
//! 19), and the replica's listener forgets the entries concerned.
//! While the listener is down nothing is kept, and every call reads the database as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::domain::caller::Caller;
use crate::domain::ids::{EndpointId, MachineId};

/// A safety net only: every change that matters is announced.
const TTL: Duration = Duration::from_secs(300);
/// Bounds memory whatever the number of sessions: past it, entries are not added.
const MAX_ENTRIES: usize = 100_000;

#[derive(Default)]
pub struct SessionCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Whether changes are heard: false until the listener is up, and while it reconnects.
    trusted: bool,
    /// Bumped by every forgetting, so a read that began before one is not cached after it.
    epoch: u64,
    by_hash: HashMap<Vec<u8>, (Caller, Instant)>,
    by_endpoint: HashMap<EndpointId, Vec<u8>>,
}

/// Taken before a database read, handed back with its result.
#[derive(Debug, Clone, Copy)]
pub struct Ticket(u64);

impl SessionCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("session cache lock poisoned")
    }

    /// Sessions held now.
    pub fn held(&self) -> usize {
        self.lock().by_hash.len()
    }

    /// The caller behind a session hash, if known and fresh; otherwise a ticket for caching the read.
    pub fn get(&self, hash: &[u8]) -> Result<Caller, Ticket> {
        let inner = self.lock();
        match inner.by_hash.get(hash) {
            Some((caller, at)) if inner.trusted && at.elapsed() < TTL => Ok(caller.clone()),
            _ => Err(Ticket(inner.epoch)),
        }
    }

    /// Keeps a caller read from the database, unless something was forgotten since the read began.
    pub fn put(&self, ticket: Ticket, caller: &Caller) {
        let mut inner = self.lock();
        if !inner.trusted || inner.epoch != ticket.0 || inner.by_hash.len() >= MAX_ENTRIES {
            return;
        }
        if let Some(old) = inner.by_endpoint.insert(caller.endpoint_id, caller.session_hash.clone())
            && old != caller.session_hash
        {
            inner.by_hash.remove(&old);
        }
        inner.by_hash.insert(caller.session_hash.clone(), (caller.clone(), Instant::now()));
    }

    /// The endpoint's session ended, changed hands, or its stream changed.
    pub fn forget_endpoint(&self, endpoint: EndpointId) {
        let mut inner = self.lock();
        inner.epoch += 1;
        if let Some(hash) = inner.by_endpoint.remove(&endpoint) {
            inner.by_hash.remove(&hash);
        }
    }

    /// The machine was revoked or removed: every session on it.
    pub fn forget_machine(&self, machine: MachineId) {
        let mut inner = self.lock();
        inner.epoch += 1;
        let gone: Vec<EndpointId> =
            inner.by_hash.values().filter(|(c, _)| c.machine_id == machine).map(|(c, _)| c.endpoint_id).collect();
        for endpoint in gone {
            if let Some(hash) = inner.by_endpoint.remove(&endpoint) {
                inner.by_hash.remove(&hash);
            }
        }
    }

    /// The card's attempt ended: the session of its agent, before the database's word arrives.
    pub fn forget_attempt(&self, card: &str) {
        let mut inner = self.lock();
        inner.epoch += 1;
        let gone: Vec<EndpointId> = inner
            .by_hash
            .values()
            .filter(|(c, _)| c.attempt.as_ref().is_some_and(|a| a.card == card))
            .map(|(c, _)| c.endpoint_id)
            .collect();
        for endpoint in gone {
            if let Some(hash) = inner.by_endpoint.remove(&endpoint) {
                inner.by_hash.remove(&hash);
            }
        }
    }

    /// Changes may go unheard from now on (the listener is down): forget everything, keep nothing.
    pub fn distrust(&self) {
        let mut inner = self.lock();
        inner.trusted = false;
        inner.epoch += 1;
        inner.by_hash.clear();
        inner.by_endpoint.clear();
    }

    /// Every change is heard from now on. A read that began before (while changes went unheard)
    /// is not kept.
    pub fn trust(&self) {
        let mut inner = self.lock();
        inner.trusted = true;
        inner.epoch += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::caller::Attempt;
    use crate::domain::ids::AccountId;

    fn caller(endpoint: i64, machine: i64, hash: u8) -> Caller {
        Caller {
            endpoint_id: EndpointId(endpoint),
            account_id: AccountId(1),
            account: "acme".into(),
            machine_id: MachineId(machine),
            machine: "laptop".into(),
            handle: format!("h{endpoint}"),
            session_hash: vec![hash],
            attempt: None,
        }
    }

    fn cached(cache: &SessionCache, c: &Caller) {
        let ticket = cache.get(&c.session_hash).expect_err("not cached yet");
        cache.put(ticket, c);
    }

    #[test]
    fn nothing_is_kept_until_changes_are_heard() {
        let cache = SessionCache::default();
        cached(&cache, &caller(1, 10, 1));
        assert!(cache.get(&[1]).is_err());
        cache.trust();
        cached(&cache, &caller(1, 10, 1));
        assert_eq!(cache.get(&[1]).unwrap().endpoint_id, EndpointId(1));
        cache.distrust();
        assert!(cache.get(&[1]).is_err());
    }

    #[test]
    fn a_changed_endpoint_or_machine_is_forgotten() {
        let cache = SessionCache::default();
        cache.trust();
        for c in [caller(1, 10, 1), caller(2, 10, 2), caller(3, 11, 3)] {
            cached(&cache, &c);
        }
        cache.forget_endpoint(EndpointId(1));
        assert!(cache.get(&[1]).is_err());
        assert!(cache.get(&[2]).is_ok());
        cache.forget_machine(MachineId(10));
        assert!(cache.get(&[2]).is_err());
        assert!(cache.get(&[3]).is_ok());
        let mut agent = caller(4, 11, 4);
        agent.attempt = Some(Attempt { card: "abc".into(), token_hash: vec![7] });
        cached(&cache, &agent);
        cache.forget_attempt("other");
        assert!(cache.get(&[4]).is_ok());
        cache.forget_attempt("abc");
        assert!(cache.get(&[4]).is_err());
        assert!(cache.get(&[3]).is_ok());
    }

    #[test]
    fn a_read_that_raced_a_change_is_not_kept() {
        let cache = SessionCache::default();
        cache.trust();
        let ticket = cache.get(&[1]).err().unwrap();
        cache.forget_endpoint(EndpointId(1));
        cache.put(ticket, &caller(1, 10, 1));
        assert!(cache.get(&[1]).is_err());
    }

    #[test]
    fn a_new_session_of_an_endpoint_replaces_the_old() {
        let cache = SessionCache::default();
        cache.trust();
        cached(&cache, &caller(1, 10, 1));
        cached(&cache, &caller(1, 10, 9));
        assert!(cache.get(&[1]).is_err());
        assert!(cache.get(&[9]).is_ok());
    }
}
