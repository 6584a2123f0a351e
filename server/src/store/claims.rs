//! Path claims: which agents are changing which paths of which repository. A claim stands while
//! its time lasts and, unless kept, while the session that made it lives; every read here asks
//! that (`STANDS`), so nothing needs to run when a claim lapses. Who may see whose claims and what
//! collides is the application's (`app::claims`).

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::row::{Col, FromRow};
use crate::domain::caller::Caller;
use crate::domain::claims::{Claim, PathGlob, RepoKey, Wanted};
use crate::domain::ids::{AccountId, ClaimId, EndpointId};
use crate::store::{Result, Tx};

/// Whether claim `c` of endpoint `e` still stands: within its time, and while the session that made
/// it lives, or (a card's claim) while the card's attempt is in progress.
const STANDS: &str = "c.until > now() and (c.session_hash is null or c.session_hash = e.session_hash) \
     and (c.job_token_hash is null or exists (select 1 from jobs j where j.job_token_hash = c.job_token_hash \
     and j.state = 'in_progress'))";

const COLUMNS: &str = "c.id, c.endpoint_id, c.account_id, ea.address, c.repo, c.paths, c.exclusive, c.reason, \
     c.since, c.until, c.session_hash is null as kept";

impl FromRow for Claim {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Claim {
            id: row.col("id")?,
            holder_id: row.col("endpoint_id")?,
            account_id: row.col("account_id")?,
            holder: row.col("address")?,
            repo: RepoKey::stored(row.col("repo")?),
            paths: row.col::<Vec<String>>("paths")?.into_iter().map(PathGlob::stored).collect(),
            exclusive: row.col("exclusive")?,
            reason: row.col("reason")?,
            since: row.col("since")?,
            until: row.col("until")?,
            kept: row.col("kept")?,
        })
    }
}

/// Holds claims in `repo` still until the transaction ends: two agents claiming in one repository
/// at once are decided one after the other.
pub(crate) async fn lock_repo(tx: &Tx<'_>, repo: &RepoKey) -> Result<()> {
    let stmt = tx.prepare_cached("select pg_advisory_xact_lock(hashtextextended('path_claims:' || $1, 0))").await?;
    tx.execute(&stmt, &[&repo.as_str()]).await?;
    Ok(())
}

/// The claims standing in `repo` held by endpoints of `accounts`, oldest first.
pub(crate) async fn standing_in(c: &impl GenericClient, repo: &RepoKey, accounts: &[AccountId]) -> Result<Vec<Claim>> {
    let stmt = c
        .prepare_cached(&format!(
            "select {COLUMNS} from path_claims c
             join endpoints e on e.id = c.endpoint_id join endpoint_addresses ea on ea.id = c.endpoint_id
             where c.repo = $1 and c.account_id = any($2) and {STANDS}
             order by c.since, c.id"
        ))
        .await?;
    c.query(&stmt, &[&repo.as_str(), &accounts]).await?.iter().map(Claim::from_row).collect()
}

/// The claims standing held by endpoints of `accounts`, in `repo` when given, of `holder` when
/// given: newest first, at most `limit`.
pub(crate) async fn list(
    c: &impl GenericClient,
    accounts: &[AccountId],
    repo: Option<&RepoKey>,
    holder: Option<EndpointId>,
    limit: usize,
) -> Result<Vec<Claim>> {
    let stmt = c
        .prepare_cached(&format!(
            "select {COLUMNS} from path_claims c
             join endpoints e on e.id = c.endpoint_id join endpoint_addresses ea on ea.id = c.endpoint_id
             where c.account_id = any($1) and ($2::text is null or c.repo = $2)
               and ($3::bigint is null or c.endpoint_id = $3) and {STANDS}
             order by c.since desc, c.id desc limit $4"
        ))
        .await?;
    let repo = repo.map(RepoKey::as_str);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    c.query(&stmt, &[&accounts, &repo, &holder, &limit]).await?.iter().map(Claim::from_row).collect()
}

/// Makes the caller's claim: renews its standing claim on the same paths of the repository (a new
/// time, reason and kind), else adds one. Whether it was renewed.
pub(crate) async fn put(tx: &Tx<'_>, caller: &Caller, wanted: &Wanted) -> Result<(Claim, bool)> {
    let paths: Vec<&str> = wanted.paths.iter().map(PathGlob::as_str).collect();
    let session = wanted.attempt.is_none().then_some(&caller.session_hash);
    let ttl = f64::from(wanted.ttl_s);
    let renew = tx
        .prepare_cached(&format!(
            "update path_claims c set until = now() + make_interval(secs => $4), exclusive = $5, reason = $6,
                    session_hash = $7, job_token_hash = $8
             from endpoints e
             where e.id = c.endpoint_id and c.endpoint_id = $1 and c.repo = $2 and c.paths = $3 and {STANDS}
             returning c.id"
        ))
        .await?;
    let renewed: Option<ClaimId> = tx
        .query_opt(
            &renew,
            &[
                &caller.endpoint_id,
                &wanted.repo.as_str(),
                &paths,
                &ttl,
                &wanted.exclusive,
                &wanted.reason,
                &session,
                &wanted.attempt,
            ],
        )
        .await?
        .map(|r| r.only())
        .transpose()?;
    let id = match renewed {
        Some(id) => id,
        None => {
            let insert = tx
                .prepare_cached(
                    "insert into path_claims (endpoint_id, account_id, session_hash, repo, paths, exclusive, reason, until,
                                              job_token_hash)
                     values ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8), $9)
                     returning id",
                )
                .await?;
            tx.query_one(
                &insert,
                &[
                    &caller.endpoint_id,
                    &caller.account_id,
                    &session,
                    &wanted.repo.as_str(),
                    &paths,
                    &wanted.exclusive,
                    &wanted.reason,
                    &ttl,
                    &wanted.attempt,
                ],
            )
            .await?
            .only()?
        }
    };
    Ok((by_id(tx, id).await?.expect("a claim just written stands"), renewed.is_some()))
}

/// A standing claim by id.
pub(crate) async fn by_id(c: &impl GenericClient, id: ClaimId) -> Result<Option<Claim>> {
    let stmt = c
        .prepare_cached(&format!(
            "select {COLUMNS} from path_claims c
             join endpoints e on e.id = c.endpoint_id join endpoint_addresses ea on ea.id = c.endpoint_id
             where c.id = $1 and {STANDS}"
        ))
        .await?;
    c.query_opt(&stmt, &[&id]).await?.as_ref().map(Claim::from_row).transpose()
}

/// Ends the holder's standing claims: `claim` alone when given, else those in `repo` when given,
/// else all of them. The claims ended.
pub(crate) async fn release(
    c: &impl GenericClient,
    holder: EndpointId,
    claim: Option<ClaimId>,
    repo: Option<&RepoKey>,
) -> Result<Vec<Claim>> {
    let stmt = c
        .prepare_cached(&format!(
            "with gone as (
                 delete from path_claims c using endpoints e
                 where e.id = c.endpoint_id and c.endpoint_id = $1 and ($2::bigint is null or c.id = $2)
                   and ($3::text is null or c.repo = $3) and {STANDS}
                 returning c.*
             )
             select c.id, c.endpoint_id, c.account_id, ea.address, c.repo, c.paths, c.exclusive, c.reason,
                    c.since, c.until, c.session_hash is null as kept
             from gone c join endpoint_addresses ea on ea.id = c.endpoint_id
             order by c.since, c.id"
        ))
        .await?;
    let repo = repo.map(RepoKey::as_str);
    c.query(&stmt, &[&holder, &claim, &repo]).await?.iter().map(Claim::from_row).collect()
}

/// Takes `paths` out of the holder's standing claims (in `repo` when given); a claim left with none
/// ends. The claims changed, as they were before.
pub(crate) async fn release_paths(
    tx: &Tx<'_>,
    holder: &Caller,
    repo: Option<&RepoKey>,
    paths: &[PathGlob],
) -> Result<Vec<Claim>> {
    let paths: Vec<&str> = paths.iter().map(PathGlob::as_str).collect();
    let touched = list(tx, &[holder.account_id], repo, Some(holder.endpoint_id), usize::MAX).await?;
    let touched: Vec<Claim> =
        touched.into_iter().filter(|c| c.paths.iter().any(|p| paths.contains(&p.as_str()))).collect();
    let ids: Vec<ClaimId> = touched.iter().map(|c| c.id).collect();
    tx.execute(
        "update path_claims set paths = array(select p from unnest(paths) p where p <> all($2)) where id = any($1)",
        &[&ids, &paths],
    )
    .await?;
    tx.execute("delete from path_claims where id = any($1) and cardinality(paths) = 0", &[&ids]).await?;
    Ok(touched)
}

/// Records that `claimant` ran into `claim`: whether its holder should be told now (not told of
/// this claimant in the last ten minutes).
pub(crate) async fn bump(tx: &Tx<'_>, claim: ClaimId, claimant: EndpointId) -> Result<bool> {
    let stmt = tx
        .prepare_cached(
            "insert into path_claim_bumps (claim_id, endpoint_id) values ($1, $2)
             on conflict (claim_id, endpoint_id) do update set told_at = now()
               where path_claim_bumps.told_at < now() - interval '10 minutes'
             returning 1",
        )
        .await?;
    Ok(tx.query_opt(&stmt, &[&claim, &claimant]).await?.is_some())
}

/// Deletes the claims in `repo` that no longer stand (any repository when `None`); how many.
pub(crate) async fn purge_lapsed(c: &impl GenericClient, repo: Option<&RepoKey>) -> Result<u64> {
    let stmt = c
        .prepare_cached(&format!(
            "delete from path_claims c using endpoints e
             where e.id = c.endpoint_id and ($1::text is null or c.repo = $1) and not ({STANDS})"
        ))
        .await?;
    Ok(c.execute(&stmt, &[&repo.map(RepoKey::as_str)]).await?)
}

/// How many claims stand, for `/metrics`.
pub(crate) async fn standing_count(c: &impl GenericClient) -> Result<i64> {
    let stmt = c
        .prepare_cached(&format!(
            "select count(*) from path_claims c join endpoints e on e.id = c.endpoint_id where {STANDS}"
        ))
        .await?;
    c.query_one(&stmt, &[]).await?.only()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::TokenHash;
    use crate::store::testing::{self, Db};

    /// Endpoint `id` with a session of its own, as its caller.
    async fn in_session(db: &Db, id: EndpointId, session: &[u8]) -> Caller {
        let sql = db.test.sql().await;
        sql.execute("update endpoints set session_hash = $2 where id = $1", &[&id, &session]).await.unwrap();
        let c = db.store.client().await.unwrap();
        let mut caller = crate::store::identity::caller_of(&c, id).await.unwrap();
        caller.session_hash = TokenHash::from_stored(session.to_vec());
        caller
    }

    fn repo() -> RepoKey {
        RepoKey::of_remote("https://github.com/acme/api").unwrap()
    }

    fn wanted(paths: &[&str], reason: &str) -> Wanted {
        let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
        Wanted {
            repo: repo(),
            paths: crate::domain::claims::parse_paths(&paths).unwrap(),
            exclusive: true,
            ttl_s: 3600,
            reason: reason.to_owned(),
            attempt: None,
        }
    }

    #[tokio::test]
    async fn a_claim_stands_while_its_session_lives_and_claiming_again_renews_it() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (other, _) = db.machine("globex", "box").await;
        let ann = db.endpoint(laptop, "ann", 0).await;
        let ann = in_session(&db, ann, b"first").await;
        let mut c = db.store.client().await.unwrap();
        let tx = crate::store::begin(&mut c).await.unwrap();
        let (claim, renewed) = put(&tx, &ann, &wanted(&["src/auth"], "one")).await.unwrap();
        assert!(!renewed && claim.holder == "acme/laptop/ann" && !claim.kept);
        let (again, renewed) = put(&tx, &ann, &wanted(&["src/auth/"], "two")).await.unwrap();
        assert!(renewed, "the same paths again renew the claim");
        assert_eq!((again.id, again.reason.as_str()), (claim.id, "two"));
        let (web, _) = put(&tx, &ann, &wanted(&["web"], "three")).await.unwrap();
        assert_ne!(web.id, claim.id, "other paths are a claim of their own");
        tx.commit().await.unwrap();

        assert_eq!(standing_in(&c, &repo(), &[acme]).await.unwrap().len(), 2);
        assert!(standing_in(&c, &repo(), &[other]).await.unwrap().is_empty(), "out of reach");
        assert_eq!(list(&c, &[acme], None, Some(ann.endpoint_id), 10).await.unwrap().len(), 2);
        assert_eq!(by_id(&c, claim.id).await.unwrap().map(|c| c.reason), Some("two".to_owned()));
        assert_eq!(standing_count(&c).await.unwrap(), 2);

        // A new session on the handle: the claims of the old one stand no more, and are purged.
        in_session(&db, ann.endpoint_id, b"second").await;
        assert!(standing_in(&c, &repo(), &[acme]).await.unwrap().is_empty());
        assert_eq!(purge_lapsed(&c, Some(&repo())).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn releasing_paths_narrows_a_claim_and_releasing_the_rest_ends_them() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let ann = db.endpoint(laptop, "ann", 0).await;
        let ann = in_session(&db, ann, b"s").await;
        let mut c = db.store.client().await.unwrap();
        let tx = crate::store::begin(&mut c).await.unwrap();
        let (two, _) = put(&tx, &ann, &wanted(&["lib/a", "lib/b"], "libs")).await.unwrap();
        let (one, _) = put(&tx, &ann, &wanted(&["docs"], "docs")).await.unwrap();
        let narrowed = release_paths(&tx, &ann, Some(&repo()), &[PathGlob::parse("lib/a").unwrap()]).await.unwrap();
        assert_eq!(narrowed.iter().map(|c| c.id).collect::<Vec<_>>(), [two.id], "as it was before");
        tx.commit().await.unwrap();
        let left = by_id(&c, two.id).await.unwrap().unwrap();
        assert_eq!(left.paths, [PathGlob::parse("lib/b").unwrap()]);

        assert_eq!(release(&c, ann.endpoint_id, Some(one.id), None).await.unwrap().len(), 1);
        assert!(release(&c, ann.endpoint_id, Some(one.id), None).await.unwrap().is_empty(), "released once");
        assert_eq!(release(&c, ann.endpoint_id, None, Some(&repo())).await.unwrap().len(), 1);
        assert!(list(&c, &[acme], None, None, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_holder_is_told_of_each_claimant_once_in_ten_minutes() {
        let db = testing::db().await;
        let (_, laptop) = db.machine("acme", "laptop").await;
        let ann = db.endpoint(laptop, "ann", 0).await;
        let bob = db.endpoint(laptop, "bob", 0).await;
        let carl = db.endpoint(laptop, "carl", 0).await;
        let ann = in_session(&db, ann, b"s").await;
        let mut c = db.store.client().await.unwrap();
        let tx = crate::store::begin(&mut c).await.unwrap();
        let (claim, _) = put(&tx, &ann, &wanted(&["src"], "r")).await.unwrap();
        assert!(bump(&tx, claim.id, bob).await.unwrap());
        assert!(!bump(&tx, claim.id, bob).await.unwrap(), "not again so soon");
        assert!(bump(&tx, claim.id, carl).await.unwrap(), "another claimant is told of");
        tx.commit().await.unwrap();
        let sql = db.test.sql().await;
        sql.execute("update path_claim_bumps set told_at = now() - interval '11 minutes'", &[]).await.unwrap();
        let tx = crate::store::begin(&mut c).await.unwrap();
        assert!(bump(&tx, claim.id, bob).await.unwrap(), "told again after ten minutes");
    }

    #[tokio::test]
    async fn claims_in_one_repository_are_decided_one_after_the_other() {
        let db = testing::db().await;
        let mut c = db.store.client().await.unwrap();
        let other = db.store.client().await.unwrap();
        let try_lock = "select pg_try_advisory_xact_lock(hashtextextended('path_claims:' || $1, 0))";
        let tx = crate::store::begin(&mut c).await.unwrap();
        lock_repo(&tx, &repo()).await.unwrap();
        let taken: bool = other.query_one(try_lock, &[&repo().as_str()]).await.unwrap().get(0);
        assert!(!taken, "held until the transaction ends");
        let elsewhere: bool = other.query_one(try_lock, &[&"github.com/acme/web"]).await.unwrap().get(0);
        assert!(elsewhere, "another repository is not held");
        tx.commit().await.unwrap();
        let taken: bool = other.query_one(try_lock, &[&repo().as_str()]).await.unwrap().get(0);
        assert!(taken);
    }
}
