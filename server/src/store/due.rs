//! What the scheduler's round finds to do, in one read: an idle replica asks this once a round and
//! nothing more.

use deadpool_postgres::GenericClient;

use super::row::{Col, FromRow};
use super::{approvals, board};
use crate::store::Result;
use tokio_postgres::Row;

/// Which of the round's jobs have work waiting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DueWork {
    pub schedules: bool,
    pub leases: bool,
    pub approvals: bool,
    /// Messages wait to be indexed for search.
    pub search: bool,
}

/// One round trip, each question an index probe: due schedules, lapsed leases, permission requests
/// past a deadline (`approval_wait_s` being the default wait of the previous release's requests),
/// messages queued for search.
/// Prepared once a connection: asked every round, it would otherwise be parsed and planned each time.
pub(crate) async fn probe(c: &impl GenericClient, approval_wait_s: f64) -> Result<DueWork> {
    let sql = format!(
        "select exists (select 1 from jobs j where {}) as schedules,
                exists (select 1 from jobs j where {}) as leases,
                exists (select 1 from approvals a where {}) as approvals,
                exists (select 1 from search_queue) as search",
        board::schedule_due(),
        board::lease_lapsed(),
        approvals::request_due()
    );
    let stmt = c.prepare_cached(&sql).await?;
    let row = c.query_one(&stmt, &[&approval_wait_s]).await?;
    DueWork::from_row(&row)
}

impl FromRow for DueWork {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(DueWork {
            schedules: row.col("schedules")?,
            leases: row.col("leases")?,
            approvals: row.col("approvals")?,
            search: row.col("search")?,
        })
    }
}
