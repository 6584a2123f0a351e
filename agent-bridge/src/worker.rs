//! `agent-bridge worker`: serves this machine's repositories on the board. It claims To do cards
//! (up to `--concurrency` at once), each under a lease it renews, makes a git worktree and branch
//! per card, runs the card's agent CLI in it with a token that ties the agent's `finish_job` to the
//! card, and removes worktrees of cards that reached Done. An agent whose lease could not be
//! renewed for a whole lease is stopped: by then the card may run elsewhere. The server decides
//! which card runs where; the worker only does the local work.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use relay_proto::bridge_config::BridgeConfig;
use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::worker_client::WorkerClient;
use relay_proto::v1::*;
use tokio::process::Command;

use crate::connection;
use relay_agent::relay::replicas::Replicas;
use relay_agent::relay::session::authed;

/// How often a running card's lease is renewed at most; a shorter lease is renewed three times
/// within its length.
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// After its card reached Review, an agent gets this long to exit before it is stopped.
const AFTER_FINISH: Duration = Duration::from_secs(120);

pub struct Options {
    pub repos: Vec<PathBuf>,
    pub worktrees: Option<PathBuf>,
    /// `claude=COMMAND …` / `codex=COMMAND …`: how to start each agent CLI.
    pub agents: Vec<String>,
    pub poll: Duration,
    /// Stop after one card has run (for scripts and tests).
    pub once: bool,
    /// Cards run at once, each in its own worktree under its own lease.
    pub concurrency: usize,
    /// `REPO=COMMAND …` (or `*=COMMAND`): how to ask the forge about a pull request.
    pub forges: Vec<String>,
}

struct Worker {
    /// The server's replicas: the worker moves to the next when one fails; its leases live in the
    /// shared database, so they carry over.
    replicas: Replicas,
    config: BridgeConfig,
    worktrees: PathBuf,
    claude: Vec<String>,
    codex: Vec<String>,
    /// The forge command per repository name; `None` is the default for the others.
    forges: Vec<(Option<String>, Vec<String>)>,
    /// The worker's own session (`MACHINE/worker`), opened when a driven Codex run first asks for a
    /// permission: the request names the card by its job token.
    approver: tokio::sync::Mutex<Option<String>>,
}

/// A driven Codex run's questions, put to people as permission requests for its card.
struct CardApprover<'a> {
    worker: &'a Worker,
    job_token: &'a str,
}

impl crate::codex::Approver for CardApprover<'_> {
    async fn approve(&self, tool: String, input: String) -> bool {
        match self.worker.ask_permission(self.job_token, tool, input).await {
            Ok(allowed) => allowed,
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask for a permission; the answer is no");
                false
            }
        }
    }
}

/// How a pull request is asked about unless told otherwise: GitHub's CLI.
const DEFAULT_FORGE: &str = "gh pr view {pr} --json state,mergedAt,closedAt";
/// A forge command that takes longer is stopped and the check counts as failed.
const FORGE_TIMEOUT: Duration = Duration::from_secs(30);

fn parse_forges(specs: &[String]) -> anyhow::Result<Vec<(Option<String>, Vec<String>)>> {
    let mut forges = vec![(None, DEFAULT_FORGE.split_whitespace().map(str::to_owned).collect::<Vec<_>>())];
    for spec in specs {
        let (repo, command) =
            spec.split_once('=').context("--forge takes REPO=COMMAND, e.g. app=\"glab mr view {pr} --output json\"")?;
        let words: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
        if !words.iter().any(|w| w.contains("{pr}")) {
            bail!("--forge {repo}= needs a command with {{pr}} where the pull request goes");
        }
        match repo.trim() {
            "*" => forges[0].1 = words,
            name => forges.push((Some(name.to_owned()), words)),
        }
    }
    Ok(forges)
}

/// What a forge's JSON says of a pull request: open, merged or closed (GitHub's and GitLab's CLIs
/// both answer with a `state`, and a merge time once merged).
fn forge_state(output: &str) -> Result<&'static str, String> {
    let value: serde_json::Value =
        serde_json::from_str(output.trim()).map_err(|e| format!("the forge's answer is not JSON: {e}"))?;
    let merged_at = ["mergedAt", "merged_at"].iter().any(|k| value.get(*k).is_some_and(|v| !v.is_null()));
    let state = value.get("state").and_then(|s| s.as_str()).map(str::to_ascii_lowercase);
    match state.as_deref() {
        _ if merged_at => Ok("merged"),
        Some("merged") => Ok("merged"),
        Some("closed" | "locked") => Ok("closed"),
        Some("open" | "opened") => Ok("open"),
        Some(other) => {
            Err(format!("the forge says the pull request is {other:?}, which is not open, merged or closed"))
        }
        None => Err("the forge's answer has no state".to_owned()),
    }
}

/// The command line of an agent CLI; `{prompt}` becomes the card's text and `{mcp_config}` a file
/// that hooks the relay bridge in.
fn default_command(agent: &str) -> Vec<String> {
    let words: &[&str] = match agent {
        // Driven over MCP by the worker, so that its approvals reach a person (see `codex`).
        "codex" => &["codex", "mcp-server"],
        _ => &[
            "claude",
            "-p",
            "--mcp-config",
            "{mcp_config}",
            "--permission-prompt-tool",
            "mcp__relay__relay_permission",
            "{prompt}",
        ],
    };
    words.iter().map(|w| (*w).to_owned()).collect()
}

fn parse_agents(specs: &[String]) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let (mut claude, mut codex) = (default_command("claude"), default_command("codex"));
    for spec in specs {
        let (name, command) =
            spec.split_once('=').context("--agent takes NAME=COMMAND, e.g. codex=\"codex exec {prompt}\"")?;
        let words: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
        if words.is_empty() {
            bail!("--agent {name}= needs a command");
        }
        match name.trim() {
            "claude" => claude = words,
            "codex" => codex = words,
            other => bail!("--agent names claude or codex, not {other}"),
        }
    }
    Ok((claude, codex))
}

fn prompt(job: &JobView) -> String {
    let ending = if job.requires_pr {
        "When the work is done, open a pull request from this branch and call the finish_job tool with its URL as pr_url."
    } else {
        "When you are done, call the finish_job tool with a summary of what you did or found; no pull request is needed."
    };
    format!(
        "You are working on a card from your team's job board.\n\nTitle: {}\n\n{}\n\nYou are in a git worktree of {} on branch {}. {ending}",
        relay_agent::frame::visible(&job.title),
        if job.detail.is_empty() { "(no further detail)".to_owned() } else { relay_agent::frame::visible(&job.detail) },
        job.repo.as_ref().map(|r| r.name.as_str()).unwrap_or("the repository"),
        job.branch
    )
}

async fn git(args: &[&str], dir: &Path) -> anyhow::Result<String> {
    let out = Command::new("git").args(args).current_dir(dir).output().await.context("cannot run git")?;
    if !out.status.success() {
        bail!("git {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A worktree on the card's branch: reused on a later attempt, so earlier work is kept.
async fn prepare_worktree(repo: &Path, worktree: &Path, branch: &str) -> anyhow::Result<()> {
    if worktree.join(".git").exists() {
        return Ok(());
    }
    let target = worktree.to_string_lossy().into_owned();
    let exists = git(&["rev-parse", "--verify", "--quiet", &format!("refs/heads/{branch}")], repo).await.is_ok();
    if exists {
        git(&["worktree", "add", &target, branch], repo).await?;
    } else {
        git(&["worktree", "add", "-b", branch, &target], repo).await?;
    }
    Ok(())
}

/// Stops a background task when the worker's loop ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The lease the server gave, or the usual 30 s when it did not say.
fn lease_length(lease_s: f64) -> Duration {
    if lease_s.is_finite() && lease_s >= 1.0 { Duration::from_secs_f64(lease_s) } else { Duration::from_secs(30) }
}

/// How often to renew a lease of `lease`: three times within it, at most every [`RENEW_EVERY`].
fn renew_every(lease: Duration) -> Duration {
    (lease / 3).clamp(Duration::from_millis(200), RENEW_EVERY)
}

impl Worker {
    /// Asks for a card (`follow_only`: only the pull requests to check). Only a claim for pull
    /// requests alone is repeated on the next replica after a lost answer: a card claim may have
    /// taken a card, which goes back to To do when its lease runs out.
    async fn claim(&self, follow_only: bool) -> Result<ClaimResponse, tonic::Status> {
        let claimed = self.replicas.call(follow_only, |channel| {
            let request = authed(ClaimRequest { follow_only }, &self.config.token);
            async move { WorkerClient::new(channel).claim(request).await }
        });
        Ok(claimed.await?.into_inner())
    }

    async fn renew(&self, token: &str, state: &str, worktree: &Path, branch: &str) -> Option<RenewResponse> {
        let request = RenewRequest {
            job_token: token.to_owned(),
            agent_state: state.to_owned(),
            worktree: worktree.display().to_string(),
            branch: branch.to_owned(),
        };
        // Renewing again is harmless: repeated on the next replica when one fails under it.
        let renewed = self.replicas.call(true, |channel| {
            let request = authed(request.clone(), &self.config.token);
            async move { WorkerClient::new(channel).renew(request).await }
        });
        match renewed.await {
            Ok(r) => Some(r.into_inner()),
            Err(e) => {
                tracing::warn!(error = %e.message(), "cannot renew the lease");
                None
            }
        }
    }

    /// Claims the paths the card names for its agent; what its agent is told of claims in the way
    /// (nothing when they are granted). A claim that cannot be made does not stop the card.
    async fn claim_paths(&self, job: &JobView, token: &str, repo: &Path) -> Option<String> {
        if job.paths.is_empty() {
            return None;
        }
        let located = match relay_agent::repo::locate(repo).await {
            Ok(located) => located,
            Err(e) => {
                tracing::warn!(card = %job.id, error = %e, "cannot claim the card's paths");
                return None;
            }
        };
        let request = ClaimCardPathsRequest { job_token: token.to_owned(), repo: Some(located.to_ref()) };
        // Claiming again renews the same claim: repeated on the next replica when one fails.
        let claimed = self.replicas.call(true, |channel| {
            let request = authed(request.clone(), &self.config.token);
            async move { WorkerClient::new(channel).claim_card_paths(request).await }
        });
        match claimed.await {
            Ok(answer) if answer.get_ref().granted => None,
            Ok(answer) => {
                let held: Vec<String> = answer
                    .into_inner()
                    .conflicts
                    .iter()
                    .map(|c| {
                        format!("{} holds {} ({})", c.holder, c.paths.join(", "), relay_agent::frame::quote(&c.reason))
                    })
                    .collect();
                tracing::info!(card = %job.id, held = ?held, "the card's paths are claimed by others");
                Some(format!(
                    "Other agents hold paths this card names: {}. Agree with them (relay_send) before you change those paths.",
                    held.join("; ")
                ))
            }
            Err(e) => {
                tracing::warn!(card = %job.id, error = %e.message(), "cannot claim the card's paths");
                None
            }
        }
    }

    async fn release(&self, token: &str, exit_code: i32, error: String) {
        let request = ReleaseRequest { job_token: token.to_owned(), exit_code, error };
        for attempt in 0..5 {
            let released = self.replicas.call(false, |channel| {
                let request = authed(request.clone(), &self.config.token);
                async move { WorkerClient::new(channel).release(request).await }
            });
            match released.await {
                Ok(r) => {
                    let job = r.into_inner();
                    tracing::info!(card = %job.id, state = %job.state, "card released");
                    return;
                }
                Err(e) if e.code() == tonic::Code::Unavailable && attempt < 4 => {
                    tokio::time::sleep(Duration::from_secs(2)).await
                }
                Err(e) => {
                    tracing::warn!(error = %e.message(), "cannot release the card; its lease will expire");
                    return;
                }
            }
        }
    }

    async fn cleanup(&self, items: Vec<Cleanup>) {
        let mut done = Vec::new();
        for item in items {
            let (repo, worktree) = (PathBuf::from(&item.repo_path), PathBuf::from(&item.worktree));
            let removed = if worktree.exists() {
                git(&["worktree", "remove", "--force", &item.worktree], &repo).await.map(|_| ())
            } else {
                Ok(())
            };
            match removed {
                Ok(()) => {
                    tracing::info!(card = %item.id, worktree = %item.worktree, "worktree removed");
                    done.push(item.id);
                }
                Err(e) => tracing::warn!(card = %item.id, error = %e, "cannot remove the worktree"),
            }
        }
        if !done.is_empty() {
            let cleaned = self.replicas.call(true, |channel| {
                let request = authed(CleanedRequest { ids: done.clone() }, &self.config.token);
                async move { WorkerClient::new(channel).cleaned(request).await }
            });
            let _ = cleaned.await;
        }
    }

    /// Asks for `tool` on behalf of the card whose job token is given, as the worker's own endpoint,
    /// and waits for the decision: true when allowed. A session refused meanwhile (ended, or its
    /// handle taken over by another worker of the machine) is opened anew and the question asked
    /// once more: a refused call never reached the operator.
    async fn ask_permission(&self, job_token: &str, tool: String, input: String) -> anyhow::Result<bool> {
        let input = relay_agent::frame::clip(&input, relay_agent::tools::PERMISSION_INPUT_BYTES);
        let request = PermissionRequest { job_token: job_token.to_owned(), tool, input };
        let mut fresh = false;
        loop {
            let session = self.worker_session(fresh).await?;
            // Not repeated: a request that reached the server is already with the operator.
            let decided = self
                .replicas
                .call(false, |channel| {
                    let request = authed(request.clone(), &session);
                    async move { RelayClient::new(channel).request_permission(request).await }
                })
                .await;
            match decided {
                Ok(decided) => return Ok(decided.into_inner().state == "allow"),
                Err(s) if s.code() == tonic::Code::Unauthenticated && !fresh => fresh = true,
                Err(s) => anyhow::bail!("the permission request failed: {}", s.message()),
            }
        }
    }

    /// The session the worker asks permissions with, opened on first use or when `fresh`: as
    /// `worker`, or under a free name when another worker of this machine holds it.
    async fn worker_session(&self, fresh: bool) -> anyhow::Result<String> {
        let mut held = self.approver.lock().await;
        if let (Some(token), false) = (held.as_ref(), fresh) {
            return Ok(token.clone());
        }
        for handle in ["worker", ""] {
            let hello = HelloRequest { handle: handle.into(), harness: "other".into(), ..Default::default() };
            let said = self
                .replicas
                .call(false, |channel| {
                    let request = authed(hello.clone(), &self.config.token);
                    async move { RelayClient::new(channel).hello(request).await }
                })
                .await;
            match said {
                Err(s) if s.code() == tonic::Code::AlreadyExists && !handle.is_empty() => continue,
                Err(s) => anyhow::bail!("cannot open the worker's session: {}", s.message()),
                Ok(reply) => {
                    let token = reply.into_inner().session_token;
                    *held = Some(token.clone());
                    return Ok(token);
                }
            }
        }
        anyhow::bail!("cannot open the worker's session")
    }

    /// Asks the forge about each pull request and tells the server what it said, or why it could
    /// not say.
    async fn follow(&self, prs: Vec<FollowPr>) {
        for pr in prs {
            let template = self
                .forges
                .iter()
                .find(|(repo, _)| repo.as_deref() == Some(pr.repo.as_str()))
                .unwrap_or(&self.forges[0]);
            let words: Vec<String> = template.1.iter().map(|w| w.replace("{pr}", &pr.pr_url)).collect();
            let ran = tokio::time::timeout(
                FORGE_TIMEOUT,
                Command::new(&words[0]).args(&words[1..]).current_dir(&pr.repo_path).stdin(Stdio::null()).output(),
            )
            .await;
            let said = match ran {
                Err(_) => Err(format!("{} took longer than {} s", words[0], FORGE_TIMEOUT.as_secs())),
                Ok(Err(e)) => Err(format!("cannot run {}: {e}", words[0])),
                Ok(Ok(out)) if !out.status.success() => {
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    let first = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("no message");
                    Err(format!("{} failed: {}", words[0], first.chars().take(300).collect::<String>()))
                }
                Ok(Ok(out)) => forge_state(&String::from_utf8_lossy(&out.stdout)),
            };
            let (state, error) = match said {
                Ok(state) => (state.to_owned(), String::new()),
                Err(error) => {
                    tracing::warn!(card = %pr.id, pr = %pr.pr_url, error = %error, "cannot check the pull request");
                    (String::new(), error)
                }
            };
            let request = PrCheckedRequest { id: pr.id.clone(), state, error };
            let reported = self.replicas.call(true, |channel| {
                let request = authed(request.clone(), &self.config.token);
                async move { WorkerClient::new(channel).pr_checked(request).await }
            });
            match reported.await {
                Ok(job) => tracing::info!(card = %pr.id, state = %job.into_inner().state, "pull request checked"),
                Err(e) => tracing::warn!(card = %pr.id, error = %e.message(), "cannot report the pull request"),
            }
        }
    }

    /// Runs one claimed card to the end of its agent process.
    async fn run(&self, job: JobView, token: String, lease_s: f64) {
        let repo = PathBuf::from(job.repo.as_ref().map(|r| r.path.clone()).unwrap_or_default());
        let worktree = self.worktrees.join(&job.id);
        let branch = job.branch.clone();
        tracing::info!(card = %job.id, title = %job.title, worktree = %worktree.display(), "running card");
        if let Err(e) = prepare_worktree(&repo, &worktree, &branch).await {
            return self.release(&token, -1, format!("cannot make the worktree: {e:#}")).await;
        }
        self.renew(&token, "starting", &worktree, &branch).await;
        let held = self.claim_paths(&job, &token, &repo).await;

        let mcp_config = self.worktrees.join(format!("{}.mcp.json", job.id));
        let me = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "agent-bridge".into());
        let config = serde_json::json!({ "mcpServers": { "relay": { "command": me, "args": ["mcp", "--harness", job.agent] } } });
        if let Err(e) = std::fs::write(&mcp_config, config.to_string()) {
            return self.release(&token, -1, format!("cannot write the agent's MCP config: {e}")).await;
        }
        let template = if job.agent == "codex" { &self.codex } else { &self.claude };
        // Codex without a {prompt} in its command is `codex mcp-server`, driven by the worker.
        let driven = job.agent == "codex" && !template.iter().any(|w| w.contains("{prompt}"));
        let text = match held {
            Some(held) => format!("{}\n\n{held}", prompt(&job)),
            None => prompt(&job),
        };
        let words: Vec<String> = template
            .iter()
            .map(|w| w.replace("{prompt}", &text).replace("{mcp_config}", &mcp_config.display().to_string()))
            .collect();
        let log = match std::fs::File::create(self.worktrees.join(format!("{}.log", job.id))) {
            Ok(f) => f,
            Err(e) => return self.release(&token, -1, format!("cannot write the agent's log: {e}")).await,
        };
        let mut command = Command::new(&words[0]);
        command
            .args(&words[1..])
            .current_dir(&worktree)
            // The card's job token is the only credential the agent is given: its bridge acts as the
            // card's endpoint while the card runs. The machine's and the person's tokens are kept out
            // of its environment and arguments (an agent running as the worker's user can still read
            // the worker's config files; run the worker as a user of its own to keep them from it).
            .env("RELAY_JOB_TOKEN", &token)
            .env_remove("RELAY_TOKEN")
            .env_remove("RELAY_HUMAN_TOKEN")
            .env_remove("RELAY_SPAWN_GRANT")
            // The replica in use first: the agent's bridge starts where the worker reached the server.
            .env("RELAY_SERVER", self.replicas.list_from(self.replicas.current().0))
            .env("RELAY_HARNESS", &job.agent)
            .env("RELAY_HANDLE", format!("job-{}", job.id))
            .env_remove("RELAY_SESSION_FILE")
            .stdin(if driven { Stdio::piped() } else { Stdio::null() })
            .stdout(if driven {
                Stdio::piped()
            } else {
                log.try_clone().map(Stdio::from).unwrap_or_else(|_| Stdio::null())
            })
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        if let Some(ca) = &self.config.ca {
            command.env("RELAY_CA", ca);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return self.release(&token, -1, format!("cannot start {}: {e}", words[0])).await,
        };
        let pid = child.id().unwrap_or_default();
        let approver = CardApprover { worker: self, job_token: &token };
        let mut driving = match (driven, child.stdin.take(), child.stdout.take()) {
            (true, Some(stdin), Some(stdout)) => {
                // Set on Codex above; its bridge inherits them by name.
                let mut inherited = vec!["RELAY_JOB_TOKEN", "RELAY_SERVER", "RELAY_HANDLE"];
                if self.config.ca.is_some() {
                    inherited.push("RELAY_CA");
                }
                let arguments = crate::codex::run_arguments(&text, &worktree, &me, &inherited);
                Some(Box::pin(crate::codex::drive(stdin, stdout, arguments, &approver)))
            }
            _ => None,
        };
        let mut lease = lease_length(lease_s);
        let every = renew_every(lease);
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        // When the lease last began by the server's reckoning, at the latest: a renewal counts from
        // when it was asked for, so the worker never believes in a lease the server has dropped.
        let mut renewed_at = tokio::time::Instant::now();
        let mut finished_at: Option<tokio::time::Instant> = None;
        let mut stopped = false;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                // The server may have given the card to another worker: never run it twice at once.
                () = tokio::time::sleep_until(renewed_at + lease), if !stopped => {
                    tracing::warn!(card = %job.id, lease_s = lease.as_secs_f64(), "the lease could not be renewed for a whole lease; stopping the agent");
                    stopped = true;
                    let _ = child.kill().await;
                }
                driven = async { driving.as_mut().expect("guarded").await }, if driving.is_some() => {
                    // The run answered (or Codex went away): its stdin closes, and it exits.
                    if let Err(e) = driven {
                        tracing::warn!(card = %job.id, error = %e, "driving codex failed");
                    }
                    driving = None;
                }
                _ = renew.tick() => {
                    if finished_at.is_some_and(|t| t.elapsed() > AFTER_FINISH) {
                        tracing::info!(card = %job.id, "agent still running well after finishing; stopping it");
                        let _ = child.kill().await;
                        continue;
                    }
                    let asked_at = tokio::time::Instant::now();
                    // A renewal still unanswered when the lease ends is given up: the branch above stops the agent.
                    let state = format!("running (pid {pid})");
                    let renewing = self.renew(&token, &state, &worktree, &branch);
                    let Ok(Some(answer)) = tokio::time::timeout_at(renewed_at + lease, renewing).await else {
                        continue;
                    };
                    renewed_at = asked_at;
                    lease = lease_length(answer.lease_s);
                    match answer.state.as_str() {
                        "in-progress" => {}
                        "review" | "done" => { finished_at.get_or_insert_with(tokio::time::Instant::now); }
                        _ => {
                            // The lease is gone and the card may run elsewhere: never twice at once.
                            tracing::warn!(card = %job.id, "lease lost; stopping the agent");
                            stopped = true;
                            let _ = child.kill().await;
                        }
                    }
                }
            }
        };
        let _ = std::fs::remove_file(&mcp_config);
        let code = status.as_ref().ok().and_then(|s| s.code()).unwrap_or(-1);
        let error = match status {
            Ok(_) => String::new(),
            Err(e) => format!("waiting for the agent failed: {e}"),
        };
        self.release(&token, code, error).await;
    }
}

pub async fn run(options: Options) -> anyhow::Result<()> {
    let config = connection::resolve()?;
    let replicas = Replicas::new(&config.server, config.ca.as_deref())?;
    let (claude, codex) = parse_agents(&options.agents)?;
    let worktrees = match options.worktrees {
        Some(dir) => dir,
        None => dirs::data_dir()
            .context("cannot find a data directory; pass --worktrees")?
            .join("agent-relay")
            .join("worktrees"),
    };
    std::fs::create_dir_all(&worktrees).with_context(|| format!("cannot create {}", worktrees.display()))?;
    let forges = parse_forges(&options.forges)?;
    let approver = tokio::sync::Mutex::new(None);
    let worker = std::sync::Arc::new(Worker { replicas, config, worktrees, claude, codex, forges, approver });

    for repo in &options.repos {
        let path = std::path::absolute(repo).unwrap_or_else(|_| repo.clone());
        git(&["rev-parse", "--git-dir"], &path)
            .await
            .with_context(|| format!("{} is not a git repository", path.display()))?;
        let request = RegisterRepoRequest { path: path.display().to_string() };
        let view = worker
            .replicas
            .call(true, |channel| {
                let request = authed(request.clone(), &worker.config.token);
                async move { WorkerClient::new(channel).register_repo(request).await }
            })
            .await
            .map_err(|s| anyhow::anyhow!("cannot register {}: {}", path.display(), s.message()))?
            .into_inner();
        eprintln!("serving {} as \"{}\" on {}", view.path, view.name, view.machine);
    }

    // Pull requests are followed on their own beat, whether or not a card runs.
    let follower = {
        let (worker, poll) = (worker.clone(), options.poll);
        tokio::spawn(async move {
            loop {
                if let Ok(reply) = worker.claim(true).await {
                    worker.follow(reply.follow).await;
                }
                tokio::time::sleep(poll).await;
            }
        })
    };
    let _follower = AbortOnDrop(follower);

    // A place per card that may run at once; a claim is made only with a place free.
    let places = std::sync::Arc::new(tokio::sync::Semaphore::new(options.concurrency.max(1)));
    let mut running = tokio::task::JoinSet::new();
    loop {
        let place = places.clone().acquire_owned().await.context("the worker's places closed")?;
        // A claim that never left goes to the next replica (see `Worker::claim`).
        match worker.claim(false).await {
            Ok(reply) => {
                worker.cleanup(reply.cleanup).await;
                if let Some(claimed) = reply.claimed
                    && let Some(job) = claimed.job
                {
                    let worker = worker.clone();
                    running.spawn(async move {
                        worker.run(job, claimed.job_token, claimed.lease_s).await;
                        drop(place);
                    });
                    if options.once {
                        while running.join_next().await.is_some() {}
                        return Ok(());
                    }
                    continue;
                }
            }
            Err(e) if e.code() == tonic::Code::Unauthenticated => {
                bail!("the server refused this machine: {}", e.message())
            }
            Err(e) => tracing::warn!(error = %e.message(), "cannot reach the server; retrying"),
        }
        drop(place);
        // Reap what finished, so the set does not grow with every card run.
        while running.try_join_next().is_some() {}
        tokio::time::sleep(options.poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_commands_default_and_override() {
        let (claude, codex) = parse_agents(&[]).unwrap();
        assert!(claude.contains(&"{prompt}".to_owned()) && claude.contains(&"{mcp_config}".to_owned()));
        assert_eq!(codex[0], "codex");
        let (claude, _) = parse_agents(&["claude=/opt/stand-in --task {prompt}".into()]).unwrap();
        assert_eq!(claude, ["/opt/stand-in", "--task", "{prompt}"]);
        assert!(parse_agents(&["gemini=x".into()]).is_err());
        assert!(parse_agents(&["claude".into()]).is_err());
    }

    #[test]
    fn forge_answers_of_github_and_gitlab_read_as_a_state() {
        assert_eq!(forge_state(r#"{"state":"OPEN","mergedAt":null,"closedAt":null}"#), Ok("open"));
        assert_eq!(forge_state(r#"{"state":"MERGED","mergedAt":"2026-11-30T10:00:00Z"}"#), Ok("merged"));
        assert_eq!(
            forge_state(r#"{"state":"CLOSED","mergedAt":null,"closedAt":"2026-11-30T10:00:00Z"}"#),
            Ok("closed")
        );
        assert_eq!(forge_state(r#"{"state":"opened","merged_at":null}"#), Ok("open"));
        assert_eq!(forge_state(r#"{"state":"merged","merged_at":"2026-11-30T10:00:00Z"}"#), Ok("merged"));
        assert!(forge_state("gh: not logged in").unwrap_err().contains("not JSON"));
        assert!(forge_state(r#"{"title":"x"}"#).unwrap_err().contains("no state"));
    }

    #[test]
    fn forge_commands_default_to_gh_and_are_set_per_repository() {
        let forges = parse_forges(&["app=glab mr view {pr} --output json".into()]).unwrap();
        assert_eq!(forges[0].1[0], "gh");
        assert_eq!(
            forges[1],
            (
                Some("app".to_owned()),
                vec!["glab".into(), "mr".into(), "view".into(), "{pr}".into(), "--output".into(), "json".into()]
            )
        );
        let star = parse_forges(&["*=/opt/forge {pr}".into()]).unwrap();
        assert_eq!(star, vec![(None, vec!["/opt/forge".to_owned(), "{pr}".to_owned()])]);
        assert!(parse_forges(&["app=gh pr view".into()]).unwrap_err().to_string().contains("{pr}"));
        assert!(parse_forges(&["gh pr view {pr}".into()]).is_err());
    }

    #[test]
    fn a_lease_is_renewed_three_times_within_its_length() {
        assert_eq!(renew_every(Duration::from_secs(30)), RENEW_EVERY);
        assert_eq!(renew_every(Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(lease_length(0.0), Duration::from_secs(30), "an older server that does not say");
        assert_eq!(lease_length(4.5), Duration::from_millis(4500));
    }

    #[test]
    fn the_prompt_says_how_to_finish() {
        let job = JobView {
            title: "t".into(),
            detail: "d".into(),
            requires_pr: false,
            branch: "relay/x".into(),
            ..Default::default()
        };
        let text = prompt(&job);
        assert!(text.contains("finish_job tool with a summary") && text.contains("branch relay/x"), "{text}");
    }
}
