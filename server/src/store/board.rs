//! The board in the database: cards, repositories, worker leases and schedule firing.

use chrono::{DateTime, SecondsFormat, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::Store;
use super::error::Col;
use super::identity::{Caller, MachineIdentity};
use crate::domain::board::{
    self, Cause, Cleanup, Column, Event, Job as JobView, LEASE_S, MAX_ATTEMPTS, Repo as RepoView, WORKER_FRESH_S,
};
use crate::domain::ids::{self, AccountId, TokenKind};
use crate::domain::redact::RedactedText;
use crate::domain::schedule::Schedule;
use crate::domain::{EntityKind, Error, Result};

/// A new card post, checked by the caller of [`Store::post_job`].
pub struct NewJob<'a> {
    pub title: &'a RedactedText,
    pub detail: &'a RedactedText,
    pub repo: &'a str,
    pub schedule: Option<Schedule>,
    pub agent: Option<&'a str>,
    pub requires_pr: Option<bool>,
    pub cwd: &'a str,
}

/// What an edit changes; `None` leaves a field alone.
#[derive(Default)]
pub struct JobEdit<'a> {
    pub title: Option<&'a RedactedText>,
    pub detail: Option<&'a RedactedText>,
    pub repo: Option<&'a str>,
    /// `Some(None)`: the card runs once.
    pub schedule: Option<Option<Schedule>>,
    pub requires_pr: Option<bool>,
    pub cwd: &'a str,
}

const JOB_COLUMNS: &str = "j.id, j.state, j.kind, j.title, j.detail, j.agent, j.requires_pr, j.schedule, j.time_zone,
     j.next_run_at, j.run_count, j.last_run_at, j.last_skip_reason, j.schedule_id, j.posted_by, j.posted_at,
     j.edited_by, j.edited_at, j.attempts, j.last_error, j.branch, j.worktree, j.agent_state, j.pr_url, j.summary,
     j.started_at, j.finished_at, j.closed_at, r.name as repo_name, r.path as repo_path, m.name as machine_name,
     coalesce(m.worker_seen_at > now() - make_interval(secs => $WORKER_FRESH), false) as dispatcher_running";

fn job_columns() -> String {
    JOB_COLUMNS.replace("$WORKER_FRESH", &WORKER_FRESH_S.to_string())
}

const JOB_JOINS: &str = "jobs j join repos r on r.id = j.repo_id join machines m on m.id = r.machine_id";

fn time(row: &Row, column: &str) -> Result<String> {
    Ok(row
        .col::<Option<DateTime<Utc>>>(column)?
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
        .unwrap_or_default())
}

fn text(row: &Row, column: &str) -> Result<String> {
    Ok(row.col::<Option<String>>(column)?.unwrap_or_default())
}

/// A UTC instant in an IANA zone, as a person reads it.
fn local(at: Option<DateTime<Utc>>, zone: Option<&str>) -> String {
    match (at, zone.and_then(|z| z.parse::<chrono_tz::Tz>().ok())) {
        (Some(at), Some(tz)) => at.with_timezone(&tz).format("%a %Y-%m-%d %H:%M %Z").to_string(),
        _ => String::new(),
    }
}

fn job_from_row(row: &Row) -> Result<JobView> {
    Ok(JobView {
        next_run_local: local(row.col("next_run_at")?, row.col::<Option<&str>>("time_zone")?),
        id: row.col("id")?,
        state: Column::from_db(row.col("state")?)?.name().to_owned(),
        title: row.col("title")?,
        detail: row.col("detail")?,
        repo: RepoView { name: row.col("repo_name")?, path: row.col("repo_path")?, machine: row.col("machine_name")? },
        agent: row.col("agent")?,
        requires_pr: row.col("requires_pr")?,
        schedule: text(row, "schedule")?,
        time_zone: text(row, "time_zone")?,
        next_run_at: time(row, "next_run_at")?,
        run_count: row.col::<i32>("run_count")? as u32,
        last_run_at: time(row, "last_run_at")?,
        last_skip_reason: text(row, "last_skip_reason")?,
        schedule_id: text(row, "schedule_id")?,
        posted_by: row.col("posted_by")?,
        posted_at: time(row, "posted_at")?,
        edited_by: text(row, "edited_by")?,
        edited_at: time(row, "edited_at")?,
        attempts: row.col::<i32>("attempts")? as u32,
        last_error: text(row, "last_error")?,
        branch: text(row, "branch")?,
        worktree: text(row, "worktree")?,
        agent_state: text(row, "agent_state")?,
        pr_url: text(row, "pr_url")?,
        summary: text(row, "summary")?,
        started_at: time(row, "started_at")?,
        finished_at: time(row, "finished_at")?,
        closed_at: time(row, "closed_at")?,
        dispatcher_running: row.col("dispatcher_running")?,
        changed: Vec::new(),
    })
}

/// The worker lease; `RELAY_LEASE_S` shortens it (tests of lost workers).
fn lease_s() -> f64 {
    std::env::var("RELAY_LEASE_S").ok().and_then(|v| v.parse::<f64>().ok()).filter(|s| *s >= 1.0).unwrap_or(LEASE_S)
}

fn new_job_id() -> String {
    // Card ids are short enough to say aloud; 10 base-36 characters leave collisions to chance alone.
    ids::new_message_id()[..10].to_owned()
}

/// A repository folder name as cards show it.
fn repo_name(path: &str) -> String {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or(path).to_owned()
}

fn absolute(path: &str) -> Result<String> {
    let p = path.trim();
    if !p.starts_with('/') || p.contains('\0') || p.split('/').any(|c| c == "..") {
        return Err(Error::invalid(format!("repository path {path:?} must be absolute")));
    }
    Ok(if p.len() > 1 { p.trim_end_matches('/').to_owned() } else { p.to_owned() })
}

async fn job(c: &impl GenericClient, account_id: AccountId, id: &str) -> Result<JobView> {
    let sql = format!("select {} from {JOB_JOINS} where j.id = $1 and j.account_id = $2", job_columns());
    let row = c.query_opt(&sql, &[&id.trim(), &account_id]).await?.ok_or_else(|| {
        Error::not_found(
            EntityKind::Card,
            format!("no card with id {:?} on your account's board: ids come from list_jobs", id.trim()),
        )
    })?;
    job_from_row(&row)
}

async fn state_of(c: &impl GenericClient, account_id: AccountId, id: &str) -> Result<(Column, String)> {
    let row = c
        .query_opt(
            "select state, kind from jobs where id = $1 and account_id = $2 for update",
            &[&id.trim(), &account_id],
        )
        .await?
        .ok_or_else(|| {
            Error::not_found(
                EntityKind::Card,
                format!("no card with id {:?} on your account's board: ids come from list_jobs", id.trim()),
            )
        })?;
    Ok((Column::from_db(row.col(0)?)?, row.col(1)?))
}

impl Store {
    pub async fn set_operator(&self, account: &str, endpoint: &str) -> Result<()> {
        let (machine, handle) = endpoint
            .split_once('/')
            .ok_or_else(|| Error::invalid(format!("invalid operator {endpoint:?}: write MACHINE/HANDLE")))?;
        crate::domain::names::validate(crate::domain::names::NameKind::Machine, machine)?;
        crate::domain::names::validate(crate::domain::names::NameKind::Handle, handle)?;
        let client = self.client().await?;
        let updated =
            client.execute("update accounts set operator = $2 where name = $1", &[&account, &endpoint]).await?;
        if updated == 0 {
            return Err(Error::not_found(EntityKind::Account, format!("no account {account}")));
        }
        Ok(())
    }

    // ---- cards -------------------------------------------------------------------------------

    pub async fn post_job(&self, caller: &Caller, new: NewJob<'_>) -> Result<JobView> {
        let title = board::title(new.title.as_str())?;
        let detail = new.detail.as_str();
        board::detail(detail)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let repo = resolve_repo(&tx, caller, new.repo, new.cwd).await?;
        let agent = match new.agent.filter(|a| !a.trim().is_empty()) {
            Some(a) => board::agent(a)?,
            None => {
                let harness: String = tx
                    .query_one("select harness from endpoints where id = $1", &[&caller.endpoint_id])
                    .await?
                    .col(0)?;
                board::agent(&harness).unwrap_or("claude")
            }
        };
        let id = new_job_id();
        let (kind, next, expr, zone) = match &new.schedule {
            Some(s) => ("schedule", Some(s.next_after(Utc::now())?), Some(s.expr()), Some(s.zone())),
            None => ("job", None, None, None),
        };
        let requires_pr = new.requires_pr.unwrap_or(new.schedule.is_none());
        tx.execute(
            "insert into jobs (id, account_id, repo_id, kind, state, title, detail, agent, requires_pr, schedule, time_zone,
                               next_run_at, posted_by)
             values ($1, $2, $3, $4, 'todo', $5, $6, $7, $8, $9, $10, $11, $12)",
            &[&id, &caller.account_id, &repo, &kind, &title, &detail, &agent, &requires_pr, &expr, &zone, &next, &caller.address()],
        )
        .await?;
        let view = job(&tx, caller.account_id, &id).await?;
        tx.commit().await?;
        Ok(view)
    }

    pub async fn list_jobs(&self, caller: &Caller, state: &str, repo: &str, cwd: &str) -> Result<(Vec<JobView>, u32)> {
        let client = self.client().await?;
        let column = if state.trim().is_empty() { None } else { Some(Column::parse(state)?) };
        let repo_id = if repo.trim().is_empty() { None } else { Some(resolve_repo(&client, caller, repo, cwd).await?) };
        let sql = format!(
            "select {} from {JOB_JOINS}
             where j.account_id = $1 and ($2::text is null and j.state <> 'done' or j.state = $2)
               and ($3::bigint is null or j.repo_id = $3)
             order by case j.state when 'todo' then 0 when 'in_progress' then 1 when 'review' then 2 else 3 end,
                      j.posted_at",
            job_columns()
        );
        let state_db = column.map(Column::db);
        let jobs = client
            .query(&sql, &[&caller.account_id, &state_db, &repo_id])
            .await?
            .iter()
            .map(job_from_row)
            .collect::<Result<_>>()?;
        let archived: i64 = if column.is_none() {
            client
                .query_one(
                    "select count(*) from jobs where account_id = $1 and state = 'done' and ($2::bigint is null or repo_id = $2)",
                    &[&caller.account_id, &repo_id],
                )
                .await?
                .col(0)?
        } else {
            0
        };
        Ok((jobs, archived as u32))
    }

    pub async fn read_job(&self, caller: &Caller, id: &str) -> Result<JobView> {
        let client = self.client().await?;
        job(&client, caller.account_id, id).await
    }

    /// Replaces the given fields of a card still in To do.
    pub async fn edit_job(&self, caller: &Caller, id: &str, edit: JobEdit<'_>) -> Result<JobView> {
        let id = id.trim();
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let (column, _) = state_of(&tx, caller.account_id, id).await?;
        if column != Column::Todo {
            return Err(Error::FailedPrecondition(format!(
                "only cards still in To do can be edited; this one is in {}: its agent already has the text",
                column.name()
            )));
        }
        let mut changed = Vec::new();
        if let Some(title) = edit.title {
            let title = board::title(title.as_str())?;
            tx.execute("update jobs set title = $2 where id = $1", &[&id, &title]).await?;
            changed.push("title");
        }
        if let Some(detail) = edit.detail {
            let detail = detail.as_str();
            board::detail(detail)?;
            tx.execute("update jobs set detail = $2 where id = $1", &[&id, &detail]).await?;
            changed.push("detail");
        }
        if let Some(repo) = edit.repo {
            let repo = resolve_repo(&tx, caller, repo, edit.cwd).await?;
            tx.execute("update jobs set repo_id = $2 where id = $1", &[&id, &repo]).await?;
            changed.push("repo");
        }
        if let Some(schedule) = edit.schedule {
            match schedule {
                Some(s) => {
                    let next = s.next_after(Utc::now())?;
                    tx.execute(
                        "update jobs set kind = 'schedule', schedule = $2, time_zone = $3, next_run_at = $4 where id = $1",
                        &[&id, &s.expr(), &s.zone(), &next],
                    )
                    .await?;
                }
                None => {
                    tx.execute(
                        "update jobs set kind = 'job', schedule = null, time_zone = null, next_run_at = null where id = $1",
                        &[&id],
                    )
                    .await?;
                }
            }
            changed.push("schedule");
        }
        if let Some(requires_pr) = edit.requires_pr {
            tx.execute("update jobs set requires_pr = $2 where id = $1", &[&id, &requires_pr]).await?;
            changed.push("requires_pr");
        }
        if changed.is_empty() {
            return Err(Error::invalid("nothing to change: pass title, detail, repo, schedule or requires_pr"));
        }
        // An edited card gets a fresh set of attempts.
        tx.execute(
            "update jobs set edited_by = $2, edited_at = now(), attempts = 0 where id = $1",
            &[&id, &caller.address()],
        )
        .await?;
        let mut view = job(&tx, caller.account_id, id).await?;
        tx.commit().await?;
        view.changed = changed.into_iter().map(str::to_owned).collect();
        Ok(view)
    }

    /// The card's agent is done: its card moves to Review with the pull request or the summary.
    pub async fn finish_job(
        &self,
        caller: &Caller,
        token: &str,
        pr_url: &RedactedText,
        summary: &RedactedText,
    ) -> Result<JobView> {
        if token.is_empty() {
            return Err(Error::FailedPrecondition(
                "finish_job is for an agent the board dispatched, and this session has no card".into(),
            ));
        }
        ids::check_token(TokenKind::JobToken, token)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "select id, state, requires_pr from jobs where job_token_hash = $1 and account_id = $2 for update",
                &[&ids::token_hash(token), &caller.account_id],
            )
            .await?
            .ok_or_else(|| {
                Error::FailedPrecondition("the card this agent was dispatched for is no longer its to finish".into())
            })?;
        let (id, state, requires_pr): (String, String, bool) = (row.col(0)?, row.col(1)?, row.col(2)?);
        let column = Column::from_db(&state)?;
        if column != Column::InProgress {
            return Err(Error::FailedPrecondition(format!("the card is in {}, not in progress", column.name())));
        }
        let (pr, summary) = (pr_url.as_str().trim(), summary.as_str().trim());
        let pr = if requires_pr {
            if pr.is_empty() {
                return Err(Error::invalid(
                    "this card requires a pull request: open it, then call finish_job with its URL as pr_url",
                ));
            }
            Some(board::pr_url(pr)?)
        } else {
            if summary.is_empty() {
                return Err(Error::invalid("this card needs no pull request: pass a summary of what you did or found"));
            }
            if pr.is_empty() { None } else { Some(board::pr_url(pr)?) }
        };
        board::detail(summary)?;
        tx.execute(
            "update jobs set state = 'review', pr_url = $2, summary = nullif($3, ''), finished_at = now(),
                             agent_state = 'finished', lease_until = null
             where id = $1",
            &[&id, &pr, &summary],
        )
        .await?;
        let review = Event::Review { pr_url: pr, summary: (!summary.is_empty()).then_some(summary) };
        super::notices::notify_board(&tx, caller.account_id, &id, review, Some(caller.endpoint_id), self.max_unread)
            .await?;
        let view = job(&tx, caller.account_id, &id).await?;
        tx.commit().await?;
        Ok(view)
    }

    /// Operator: a card in Review is accepted (Done) or sent back to To do with the note.
    pub async fn close_job(&self, caller: &Caller, id: &str, accept: bool, note: &RedactedText) -> Result<JobView> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        is_operator(&tx, caller).await?;
        let (column, _) = state_of(&tx, caller.account_id, id).await?;
        if column != Column::Review {
            return Err(Error::FailedPrecondition(format!(
                "only cards in Review can be closed; this one is in {}",
                column.name()
            )));
        }
        let by = caller.address();
        if accept {
            tx.execute(
                "update jobs set state = 'done', closed_at = now(), job_token_hash = null where id = $1",
                &[&id.trim()],
            )
            .await?;
            let done = Event::Done { by: &by };
            super::notices::notify_board(
                &tx,
                caller.account_id,
                id.trim(),
                done,
                Some(caller.endpoint_id),
                self.max_unread,
            )
            .await?;
        } else {
            let note = note.as_str().trim();
            if note.is_empty() {
                return Err(Error::invalid(
                    "sending a card back needs a note: what the next worker must do differently",
                ));
            }
            if note.len() > board::MAX_NOTE_BYTES {
                return Err(Error::invalid(format!("note is longer than {} bytes", board::MAX_NOTE_BYTES)));
            }
            let appended = format!("\n\nReview note from {} for the next attempt:\n{note}", caller.address());
            tx.execute(
                "update jobs set state = 'todo', detail = detail || $2, closed_at = null, finished_at = null, pr_url = null,
                                 summary = null, job_token_hash = null, lease_until = null, agent_state = null, attempts = 0
                 where id = $1",
                &[&id.trim(), &appended],
            )
            .await?;
            let back = Event::SentBack { by: &by, note };
            super::notices::notify_board(
                &tx,
                caller.account_id,
                id.trim(),
                back,
                Some(caller.endpoint_id),
                self.max_unread,
            )
            .await?;
        }
        let view = job(&tx, caller.account_id, id).await?;
        tx.commit().await?;
        Ok(view)
    }

    /// Operator: a repository of the operator's own machine.
    pub async fn add_repo(&self, caller: &Caller, path: &RedactedText) -> Result<RepoView> {
        let client = self.client().await?;
        is_operator(&client, caller).await?;
        let identity = MachineIdentity {
            account_id: caller.account_id,
            account: caller.account.clone(),
            machine_id: caller.machine_id,
            machine: caller.machine.clone(),
        };
        insert_repo(&client, &identity, path.as_str(), &caller.address()).await
    }

    // ---- workers -----------------------------------------------------------------------------

    pub async fn register_repo(&self, machine: &MachineIdentity, path: &str) -> Result<RepoView> {
        let client = self.client().await?;
        insert_repo(&client, machine, path, &format!("worker on {}", machine.machine)).await
    }

    /// Takes the oldest runnable To do card of this machine's repositories, and lists finished
    /// cards whose worktrees this machine should remove.
    pub async fn claim(&self, machine: &MachineIdentity) -> Result<(Option<(JobView, String)>, Vec<Cleanup>)> {
        let token = ids::new_token(TokenKind::JobToken);
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute("update machines set worker_seen_at = now() where id = $1", &[&machine.machine_id]).await?;
        let claimed = tx
            .query_opt(
                "update jobs set state = 'in_progress', lease_machine = $1, lease_until = now() + make_interval(secs => $2),
                                 job_token_hash = $3, attempts = attempts + 1, started_at = now(), agent_state = 'starting',
                                 branch = 'relay/' || id
                 where id = (
                     select j.id from jobs j join repos r on r.id = j.repo_id
                     where r.machine_id = $1 and j.kind = 'job' and j.state = 'todo' and j.attempts < $4
                     order by j.posted_at
                     for update of j skip locked
                     limit 1)
                 returning id",
                &[&machine.machine_id, &lease_s(), &ids::token_hash(&token), &MAX_ATTEMPTS],
            )
            .await?;
        let claimed = match claimed {
            Some(row) => Some((job(&tx, machine.account_id, row.col(0)?).await?, token)),
            None => None,
        };
        let cleanup = tx
            .query(
                "select j.id, j.worktree, r.path from jobs j join repos r on r.id = j.repo_id
                 where r.machine_id = $1 and j.state = 'done' and j.worktree is not null and not j.worktree_removed",
                &[&machine.machine_id],
            )
            .await?
            .iter()
            .map(|r| Ok(Cleanup { id: r.col(0)?, worktree: r.col(1)?, repo_path: r.col(2)? }))
            .collect::<Result<_>>()?;
        tx.commit().await?;
        Ok((claimed, cleanup))
    }

    /// Renews the lease; returns whether the card is still in progress and its column.
    pub async fn renew(
        &self,
        machine: &MachineIdentity,
        token: &str,
        agent_state: &RedactedText,
        worktree: &str,
        branch: &str,
    ) -> Result<(bool, String)> {
        ids::check_token(TokenKind::JobToken, token)?;
        let client = self.client().await?;
        client.execute("update machines set worker_seen_at = now() where id = $1", &[&machine.machine_id]).await?;
        let renewed = client
            .execute(
                "update jobs set lease_until = now() + make_interval(secs => $3), agent_state = nullif($4, ''),
                                 worktree = coalesce(nullif($5, ''), worktree), branch = coalesce(nullif($6, ''), branch)
                 where job_token_hash = $1 and lease_machine = $2 and state = 'in_progress'",
                &[&ids::token_hash(token), &machine.machine_id, &lease_s(), &agent_state.as_str(), &worktree, &branch],
            )
            .await?;
        let state = client
            .query_opt("select state from jobs where job_token_hash = $1", &[&ids::token_hash(token)])
            .await?
            .map(|r| Column::from_db(r.col(0)?).map(|c| c.name().to_owned()))
            .transpose()?
            .unwrap_or_else(|| "todo".to_owned());
        Ok((renewed == 1, state))
    }

    /// The agent process ended; a card it left in progress goes back to To do with the error.
    pub async fn release(
        &self,
        machine: &MachineIdentity,
        token: &str,
        exit_code: i32,
        error: &RedactedText,
    ) -> Result<JobView> {
        let error = error.as_str();
        ids::check_token(TokenKind::JobToken, token)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "select id, state, attempts from jobs where job_token_hash = $1 and lease_machine = $2 for update",
                &[&ids::token_hash(token), &machine.machine_id],
            )
            .await?
            .ok_or_else(|| {
                Error::not_found(EntityKind::Card, "no card holds this job token (its lease may have expired)")
            })?;
        let (id, state, attempts): (String, String, i32) = (row.col(0)?, row.col(1)?, row.col(2)?);
        if Column::from_db(&state)? == Column::InProgress {
            let mut why = if error.trim().is_empty() {
                format!("attempt {attempts}: the agent exited with code {exit_code} before calling finish_job")
            } else {
                format!("attempt {attempts}: {}", error.trim())
            };
            if attempts >= MAX_ATTEMPTS {
                why.push_str(&format!("; gave up after {MAX_ATTEMPTS} attempts: edit the card to try again"));
            }
            tx.execute(
                "update jobs set state = 'todo', last_error = $2, job_token_hash = null, lease_until = null,
                                 agent_state = $3, started_at = null
                 where id = $1",
                &[&id, &why, &format!("exited with code {exit_code}")],
            )
            .await?;
            let cause = Cause::Exited { code: exit_code, error };
            let event = if attempts >= MAX_ATTEMPTS {
                Event::Exhausted { cause }
            } else {
                Event::Returned { attempt: attempts, cause }
            };
            super::notices::notify_board(&tx, machine.account_id, &id, event, None, self.max_unread).await?;
        } else {
            tx.execute(
                "update jobs set agent_state = $2, job_token_hash = null where id = $1",
                &[&id, &format!("exited with code {exit_code}")],
            )
            .await?;
        }
        let view = job(&tx, machine.account_id, &id).await?;
        tx.commit().await?;
        Ok(view)
    }

    pub async fn cleaned(&self, machine: &MachineIdentity, ids: &[String]) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "update jobs j set worktree_removed = true from repos r
                 where r.id = j.repo_id and r.machine_id = $1 and j.id = any($2) and j.state = 'done'",
                &[&machine.machine_id, &ids],
            )
            .await?;
        Ok(())
    }

    // ---- the scheduler's rounds ----------------------------------------------------------------

    /// Cards whose worker stopped renewing go back to To do with the reason; the board tells the
    /// operator and the poster.
    pub async fn expire_leases(&self) -> Result<u64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let expired = tx
            .query(
                "update jobs j set state = 'todo', job_token_hash = null, lease_until = null, agent_state = 'lost',
                                   started_at = null,
                                   last_error = 'attempt ' || j.attempts || ': the worker on ' || m.name
                                       || ' stopped renewing its lease'
                                       || case when j.attempts >= $1 then '; gave up after ' || $1 || ' attempts: edit the card to try again' else '' end
                 from machines m
                 where m.id = j.lease_machine and j.state = 'in_progress' and j.lease_until < now()
                 returning j.id, j.account_id, j.attempts, m.name",
                &[&MAX_ATTEMPTS],
            )
            .await?;
        for row in &expired {
            let (id, account_id, attempts, machine): (&str, AccountId, i32, &str) =
                (row.col(0)?, row.col(1)?, row.col(2)?, row.col(3)?);
            let cause = Cause::LeaseLost { machine };
            let event = if attempts >= MAX_ATTEMPTS {
                Event::Exhausted { cause }
            } else {
                Event::Returned { attempt: attempts, cause }
            };
            super::notices::notify_board(&tx, account_id, id, event, None, self.max_unread).await?;
        }
        tx.commit().await?;
        Ok(expired.len() as u64)
    }

    /// Posts a run card for each due schedule, unless its last run is still going or its pull request
    /// is open. `skip locked` and the move of `next_run_at` in the same transaction make each slot fire
    /// on one replica only; a schedule late after downtime fires once and moves to its next future slot.
    pub async fn fire_due_schedules(&self) -> Result<u32> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let due = tx
            .query(
                "select id, schedule, time_zone, account_id, coalesce(last_skip_reason, '') from jobs
                 where kind = 'schedule' and state = 'todo' and next_run_at <= now()
                 order by next_run_at limit 50
                 for update skip locked",
                &[],
            )
            .await?;
        let mut fired = 0;
        for row in &due {
            let (id, expr, zone, account_id, skipped): (String, String, String, AccountId, String) =
                (row.col(0)?, row.col(1)?, row.col(2)?, row.col(3)?, row.col(4)?);
            let next = Schedule::parse(&expr, &zone).and_then(|s| s.next_after(Utc::now()));
            let next = match next {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(card = %id, error = %e, "schedule cannot be evaluated; parked");
                    tx.execute(
                        "update jobs set next_run_at = null, last_skip_reason = $2 where id = $1",
                        &[&id, &e.to_string()],
                    )
                    .await?;
                    continue;
                }
            };
            let last = tx
                .query_opt(
                    "select state, pr_url is not null from jobs where schedule_id = $1 order by posted_at desc limit 1",
                    &[&id],
                )
                .await?;
            let last_run = match &last {
                Some(r) => Some((r.col::<&str>(0)?, r.col::<bool>(1)?)),
                None => None,
            };
            let hold = match last_run {
                Some(("todo" | "in_progress", _)) => Some("its last run is still in progress"),
                Some(("review", true)) => Some("its last run's pull request is still open"),
                _ => None,
            };
            if let Some(reason) = hold {
                tx.execute(
                    "update jobs set next_run_at = $2, last_skip_reason = $3 where id = $1",
                    &[&id, &next, &format!("{} at {}", reason, Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true))],
                )
                .await?;
                // Told once when it starts holding off for this reason, not at every slot after.
                if !skipped.starts_with(reason) {
                    let next = next.to_rfc3339_opts(SecondsFormat::Secs, true);
                    let held = Event::HeldOff { why: reason, next: &next };
                    super::notices::notify_board(&tx, account_id, &id, held, None, self.max_unread).await?;
                }
                continue;
            }
            let run = new_job_id();
            tx.execute(
                "insert into jobs (id, account_id, repo_id, kind, state, title, detail, agent, requires_pr, schedule_id, posted_by)
                 select $2, account_id, repo_id, 'job', 'todo', title, detail, agent, requires_pr, id, 'schedule ' || id
                 from jobs where id = $1",
                &[&id, &run],
            )
            .await?;
            tx.execute(
                "update jobs set next_run_at = $2, run_count = run_count + 1, last_run_at = now(), last_skip_reason = null
                 where id = $1",
                &[&id, &next],
            )
            .await?;
            super::notices::notify_board(&tx, account_id, &id, Event::Fired { run: &run }, None, self.max_unread)
                .await?;
            fired += 1;
        }
        tx.commit().await?;
        Ok(fired)
    }
}

/// The repository a card is for: a path or folder name, else the one containing `cwd` on the
/// caller's machine.
async fn resolve_repo(c: &impl GenericClient, caller: &Caller, repo: &str, cwd: &str) -> Result<i64> {
    let repo = repo.trim();
    let rows = if repo.is_empty() {
        let cwd = cwd.trim();
        if cwd.is_empty() {
            return Err(Error::invalid("no repo given: pass repo (a path or a folder name from list_jobs)"));
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
            &[&caller.account_id, &absolute(repo)?, &caller.machine_id],
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
        )),
        [] => Err(Error::not_found(
            EntityKind::Repository,
            format!(
                "no repository {repo:?} on the board: pass a path or folder name that list_jobs shows, or add it with add_repo"
            ),
        )),
        [one] => one.col(0),
        [first, ..] => first.col(0),
    }
}

pub(crate) async fn is_operator(c: &impl GenericClient, caller: &Caller) -> Result<()> {
    let operator: Option<String> =
        c.query_one("select operator from accounts where id = $1", &[&caller.account_id]).await?.col(0)?;
    match operator {
        Some(op) if op == format!("{}/{}", caller.machine, caller.handle) => Ok(()),
        Some(op) => Err(Error::PermissionDenied(format!(
            "only the account's operator endpoint ({}/{op}) may do this",
            caller.account
        ))),
        None => Err(Error::PermissionDenied(
            "this account has no operator endpoint: an admin names one with relay-server admin operator ACCOUNT MACHINE/HANDLE"
                .into(),
        )),
    }
}

async fn insert_repo(c: &impl GenericClient, machine: &MachineIdentity, path: &str, by: &str) -> Result<RepoView> {
    let path = absolute(path)?;
    let name = repo_name(&path);
    c.execute(
        "insert into repos (account_id, machine_id, path, name, added_by) values ($1, $2, $3, $4, $5)
         on conflict (machine_id, path) do nothing",
        &[&machine.account_id, &machine.machine_id, &path, &name, &by],
    )
    .await?;
    Ok(RepoView { name, path, machine: machine.machine.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_paths() {
        assert_eq!(absolute("/src/app/").unwrap(), "/src/app");
        assert_eq!(absolute("/").unwrap(), "/");
        assert!(absolute("src/app").is_err() && absolute("/src/../etc").is_err());
        assert_eq!(repo_name("/src/app"), "app");
    }
}
