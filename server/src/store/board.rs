//! The board in the database: cards, repositories, worker leases and schedule firing. Free
//! repository functions on a client or transaction the application layer (`app::board`) holds.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::row::{Col, FromRow};
use crate::domain::board::{
    Agent, CardKind, Cleanup, Column, DispatchedCard, DueSchedule, FollowPr, Job as JobView, LeasedCard, LostLease,
    MAX_ATTEMPTS, PrState, Repo as RepoView, WORKER_FRESH_S, repo_path,
};
use crate::domain::caller::{Caller, MachineIdentity};
use crate::domain::ids::{AccountId, EndpointId, JobId, MachineId, RepoId, ScheduleId, TokenHash};
use crate::domain::schedule::Schedule;
use crate::domain::{EntityKind, Error};
use crate::store::Result;
use crate::store::Tx;

/// Card columns and kinds as SQL text spells them: literals in the text, where the partial indexes
/// `jobs_todo`, `jobs_due` and `jobs_leases` (migration 3) need them.
const TODO: &str = Column::Todo.db();
pub(super) const IN_PROGRESS: &str = Column::InProgress.db();
const REVIEW: &str = Column::Review.db();
const DONE: &str = Column::Done.db();
const JOB: &str = CardKind::Job.db();
const SCHEDULE: &str = CardKind::Schedule.db();

/// A new card's row.
pub(crate) struct NewJob<'a> {
    pub id: &'a JobId,
    pub account_id: AccountId,
    pub repo_id: RepoId,
    pub title: &'a str,
    pub detail: &'a str,
    pub agent: &'a str,
    pub requires_pr: bool,
    /// A schedule card's schedule and first run; a job has none.
    pub schedule: Option<(&'a Schedule, DateTime<Utc>)>,
    pub posted_by: &'a str,
    /// The paths its work changes, from the repository's root.
    pub paths: &'a [String],
}

const JOB_COLUMNS: &str = "j.id, j.state, j.kind, j.title, j.detail, j.agent, j.requires_pr, j.schedule, j.time_zone,
     j.next_run_at, j.run_count, j.last_run_at, j.last_skip_reason, j.schedule_id, j.posted_by, j.posted_at,
     j.edited_by, j.edited_at, j.attempts, j.last_error, j.branch, j.worktree, j.agent_state, j.pr_url, j.summary,
     j.started_at, j.finished_at, j.closed_at, j.paths, r.name as repo_name, r.path as repo_path, m.name as machine_name,
     coalesce(m.worker_seen_at > now() - make_interval(secs => $WORKER_FRESH), false) as dispatcher_running";

fn job_columns() -> String {
    JOB_COLUMNS.replace("$WORKER_FRESH", &WORKER_FRESH_S.to_string())
}

const JOB_JOINS: &str = "jobs j join repos r on r.id = j.repo_id join machines m on m.id = r.machine_id";

impl FromRow for JobView {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(JobView {
            id: row.col("id")?,
            column: Column::from_db(row.col("state")?)?,
            kind: CardKind::from_db(row.col("kind")?)?,
            title: row.col("title")?,
            detail: row.col("detail")?,
            repo: RepoView {
                name: row.col("repo_name")?,
                path: row.col("repo_path")?,
                machine: row.col("machine_name")?,
            },
            agent: Agent::from_db(row.col("agent")?)?,
            requires_pr: row.col("requires_pr")?,
            schedule: row.col("schedule")?,
            time_zone: row.col("time_zone")?,
            next_run_at: row.col("next_run_at")?,
            run_count: row.col::<i32>("run_count")? as u32,
            last_run_at: row.col("last_run_at")?,
            last_skip_reason: row.col("last_skip_reason")?,
            schedule_id: row.col("schedule_id")?,
            posted_by: row.col("posted_by")?,
            posted_at: row.col("posted_at")?,
            edited_by: row.col("edited_by")?,
            edited_at: row.col("edited_at")?,
            attempts: row.col::<i32>("attempts")? as u32,
            last_error: row.col("last_error")?,
            branch: row.col("branch")?,
            worktree: row.col("worktree")?,
            agent_state: row.col("agent_state")?,
            pr_url: row.col("pr_url")?,
            summary: row.col("summary")?,
            started_at: row.col("started_at")?,
            finished_at: row.col("finished_at")?,
            closed_at: row.col("closed_at")?,
            dispatcher_running: row.col("dispatcher_running")?,
            paths: row.col("paths")?,
            changed: Vec::new(),
        })
    }
}

/// The card `id` of the account, as the board shows it.
pub(crate) async fn job(c: &impl GenericClient, account_id: AccountId, id: &JobId) -> Result<JobView> {
    let sql = format!("select {} from {JOB_JOINS} where j.id = $1 and j.account_id = $2", job_columns());
    let row = c.query_opt(&sql, &[&id, &account_id]).await?.ok_or_else(|| no_card(id))?;
    JobView::from_row(&row)
}

fn no_card(id: &JobId) -> Error {
    Error::not_found(
        EntityKind::Card,
        format!("no card with id {:?} on your account's board: ids come from list_jobs", id),
    )
}

/// Locks card `id` of the account (`for update`) and reads its column.
pub(crate) async fn lock_card(c: &Tx<'_>, account_id: AccountId, id: &JobId) -> Result<Column> {
    let row = c
        .query_opt("select state, kind from jobs where id = $1 and account_id = $2 for update", &[&id, &account_id])
        .await?
        .ok_or_else(|| no_card(id))?;
    Ok(Column::from_db(row.col("state")?)?)
}

/// Names the account's operator endpoint (`machine/handle`).
pub(crate) async fn set_operator(c: &impl GenericClient, account: &str, endpoint: &str) -> Result<()> {
    let updated = c.execute("update accounts set operator = $2 where name = $1", &[&account, &endpoint]).await?;
    if updated == 0 {
        return Err(Error::not_found(EntityKind::Account, format!("no account {account}")).into());
    }
    Ok(())
}

/// The account's operator endpoint (`machine/handle`), if it has one.
pub(crate) async fn operator(c: &impl GenericClient, account_id: AccountId) -> Result<Option<String>> {
    c.query_one("select operator from accounts where id = $1", &[&account_id]).await?.only()
}

/// The harness an endpoint runs: the agent its cards get unless they name one.
pub(crate) async fn harness(c: &impl GenericClient, endpoint_id: EndpointId) -> Result<String> {
    c.query_one("select harness from endpoints where id = $1", &[&endpoint_id]).await?.only()
}

/// Inserts a new card in To do.
pub(crate) async fn insert_job(c: &impl GenericClient, new: &NewJob<'_>) -> Result<()> {
    let (kind, expr, zone, next) = match new.schedule {
        Some((s, next)) => (SCHEDULE, Some(s.expr()), Some(s.zone()), Some(next)),
        None => (JOB, None, None, None),
    };
    c.execute(
        &format!(
            "insert into jobs (id, account_id, repo_id, kind, state, title, detail, agent, requires_pr, schedule, time_zone,
                               next_run_at, posted_by, paths)
             values ($1, $2, $3, $4, '{TODO}', $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        ),
        &[
            &new.id,
            &new.account_id,
            &new.repo_id,
            &kind,
            &new.title,
            &new.detail,
            &new.agent,
            &new.requires_pr,
            &expr,
            &zone,
            &next,
            &new.posted_by,
            &new.paths,
        ],
    )
    .await?;
    Ok(())
}

/// The account's cards of one column (all but Done when `None`), of one repository or all, in
/// column order and then as posted.
pub(crate) async fn list(
    c: &impl GenericClient,
    account_id: AccountId,
    column: Option<Column>,
    repo_id: Option<RepoId>,
) -> Result<Vec<JobView>> {
    let sql = format!(
        "select {} from {JOB_JOINS}
         where j.account_id = $1 and ($2::text is null and j.state <> '{DONE}' or j.state = $2)
           and ($3::bigint is null or j.repo_id = $3)
         order by case j.state when '{TODO}' then 0 when '{IN_PROGRESS}' then 1 when '{REVIEW}' then 2 else 3 end,
                  j.posted_at",
        job_columns()
    );
    let state_db = column.map(Column::db);
    c.query(&sql, &[&account_id, &state_db, &repo_id]).await?.iter().map(JobView::from_row).collect()
}

/// The account's newest `limit` cards in Done, newest first.
pub(crate) async fn recently_done(c: &impl GenericClient, account_id: AccountId, limit: i64) -> Result<Vec<JobView>> {
    let sql = format!(
        "select {} from {JOB_JOINS} where j.account_id = $1 and j.state = '{DONE}'
         order by j.closed_at desc nulls last, j.posted_at desc limit $2",
        job_columns()
    );
    c.query(&sql, &[&account_id, &limit]).await?.iter().map(JobView::from_row).collect()
}

/// The account's repositories, by name and machine.
pub(crate) async fn repos(c: &impl GenericClient, account_id: AccountId) -> Result<Vec<RepoView>> {
    let rows = c
        .query(
            "select r.name, r.path, m.name as machine from repos r join machines m on m.id = r.machine_id
             where r.account_id = $1 and m.revoked_at is null order by r.name, m.name",
            &[&account_id],
        )
        .await?;
    rows.iter().map(RepoView::from_row).collect()
}

impl FromRow for RepoView {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(RepoView { name: row.col("name")?, path: row.col("path")?, machine: row.col("machine")? })
    }
}

/// How many of the account's cards (of one repository, or all) are Done.
pub(crate) async fn archived(c: &impl GenericClient, account_id: AccountId, repo_id: Option<RepoId>) -> Result<u32> {
    let count: i64 = c
        .query_one(
            &format!(
                "select count(*) from jobs where account_id = $1 and state = '{DONE}' and ($2::bigint is null or repo_id = $2)"
            ),
            &[&account_id, &repo_id],
        )
        .await?
        .only()?;
    Ok(count as u32)
}

/// Replaces the card's title.
pub(crate) async fn set_title(c: &impl GenericClient, id: &JobId, title: &str) -> Result<()> {
    c.execute("update jobs set title = $2 where id = $1", &[&id, &title]).await?;
    Ok(())
}

/// Replaces the card's detail.
pub(crate) async fn set_detail(c: &impl GenericClient, id: &JobId, detail: &str) -> Result<()> {
    c.execute("update jobs set detail = $2 where id = $1", &[&id, &detail]).await?;
    Ok(())
}

/// Moves the card to another repository.
pub(crate) async fn set_repo(c: &impl GenericClient, id: &JobId, repo_id: RepoId) -> Result<()> {
    c.execute("update jobs set repo_id = $2 where id = $1", &[&id, &repo_id]).await?;
    Ok(())
}

/// Makes the card a schedule with its next run, or (`None`) a job that runs once.
pub(crate) async fn set_schedule(
    c: &impl GenericClient,
    id: &JobId,
    schedule: Option<(&Schedule, DateTime<Utc>)>,
) -> Result<()> {
    match schedule {
        Some((s, next)) => {
            c.execute(
                &format!(
                    "update jobs set kind = '{SCHEDULE}', schedule = $2, time_zone = $3, next_run_at = $4 where id = $1"
                ),
                &[&id, &s.expr(), &s.zone(), &next],
            )
            .await?;
        }
        None => {
            c.execute(
                &format!(
                    "update jobs set kind = '{JOB}', schedule = null, time_zone = null, next_run_at = null where id = $1"
                ),
                &[&id],
            )
            .await?;
        }
    }
    Ok(())
}

/// Sets whether the card's agent must open a pull request.
pub(crate) async fn set_requires_pr(c: &impl GenericClient, id: &JobId, requires_pr: bool) -> Result<()> {
    c.execute("update jobs set requires_pr = $2 where id = $1", &[&id, &requires_pr]).await?;
    Ok(())
}

/// Records who edited the card and gives it a fresh set of attempts.
pub(crate) async fn mark_edited(c: &impl GenericClient, id: &JobId, by: &str) -> Result<()> {
    c.execute("update jobs set edited_by = $2, edited_at = now(), attempts = 0 where id = $1", &[&id, &by]).await?;
    Ok(())
}

/// Locks (`for update`) the account's card whose current attempt holds the job token `token_hash`.
pub(crate) async fn lock_dispatched(
    c: &Tx<'_>,
    account_id: AccountId,
    token_hash: &TokenHash,
) -> Result<Option<DispatchedCard>> {
    c.query_opt(
        "select id, state, requires_pr from jobs where job_token_hash = $1 and account_id = $2 for update",
        &[&token_hash, &account_id],
    )
    .await?
    .map(|row| DispatchedCard::from_row(&row))
    .transpose()
}

impl FromRow for DispatchedCard {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(DispatchedCard {
            id: row.col("id")?,
            column: Column::from_db(row.col("state")?)?,
            requires_pr: row.col("requires_pr")?,
        })
    }
}

/// Moves the card to Review with its pull request or summary; its lease ends.
pub(crate) async fn set_review(c: &impl GenericClient, id: &JobId, pr_url: Option<&str>, summary: &str) -> Result<()> {
    c.execute(
        &format!(
            "update jobs set state = '{REVIEW}', pr_url = $2, summary = nullif($3, ''), finished_at = now(),
                             agent_state = 'finished', lease_until = null
             where id = $1"
        ),
        &[&id, &pr_url, &summary],
    )
    .await?;
    Ok(())
}

/// Moves the card to Done; no token can touch it after.
pub(crate) async fn set_done(c: &impl GenericClient, id: &JobId) -> Result<()> {
    c.execute(
        &format!("update jobs set state = '{DONE}', closed_at = now(), job_token_hash = null where id = $1"),
        &[&id],
    )
    .await?;
    Ok(())
}

/// Cards in Review on the machine's repositories whose pull request is open (or not yet asked
/// about) and was not asked about for `every_s`, oldest first.
pub(crate) async fn prs_to_follow(
    c: &impl GenericClient,
    machine_id: MachineId,
    every_s: f64,
) -> Result<Vec<FollowPr>> {
    c.query(
        &format!(
            "select j.id, j.pr_url, r.path as repo_path, r.name as repo from jobs j join repos r on r.id = j.repo_id
             where r.machine_id = $1 and j.state = '{REVIEW}' and j.pr_url is not null
               and coalesce(j.pr_state, 'open') = 'open'
               and (j.pr_checked_at is null or j.pr_checked_at < now() - make_interval(secs => $2::float8))
             order by j.finished_at limit 20"
        ),
        &[&machine_id, &every_s],
    )
    .await?
    .iter()
    .map(FollowPr::from_row)
    .collect()
}

impl FromRow for FollowPr {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(FollowPr {
            id: row.col("id")?,
            pr_url: row.col("pr_url")?,
            repo_path: row.col("repo_path")?,
            repo: row.col("repo")?,
        })
    }
}

/// A card in Review with a pull request on one of the machine's repositories, locked: its account
/// and pull request.
pub(crate) async fn lock_followed(
    c: &Tx<'_>,
    machine_id: MachineId,
    id: &JobId,
) -> Result<Option<(AccountId, String)>> {
    c.query_opt(
        &format!(
            "select j.account_id, j.pr_url from jobs j join repos r on r.id = j.repo_id
             where j.id = $1 and r.machine_id = $2 and j.state = '{REVIEW}' and j.pr_url is not null
             for update of j"
        ),
        &[&id, &machine_id],
    )
    .await?
    .map(|r| Ok((r.col("account_id")?, r.col("pr_url")?)))
    .transpose()
}

/// Records what the forge said (`state`, or `None` when the check failed with `error`).
pub(crate) async fn set_pr_checked(
    c: &impl GenericClient,
    id: &JobId,
    state: Option<PrState>,
    error: Option<&str>,
) -> Result<()> {
    c.execute(
        "update jobs set pr_state = coalesce($2, pr_state), pr_checked_at = now(), last_error = $3 where id = $1",
        &[&id, &state.map(PrState::db), &error],
    )
    .await?;
    Ok(())
}

/// Sends the card back to To do with `note` added to its detail and a fresh set of attempts.
pub(crate) async fn send_back(c: &impl GenericClient, id: &JobId, note: &str) -> Result<()> {
    c.execute(
        &format!(
            "update jobs set state = '{TODO}', detail = detail || $2, closed_at = null, finished_at = null, pr_url = null,
                             summary = null, job_token_hash = null, lease_until = null, agent_state = null, attempts = 0
             where id = $1"
        ),
        &[&id, &note],
    )
    .await?;
    Ok(())
}

/// Adds a repository of `machine` (nothing when it is there already). `path` is as
/// [`repo_path`] keeps it.
pub(crate) async fn insert_repo(
    c: &impl GenericClient,
    machine: &MachineIdentity,
    path: &str,
    name: &str,
    by: &str,
) -> Result<()> {
    c.execute(
        "insert into repos (account_id, machine_id, path, name, added_by) values ($1, $2, $3, $4, $5)
         on conflict (machine_id, path) do nothing",
        &[&machine.account_id, &machine.machine_id, &path, &name, &by],
    )
    .await?;
    Ok(())
}

/// Records that the machine's worker is asking for work now, at most once in half the time a
/// worker counts as running ([`WORKER_FRESH_S`]): it stays running between two marks, and a worker
/// asking every few seconds with nothing to do writes nothing most times (its claim, finding no
/// card, then takes no transaction id and waits for no flush).
pub(crate) async fn worker_seen(c: &impl GenericClient, machine_id: MachineId) -> Result<()> {
    let stmt = c
        .prepare_cached(&format!(
            "update machines set worker_seen_at = now()
             where id = $1 and (worker_seen_at is null or worker_seen_at < now() - make_interval(secs => {}))",
            WORKER_FRESH_S / 2.0
        ))
        .await?;
    c.execute(&stmt, &[&machine_id]).await?;
    Ok(())
}

/// Takes the oldest runnable To do card of the machine's repositories for an attempt leased for
/// `lease_s` under job token `token_hash`; its id. Rows locked by another claim are skipped.
pub(crate) async fn claim_next(
    c: &Tx<'_>,
    machine_id: MachineId,
    lease_s: f64,
    token_hash: &TokenHash,
) -> Result<Option<JobId>> {
    c.query_opt(
        &format!(
            "update jobs set state = '{IN_PROGRESS}', lease_machine = $1, lease_until = now() + make_interval(secs => $2),
                             job_token_hash = $3, attempts = attempts + 1, started_at = now(), agent_state = 'starting',
                             branch = 'relay/' || id
             where id = (
                 select j.id from jobs j join repos r on r.id = j.repo_id
                 where r.machine_id = $1 and j.kind = '{JOB}' and j.state = '{TODO}' and j.attempts < $4
                 order by j.posted_at
                 for update of j skip locked
                 limit 1)
             returning id"
        ),
        &[&machine_id, &lease_s, &token_hash, &MAX_ATTEMPTS],
    )
    .await?
    .map(|row| row.only())
    .transpose()
}

/// Done cards of the machine's repositories whose worktrees are still there.
pub(crate) async fn cleanups(c: &impl GenericClient, machine_id: MachineId) -> Result<Vec<Cleanup>> {
    c.query(
        &format!(
            "select j.id, j.worktree, r.path as repo_path from jobs j join repos r on r.id = j.repo_id
             where r.machine_id = $1 and j.state = '{DONE}' and j.worktree is not null and not j.worktree_removed"
        ),
        &[&machine_id],
    )
    .await?
    .iter()
    .map(Cleanup::from_row)
    .collect()
}

impl FromRow for Cleanup {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Cleanup { id: row.col("id")?, worktree: row.col("worktree")?, repo_path: row.col("repo_path")? })
    }
}

/// Extends the lease of the in-progress card the machine holds under `token_hash`, with what its
/// agent reports (an empty worktree or branch keeps the one known); whether there was one.
pub(crate) async fn renew_lease(
    c: &impl GenericClient,
    machine_id: MachineId,
    token_hash: &TokenHash,
    lease_s: f64,
    agent_state: &str,
    worktree: &str,
    branch: &str,
) -> Result<bool> {
    let renewed = c
        .execute(
            &format!(
                "update jobs set lease_until = now() + make_interval(secs => $3), agent_state = nullif($4, ''),
                                 worktree = coalesce(nullif($5, ''), worktree), branch = coalesce(nullif($6, ''), branch)
                 where job_token_hash = $1 and lease_machine = $2 and state = '{IN_PROGRESS}'"
            ),
            &[&token_hash, &machine_id, &lease_s, &agent_state, &worktree, &branch],
        )
        .await?;
    Ok(renewed == 1)
}

/// The column of the card whose current attempt holds `token_hash`.
pub(crate) async fn column_of_token(c: &impl GenericClient, token_hash: &TokenHash) -> Result<Option<Column>> {
    Ok(c.query_opt("select state from jobs where job_token_hash = $1", &[&token_hash])
        .await?
        .map(|r| Column::from_db(r.only()?))
        .transpose()?)
}

/// The attempt a job token names, as its agent authenticates with it.
pub(crate) struct AttemptHolder {
    /// The machine that leased the card: its agent's endpoint lives there.
    pub machine: MachineIdentity,
    pub revoked: bool,
    pub card: JobId,
    pub column: Column,
    pub lease_live: bool,
}

/// The card whose current attempt holds `token_hash`, with the machine that leased it.
pub(crate) async fn attempt_holder(c: &impl GenericClient, token_hash: &TokenHash) -> Result<Option<AttemptHolder>> {
    let stmt = c
        .prepare_cached(
            "select j.id as card, j.state, coalesce(j.lease_until > now(), false) as lease_live,
                    m.id as machine_id, m.name as machine, a.id as account_id, a.name as account,
                    m.revoked_at is not null as revoked
             from jobs j
             join machines m on m.id = j.lease_machine
             join accounts a on a.id = m.account_id
             where j.job_token_hash = $1",
        )
        .await?;
    c.query_opt(&stmt, &[&token_hash]).await?.map(|row| AttemptHolder::from_row(&row)).transpose()
}

impl FromRow for AttemptHolder {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(AttemptHolder {
            card: row.col("card")?,
            column: Column::from_db(row.col("state")?)?,
            lease_live: row.col("lease_live")?,
            machine: MachineIdentity::from_row(row)?,
            revoked: row.col("revoked")?,
        })
    }
}

/// Holds the attempt `token_hash` in progress under a live lease until the transaction ends
/// (`for share`): a claim of its agent's endpoint commits before anything ends the attempt, which
/// then ends that session too. Whether the attempt is still running.
pub(crate) async fn hold_attempt(c: &Tx<'_>, token_hash: &TokenHash) -> Result<bool> {
    let held = c
        .query_opt(
            &format!(
                "select 1 from jobs where job_token_hash = $1 and state = '{IN_PROGRESS}' and lease_until > now()
                 for share"
            ),
            &[&token_hash],
        )
        .await?;
    Ok(held.is_some())
}

/// Locks (`for update`) the card the machine leased under `token_hash`.
pub(crate) async fn lock_leased(
    c: &Tx<'_>,
    machine_id: MachineId,
    token_hash: &TokenHash,
) -> Result<Option<LeasedCard>> {
    c.query_opt(
        "select id, state, attempts from jobs where job_token_hash = $1 and lease_machine = $2 for update",
        &[&token_hash, &machine_id],
    )
    .await?
    .map(|row| LeasedCard::from_row(&row))
    .transpose()
}

impl FromRow for LeasedCard {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(LeasedCard {
            id: row.col("id")?,
            column: Column::from_db(row.col("state")?)?,
            attempts: row.col("attempts")?,
        })
    }
}

/// Puts a card whose agent ended unfinished back in To do with the error; its token and lease end.
pub(crate) async fn return_to_todo(c: &impl GenericClient, id: &JobId, error: &str, agent_state: &str) -> Result<()> {
    c.execute(
        &format!(
            "update jobs set state = '{TODO}', last_error = $2, job_token_hash = null, lease_until = null,
                             agent_state = $3, started_at = null
             where id = $1"
        ),
        &[&id, &error, &agent_state],
    )
    .await?;
    Ok(())
}

/// Records that the agent of a card no longer in progress ended; its token ends.
pub(crate) async fn set_exited(c: &impl GenericClient, id: &JobId, agent_state: &str) -> Result<()> {
    c.execute("update jobs set agent_state = $2, job_token_hash = null where id = $1", &[&id, &agent_state]).await?;
    Ok(())
}

/// Records that the machine removed the worktrees of these Done cards.
pub(crate) async fn mark_cleaned(c: &impl GenericClient, machine_id: MachineId, ids: &[JobId]) -> Result<()> {
    c.execute(
        &format!(
            "update jobs j set worktree_removed = true from repos r
             where r.id = j.repo_id and r.machine_id = $1 and j.id = any($2) and j.state = '{DONE}'"
        ),
        &[&machine_id, &ids],
    )
    .await?;
    Ok(())
}

/// Puts every in-progress card whose lease ran out back in To do with the reason, and returns them.
pub(crate) async fn expire_leases(c: &impl GenericClient) -> Result<Vec<LostLease>> {
    c.query(
        &format!(
            "update jobs j set state = '{TODO}', job_token_hash = null, lease_until = null, agent_state = 'lost',
                               started_at = null,
                               last_error = 'attempt ' || j.attempts || ': the worker on ' || m.name
                                   || ' stopped renewing its lease'
                                   || case when j.attempts >= $1 then '; gave up after ' || $1 || ' attempts: edit the card to try again' else '' end
             from machines m
             where m.id = j.lease_machine and {}
             returning j.id, j.account_id, j.attempts, m.name as machine",
            lease_lapsed()
        ),
        &[&MAX_ATTEMPTS],
    )
    .await?
    .iter()
    .map(LostLease::from_row)
    .collect()
}

impl FromRow for LostLease {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(LostLease {
            id: row.col("id")?,
            account_id: row.col("account_id")?,
            attempts: row.col("attempts")?,
            machine: row.col("machine")?,
        })
    }
}

/// A schedule that came due, of `jobs` as `j` (the scheduler's probe reads the same).
pub(crate) fn schedule_due() -> String {
    format!("j.kind = '{SCHEDULE}' and j.state = '{TODO}' and j.next_run_at <= now()")
}

/// A card whose worker stopped renewing its lease, of `jobs` as `j`.
pub(crate) fn lease_lapsed() -> String {
    format!("j.state = '{IN_PROGRESS}' and j.lease_until < now()")
}

/// Locks (`for update skip locked`) up to 50 schedules that came due, the longest due first; a
/// schedule another replica is firing is skipped.
pub(crate) async fn lock_due_schedules(c: &Tx<'_>) -> Result<Vec<DueSchedule>> {
    c.query(
        &format!(
            "select id, schedule, time_zone, account_id, coalesce(last_skip_reason, '') as last_skip_reason,
                    next_run_at, now() from jobs j
             where {}
             order by next_run_at limit 50
             for update skip locked",
            schedule_due()
        ),
        &[],
    )
    .await?
    .iter()
    .map(DueSchedule::from_row)
    .collect()
}

impl FromRow for DueSchedule {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(DueSchedule {
            id: row.col("id")?,
            expr: row.col("schedule")?,
            zone: row.col("time_zone")?,
            account_id: row.col("account_id")?,
            last_skip_reason: row.col("last_skip_reason")?,
            slot: row.col("next_run_at")?,
            now: row.col("now")?,
        })
    }
}

/// Stops a schedule that cannot be evaluated, with the reason.
pub(crate) async fn park_schedule(c: &impl GenericClient, id: &ScheduleId, reason: &str) -> Result<()> {
    c.execute("update jobs set next_run_at = null, last_skip_reason = $2 where id = $1", &[&id, &reason]).await?;
    Ok(())
}

/// The column of the schedule's latest run card, and whether it has a pull request still open.
pub(crate) async fn last_run(c: &impl GenericClient, schedule_id: &ScheduleId) -> Result<Option<(Column, bool)>> {
    c.query_opt(
        "select state, pr_url is not null and coalesce(pr_state, 'open') = 'open' as pr_open
         from jobs where schedule_id = $1 order by posted_at desc limit 1",
        &[&schedule_id],
    )
    .await?
    .map(|r| Ok((Column::from_db(r.col("state")?)?, r.col("pr_open")?)))
    .transpose()
}

/// Moves the schedule to its next run without posting one, with the reason.
pub(crate) async fn hold_off(c: &impl GenericClient, id: &ScheduleId, next: DateTime<Utc>, reason: &str) -> Result<()> {
    c.execute("update jobs set next_run_at = $2, last_skip_reason = $3 where id = $1", &[&id, &next, &reason]).await?;
    Ok(())
}

/// Posts run card `run` of schedule `id` to To do, a copy of the schedule's card.
pub(crate) async fn insert_run(c: &impl GenericClient, id: &ScheduleId, run: &JobId) -> Result<()> {
    c.execute(
        &format!(
            "insert into jobs (id, account_id, repo_id, kind, state, title, detail, agent, requires_pr, schedule_id, posted_by,
                               paths)
             select $2, account_id, repo_id, '{JOB}', '{TODO}', title, detail, agent, requires_pr, id, 'schedule ' || id,
                    paths
             from jobs where id = $1"
        ),
        &[&id, &run],
    )
    .await?;
    Ok(())
}

/// Counts a run of the schedule and moves it to its next one.
pub(crate) async fn advance_schedule(c: &impl GenericClient, id: &ScheduleId, next: DateTime<Utc>) -> Result<()> {
    c.execute(
        "update jobs set next_run_at = $2, run_count = run_count + 1, last_run_at = now(), last_skip_reason = null
         where id = $1",
        &[&id, &next],
    )
    .await?;
    Ok(())
}

/// The repository a card is for: a path or folder name, else the one containing `cwd` on the
/// caller's machine.
pub(crate) async fn resolve_repo(c: &impl GenericClient, caller: &Caller, repo: &str, cwd: &str) -> Result<RepoId> {
    let repo = repo.trim();
    let rows = if repo.is_empty() {
        let cwd = cwd.trim();
        if cwd.is_empty() {
            return Err(Error::invalid("no repo given: pass repo (a path or a folder name from list_jobs)").into());
        }
        c.query(
            "select id, name, path from repos where machine_id = $1 and ($2 = path or $2 like path || '/%')
             order by length(path) desc limit 1",
            &[&caller.machine_id, &cwd],
        )
        .await?
    } else if repo.starts_with('/') {
        c.query(
            "select id, name, path from repos where account_id = $1 and path = $2
             order by (machine_id = $3) desc",
            &[&caller.account_id, &repo_path(repo)?, &caller.machine_id],
        )
        .await?
    } else {
        c.query(
            "select id, name, path from repos where account_id = $1 and name = $2 order by (machine_id = $3) desc",
            &[&caller.account_id, &repo, &caller.machine_id],
        )
        .await?
    };
    match rows.as_slice() {
        [] if repo.is_empty() => Err(Error::not_found(
            EntityKind::Repository,
            format!(
                "{} is not inside a repository on the board: pass repo, or have the operator add it with add_repo",
                cwd.trim()
            ),
        ).into()),
        [] => Err(Error::not_found(
            EntityKind::Repository,
            format!(
                "no repository {repo:?} on the board: pass a path or folder name that list_jobs shows, or add it with add_repo"
            ),
        ).into()),
        [one] => one.col("id"),
        [first, ..] => first.col("id"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[tokio::test]
    async fn a_card_goes_through_review_to_done_its_pull_request_followed_until_merged_and_its_worktree_cleaned() {
        let db = testing::db().await;
        let (account_id, machine_id) = db.machine("acme", "laptop").await;
        let (_, desk) = db.machine("acme", "desk").await;
        let id = db.card(account_id, machine_id, "c1").await;
        let mut c = db.store.client().await.unwrap();
        let token = TokenHash::from_stored(b"job-token".to_vec());
        let tx = c.transaction().await.unwrap();
        claim_next(&tx, machine_id, 60.0, &token).await.unwrap().expect("the card");
        tx.commit().await.unwrap();
        assert!(renew_lease(&c, machine_id, &token, 60.0, "running", "/wt/c1", "").await.unwrap());
        assert!(
            !renew_lease(&c, desk, &token, 60.0, "running", "", "").await.unwrap(),
            "only the machine that leased it"
        );
        let card = job(&c, account_id, &id).await.unwrap();
        assert_eq!(
            (card.worktree.as_deref(), card.branch.as_deref()),
            (Some("/wt/c1"), Some("relay/c1")),
            "an empty branch keeps the one known"
        );

        let tx = c.transaction().await.unwrap();
        let dispatched = lock_dispatched(&tx, account_id, &token).await.unwrap().expect("the token's card");
        assert_eq!((dispatched.id, dispatched.column), (id.clone(), Column::InProgress));
        set_review(&tx, &id, Some("https://forge.example/acme/app/pull/7"), "fixed").await.unwrap();
        tx.commit().await.unwrap();
        let follow: Vec<String> =
            prs_to_follow(&c, machine_id, 0.0).await.unwrap().into_iter().map(|f| f.pr_url).collect();
        assert_eq!(follow, ["https://forge.example/acme/app/pull/7"]);
        set_pr_checked(&c, &id, Some(PrState::Open), None).await.unwrap();
        assert!(prs_to_follow(&c, machine_id, 3600.0).await.unwrap().is_empty(), "asked just now");
        set_pr_checked(&c, &id, Some(PrState::Merged), None).await.unwrap();
        assert!(prs_to_follow(&c, machine_id, 0.0).await.unwrap().is_empty(), "merged: nothing more to follow");

        assert!(cleanups(&c, machine_id).await.unwrap().is_empty(), "not done yet");
        set_done(&c, &id).await.unwrap();
        assert_eq!(column_of_token(&c, &token).await.unwrap(), None, "a done card's token names nothing");
        let cleanup: Vec<String> = cleanups(&c, machine_id).await.unwrap().into_iter().map(|c| c.worktree).collect();
        assert_eq!(cleanup, ["/wt/c1"]);
        mark_cleaned(&c, desk, std::slice::from_ref(&id)).await.unwrap();
        assert_eq!(cleanups(&c, machine_id).await.unwrap().len(), 1, "another machine cannot mark it cleaned");
        mark_cleaned(&c, machine_id, &[id]).await.unwrap();
        assert!(cleanups(&c, machine_id).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn cards_are_listed_by_column_edited_in_place_and_an_attempt_that_ends_unfinished_goes_back_to_todo() {
        let db = testing::db().await;
        let (account_id, machine_id) = db.machine("acme", "laptop").await;
        let first = db.card(account_id, machine_id, "c1").await;
        let second = db.card(account_id, machine_id, "c2").await;
        let mut c = db.store.client().await.unwrap();
        let ids = |cards: Vec<JobView>| cards.into_iter().map(|j| j.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(list(&c, account_id, None, None).await.unwrap()), ["c1", "c2"], "as posted");
        assert!(matches!(
            Error::from(job(&c, account_id, &JobId::new("c9")).await.unwrap_err()),
            Error::NotFound { .. }
        ));

        set_title(&c, &second, "fix the flaky test").await.unwrap();
        set_detail(&c, &second, "it fails one run in ten").await.unwrap();
        set_requires_pr(&c, &second, true).await.unwrap();
        mark_edited(&c, &second, "pat").await.unwrap();
        let edited = job(&c, account_id, &second).await.unwrap();
        assert_eq!(
            (edited.title.as_str(), edited.detail.as_str(), edited.requires_pr),
            ("fix the flaky test", "it fails one run in ten", true)
        );
        assert_eq!(edited.edited_by.as_deref(), Some("pat"));

        set_operator(&c, "acme", "laptop/lead").await.unwrap();
        assert_eq!(operator(&c, account_id).await.unwrap().as_deref(), Some("laptop/lead"));
        assert!(matches!(Error::from(set_operator(&c, "initech", "x/y").await.unwrap_err()), Error::NotFound { .. }));

        let token = TokenHash::from_stored(b"job-token".to_vec());
        let tx = c.transaction().await.unwrap();
        assert_eq!(claim_next(&tx, machine_id, 60.0, &token).await.unwrap(), Some(first.clone()), "the oldest first");
        tx.commit().await.unwrap();
        assert_eq!(ids(list(&c, account_id, Some(Column::InProgress), None).await.unwrap()), ["c1"]);
        let tx = c.transaction().await.unwrap();
        assert!(hold_attempt(&tx, &token).await.unwrap(), "in progress under a live lease");
        let leased = lock_leased(&tx, machine_id, &token).await.unwrap().expect("the machine's leased card");
        assert_eq!((leased.id.clone(), leased.column, leased.attempts), (first.clone(), Column::InProgress, 1));
        assert_eq!(lock_card(&tx, account_id, &first).await.unwrap(), Column::InProgress);
        return_to_todo(&tx, &first, "the agent exited with 1", "exited").await.unwrap();
        tx.commit().await.unwrap();
        let back = job(&c, account_id, &first).await.unwrap();
        assert_eq!((back.column, back.last_error.as_deref()), (Column::Todo, Some("the agent exited with 1")));
        assert_eq!(column_of_token(&c, &token).await.unwrap(), None, "its token ended");

        set_done(&c, &second).await.unwrap();
        assert_eq!(ids(recently_done(&c, account_id, 10).await.unwrap()), ["c2"]);
        assert_eq!(archived(&c, account_id, None).await.unwrap(), 1);
        send_back(&c, &second, "\n\nstill flaky").await.unwrap();
        let again = job(&c, account_id, &second).await.unwrap();
        assert_eq!((again.column, again.attempts), (Column::Todo, 0));
        assert!(again.detail.ends_with("still flaky"));
        assert_eq!(archived(&c, account_id, None).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_card_finds_its_repository_moves_between_repositories_and_schedules_and_is_followed_by_its_own_machine() {
        let db = testing::db().await;
        let (account_id, machine_id) = db.machine("acme", "laptop").await;
        let (_, desk) = db.machine("acme", "desk").await;
        let id = db.card(account_id, machine_id, "c1").await;
        let c = db.store.client().await.unwrap();
        let owner = db.endpoint(machine_id, "lead", 0).await;
        let lead = crate::store::identity::caller_of(&c, owner).await.unwrap();
        let app = resolve_repo(&c, &lead, "", "/src/app/server/src").await.unwrap();
        assert_eq!(resolve_repo(&c, &lead, "/src/app", "").await.unwrap(), app);
        assert_eq!(resolve_repo(&c, &lead, "app", "").await.unwrap(), app);
        assert!(matches!(Error::from(resolve_repo(&c, &lead, "", "").await.unwrap_err()), Error::Invalid(_)));
        assert!(matches!(
            Error::from(resolve_repo(&c, &lead, "", "/elsewhere").await.unwrap_err()),
            Error::NotFound { .. }
        ));
        let laptop = MachineIdentity { machine_id, machine: "laptop".into(), account_id, account: "acme".into() };
        insert_repo(&c, &laptop, "/src/web", "web", "pat").await.unwrap();
        let web = resolve_repo(&c, &lead, "web", "").await.unwrap();
        set_repo(&c, &id, web).await.unwrap();
        assert_eq!(job(&c, account_id, &id).await.unwrap().repo.name, "web");
        assert_eq!(harness(&c, owner).await.unwrap(), "other", "an endpoint that never said what it runs");

        let hourly = Schedule::parse("0 * * * *", "UTC").unwrap();
        let next = Utc::now() + chrono::Duration::hours(1);
        set_schedule(&c, &id, Some((&hourly, next))).await.unwrap();
        let card = job(&c, account_id, &id).await.unwrap();
        assert_eq!((card.kind, card.schedule.as_deref()), (CardKind::Schedule, Some("0 * * * *")));
        hold_off(&c, &ScheduleId::new("c1"), next + chrono::Duration::hours(1), "the last run is still open")
            .await
            .unwrap();
        let held = job(&c, account_id, &id).await.unwrap();
        assert_eq!(held.last_skip_reason.as_deref(), Some("the last run is still open"));
        set_schedule(&c, &id, None).await.unwrap();
        assert_eq!(job(&c, account_id, &id).await.unwrap().kind, CardKind::Job);

        // Its pull request is followed, under lock, only by the machine its repository is on.
        worker_seen(&c, machine_id).await.unwrap();
        assert!(job(&c, account_id, &id).await.unwrap().dispatcher_running, "a worker asked just now");
        set_review(&c, &id, Some("https://forge.example/acme/web/pull/3"), "").await.unwrap();
        let mut c = db.store.client().await.unwrap();
        let tx = c.transaction().await.unwrap();
        assert!(lock_followed(&tx, desk, &id).await.unwrap().is_none());
        assert_eq!(
            lock_followed(&tx, machine_id, &id).await.unwrap(),
            Some((account_id, "https://forge.example/acme/web/pull/3".to_owned()))
        );
        set_exited(&tx, &id, "exited").await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(job(&c, account_id, &id).await.unwrap().agent_state.as_deref(), Some("exited"));
    }

    #[tokio::test]
    async fn a_due_schedule_is_locked_by_one_replica_posts_its_run_and_moves_on() {
        let db = testing::db().await;
        let (account_id, machine_id) = db.machine("acme", "laptop").await;
        db.card(account_id, machine_id, "c1").await;
        let mut c = db.store.client().await.unwrap();
        let mut other = db.store.client().await.unwrap();
        let repo_id = RepoId(c.query_one("select id from repos", &[]).await.unwrap().get(0));
        let daily = Schedule::parse("0 9 * * *", "UTC").unwrap();
        let slot = Utc::now() - chrono::Duration::minutes(5);
        let new = NewJob {
            id: &JobId::new("s1"),
            account_id,
            repo_id,
            title: "rotate the logs",
            detail: "",
            agent: "claude",
            requires_pr: false,
            schedule: Some((&daily, slot)),
            posted_by: "pat",
            paths: &[],
        };
        insert_job(&c, &new).await.unwrap();
        let schedule = ScheduleId::new("s1");

        let tx = c.transaction().await.unwrap();
        let due = lock_due_schedules(&tx).await.unwrap();
        assert_eq!(
            due.iter().map(|d| (&d.id, d.expr.as_str(), d.zone.as_str())).collect::<Vec<_>>(),
            [(&schedule, "0 9 * * *", "UTC")]
        );
        assert!(due[0].slot <= due[0].now && due[0].last_skip_reason.is_empty());
        let beside = other.transaction().await.unwrap();
        assert!(lock_due_schedules(&beside).await.unwrap().is_empty(), "another replica skips what this one holds");
        drop(beside);
        assert_eq!(last_run(&tx, &schedule).await.unwrap(), None, "it never ran");
        let run = JobId::new("r1");
        insert_run(&tx, &schedule, &run).await.unwrap();
        advance_schedule(&tx, &schedule, Utc::now() + chrono::Duration::hours(1)).await.unwrap();
        tx.commit().await.unwrap();

        let posted = job(&c, account_id, &run).await.unwrap();
        assert_eq!(
            (posted.title.as_str(), posted.column, posted.schedule_id.as_ref()),
            ("rotate the logs", Column::Todo, Some(&schedule))
        );
        assert_eq!(last_run(&c, &schedule).await.unwrap(), Some((Column::Todo, false)));
        let tx = c.transaction().await.unwrap();
        assert!(lock_due_schedules(&tx).await.unwrap().is_empty(), "moved to its next run");
        park_schedule(&tx, &schedule, "its repository is gone").await.unwrap();
        tx.commit().await.unwrap();
        let parked = job(&c, account_id, &JobId::new("s1")).await.unwrap();
        assert_eq!((parked.next_run_at, parked.last_skip_reason.as_deref()), (None, Some("its repository is gone")));
    }

    #[tokio::test]
    async fn a_claimed_card_whose_lease_lapses_goes_back_to_todo_once_and_its_token_opens_nothing() {
        let db = testing::db().await;
        let (account_id, machine_id) = db.machine("acme", "laptop").await;
        let laptop = MachineIdentity { machine_id, machine: "laptop".into(), account_id, account: "acme".into() };
        let mut c = db.store.client().await.unwrap();
        insert_repo(&c, &laptop, "/src/app", "app", "pat").await.unwrap();
        insert_repo(&c, &laptop, "/src/app", "app again", "pat").await.unwrap();
        assert_eq!(repos(&c, account_id).await.unwrap().len(), 1, "a path is one repository");
        // Posted on that repository (the same path again: no second one).
        let id = db.card(account_id, machine_id, "j1").await;
        assert_eq!(repos(&c, account_id).await.unwrap().len(), 1);

        let token = TokenHash::from_stored(b"job-token".to_vec());
        let tx = c.transaction().await.unwrap();
        assert_eq!(claim_next(&tx, machine_id, 60.0, &token).await.unwrap(), Some(id.clone()));
        tx.commit().await.unwrap();
        let holder = attempt_holder(&c, &token).await.unwrap().expect("the attempt the token names");
        assert_eq!((holder.card.clone(), holder.column, holder.lease_live), (id.clone(), Column::InProgress, true));
        assert_eq!(expire_leases(&c).await.unwrap().len(), 0, "a live lease is kept");

        db.test.sql().await.execute("update jobs set lease_until = now() - interval '1 second'", &[]).await.unwrap();
        let lost = expire_leases(&c).await.unwrap();
        assert_eq!(lost.len(), 1);
        assert_eq!((&lost[0].id, lost[0].attempts, lost[0].machine.as_str()), (&id, 1, "laptop"));
        assert!(expire_leases(&c).await.unwrap().is_empty(), "lost once");
        let card = job(&c, account_id, &id).await.unwrap();
        assert_eq!(card.column, Column::Todo);
        assert!(
            card.last_error.as_deref().is_some_and(|e| e.contains("stopped renewing its lease")),
            "{:?}",
            card.last_error
        );
        assert!(attempt_holder(&c, &token).await.unwrap().is_none(), "the attempt's token ended with it");
    }

    #[test]
    fn card_columns_and_kinds_are_the_ones_the_table_allows() {
        let table = include_str!("../../migrations/0003_board.sql");
        let kinds: Vec<String> = CardKind::ALL.iter().map(|k| format!("'{}'", k.db())).collect();
        assert!(table.contains(&format!("check (kind in ({}))", kinds.join(", "))), "{kinds:?}");
        let columns: Vec<String> = [TODO, IN_PROGRESS, REVIEW, DONE].iter().map(|c| format!("'{c}'")).collect();
        assert!(table.contains(&format!("check (state in ({}))", columns.join(", "))), "{columns:?}");
        assert!(table.contains(&format!("where state = '{TODO}' and kind = '{JOB}';")));
        assert!(table.contains(&format!("where kind = '{SCHEDULE}';")));
        assert!(table.contains(&format!("where state = '{IN_PROGRESS}';")));
    }
}
