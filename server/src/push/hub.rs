//! Local wake-ups per recipient endpoint.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// Wakes the streams and long polls waiting on an endpoint's inbox in this process.
///
/// Each endpoint with waiters has a watch channel whose value is a change counter: a waiter that
/// subscribed before reading the database cannot miss a change made after its read.
#[derive(Clone, Default)]
pub struct Hub {
    inner: Arc<Mutex<HashMap<i64, watch::Sender<u64>>>>,
}

/// A waiter's handle; dropping the last one for an endpoint forgets the endpoint.
pub struct Waiter {
    hub: Hub,
    endpoint: i64,
    rx: watch::Receiver<u64>,
}

impl Hub {
    pub fn waiter(&self, endpoint: i64) -> Waiter {
        let mut map = self.inner.lock().expect("hub lock poisoned");
        let tx = map.entry(endpoint).or_insert_with(|| watch::channel(0).0);
        let rx = tx.subscribe();
        Waiter { hub: self.clone(), endpoint, rx }
    }

    /// Something changed in this endpoint's inbox.
    pub fn wake(&self, endpoint: i64) {
        if let Some(tx) = self.inner.lock().expect("hub lock poisoned").get(&endpoint) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes every waiter, after notifications may have been missed.
    pub fn wake_all(&self) {
        for tx in self.inner.lock().expect("hub lock poisoned").values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().len()
    }
}

impl Waiter {
    /// Resolves at the next wake-up after the last one seen.
    pub async fn changed(&mut self) {
        // The sender lives in the hub as long as this waiter does, so this cannot fail.
        let _ = self.rx.changed().await;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut map = self.hub.inner.lock().expect("hub lock poisoned");
        // This waiter's receiver still counts until the drop completes.
        if map.get(&self.endpoint).is_some_and(|tx| tx.receiver_count() <= 1) {
            map.remove(&self.endpoint);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_wake_reaches_every_waiter_of_the_endpoint_only() {
        let hub = Hub::default();
        let mut a = hub.waiter(1);
        let mut b = hub.waiter(1);
        let mut other = hub.waiter(2);
        hub.wake(1);
        tokio::time::timeout(Duration::from_secs(1), a.changed()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), b.changed()).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(50), other.changed()).await.is_err());
    }

    #[tokio::test]
    async fn a_wake_before_waiting_is_not_lost() {
        let hub = Hub::default();
        let mut a = hub.waiter(1);
        hub.wake(1);
        tokio::time::timeout(Duration::from_secs(1), a.changed()).await.unwrap();
    }

    #[test]
    fn endpoints_are_forgotten_with_their_last_waiter() {
        let hub = Hub::default();
        let a = hub.waiter(7);
        let b = hub.waiter(7);
        drop(a);
        assert_eq!(hub.len(), 1);
        drop(b);
        assert_eq!(hub.len(), 0);
        hub.wake(7);
    }
}
