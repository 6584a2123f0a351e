//! The board: cards posted, edited, finished and closed by agents, and the worker's side (claims,
//! leases, releases, cleanups). Card text is redacted before it is stored; schedules are parsed in
//! the poster's zone.

use chrono::{SecondsFormat, Utc};
use deadpool_postgres::GenericClient;

use super::notices::notify_board;
use super::{Core, optional};
use crate::domain::board::{self as rules, Cause, Cleanup, Column, Event, Job, Repo, hold_reason};
use crate::domain::caller::Human;
use crate::domain::caller::{Caller, MachineIdentity};
use crate::domain::ids::{self, JobId, TokenKind};
use crate::domain::redact::RedactedText;
use crate::domain::schedule::Schedule;
use crate::domain::{EntityKind, Error, Result, limits};
use crate::store;
use crate::store::board::{self, NewJob};

/// The job board: cards, repositories, workers' leases, schedules, pull requests.
#[derive(Clone)]
pub struct BoardService {
    core: Core,
}

impl BoardService {
    pub(super) fn new(core: Core) -> Self {
        Self { core }
    }

    /// A worker's lease on a card, in seconds.
    pub fn lease_s(&self) -> f64 {
        self.core.lease_s()
    }
}

/// A schedule as a card carries it: absent when the expression is empty; read in `zone` (UTC when empty).
fn schedule(expr: &str, zone: &str) -> Result<Option<Schedule>> {
    if expr.trim().is_empty() {
        return Ok(None);
    }
    Schedule::parse(expr, if zone.trim().is_empty() { "UTC" } else { zone.trim() }).map(Some)
}

/// Refuses a caller that is not the account's operator endpoint. A card's agent never is: it
/// would review its own card and answer its own permission requests.
pub(super) async fn is_operator(c: &impl GenericClient, caller: &Caller) -> Result<()> {
    caller.not_card_agent("the operator's work")?;
    let operator = board::operator(c, caller.account_id).await?;
    rules::check_operator(operator.as_deref(), &caller.account, &format!("{}/{}", caller.machine, caller.handle))
}

/// A card to post, as the agent wrote it.
pub struct Post<'a> {
    pub title: &'a str,
    pub detail: &'a str,
    pub repo: &'a str,
    pub schedule: &'a str,
    pub time_zone: &'a str,
    pub agent: &'a str,
    pub requires_pr: Option<bool>,
    /// Where the poster works: the default repository.
    pub cwd: &'a str,
    /// The paths the work changes (claimed for the card's agent when it runs).
    pub paths: &'a [String],
}

/// What an edit changes; `None` leaves a field as it is.
pub struct Edit<'a> {
    pub title: Option<&'a str>,
    pub detail: Option<&'a str>,
    pub repo: Option<&'a str>,
    /// `Some("")` makes the card run once.
    pub schedule: Option<&'a str>,
    pub time_zone: &'a str,
    pub requires_pr: Option<bool>,
    pub cwd: &'a str,
}

impl BoardService {
    pub async fn post_job(&self, caller: &Caller, post: Post<'_>) -> Result<Job> {
        let schedule = schedule(post.schedule, post.time_zone)?;
        let (title, detail) = (RedactedText::from_agent(post.title), RedactedText::from_agent(post.detail));
        let title = rules::title(title.as_str())?;
        let detail = detail.as_str();
        rules::detail(detail)?;
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let repo_id = board::resolve_repo(&tx, caller, post.repo, post.cwd).await?;
        let agent = match optional(post.agent).filter(|a| !a.trim().is_empty()) {
            Some(a) => rules::agent(a)?,
            None => rules::agent(&board::harness(&tx, caller.endpoint_id).await?).unwrap_or("claude"),
        };
        let id = rules::new_card_id();
        let schedule = match &schedule {
            Some(s) => Some((s, s.next_after(Utc::now())?)),
            None => None,
        };
        let posted_by = caller.address();
        let paths: Vec<String> = if post.paths.is_empty() {
            Vec::new()
        } else {
            crate::domain::claims::parse_paths(post.paths)?.iter().map(ToString::to_string).collect()
        };
        let new = NewJob {
            id: &id,
            account_id: caller.account_id,
            repo_id,
            title,
            detail,
            agent,
            requires_pr: post.requires_pr.unwrap_or(schedule.is_none()),
            schedule,
            posted_by: &posted_by,
            paths: &paths,
        };
        board::insert_job(&tx, &new).await?;
        let job = board::job(&tx, caller.account_id, &id).await?;
        store::commit(tx).await?;
        tracing::info!(card = %job.id, by = %caller.address(), "card posted");
        Ok(job)
    }

    /// Cards of one column (or all but the archive), of one repository or all; and how many are archived.
    pub async fn list_jobs(&self, caller: &Caller, state: &str, repo: &str, cwd: &str) -> Result<(Vec<Job>, u32)> {
        let db = self.core.store.client().await?;
        let column = if state.trim().is_empty() { None } else { Some(Column::parse(state)?) };
        let repo_id =
            if repo.trim().is_empty() { None } else { Some(board::resolve_repo(&db, caller, repo, cwd).await?) };
        let jobs = board::list(&db, caller.account_id, column, repo_id).await?;
        let archived = if column.is_none() { board::archived(&db, caller.account_id, repo_id).await? } else { 0 };
        Ok((jobs, archived))
    }

    pub async fn read_job(&self, caller: &Caller, id: &str) -> Result<Job> {
        let db = self.core.store.client().await?;
        Ok(board::job(&db, caller.account_id, &JobId::new(id.trim())).await?)
    }

    /// Replaces the given fields of a card still in To do.
    pub async fn edit_job(&self, caller: &Caller, id: &str, edit: Edit<'_>) -> Result<Job> {
        let schedule = edit.schedule.map(|expr| schedule(expr, edit.time_zone)).transpose()?;
        let (title, detail) = (edit.title.map(RedactedText::from_agent), edit.detail.map(RedactedText::from_agent));
        let id = &JobId::new(id.trim());
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        rules::check_editable(board::lock_card(&tx, caller.account_id, id).await?)?;
        let mut changed = Vec::new();
        if let Some(title) = &title {
            board::set_title(&tx, id, rules::title(title.as_str())?).await?;
            changed.push("title");
        }
        if let Some(detail) = &detail {
            let detail = detail.as_str();
            rules::detail(detail)?;
            board::set_detail(&tx, id, detail).await?;
            changed.push("detail");
        }
        if let Some(repo) = edit.repo {
            let repo_id = board::resolve_repo(&tx, caller, repo, edit.cwd).await?;
            board::set_repo(&tx, id, repo_id).await?;
            changed.push("repo");
        }
        if let Some(schedule) = &schedule {
            let schedule = match schedule {
                Some(s) => Some((s, s.next_after(Utc::now())?)),
                None => None,
            };
            board::set_schedule(&tx, id, schedule).await?;
            changed.push("schedule");
        }
        if let Some(requires_pr) = edit.requires_pr {
            board::set_requires_pr(&tx, id, requires_pr).await?;
            changed.push("requires_pr");
        }
        if changed.is_empty() {
            return Err(Error::invalid("nothing to change: pass title, detail, repo, schedule or requires_pr"));
        }
        board::mark_edited(&tx, id, &caller.address()).await?;
        let mut job = board::job(&tx, caller.account_id, id).await?;
        store::commit(tx).await?;
        job.changed = changed.into_iter().map(str::to_owned).collect();
        Ok(job)
    }

    /// A dispatched agent reports its card done: to Review with the pull request or the summary.
    /// A card's agent finishes its own card (its session ends with the attempt); a machine's agent
    /// names the card by the job token it was given.
    pub async fn finish_job(&self, caller: &Caller, job_token: &str, pr_url: &str, summary: &str) -> Result<Job> {
        let (pr_url, summary) = (RedactedText::from_agent(pr_url), RedactedText::from_agent(summary));
        let token_hash = caller.attempt_hash(job_token)?.ok_or_else(|| {
            Error::FailedPrecondition(
                "finish_job is for an agent the board dispatched, and this session has no card".into(),
            )
        })?;
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let card = board::lock_dispatched(&tx, caller.account_id, &token_hash).await?.ok_or_else(|| {
            Error::FailedPrecondition("the card this agent was dispatched for is no longer its to finish".into())
        })?;
        let summary = summary.as_str().trim();
        let pr = rules::finished(card.column, card.requires_pr, pr_url.as_str().trim(), summary)?;
        board::set_review(&tx, &card.id, pr, summary).await?;
        let review = Event::Review { pr_url: pr, summary: (!summary.is_empty()).then_some(summary) };
        notify_board(&tx, caller.account_id, &card.id, review, Some(caller.endpoint_id), self.core.store.max_unread())
            .await?;
        let job = board::job(&tx, caller.account_id, &card.id).await?;
        store::commit(tx).await?;
        // The database ended the agent's session with the attempt; this replica forgets it now.
        self.core.store.sessions().forget_attempt(&card.id);
        tracing::info!(card = %job.id, by = %caller.address(), "card finished");
        Ok(job)
    }

    /// The operator accepts a card in Review (Done) or sends it back to To do with a note.
    pub async fn close_job(&self, caller: &Caller, id: &str, accept: bool, note: &str) -> Result<Job> {
        self.close(caller, id, accept, note, &caller.address(), true).await
    }

    /// Closes a card in Review as `actor`, named `by` in the notices; only the operator endpoint
    /// when `operator_only` (a person of the account may close its cards too).
    async fn close(
        &self,
        actor: &Caller,
        id: &str,
        accept: bool,
        note: &str,
        by: &str,
        operator_only: bool,
    ) -> Result<Job> {
        let note = RedactedText::from_agent(note);
        let id = &JobId::new(id.trim());
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        if operator_only {
            is_operator(&tx, actor).await?;
        }
        rules::check_closable(board::lock_card(&tx, actor.account_id, id).await?)?;
        let event = if accept {
            board::set_done(&tx, id).await?;
            Event::Done { by }
        } else {
            let note = rules::review_note(note.as_str())?;
            board::send_back(&tx, id, &rules::review_note_detail(by, note)).await?;
            Event::SentBack { by, note }
        };
        notify_board(&tx, actor.account_id, id, event, Some(actor.endpoint_id), self.core.store.max_unread()).await?;
        let job = board::job(&tx, actor.account_id, id).await?;
        store::commit(tx).await?;
        tracing::info!(card = %job.id, by, state = job.column.name(), "card closed");
        Ok(job)
    }

    // ---- the account's person, from the web console: the agents' rules, as the human `me` ------

    /// Posts a card as the account's human; `repo` names one of the account's repositories.
    pub async fn person_post_job(&self, person: &Human, post: Post<'_>) -> Result<Job> {
        let me = self.core.me(person).await?;
        self.post_job(&me, post).await
    }

    /// Edits a card still in To do, as the account's human.
    pub async fn person_edit_job(&self, person: &Human, id: &str, edit: Edit<'_>) -> Result<Job> {
        let me = self.core.me(person).await?;
        self.edit_job(&me, id, edit).await
    }

    /// The account's person accepts a card in Review or sends it back with a note, as the operator
    /// would; the operator and the poster are told.
    pub async fn person_close_job(&self, person: &Human, id: &str, accept: bool, note: &str) -> Result<Job> {
        let me = self.core.me(person).await?;
        let by = format!("{}/me ({})", person.account, person.name);
        self.close(&me, id, accept, note, &by, false).await
    }

    /// The operator adds a repository of its own machine.
    pub async fn add_repo(&self, caller: &Caller, path: &str) -> Result<Repo> {
        let db = self.core.store.client().await?;
        is_operator(&db, caller).await?;
        let machine = MachineIdentity {
            account_id: caller.account_id,
            account: caller.account.clone(),
            machine_id: caller.machine_id,
            machine: caller.machine.clone(),
        };
        add_repo(&db, &machine, path, &caller.address()).await
    }

    pub async fn register_repo(&self, machine: &MachineIdentity, path: &str) -> Result<Repo> {
        let db = self.core.store.client().await?;
        add_repo(&db, machine, path, &format!("worker on {}", machine.machine)).await
    }

    /// The next card for a machine's worker (the oldest runnable To do card of its repositories),
    /// with its job token, and the finished cards whose worktrees it should remove.
    pub async fn claim(&self, machine: &MachineIdentity) -> Result<(Option<(Job, String)>, Vec<Cleanup>)> {
        let token = ids::new_token(TokenKind::JobToken);
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        board::worker_seen(&tx, machine.machine_id).await?;
        let claimed =
            match board::claim_next(&tx, machine.machine_id, self.core.lease_s(), &ids::token_hash(&token)).await? {
                Some(id) => Some((board::job(&tx, machine.account_id, &id).await?, token)),
                None => None,
            };
        let cleanup = board::cleanups(&tx, machine.machine_id).await?;
        store::commit(tx).await?;
        if let Some((job, _)) = &claimed {
            tracing::info!(card = %job.id, machine = %machine.machine, attempt = job.attempts, "card claimed");
        }
        Ok((claimed, cleanup))
    }

    /// Pull requests of the machine's cards in Review to ask the forge about now: each open one
    /// every `--pr-check-s` (60 s).
    pub async fn prs_to_follow(&self, machine: &MachineIdentity) -> Result<Vec<rules::FollowPr>> {
        let db = self.core.store.client().await?;
        Ok(board::prs_to_follow(&db, machine.machine_id, self.core.timings.pr_check.as_secs_f64()).await?)
    }

    /// What the forge said of a card's pull request (`state` empty when the check failed with
    /// `error`): merged, the card is Done; closed without merging, it stays in Review with a note;
    /// a failed check shows on the card as its error.
    pub async fn pr_checked(&self, machine: &MachineIdentity, id: &str, state: &str, error: &str) -> Result<Job> {
        let error = RedactedText::from_agent(error);
        let state = if state.trim().is_empty() { None } else { Some(rules::PrState::parse(state)?) };
        if state.is_none() && error.as_str().trim().is_empty() {
            return Err(Error::invalid("a pull request check gives its state or the error that stopped it"));
        }
        let id = &JobId::new(id.trim());
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let (account_id, pr_url) = board::lock_followed(&tx, machine.machine_id, id).await?.ok_or_else(|| {
            Error::FailedPrecondition(format!("card {id} of this machine is not in Review with a pull request"))
        })?;
        let cap = self.core.store.max_unread();
        match state {
            None => board::set_pr_checked(&tx, id, None, Some(&rules::pr_check_failed(error.as_str()))).await?,
            Some(rules::PrState::Open) => board::set_pr_checked(&tx, id, state, None).await?,
            Some(rules::PrState::Merged) => {
                board::set_pr_checked(&tx, id, state, None).await?;
                board::set_done(&tx, id).await?;
                notify_board(&tx, account_id, id, Event::Merged { pr_url: &pr_url }, None, cap).await?;
            }
            Some(rules::PrState::Closed) => {
                board::set_pr_checked(&tx, id, state, Some(rules::PR_CLOSED)).await?;
                notify_board(&tx, account_id, id, Event::PrClosed { pr_url: &pr_url }, None, cap).await?;
            }
        }
        let job = board::job(&tx, account_id, id).await?;
        store::commit(tx).await?;
        tracing::info!(card = %id, pr = ?state.map(rules::PrState::db), "pull request checked");
        Ok(job)
    }

    /// Renews a card's lease; whether it is still in progress, and its state.
    pub async fn renew(
        &self,
        machine: &MachineIdentity,
        job_token: &str,
        agent_state: &str,
        worktree: &str,
        branch: &str,
    ) -> Result<(bool, String)> {
        let agent_state = RedactedText::from_agent(agent_state);
        // Both name things on the worker's disk, which redacting would change: refused instead.
        limits::no_credential("a worktree path", worktree, "name it by the card")?;
        limits::no_credential("a branch name", branch, "name it by the card")?;
        ids::check_token(TokenKind::JobToken, job_token)?;
        let token_hash = ids::token_hash(job_token);
        let db = self.core.store.client().await?;
        board::worker_seen(&db, machine.machine_id).await?;
        let renewed = board::renew_lease(
            &db,
            machine.machine_id,
            &token_hash,
            self.core.lease_s(),
            agent_state.as_str(),
            worktree,
            branch,
        )
        .await?;
        let column = board::column_of_token(&db, &token_hash).await?.unwrap_or(Column::Todo);
        Ok((renewed, column.name().to_owned()))
    }

    /// The card's agent ended; the worker reports what it printed last, redacted like everything
    /// agents write. A card it left in progress goes back to To do with the error.
    pub async fn release(
        &self,
        machine: &MachineIdentity,
        job_token: &str,
        exit_code: i32,
        error: &str,
    ) -> Result<Job> {
        let error = RedactedText::from_agent(error);
        let error = error.as_str();
        ids::check_token(TokenKind::JobToken, job_token)?;
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let card =
            board::lock_leased(&tx, machine.machine_id, &ids::token_hash(job_token)).await?.ok_or_else(|| {
                Error::not_found(EntityKind::Card, "no card holds this job token (its lease may have expired)")
            })?;
        let exited = format!("exited with code {exit_code}");
        if card.column == Column::InProgress {
            let why = rules::exit_error(card.attempts, exit_code, error);
            board::return_to_todo(&tx, &card.id, &why, &exited).await?;
            let event = Event::returned(card.attempts, Cause::Exited { code: exit_code, error });
            notify_board(&tx, machine.account_id, &card.id, event, None, self.core.store.max_unread()).await?;
        } else {
            board::set_exited(&tx, &card.id, &exited).await?;
        }
        let job = board::job(&tx, machine.account_id, &card.id).await?;
        store::commit(tx).await?;
        self.core.store.sessions().forget_attempt(&card.id);
        tracing::info!(card = %job.id, state = job.column.name(), exit_code, "card agent ended");
        Ok(job)
    }

    pub async fn cleaned(&self, machine: &MachineIdentity, ids: &[String]) -> Result<()> {
        limits::count("card ids", ids.len(), limits::MAX_CLEANED_IDS)?;
        let ids: Vec<JobId> = ids.iter().map(|id| JobId::new(id.trim())).collect();
        let db = self.core.store.client().await?;
        Ok(board::mark_cleaned(&db, machine.machine_id, &ids).await?)
    }

    // ---- the scheduler's rounds ----------------------------------------------------------------

    /// Cards whose worker stopped renewing go back to To do with the reason; the board tells the
    /// operator and the poster. How many went back.
    pub async fn expire_leases(&self) -> Result<u64> {
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let expired = board::expire_leases(&tx).await?;
        for lost in &expired {
            let event = Event::returned(lost.attempts, Cause::LeaseLost { machine: &lost.machine });
            notify_board(&tx, lost.account_id, &lost.id, event, None, self.core.store.max_unread()).await?;
        }
        store::commit(tx).await?;
        for lost in &expired {
            self.core.store.sessions().forget_attempt(&lost.id);
        }
        Ok(expired.len() as u64)
    }

    /// Posts a run card for each due schedule, unless its last run is still going or its pull request
    /// is open. `skip locked` and the move of `next_run_at` in the same transaction make each slot fire
    /// on one replica only; a schedule late after downtime fires once and moves to its next future slot.
    pub async fn fire_due_schedules(&self) -> Result<u32> {
        let cap = self.core.store.max_unread();
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let due = board::lock_due_schedules(&tx).await?;
        let mut fired = 0;
        for schedule in &due {
            let id = &schedule.id;
            let card = &id.card();
            let parsed = Schedule::parse(&schedule.expr, &schedule.zone);
            let next = match parsed.and_then(|s| s.next_slot(schedule.slot, schedule.now)) {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(card = %id, error = %e, "schedule cannot be evaluated; parked");
                    board::park_schedule(&tx, id, &e.to_string()).await?;
                    continue;
                }
            };
            if let Some(reason) = hold_reason(board::last_run(&tx, id).await?) {
                let at = schedule.now.to_rfc3339_opts(SecondsFormat::Secs, true);
                board::hold_off(&tx, id, next, &format!("{reason} at {at}")).await?;
                // Told once when it starts holding off for this reason, not at every slot after.
                if !schedule.last_skip_reason.starts_with(reason) {
                    let next = next.to_rfc3339_opts(SecondsFormat::Secs, true);
                    let held = Event::HeldOff { why: reason, next: &next };
                    notify_board(&tx, schedule.account_id, card, held, None, cap).await?;
                }
                continue;
            }
            let run = rules::new_card_id();
            board::insert_run(&tx, id, &run).await?;
            board::advance_schedule(&tx, id, next).await?;
            notify_board(&tx, schedule.account_id, card, Event::Fired { run: run.as_str() }, None, cap).await?;
            fired += 1;
        }
        store::commit(tx).await?;
        Ok(fired)
    }
}

/// Adds a repository of `machine` at `path` (absolute), recorded as added `by`. The path is kept
/// as written, for the worker to find the repository by: one holding a credential is refused.
async fn add_repo(c: &impl GenericClient, machine: &MachineIdentity, path: &str, by: &str) -> Result<Repo> {
    limits::no_credential("a repository path", path, "give the path without it")?;
    let path = rules::repo_path(path)?;
    let name = rules::repo_name(&path);
    board::insert_repo(c, machine, &path, &name, by).await?;
    Ok(Repo { name, path, machine: machine.machine.clone() })
}
