//! Replica liveness: one row per running server, renewed every few seconds. Endpoints whose push
//! stream a replica holds are online while its row is alive.

use std::sync::atomic::Ordering;

use super::Store;
use super::row::Col;
use crate::domain::ids::ReplicaId;
use crate::domain::presence;
use crate::store::Result;

impl Store {
    /// The replica this store's push streams belong to; 0 before [`Store::register_replica`].
    pub fn replica(&self) -> ReplicaId {
        ReplicaId(self.replica.load(Ordering::Relaxed))
    }

    /// Takes a liveness row for this process; its streams count from now on. Rows of replicas dead
    /// for a day are cleared on the way.
    pub async fn register_replica(&self) -> Result<ReplicaId> {
        let client = self.client().await?;
        client.execute("delete from replicas where alive_until < now() - interval '1 day'", &[]).await?;
        let lease = presence::secs(presence::REPLICA_LEASE);
        let id: ReplicaId = client
            .query_one(
                "insert into replicas (alive_until) values (now() + $1 * interval '1 second') returning id",
                &[&lease],
            )
            .await?
            .only()?;
        self.replica.store(id.0, Ordering::Relaxed);
        Ok(id)
    }

    /// Extends this replica's liveness. A row cleared meanwhile (this replica was given up for dead)
    /// is taken again under the same id, so its streams count again.
    pub async fn renew_replica(&self) -> Result<()> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "insert into replicas (id, alive_until) overriding system value
                 values ($1, now() + $2 * interval '1 second')
                 on conflict (id) do update set alive_until = excluded.alive_until",
            )
            .await?;
        client.execute(&stmt, &[&self.replica(), &presence::secs(presence::REPLICA_LEASE)]).await?;
        Ok(())
    }

    /// A replica stopping: the endpoints whose streams it held go offline at once.
    pub async fn retire_replica(&self) -> Result<()> {
        let client = self.client().await?;
        client.execute("delete from replicas where id = $1", &[&self.replica()]).await?;
        Ok(())
    }
}

/// Whether replica `id` is alive: its row renewed within its lease.
pub(crate) async fn alive(c: &impl deadpool_postgres::GenericClient, id: ReplicaId) -> Result<bool> {
    let stmt = c.prepare_cached("select exists (select 1 from replicas where id = $1 and alive_until > now())").await?;
    c.query_one(&stmt, &[&id]).await?.only()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[tokio::test]
    async fn a_replica_is_alive_from_its_registration_until_it_retires() {
        let db = testing::db().await;
        let id = db.store.register_replica().await.unwrap();
        assert_eq!(db.store.replica(), id);
        let c = db.store.client().await.unwrap();
        assert!(alive(&c, id).await.unwrap());
        assert!(!alive(&c, ReplicaId(id.0 + 1000)).await.unwrap(), "no other replica is");
        db.store.retire_replica().await.unwrap();
        assert!(!alive(&c, id).await.unwrap());
        // Renewed after it was given up for dead, it takes its row again.
        db.store.renew_replica().await.unwrap();
        assert!(alive(&c, id).await.unwrap());
    }
}
