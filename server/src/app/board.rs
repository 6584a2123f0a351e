//! The board: cards posted, edited, finished and closed by agents, and the worker's side (claims,
//! leases, releases, cleanups). Card text is redacted before it is stored; schedules are parsed in
//! the poster's zone.

use super::{App, optional};
use crate::domain::Result;
use crate::domain::board::{Cleanup, Job, Repo};
use crate::domain::redact::RedactedText;
use crate::domain::schedule::Schedule;
use crate::store::board::{JobEdit, NewJob};
use crate::store::identity::{Caller, MachineIdentity};

/// A schedule as a card carries it: absent when the expression is empty; read in `zone` (UTC when empty).
fn schedule(expr: &str, zone: &str) -> Result<Option<Schedule>> {
    if expr.trim().is_empty() {
        return Ok(None);
    }
    Schedule::parse(expr, if zone.trim().is_empty() { "UTC" } else { zone.trim() }).map(Some)
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

impl App {
    pub async fn post_job(&self, caller: &Caller, post: Post<'_>) -> Result<Job> {
        let schedule = schedule(post.schedule, post.time_zone)?;
        let (title, detail) = (RedactedText::from_agent(post.title), RedactedText::from_agent(post.detail));
        let new = NewJob {
            title: &title,
            detail: &detail,
            repo: post.repo,
            schedule,
            agent: optional(post.agent),
            requires_pr: post.requires_pr,
            cwd: post.cwd,
        };
        let job = self.store.post_job(caller, new).await?;
        tracing::info!(card = %job.id, by = %caller.address(), "card posted");
        Ok(job)
    }

    /// Cards of one column (or all but the archive), of one repository or all; and how many are archived.
    pub async fn list_jobs(&self, caller: &Caller, state: &str, repo: &str, cwd: &str) -> Result<(Vec<Job>, u32)> {
        self.store.list_jobs(caller, state, repo, cwd).await
    }

    pub async fn read_job(&self, caller: &Caller, id: &str) -> Result<Job> {
        self.store.read_job(caller, id).await
    }

    pub async fn edit_job(&self, caller: &Caller, id: &str, edit: Edit<'_>) -> Result<Job> {
        let schedule = edit.schedule.map(|expr| schedule(expr, edit.time_zone)).transpose()?;
        let (title, detail) = (edit.title.map(RedactedText::from_agent), edit.detail.map(RedactedText::from_agent));
        let change = JobEdit {
            title: title.as_ref(),
            detail: detail.as_ref(),
            repo: edit.repo,
            schedule,
            requires_pr: edit.requires_pr,
            cwd: edit.cwd,
        };
        self.store.edit_job(caller, id, change).await
    }

    /// A dispatched agent reports its card done: to Review.
    pub async fn finish_job(&self, caller: &Caller, job_token: &str, pr_url: &str, summary: &str) -> Result<Job> {
        let (pr_url, summary) = (RedactedText::from_agent(pr_url), RedactedText::from_agent(summary));
        let job = self.store.finish_job(caller, job_token, &pr_url, &summary).await?;
        tracing::info!(card = %job.id, by = %caller.address(), "card finished");
        Ok(job)
    }

    /// The operator accepts a card in Review (Done) or sends it back to To do with a note.
    pub async fn close_job(&self, caller: &Caller, id: &str, accept: bool, note: &str) -> Result<Job> {
        self.store.close_job(caller, id, accept, &RedactedText::from_agent(note)).await
    }

    /// An operator's repository path is agent text like any other: a credential in it is not stored.
    pub async fn add_repo(&self, caller: &Caller, path: &str) -> Result<Repo> {
        self.store.add_repo(caller, &RedactedText::from_agent(path)).await
    }

    pub async fn register_repo(&self, machine: &MachineIdentity, path: &str) -> Result<Repo> {
        self.store.register_repo(machine, path).await
    }

    /// The next card for a machine's worker, with its job token, and worktrees to remove.
    pub async fn claim(&self, machine: &MachineIdentity) -> Result<(Option<(Job, String)>, Vec<Cleanup>)> {
        let (claimed, cleanup) = self.store.claim(machine).await?;
        if let Some((job, _)) = &claimed {
            tracing::info!(card = %job.id, machine = %machine.machine, attempt = job.attempts, "card claimed");
        }
        Ok((claimed, cleanup))
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
        self.store.renew(machine, job_token, &agent_state, worktree, branch).await
    }

    /// The card's agent ended; the worker reports what it printed last, redacted like everything
    /// agents write.
    pub async fn release(
        &self,
        machine: &MachineIdentity,
        job_token: &str,
        exit_code: i32,
        error: &str,
    ) -> Result<Job> {
        let job = self.store.release(machine, job_token, exit_code, &RedactedText::from_agent(error)).await?;
        tracing::info!(card = %job.id, state = %job.state, exit_code, "card agent ended");
        Ok(job)
    }

    pub async fn cleaned(&self, machine: &MachineIdentity, ids: &[String]) -> Result<()> {
        self.store.cleaned(machine, ids).await
    }
}
