//! What the ops port asks of the replica: whether it should get traffic, and the figures read
//! from the database when metrics are scraped.

use std::time::Duration;

use super::App;
use crate::metrics::{ApprovalLabel, metrics};
use crate::store::observe;

/// How long a probe or a scrape waits for the database.
const DB_WAIT: Duration = Duration::from_secs(2);

impl App {
    /// Why the replica should get no traffic now, if it should not: shutdown has begun, the
    /// database's notifications are not heard, or the database does not answer.
    pub async fn not_ready(&self) -> Option<String> {
        if self.shutdown.is_cancelled() {
            return Some("shutting down".into());
        }
        if !*self.store.heard().borrow() {
            return Some("the notification connection to the database is down".into());
        }
        match self.store.check(DB_WAIT).await {
            Ok(()) => None,
            Err(e) => Some(format!("the database does not answer: {e}")),
        }
    }

    /// Brings the gauges read on demand up to date: the pool and sessions from memory, waiting
    /// approvals from the database (on failure the last figures stay, and it is logged).
    pub async fn refresh_metrics(&self) {
        self.store.observe_pool();
        let read = tokio::time::timeout(DB_WAIT, async {
            let client = self.store.client().await?;
            observe::approvals_waiting(&client).await
        })
        .await;
        match read {
            Ok(Ok(waiting)) => {
                for (state, n) in waiting {
                    metrics().approvals_waiting.get_or_create(&ApprovalLabel { state: state.as_db() }).set(n);
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot read waiting approvals for metrics"),
            Err(_) => tracing::warn!("reading waiting approvals for metrics took too long"),
        }
    }
}
