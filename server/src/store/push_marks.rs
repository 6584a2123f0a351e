//! Pushes are recorded together. A stream that pushed messages leaves its inbox's new mark here
//! and goes on; one task per replica writes whatever marks gathered meanwhile with one call of
//! `relay_mark_pushed` (migration 31), one transaction for every inbox that was pushed to, instead
//! of one for each push.
//!
//! A mark is a status the sender reads (`pushed`), never what a stream resumes from (the bridge
//! says where it stands), so a mark lost with its replica only shows a pushed message as queued
//! until it is surfaced; the function does not wait for a disk flush either.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use tokio::sync::Notify;

use crate::domain::Result;
use crate::domain::ids::EndpointId;

/// How long a round of marks gathers before it is written.
const GATHER: std::time::Duration = std::time::Duration::from_millis(5);

#[derive(Default)]
pub(super) struct PushMarks {
    /// Each inbox's highest seq pushed and not yet written.
    waiting: Mutex<HashMap<EndpointId, i64>>,
    /// Rung when the first mark of a round is left.
    rung: Notify,
}

impl PushMarks {
    /// Starts the task that writes the marks.
    pub(super) fn start(pool: Pool) -> Arc<Self> {
        let marks = Arc::new(Self::default());
        tokio::spawn(marks.clone().run(pool));
        marks
    }

    /// Every delivery of `inbox` up to `through` reached its bridge.
    pub(super) fn pushed(&self, inbox: EndpointId, through: i64) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let first = waiting.is_empty();
        let mark = waiting.entry(inbox).or_insert(through);
        *mark = (*mark).max(through);
        drop(waiting);
        if first {
            self.rung.notify_one();
        }
    }

    fn take(&self) -> Vec<(EndpointId, i64)> {
        let mut waiting = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        let mut marks: Vec<_> = waiting.drain().collect();
        // In inbox order, so that two replicas writing marks of the same inboxes lock them in one order.
        marks.sort_unstable();
        marks
    }

    async fn run(self: Arc<Self>, pool: Pool) {
        loop {
            self.rung.notified().await;
            // Marks of other streams gather meanwhile: one statement records them all.
            tokio::time::sleep(GATHER).await;
            let marks = self.take();
            if marks.is_empty() {
                continue;
            }
            if let Err(err) = write(&pool, &marks).await {
                tracing::warn!(error = %err, inboxes = marks.len(), "cannot record pushes; their senders see them queued until surfaced");
            }
        }
    }
}

async fn write(pool: &Pool, marks: &[(EndpointId, i64)]) -> Result<()> {
    let client = pool.get().await?;
    let (inboxes, through): (Vec<EndpointId>, Vec<i64>) = marks.iter().copied().unzip();
    let stmt = client.prepare_cached("select relay_mark_pushed($1, $2)").await?;
    client.execute(&stmt, &[&inboxes, &through]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_gathered_meanwhile_keep_each_inboxs_highest_in_inbox_order() {
        let marks = PushMarks::default();
        marks.pushed(EndpointId(7), 3);
        marks.pushed(EndpointId(2), 9);
        marks.pushed(EndpointId(7), 5);
        marks.pushed(EndpointId(7), 4);
        assert_eq!(marks.take(), [(EndpointId(2), 9), (EndpointId(7), 5)]);
        assert!(marks.take().is_empty(), "taken once");
    }
}
