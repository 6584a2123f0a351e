//! What the ops port asks of the replica: whether it should get traffic, and the figures read
//! from the database when metrics are scraped.

use std::time::Duration;

use super::Core;
use crate::domain::retention::Retention;
use crate::metrics::{ApprovalLabel, metrics};
use crate::store::{self, observe};

/// What the ops port and the scheduler ask of the replica: readiness, figures, purges.
#[derive(Clone)]
pub struct OpsService {
    pub(super) core: Core,
    /// How long records are kept (see [`OpsService::purge`]).
    pub(super) retention: Retention,
}

impl OpsService {
    pub(super) fn new(core: Core, retention: Retention) -> Self {
        Self { core, retention }
    }

    /// The periods the scheduler keeps.
    pub fn timings(&self) -> crate::domain::timings::Timings {
        self.core.timings()
    }

    /// What the scheduler's round has to do now (one read).
    pub async fn due_work(&self) -> crate::domain::Result<crate::store::due::DueWork> {
        self.core.due_work().await
    }
}

/// How long a probe or a scrape waits for the database.
const DB_WAIT: Duration = Duration::from_secs(2);

impl OpsService {
    /// Why the replica should get no traffic now, if it should not: shutdown has begun, the
    /// database's notifications are not heard, or the database does not answer.
    pub async fn not_ready(&self) -> Option<String> {
        if self.core.shutdown.is_cancelled() {
            return Some("shutting down".into());
        }
        if !*self.core.store.heard().borrow() {
            return Some("the notification connection to the database is down".into());
        }
        match self.core.store.check(DB_WAIT).await {
            Ok(()) => None,
            Err(e) => Some(format!("the database does not answer: {e}")),
        }
    }

    /// Brings the gauges read on demand up to date: the pool and sessions from memory, waiting
    /// approvals from the database (on failure the last figures stay, and it is logged).
    pub async fn refresh_metrics(&self) {
        self.core.store.observe_pool();
        if let Some(waiting) =
            self.figure("waiting approvals", |c| async move { observe::approvals_waiting(&c).await }).await
        {
            for (state, n) in waiting {
                metrics().approvals_waiting.get_or_create(&ApprovalLabel { state: state.as_db() }).set(n);
            }
        }
        let standing = self.figure("standing claims", |c| async move { store::claims::standing_count(&c).await });
        if let Some(n) = standing.await {
            metrics().claims_standing.set(n);
        }
        let queued = self.figure("messages queued for search", |c| async move { store::search::queued(&c).await });
        if let Some(n) = queued.await {
            metrics().search_queued.set(n);
        }
    }

    /// One figure read from the database for a scrape, within [`DB_WAIT`]; `None`, logged, when it
    /// cannot be read (the metric keeps its last value).
    async fn figure<T, F, Fut>(&self, what: &str, read: F) -> Option<T>
    where
        F: FnOnce(deadpool_postgres::Object) -> Fut,
        Fut: std::future::Future<Output = crate::store::Result<T>>,
    {
        let read = tokio::time::timeout(DB_WAIT, async { read(self.core.store.client().await?).await }).await;
        match read {
            Ok(Ok(value)) => Some(value),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, what, "cannot read a figure for metrics");
                None
            }
            Err(_) => {
                tracing::warn!(what, "reading a figure for metrics took too long");
                None
            }
        }
    }
}
