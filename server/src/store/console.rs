//! The web console's sessions, and the channel that wakes an account's consoles.

use deadpool_postgres::GenericClient;

use super::row::{Col, FromRow};
use crate::domain::caller::Human;
use crate::domain::ids::TokenHash;
use crate::store::Result;

/// Channel on which triggers (migrations 21 and 25) announce that something an account's people
/// see changed: a card, a hold, a permission request (and, for the previous release, a console
/// session or human token that ended). The payload is the account's id.
pub const ACCOUNT_CHANNEL: &str = "relay_account";

/// Channel on which triggers (migration 28) announce that a console session of an account ended:
/// signed out, or its human revoked, re-keyed or removed. The payload is the account's id.
pub const CONSOLE_CHANNEL: &str = "relay_console";

/// Opens a session for the human `human` of its account, lasting `ttl_s`; false when that human
/// is gone or revoked meanwhile.
pub(crate) async fn insert_session(
    c: &impl GenericClient,
    id_hash: &TokenHash,
    human: &Human,
    ttl_s: f64,
) -> Result<bool> {
    let inserted = c
        .execute(
            "insert into console_sessions (id_hash, human_id, expires_at)
             select $1, h.id, now() + make_interval(secs => $4) from humans h
             where h.account_id = $2 and h.name = $3 and h.revoked_at is null",
            &[&id_hash, &human.account_id, &human.name, &ttl_s],
        )
        .await?;
    Ok(inserted == 1)
}

/// The person a live session belongs to (not expired, its human token not revoked), and how many
/// seconds it has left by the database's clock.
pub(crate) async fn session_person(c: &impl GenericClient, id_hash: &TokenHash) -> Result<Option<(Human, f64)>> {
    let stmt = c
        .prepare_cached(
            "select a.id as account_id, a.name as account, h.name,
                    greatest(extract(epoch from s.expires_at - now()), 0)::float8 as left_s
             from console_sessions s join humans h on h.id = s.human_id join accounts a on a.id = h.account_id
             where s.id_hash = $1 and s.expires_at > now() and h.revoked_at is null",
        )
        .await?;
    let Some(row) = c.query_opt(&stmt, &[&id_hash]).await? else {
        return Ok(None);
    };
    Ok(Some((Human::from_row(&row)?, row.col("left_s")?)))
}

pub(crate) async fn delete_session(c: &impl GenericClient, id_hash: &TokenHash) -> Result<()> {
    c.execute("delete from console_sessions where id_hash = $1", &[&id_hash]).await?;
    Ok(())
}

/// Deletes up to `batch` sessions that can no longer be used: expired, or of a revoked human.
pub(crate) async fn purge_sessions(c: &impl GenericClient, batch: i64) -> Result<u64> {
    let sql = "with doomed as (
                   select s.id_hash from console_sessions s join humans h on h.id = s.human_id
                   where s.expires_at < now() or h.revoked_at is not null
                   limit $1 for update of s skip locked)
               delete from console_sessions s using doomed where s.id_hash = doomed.id_hash";
    Ok(c.execute(sql, &[&batch]).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contacts::{human_by_token, insert_human, revoke_human};
    use crate::store::testing;

    #[tokio::test]
    async fn a_persons_console_session_lives_until_it_is_deleted_or_its_person_is_revoked() {
        let db = testing::db().await;
        let (account_id, _) = db.machine("acme", "laptop").await;
        let c = db.store.client().await.unwrap();
        let token = TokenHash::from_stored(b"human-token".to_vec());
        assert!(insert_human(&c, account_id, "pat", &token).await.unwrap());
        assert!(
            !insert_human(&c, account_id, "pat", &TokenHash::from_stored(b"other".to_vec())).await.unwrap(),
            "one pat"
        );
        let (pat, revoked) = human_by_token(&c, &token).await.unwrap().expect("pat's token");
        assert_eq!((pat.name.as_str(), pat.account.as_str(), revoked), ("pat", "acme", false));

        let (first, second) =
            (TokenHash::from_stored(b"console-1".to_vec()), TokenHash::from_stored(b"console-2".to_vec()));
        assert!(insert_session(&c, &first, &pat, 3600.0).await.unwrap());
        assert!(insert_session(&c, &second, &pat, 3600.0).await.unwrap());
        let (person, left_s) = session_person(&c, &first).await.unwrap().expect("a live session");
        assert!(
            (person.account_id, person.name.as_str()) == (account_id, "pat") && left_s > 3500.0 && left_s <= 3600.0,
            "{person:?} {left_s}"
        );
        delete_session(&c, &first).await.unwrap();
        assert!(session_person(&c, &first).await.unwrap().is_none(), "signed out");
        assert_eq!(purge_sessions(&c, 10).await.unwrap(), 0, "the other still lives");

        assert_eq!(revoke_human(&c, account_id, "pat").await.unwrap(), 1);
        assert!(session_person(&c, &second).await.unwrap().is_none(), "a revoked person's sessions end");
        assert!(!insert_session(&c, &TokenHash::from_stored(b"console-3".to_vec()), &pat, 3600.0).await.unwrap());
        assert_eq!(purge_sessions(&c, 10).await.unwrap(), 1);
        assert!(human_by_token(&c, &token).await.unwrap().expect("still found").1, "and said to be revoked");
    }
}
