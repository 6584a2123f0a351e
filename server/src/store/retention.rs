//! Purging what outlived its retention, one bounded batch per statement. Each batch takes the
//! oldest rows it can lock (`skip locked`), so replicas purging at once share the work.

use deadpool_postgres::GenericClient;

use super::messages::READ;
use super::trust::HOLD_PENDING;
use crate::domain::board::Column;
use crate::store::Result;

const DONE: &str = Column::Done.db();

/// Deletes up to `batch` messages older than `age_s` that nobody still has to read: every delivery
/// read or withdrawn, no hold waiting for the human. Their deliveries and decided holds go with them.
pub(crate) async fn purge_messages(c: &impl GenericClient, age_s: f64, batch: i64) -> Result<u64> {
    let sql = format!(
        "with doomed as (
             select m.id from messages m
             where m.created_at < now() - make_interval(secs => $1)
               and not exists (select 1 from deliveries d where d.message_id = m.id and d.state < {READ})
               and not exists (select 1 from holds h where h.message_id = m.id and h.state = '{HOLD_PENDING}')
             order by m.created_at
             limit $2
             for update skip locked)
         delete from messages m using doomed where m.id = doomed.id"
    );
    Ok(c.execute(&sql, &[&age_s, &batch]).await?)
}

/// Deletes up to `batch` cards closed in Done more than `age_s` ago whose worktree is gone (a worker
/// still has to clean up the others); their approvals go with them.
pub(crate) async fn purge_cards(c: &impl GenericClient, age_s: f64, batch: i64) -> Result<u64> {
    let sql = format!(
        "with doomed as (
             select id from jobs
             where state = '{DONE}' and closed_at < now() - make_interval(secs => $1)
               and (worktree is null or worktree_removed)
             order by closed_at
             limit $2
             for update skip locked)
         delete from jobs j using doomed where j.id = doomed.id"
    );
    Ok(c.execute(&sql, &[&age_s, &batch]).await?)
}

/// Deletes up to `batch` records of peeks older than `age_s`.
pub(crate) async fn purge_peeks(c: &impl GenericClient, age_s: f64, batch: i64) -> Result<u64> {
    let sql = "with doomed as (
                   select id from peeks where at < now() - make_interval(secs => $1)
                   order by at limit $2 for update skip locked)
               delete from peeks p using doomed where p.id = doomed.id";
    Ok(c.execute(sql, &[&age_s, &batch]).await?)
}
