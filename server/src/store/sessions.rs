//! Sessions and machine tokens held in memory, so a call is authenticated without a database read.
//!
//! An entry is trusted only while this replica hears every change that could make it wrong: the
//! database announces a session ending or changing hands and a machine revoked, removed or given a
//! new token (triggers of migrations 9 and 38, on `relay_control`; a card's attempt ending ends its
//! agent's session, migration 19), and the replica's listener forgets the entries concerned.
//! While the listener is down nothing is kept, and every call reads the database as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use super::heard::{self, Heard, Ticket};
use crate::domain::caller::{Caller, MachineIdentity};
use crate::domain::ids::{EndpointId, JobId, MachineId, TokenHash};

/// Bounds memory whatever the number of sessions: past it, the oldest half is dropped.
const MAX_ENTRIES: usize = 100_000;

#[derive(Default)]
pub struct SessionCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    heard: Heard,
    by_hash: HashMap<TokenHash, (Caller, Instant)>,
    by_endpoint: HashMap<EndpointId, TokenHash>,
    /// Live machine tokens, by their hash.
    machines: HashMap<TokenHash, (MachineIdentity, Instant)>,
}

impl SessionCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("session cache lock poisoned")
    }

    /// Sessions held now.
    pub fn held(&self) -> usize {
        self.lock().by_hash.len()
    }

    /// The caller behind a session hash, if known and fresh; otherwise a ticket for caching the read.
    pub fn get(&self, hash: &TokenHash) -> Result<Caller, Ticket> {
        let inner = self.lock();
        match inner.by_hash.get(hash) {
            Some((caller, at)) if inner.heard.serves(*at) => Ok(caller.clone()),
            _ => Err(inner.heard.ticket()),
        }
    }

    /// Keeps a caller read from the database, unless something was forgotten since the read began.
    pub fn put(&self, ticket: Ticket, caller: &Caller) {
        let mut inner = self.lock();
        if !inner.heard.admits(ticket) {
            return;
        }
        let Inner { by_hash, by_endpoint, .. } = &mut *inner;
        for dropped in heard::make_room(by_hash, MAX_ENTRIES) {
            if by_endpoint.get(&dropped.endpoint_id) == Some(&dropped.session_hash) {
                by_endpoint.remove(&dropped.endpoint_id);
            }
        }
        if let Some(old) = by_endpoint.insert(caller.endpoint_id, caller.session_hash.clone())
            && old != caller.session_hash
        {
            by_hash.remove(&old);
        }
        by_hash.insert(caller.session_hash.clone(), (caller.clone(), Instant::now()));
    }

    /// The machine a live machine token's hash names, if known and fresh; otherwise a ticket for
    /// caching the read.
    pub fn machine(&self, hash: &TokenHash) -> Result<MachineIdentity, Ticket> {
        let inner = self.lock();
        match inner.machines.get(hash) {
            Some((machine, at)) if inner.heard.serves(*at) => Ok(machine.clone()),
            _ => Err(inner.heard.ticket()),
        }
    }

    /// Keeps a live machine token read from the database, unless something was forgotten since
    /// the read began.
    pub fn put_machine(&self, ticket: Ticket, hash: &TokenHash, machine: &MachineIdentity) {
        let mut inner = self.lock();
        if !inner.heard.admits(ticket) {
            return;
        }
        heard::make_room(&mut inner.machines, MAX_ENTRIES);
        inner.machines.insert(hash.clone(), (machine.clone(), Instant::now()));
    }

    /// The endpoint's session ended, changed hands, or its stream changed.
    pub fn forget_endpoint(&self, endpoint: EndpointId) {
        let mut inner = self.lock();
        inner.heard.forgot();
        if let Some(hash) = inner.by_endpoint.remove(&endpoint) {
            inner.by_hash.remove(&hash);
        }
    }

    /// The machine was revoked, removed or given a new token: its token and every session on it.
    pub fn forget_machine(&self, machine: MachineId) {
        self.forget_where(|c| c.machine_id == machine);
        self.lock().machines.retain(|_, (m, _)| m.machine_id != machine);
    }

    /// The card's attempt ended: the session of its agent, before the database's word arrives.
    pub fn forget_attempt(&self, card: &JobId) {
        self.forget_where(|c| c.attempt.as_ref().is_some_and(|a| &a.card == card));
    }

    /// Every session whose caller `gone` picks.
    fn forget_where(&self, gone: impl Fn(&Caller) -> bool) {
        let mut inner = self.lock();
        inner.heard.forgot();
        let Inner { by_hash, by_endpoint, .. } = &mut *inner;
        by_hash.retain(|hash, (caller, _)| {
            if !gone(caller) {
                return true;
            }
            if by_endpoint.get(&caller.endpoint_id) == Some(hash) {
                by_endpoint.remove(&caller.endpoint_id);
            }
            false
        });
    }

    /// Changes may go unheard from now on (the listener is down): forget everything, keep nothing.
    pub fn distrust(&self) {
        let mut inner = self.lock();
        inner.heard.distrust();
        inner.by_hash.clear();
        inner.by_endpoint.clear();
        inner.machines.clear();
    }

    /// Every change is heard from now on; a read that began before is not kept.
    pub fn trust(&self) {
        self.lock().heard.trust();
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
            session_hash: hash_of(hash),
            attempt: None,
        }
    }

    fn hash_of(byte: u8) -> TokenHash {
        TokenHash::from_stored(vec![byte])
    }

    fn cached(cache: &SessionCache, c: &Caller) {
        let ticket = cache.get(&c.session_hash).expect_err("not cached yet");
        cache.put(ticket, c);
    }

    #[test]
    fn nothing_is_kept_until_changes_are_heard() {
        let cache = SessionCache::default();
        cached(&cache, &caller(1, 10, 1));
        assert!(cache.get(&hash_of(1)).is_err());
        cache.trust();
        cached(&cache, &caller(1, 10, 1));
        assert_eq!(cache.get(&hash_of(1)).unwrap().endpoint_id, EndpointId(1));
        cache.distrust();
        assert!(cache.get(&hash_of(1)).is_err());
    }

    #[test]
    fn a_changed_endpoint_or_machine_is_forgotten() {
        let cache = SessionCache::default();
        cache.trust();
        for c in [caller(1, 10, 1), caller(2, 10, 2), caller(3, 11, 3)] {
            cached(&cache, &c);
        }
        cache.forget_endpoint(EndpointId(1));
        assert!(cache.get(&hash_of(1)).is_err());
        assert!(cache.get(&hash_of(2)).is_ok());
        cache.forget_machine(MachineId(10));
        assert!(cache.get(&hash_of(2)).is_err());
        assert!(cache.get(&hash_of(3)).is_ok());
        let mut agent = caller(4, 11, 4);
        agent.attempt = Some(Attempt { card: JobId::new("abc"), token_hash: hash_of(7) });
        cached(&cache, &agent);
        cache.forget_attempt(&JobId::new("other"));
        assert!(cache.get(&hash_of(4)).is_ok());
        cache.forget_attempt(&JobId::new("abc"));
        assert!(cache.get(&hash_of(4)).is_err());
        assert!(cache.get(&hash_of(3)).is_ok());
    }

    #[test]
    fn a_machine_token_is_kept_until_its_machine_changes() {
        let cache = SessionCache::default();
        let machine = |id| MachineIdentity {
            account_id: AccountId(1),
            account: "acme".into(),
            machine_id: MachineId(id),
            machine: format!("m{id}"),
        };
        let ticket = cache.machine(&hash_of(1)).expect_err("nothing kept before changes are heard");
        cache.put_machine(ticket, &hash_of(1), &machine(10));
        assert!(cache.machine(&hash_of(1)).is_err());
        cache.trust();
        for (hash, id) in [(1, 10), (2, 11)] {
            let ticket = cache.machine(&hash_of(hash)).expect_err("not cached yet");
            cache.put_machine(ticket, &hash_of(hash), &machine(id));
        }
        assert_eq!(cache.machine(&hash_of(1)).unwrap().machine_id, MachineId(10));
        cache.forget_machine(MachineId(10));
        assert!(cache.machine(&hash_of(1)).is_err(), "revoked, removed or reissued");
        assert!(cache.machine(&hash_of(2)).is_ok());
        let ticket = cache.machine(&hash_of(1)).expect_err("gone");
        cache.forget_machine(MachineId(11));
        cache.put_machine(ticket, &hash_of(1), &machine(10));
        assert!(cache.machine(&hash_of(1)).is_err(), "a read that raced a change is not kept");
        cache.distrust();
        assert!(cache.machine(&hash_of(2)).is_err());
    }

    #[test]
    fn a_read_that_raced_a_change_is_not_kept() {
        let cache = SessionCache::default();
        cache.trust();
        let ticket = cache.get(&hash_of(1)).err().unwrap();
        cache.forget_endpoint(EndpointId(1));
        cache.put(ticket, &caller(1, 10, 1));
        assert!(cache.get(&hash_of(1)).is_err());
    }

    #[test]
    fn a_full_cache_drops_its_older_half_and_keeps_taking_new_sessions() {
        let cache = SessionCache::default();
        cache.trust();
        for i in 0..MAX_ENTRIES as i64 {
            let mut c = caller(i, 10, 0);
            c.session_hash = TokenHash::from_stored(i.to_be_bytes().to_vec());
            cached(&cache, &c);
        }
        let newest = caller(-1, 10, 1);
        cached(&cache, &newest);
        let inner = cache.lock();
        assert!(inner.by_hash.len() <= MAX_ENTRIES / 2 + 1, "{} sessions held", inner.by_hash.len());
        assert_eq!(inner.by_endpoint.len(), inner.by_hash.len(), "the endpoint index dropped them too");
        drop(inner);
        assert_eq!(cache.get(&hash_of(1)).map(|c| c.endpoint_id), Ok(EndpointId(-1)), "the new session is held");
    }

    #[test]
    fn a_new_session_of_an_endpoint_replaces_the_old() {
        let cache = SessionCache::default();
        cache.trust();
        cached(&cache, &caller(1, 10, 1));
        cached(&cache, &caller(1, 10, 9));
        assert!(cache.get(&hash_of(1)).is_err());
        assert!(cache.get(&hash_of(9)).is_ok());
    }
}
