//! The board tools: cards for the account's job board. The server checks everything; these read
//! arguments, add where the agent works, and read back what the server stored.

use std::time::Duration;

use relay_proto::v1::*;
use serde_json::{Map, Value, json};

use super::args::parse;
use super::input::{self, text, word};
use super::output;
use super::{Outcome, ToolError, Tools};
use crate::frame;

type Result<T> = std::result::Result<T, ToolError>;

pub async fn call(tools: &Tools, name: &str, arguments: &Map<String, Value>) -> Result<Outcome> {
    match name {
        "post_job" => post_job(tools, parse(arguments)?).await,
        "list_jobs" => list_jobs(tools, parse(arguments)?).await,
        "read_job" => read_job(tools, parse(arguments)?).await,
        "edit_job" => edit_job(tools, parse(arguments)?).await,
        "finish_job" => finish_job(tools, parse(arguments)?).await,
        "close_job" => close_job(tools, parse(arguments)?).await,
        "add_repo" => add_repo(tools, parse(arguments)?).await,
        "answer_permission" => answer_permission(tools, parse(arguments)?).await,
        "relay_permission" => permission(tools, parse(arguments)?).await,
        other => Err(ToolError::Refused(format!("no tool {other}"))),
    }
}

/// A card's result: agent-written text neutralised, and marked as data.
fn card(text: String, job: &JobView) -> Outcome {
    Outcome::data(text, &output::Job::from(job)).untrusted()
}

fn column_label(state: &str) -> &'static str {
    match state {
        "todo" => "To do",
        "in-progress" => "In progress",
        "review" => "Review",
        _ => "Done",
    }
}

fn schedule_text(j: &JobView) -> String {
    if j.next_run_at.is_empty() {
        format!("{} ({})", j.schedule, j.time_zone)
    } else {
        format!("{} ({}), next run {} ({})", j.schedule, j.time_zone, j.next_run_local, j.next_run_at)
    }
}

fn dispatcher_note(j: &JobView) -> Option<String> {
    (!j.dispatcher_running).then(|| {
        let machine = j.repo.as_ref().map(|r| r.machine.as_str()).unwrap_or("its machine");
        format!("No worker is serving {machine} right now, so it waits until `agent-bridge worker` runs there.")
    })
}

async fn post_job(tools: &Tools, args: input::PostJob) -> Result<Outcome> {
    let request = PostJobRequest {
        title: args.title.0,
        detail: text(args.detail),
        repo: text(args.repo),
        schedule: text(args.schedule),
        agent: word(args.agent),
        requires_pr: args.requires_pr.map(|f| f.0),
        cwd: tools.host().cwd(),
        time_zone: tools.host().time_zone(),
        paths: args.paths.map(|p| p.0).unwrap_or_default(),
    };
    // No idempotency key: a card posted but not confirmed is not posted again.
    let job = tools.relay().call_once(Duration::ZERO, request, |mut c, r| async move { c.post_job(r).await }).await?;
    let repo = job.repo.clone().unwrap_or_default();
    let what = if job.schedule.is_empty() {
        format!("to To do{}", if job.requires_pr { "" } else { " (no pull request)" })
    } else {
        format!("as a schedule: {}; each run posts its own card", schedule_text(&job))
    };
    let text = format!(
        "Posted {} in {} on {} {what}.\nid: {}",
        frame::quote(&job.title),
        frame::neutralize(&repo.name),
        repo.machine,
        job.id
    );
    let outcome = card(text, &job);
    Ok(match dispatcher_note(&job).filter(|_| job.schedule.is_empty()) {
        Some(note) => outcome.then(note),
        None => outcome,
    })
}

fn summary_line(j: &JobView) -> String {
    let repo = j.repo.clone().unwrap_or_default();
    let mut bits = vec![format!("{} on {}", frame::neutralize(&repo.name), repo.machine), j.agent.clone()];
    if !j.schedule.is_empty() {
        bits.push(format!("schedule {}", schedule_text(j)));
    }
    if !j.schedule_id.is_empty() {
        bits.push(format!("a run of {}", j.schedule_id));
    }
    if !j.agent_state.is_empty() {
        bits.push(format!("agent {}", frame::quote(&j.agent_state)));
    }
    if !j.pr_url.is_empty() {
        bits.push(frame::quote(&j.pr_url));
    }
    if !j.last_error.is_empty() {
        bits.push(format!("last error: {}", frame::quote(&j.last_error)));
    }
    format!("  {}  {}\n    {}", j.id, frame::quote(&j.title), bits.join(" · "))
}

async fn list_jobs(tools: &Tools, args: input::ListJobs) -> Result<Outcome> {
    let request = ListJobsRequest { state: word(args.state), repo: text(args.repo), cwd: tools.host().cwd() };
    let reply = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.list_jobs(r).await }).await?;
    let data = output::Jobs { jobs: reply.jobs.iter().map(output::Job::from).collect(), archived: reply.archived };
    let archive = (reply.archived > 0)
        .then(|| format!("{} finished card(s) are archived (state: \"done\" lists them).", reply.archived));
    if reply.jobs.is_empty() {
        let outcome = Outcome::data("Nothing on the board here.", &data);
        return Ok(match archive {
            Some(line) => outcome.then(line),
            None => outcome,
        });
    }
    let mut sections = Vec::new();
    for state in ["todo", "in-progress", "review", "done"] {
        let cards: Vec<String> = reply.jobs.iter().filter(|j| j.state == state).map(summary_line).collect();
        if !cards.is_empty() {
            sections.push(format!("{} ({})\n{}", column_label(state), cards.len(), cards.join("\n")));
        }
    }
    let text = format!("{} card(s) on the board:\n\n{}", reply.jobs.len(), sections.join("\n\n"));
    let outcome = Outcome::data(text, &data).untrusted();
    Ok(match archive {
        Some(line) => outcome.then(line),
        None => outcome,
    })
}

fn full_text(j: &JobView) -> String {
    let repo = j.repo.clone().unwrap_or_default();
    let mut lines = vec![
        frame::quote(&j.title),
        format!("id: {}", j.id),
        format!("column: {}", column_label(&j.state)),
        format!("repo: {} ({} on {})", frame::neutralize(&repo.name), frame::neutralize(&repo.path), repo.machine),
        format!("agent: {}", j.agent),
        if j.schedule.is_empty() {
            format!("runs once{}", if j.requires_pr { ", ends in a pull request" } else { ", no pull request" })
        } else {
            let mut s = format!("schedule: {}", schedule_text(j));
            if j.run_count > 0 {
                s.push_str(&format!("; posted {} run(s), last {}", j.run_count, j.last_run_at));
            }
            if !j.last_skip_reason.is_empty() {
                s.push_str(&format!("; last held off: {}", frame::neutralize(&j.last_skip_reason)));
            }
            s
        },
        format!("posted {} by {}", j.posted_at, j.posted_by),
    ];
    let mut add = |label: &str, value: &str| {
        if !value.is_empty() {
            lines.push(format!("{label}: {}", frame::neutralize(value)));
        }
    };
    add("a run of schedule", &j.schedule_id);
    add("last edited by", &j.edited_by);
    add("branch", &j.branch);
    add("worktree", &j.worktree);
    add("agent state", &j.agent_state);
    add("pull request", &j.pr_url);
    add("result", &j.summary);
    add("last error", &j.last_error);
    if j.attempts > 0 {
        lines.push(format!("attempts: {}", j.attempts));
    }
    lines.push(String::new());
    lines.push(if j.detail.is_empty() { "(no detail)".to_owned() } else { frame::neutralize(&j.detail) });
    lines.join("\n")
}

async fn read_job(tools: &Tools, args: input::ReadJob) -> Result<Outcome> {
    let request = ReadJobRequest { id: args.id.0 };
    let job = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.read_job(r).await }).await?;
    let outcome = card(full_text(&job), &job);
    Ok(if job.state == "todo" {
        outcome
    } else {
        outcome.then("This card has left To do, so edit_job can no longer change it.")
    })
}

async fn edit_job(tools: &Tools, args: input::EditJob) -> Result<Outcome> {
    let request = EditJobRequest {
        id: args.id.0,
        title: args.title.map(|t| t.0),
        detail: args.detail.map(|t| t.0),
        repo: args.repo.map(|t| t.0),
        schedule: args.schedule.map(|t| t.0),
        requires_pr: args.requires_pr.map(|f| f.0),
        cwd: tools.host().cwd(),
        time_zone: tools.host().time_zone(),
    };
    let job = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.edit_job(r).await }).await?;
    let runs = if job.schedule.is_empty() { String::new() } else { format!(" It runs {}.", schedule_text(&job)) };
    let text = format!("Updated {} on {}, still in To do.{runs}", job.changed.join(", "), frame::quote(&job.title));
    Ok(card(text, &job))
}

async fn finish_job(tools: &Tools, args: input::FinishJob) -> Result<Outcome> {
    let request = FinishJobRequest {
        job_token: tools.host().job_token(),
        pr_url: text(args.pr_url),
        summary: text(args.summary),
    };
    // Done twice, the second would be refused as if the first had failed.
    let job = tools.relay().call_once(Duration::ZERO, request, |mut c, r| async move { c.finish_job(r).await }).await?;
    Ok(card(format!("{} is in Review.", frame::quote(&job.title)), &job).then("You are done: end your turn here."))
}

async fn close_job(tools: &Tools, args: input::CloseJob) -> Result<Outcome> {
    let accept = args.accept.0;
    let request = CloseJobRequest { id: args.id.0, accept, note: text(args.note) };
    let job = tools.relay().call_once(Duration::ZERO, request, |mut c, r| async move { c.close_job(r).await }).await?;
    let text = if accept {
        format!("{} is Done; its worktree is removed on the worker's next round.", frame::quote(&job.title))
    } else {
        format!("{} is back in To do with your note; a fresh worker picks it up.", frame::quote(&job.title))
    };
    Ok(card(text, &job))
}

async fn add_repo(tools: &Tools, args: input::AddRepo) -> Result<Outcome> {
    let path = tools.host().expand_home(&args.path.0);
    let request = AddRepoRequest { path };
    let repo = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.add_repo(r).await }).await?;
    // The board's tools are listed from now on.
    tools.observe_board(true);
    let text =
        format!("{} is on the board as \"{}\" ({}); post_job can use it now.", repo.path, repo.name, repo.machine);
    Ok(Outcome::data(text, &output::Repo { name: repo.name, path: repo.path, machine: repo.machine }))
}

async fn answer_permission(tools: &Tools, args: input::AnswerPermission) -> Result<Outcome> {
    let request = AnswerPermissionRequest {
        id: args.id.0.trim().to_owned(),
        decision: args.decision.as_str().to_owned(),
        reason: text(args.reason),
    };
    let d = tools
        .relay()
        .call_once(Duration::ZERO, request, |mut c, r| async move { c.answer_permission(r).await })
        .await?;
    let text = match d.state.as_str() {
        "escalated" => format!("Left to your account's human: request {} now waits for them.", d.id),
        state => format!("Request {} answered: {state}.", d.id),
    };
    Ok(Outcome::data(text, &output::Decision { id: d.id, state: d.state }))
}

/// Most of a tool's input a permission request carries: whoever decides sees an excerpt, and the
/// server takes no more.
pub const PERMISSION_INPUT_BYTES: usize = 64 * 1024;

/// Claude Code's permission prompt tool for a board agent: the answer is the JSON it expects.
async fn permission(tools: &Tools, args: input::Permission) -> Result<Outcome> {
    let tool = args.tool_name.0;
    let input = args.input.unwrap_or(Value::Null);
    let request = PermissionRequest {
        job_token: tools.host().job_token(),
        tool,
        input: frame::clip(&input.to_string(), PERMISSION_INPUT_BYTES),
    };
    // Someone has to answer: the operator, then the human, each with their time.
    let d = tools
        .relay()
        .call_once(Duration::from_secs(7200), request, |mut c, r| async move { c.request_permission(r).await })
        .await?;
    let answer = if d.state == "allow" {
        json!({ "behavior": "allow", "updatedInput": input })
    } else {
        let why = if d.reason.is_empty() { "denied".to_owned() } else { frame::neutralize(&d.reason) };
        json!({ "behavior": "deny", "message": format!("{} said no: {why}", if d.decided_by.is_empty() { "nobody" } else { &d.decided_by }) })
    };
    // Text alone: Claude Code reads the decision from the text, and would read structuredContent instead.
    Ok(Outcome::text(answer.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_card_shows_its_repository_defused() {
        let job = JobView {
            id: "c1".into(),
            state: "todo".into(),
            title: "t".into(),
            repo: Some(RepoView {
                name: "app\u{1b}]0;x\u{7}".into(),
                path: "/srv/\u{1b}[2Japp\u{202e}".into(),
                machine: "ci".into(),
            }),
            ..Default::default()
        };
        let shown = full_text(&job);
        assert!(!shown.chars().any(|c| c == '\u{1b}' || c == '\u{7}' || c == '\u{202e}'), "{shown:?}");
        assert!(shown.contains("repo: app\u{241b}]0;x\u{2407} (/srv/\u{241b}[2Japp[U+202E] on ci)"), "{shown}");
        let data = output::Job::from(&job);
        assert!(shown.contains(&data.repo_path) && shown.contains(&data.repo), "the same text in both channels");
    }
}
