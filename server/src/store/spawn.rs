//! Spawn trees: a child endpoint reserved for a worker, claimed by the worker's own bridge with a
//! one-time grant, and the worker's final report sent to its parent as the child.

use deadpool_postgres::GenericClient;

use super::row::Col;
use crate::domain::Error;
use crate::domain::caller::MachineIdentity;
use crate::domain::ids::{self, EndpointId, MachineId, TokenHash, TokenKind};
use crate::store::Result;

/// How long a reserved child endpoint waits for its worker's bridge before its handle is free again.
const RESERVATION_S: f64 = 600.0;

/// Handles on the machine that start with `<parent handle>-`, which a child's handle must avoid.
pub(crate) async fn child_handles(c: &impl GenericClient, machine_id: MachineId, parent: &str) -> Result<Vec<String>> {
    c.query("select handle from endpoints where machine_id = $1 and handle like $2 || '-%'", &[&machine_id, &parent])
        .await?
        .iter()
        .map(|r| r.only())
        .collect()
}

/// Inserts the child endpoint reserved for a worker, claimable with the grant for
/// [`RESERVATION_S`]; its id.
pub(crate) async fn insert_child(
    c: &impl GenericClient,
    machine_id: MachineId,
    handle: &str,
    harness: &str,
    parent: EndpointId,
    grant_hash: &TokenHash,
) -> Result<EndpointId> {
    c.query_one(
        "insert into endpoints (machine_id, handle, harness, parent_id, spawn_grant_hash, online_until, last_seen_at)
         values ($1, $2, $3, $4, $5, now() + $6 * interval '1 second', now())
         returning id",
        &[&machine_id, &handle, &harness, &parent, &grant_hash, &RESERVATION_S],
    )
    .await?
    .only()
}

/// The endpoint an unspent grant reserved, on a machine not revoked, and its parent (`None` once
/// the parent is gone).
pub(crate) async fn grant_holder(
    c: &impl GenericClient,
    grant_hash: &TokenHash,
) -> Result<Option<(EndpointId, Option<EndpointId>)>> {
    c.query_opt(
        "select e.id, e.parent_id
         from endpoints e join machines m on m.id = e.machine_id
         where e.spawn_grant_hash = $1 and m.revoked_at is null",
        &[&grant_hash],
    )
    .await?
    .map(|r| Ok((r.col("id")?, r.col("parent_id")?)))
    .transpose()
}

/// The address of an endpoint that exists.
pub(crate) async fn address_of(c: &impl GenericClient, id: EndpointId) -> Result<String> {
    c.query_one("select address from endpoint_addresses where id = $1", &[&id]).await?.only()
}

/// Spends the child's grant: its report is sent.
pub(crate) async fn spend_grant(c: &impl GenericClient, child: EndpointId) -> Result<()> {
    c.execute("update endpoints set spawn_grant_hash = null where id = $1", &[&child]).await?;
    Ok(())
}

/// The endpoint a spawn grant reserved, on the machine presenting it.
pub(crate) async fn granted_endpoint(
    client: &impl GenericClient,
    machine: &MachineIdentity,
    grant: &str,
) -> Result<EndpointId> {
    ids::check_token(TokenKind::SpawnGrant, grant)?;
    client
        .query_opt(
            "select id from endpoints where spawn_grant_hash = $1 and machine_id = $2",
            &[&ids::token_hash(grant), &machine.machine_id],
        )
        .await?
        .ok_or_else(|| Error::Unauthenticated("unknown or used spawn grant".into()))?
        .only()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreError, testing};

    #[tokio::test]
    async fn a_spawn_grant_opens_its_child_on_its_own_machine_only_until_it_is_spent() {
        let db = testing::db().await;
        let (account_id, machine_id) = db.machine("acme", "laptop").await;
        let (_, desk) = db.machine("acme", "desk").await;
        let parent = db.endpoint(machine_id, "lead", 0).await;
        let c = db.store.client().await.unwrap();
        let grant = ids::new_token(TokenKind::SpawnGrant);
        let hash = ids::token_hash(&grant);
        assert!(child_handles(&c, machine_id, "lead").await.unwrap().is_empty());
        let child = insert_child(&c, machine_id, "lead-1", "claude-code", parent, &hash).await.unwrap();
        assert_eq!(child_handles(&c, machine_id, "lead").await.unwrap(), ["lead-1"]);
        assert_eq!(address_of(&c, child).await.unwrap(), "acme/laptop/lead-1");
        assert_eq!(grant_holder(&c, &hash).await.unwrap(), Some((child, Some(parent))));

        let laptop = MachineIdentity { machine_id, machine: "laptop".into(), account_id, account: "acme".into() };
        let elsewhere = MachineIdentity { machine_id: desk, machine: "desk".into(), ..laptop.clone() };
        assert_eq!(granted_endpoint(&c, &laptop, &grant).await.unwrap(), child);
        let unknown = |e: StoreError| matches!(Error::from(e), Error::Unauthenticated(_));
        assert!(
            unknown(granted_endpoint(&c, &elsewhere, &grant).await.unwrap_err()),
            "only on the machine it was made for"
        );
        assert!(granted_endpoint(&c, &laptop, "not-a-grant").await.is_err());
        spend_grant(&c, child).await.unwrap();
        assert!(unknown(granted_endpoint(&c, &laptop, &grant).await.unwrap_err()), "spent");
        assert_eq!(grant_holder(&c, &hash).await.unwrap(), None);
    }
}
