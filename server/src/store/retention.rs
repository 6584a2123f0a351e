//! Purging what outlived its retention, one bounded batch per statement. Each batch takes the
//! oldest rows it can lock (`skip locked`), so replicas purging at once share the work.

use deadpool_postgres::GenericClient;

use super::messages::READ;
use super::trust::HOLD_PENDING;
use crate::domain::board::Column;
use crate::store::Result;

const DONE: &str = Column::Done.db();

/// Deletes up to `batch` messages older than `age_s` that nobody still has to read: every delivery
/// read or withdrawn, no hold waiting for the human. Their deliveries, decided holds and links to
/// their files go with them (the files' contents, once nothing refers to them, with the files'
/// purge).
pub(crate) async fn purge_messages(c: &impl GenericClient, age_s: f64, batch: i64) -> Result<u64> {
    let sql = format!(
        "with doomed as (
             select m.id from messages m
             where m.created_at < now() - make_interval(secs => $1)
               and not exists (select 1 from deliveries d where d.message_id = m.id and d.state < {READ})
               and not exists (select 1 from holds h where h.message_id = m.id and h.state = '{HOLD_PENDING}')
             order by m.created_at
             limit $2
             for update skip locked),
         files as (delete from message_artifacts a using doomed where a.message_id = doomed.id)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::delivery::State;
    use crate::domain::ids::Seq;
    use crate::store::messages::{Target, advance};
    use crate::store::testing;

    #[tokio::test]
    async fn old_done_cards_without_a_worktree_and_old_peek_records_are_purged() {
        let db = testing::db().await;
        let (account_id, machine) = db.machine("acme", "laptop").await;
        let bob = db.endpoint(machine, "bob", 0).await;
        let (cleaned, dirty, open) = (
            db.card(account_id, machine, "c1").await,
            db.card(account_id, machine, "c2").await,
            db.card(account_id, machine, "c3").await,
        );
        let c = db.store.client().await.unwrap();
        for id in [&cleaned, &dirty] {
            crate::store::board::set_done(&c, id).await.unwrap();
        }
        c.execute("update jobs set worktree = '/wt/c2' where id = $1", &[&dirty]).await.unwrap();
        assert_eq!(purge_cards(&c, 3600.0, 10).await.unwrap(), 0, "closed just now");
        c.execute("update jobs set closed_at = now() - interval '2 hours' where closed_at is not null", &[])
            .await
            .unwrap();
        assert_eq!(purge_cards(&c, 3600.0, 10).await.unwrap(), 1, "the one whose worktree is gone");
        let left: Vec<String> =
            c.query("select id from jobs order by id", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
        assert_eq!(left, [dirty.to_string(), open.to_string()]);

        crate::store::trust::insert_peek(&c, bob, "acme/laptop/ann", 2).await.unwrap();
        crate::store::trust::insert_peek(&c, bob, "acme/laptop/cid", 2).await.unwrap();
        c.execute("update peeks set at = now() - interval '2 hours' where peeker = 'acme/laptop/ann'", &[])
            .await
            .unwrap();
        assert_eq!(purge_peeks(&c, 3600.0, 10).await.unwrap(), 1);
        assert_eq!(crate::store::trust::peekers(&c, bob).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn only_old_messages_nobody_has_to_read_any_more_are_purged_in_bounded_batches() {
        let db = testing::db().await;
        let (account_id, machine) = db.machine("acme", "laptop").await;
        let (ann, bob) = (db.endpoint(machine, "ann", 0).await, db.endpoint(machine, "bob", 0).await);
        let c = db.store.client().await.unwrap();
        let to_bob = [Target { id: bob, address: "acme/laptop/bob".into(), account_id }];
        for text in ["read", "also read", "unread"] {
            db.send(ann, &to_bob, text, None, None).await;
        }
        advance(&c, bob, &[Seq(1), Seq(2)], State::Read).await.unwrap();
        let held = db.send(ann, &[], "waiting for the human", None, None).await;
        c.execute(
            "insert into holds (id, account_id, message_id, class, recipients) values ('h1', $1, $2, 'contact', $3)",
            &[&account_id, &held, &vec![bob]],
        )
        .await
        .unwrap();
        let count = async || -> i64 { c.query_one("select count(*) from messages", &[]).await.unwrap().get(0) };

        assert_eq!(purge_messages(&c, 3600.0, 10).await.unwrap(), 0, "nothing is old yet");
        c.execute("update messages set created_at = now() - interval '2 hours'", &[]).await.unwrap();
        assert_eq!(purge_messages(&c, 3600.0, 1).await.unwrap(), 1, "one batch of one");
        assert_eq!(purge_messages(&c, 3600.0, 10).await.unwrap(), 1, "the other read one");
        assert_eq!(purge_messages(&c, 3600.0, 10).await.unwrap(), 0);
        assert_eq!(count().await, 2, "the unread one and the held one stay");
        let deliveries: i64 = c.query_one("select count(*) from deliveries", &[]).await.unwrap().get(0);
        assert_eq!(deliveries, 1, "the purged messages' deliveries went with them");
    }
}
