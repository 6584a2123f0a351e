//! Pushes are recorded together. A stream that pushed messages leaves its inbox's new mark here
//! and goes on; one task per replica writes whatever marks gathered meanwhile with one call of
//! `relay_mark_pushed` (migration 31), one transaction for every inbox that was pushed to, instead
//! of one for each push. A round that cannot be written is kept for the next; what waits when the
//! server stops is written as it stops.
//!
//! A mark is a status the sender reads (`pushed`), never what a stream resumes from (the bridge
//! says where it stands), so a mark lost with its replica only shows a pushed message as queued
//! until it is surfaced; the function does not wait for a disk flush either.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::Notify;

use crate::domain::ids::{EndpointId, Seq};
use crate::store::Result;

/// How long a round of marks gathers before it is written.
const GATHER: Duration = Duration::from_millis(5);
/// How long a round that could not be written waits to be tried again.
const RETRY: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct PushMarks {
    /// Each inbox's highest seq pushed and not yet written.
    waiting: Mutex<HashMap<EndpointId, Seq>>,
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
    pub(super) fn pushed(&self, inbox: EndpointId, through: Seq) {
        if self.keep(std::iter::once((inbox, through))) {
            self.rung.notify_one();
        }
    }

    /// Writes the marks waiting now; `false` when they could not be, and wait for the next round.
    pub(super) async fn write_waiting(&self, pool: &Pool) -> bool {
        let marks = self.take();
        if marks.is_empty() {
            return true;
        }
        match write(pool, &marks).await {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(error = %err, inboxes = marks.len(), "cannot record pushes yet; trying again");
                self.keep(marks);
                false
            }
        }
    }

    /// Keeps each inbox's highest mark; whether nothing waited before.
    fn keep(&self, marks: impl IntoIterator<Item = (EndpointId, Seq)>) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let first = waiting.is_empty();
        for (inbox, through) in marks {
            let mark = waiting.entry(inbox).or_insert(through);
            *mark = (*mark).max(through);
        }
        first
    }

    fn take(&self) -> Vec<(EndpointId, Seq)> {
        let mut waiting = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        let mut marks: Vec<_> = waiting.drain().collect();
        // In inbox order, so that two replicas writing marks of the same inboxes lock them in one order.
        marks.sort_unstable();
        marks
    }

    fn is_empty(&self) -> bool {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    async fn run(self: Arc<Self>, pool: Pool) {
        loop {
            // A mark left after this look rings, and the ring is kept until it is waited for.
            if self.is_empty() {
                self.rung.notified().await;
            }
            // Marks of other streams gather meanwhile: one statement records them all.
            tokio::time::sleep(GATHER).await;
            if !self.write_waiting(&pool).await {
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

async fn write(pool: &Pool, marks: &[(EndpointId, Seq)]) -> Result<()> {
    let client = pool.get().await?;
    let (inboxes, through): (Vec<EndpointId>, Vec<Seq>) = marks.iter().copied().unzip();
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
        assert!(marks.keep([(EndpointId(7), Seq(3))]), "the first of a round rings");
        assert!(!marks.keep([(EndpointId(2), Seq(9)), (EndpointId(7), Seq(5))]));
        assert!(!marks.keep([(EndpointId(7), Seq(4))]));
        assert_eq!(marks.take(), [(EndpointId(2), Seq(9)), (EndpointId(7), Seq(5))]);
        assert!(marks.take().is_empty(), "taken once");
    }

    #[test]
    fn a_round_kept_for_the_next_loses_nothing_to_the_marks_left_meanwhile() {
        let marks = PushMarks::default();
        marks.keep([(EndpointId(1), Seq(8))]);
        let failed = marks.take();
        marks.keep([(EndpointId(1), Seq(6)), (EndpointId(3), Seq(2))]);
        marks.keep(failed);
        assert_eq!(marks.take(), [(EndpointId(1), Seq(8)), (EndpointId(3), Seq(2))]);
    }
}
