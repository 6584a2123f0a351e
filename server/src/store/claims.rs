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
