//! What the ops port reads from the database when it is scraped; nothing here runs otherwise.

use deadpool_postgres::GenericClient;

use super::row::Col;
use crate::domain::trust::ApprovalState;
use crate::store::Result;

/// Permission requests waiting for a decision, by state (pending or escalated); one index scan of
/// the open ones.
pub(crate) async fn approvals_waiting(c: &impl GenericClient) -> Result<Vec<(ApprovalState, i64)>> {
    let open = [ApprovalState::Pending, ApprovalState::Escalated];
    let names: Vec<&str> = open.iter().map(|s| s.as_db()).collect();
    let rows = c
        .query("select state, count(*) as waiting from approvals where state = any($1) group by state", &[&names])
        .await?;
    // Both states are reported, at 0 when none waits, so a dashboard's series never vanish.
    let mut waiting: Vec<(ApprovalState, i64)> = open.into_iter().map(|s| (s, 0)).collect();
    for row in rows {
        let state = ApprovalState::from_db(row.col::<&str>("state")?)?;
        if let Some(entry) = waiting.iter_mut().find(|(s, _)| *s == state) {
            entry.1 = row.col("waiting")?;
        }
    }
    Ok(waiting)
}
