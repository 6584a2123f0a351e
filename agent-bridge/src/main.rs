//! agent-bridge: the per-machine Relay bridge. `mcp` is the stdio MCP server an agent starts;
//! `login` stores the machine's credential; `install` hooks the bridge into an agent's client.
//!
//! * [`mcp`]: the MCP protocol layer (JSON-RPC over stdio).
//! * [`tools`]: the relay tools: schemas, arguments, wording.
//! * [`frame`]: text other agents wrote, made safe to show to a model or a terminal.
//! * [`relay`]: the gRPC client: channel, endpoint session, push stream.

mod codex;
mod connection;
mod doctor;
mod hook;
mod human;
mod install;
mod mcp;
mod process;
mod session_file;
mod spawn;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use relay_proto::bridge_config::{self, BridgeConfig};
use relay_proto::v1::CheckMachineRequest;
use relay_proto::v1::relay_client::RelayClient;
use tracing_subscriber::EnvFilter;

use relay_agent::relay::session::{Claim, authed};
use relay_agent::{relay, tools};

/// The Relay bridge for one machine.
#[derive(Parser)]
#[command(name = "agent-bridge", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve MCP on stdin/stdout for one agent session.
    Mcp {
        /// The handle to claim on this machine; a free one is picked when absent.
        #[arg(long, env = "RELAY_HANDLE")]
        handle: Option<String>,
        /// The agent's harness.
        #[arg(long, env = "RELAY_HARNESS", value_enum, default_value_t = Harness::Other)]
        harness: Harness,
        /// Offer channel pushes (`notifications/claude/channel`) to clients that take them.
        #[arg(long, env = "RELAY_CHANNELS")]
        channels: bool,
    },
    /// Check a machine token against the server and store it in the bridge config (mode 0600). The
    /// token is read from RELAY_TOKEN, else stdin (a prompt on a terminal), so it stays out of argv.
    Login {
        /// The server's URL, or its replicas' comma-separated (the bridge moves to the next when
        /// one fails).
        #[arg(long)]
        server: String,
        /// The token itself; visible to other users in the process list, so prefer stdin.
        #[arg(long)]
        token: Option<String>,
        /// A PEM certificate to trust for the server, beside the system's roots.
        #[arg(long, env = "RELAY_CA")]
        ca: Option<PathBuf>,
    },
    /// Check what this machine needs: the config and token, the server, the clock, each client set
    /// up here; prints what to fix and exits non-zero when something is wrong.
    Doctor,
    /// Add the bridge to an agent client's MCP configuration (idempotent; never writes the token),
    /// and with --guard the git pre-commit guard to this repository.
    Install {
        #[arg(value_enum, required_unless_present = "guard")]
        client: Option<install::Client>,
        /// Add a git pre-commit hook refusing commits that touch paths another agent holds
        /// exclusively (RELAY_GUARD=off passes it).
        #[arg(long)]
        guard: bool,
    },
    /// Start a worker agent as a child of the calling agent; returns at once with its name.
    Spawn {
        /// The worker's harness.
        #[arg(long, value_enum, default_value_t = Harness::Other)]
        harness: Harness,
        /// Caps on the worker in both directions: tree, parent or none (default: none set).
        #[arg(long)]
        scope: Option<String>,
        /// The worker's command line.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// What an account's person does: contacts.
    #[command(subcommand)]
    Human(human::HumanCommand),
    /// Serve this machine's repositories on the board: claim cards and run their agents.
    Worker {
        /// A repository of this machine to serve (registered on the board); repeatable.
        #[arg(long = "repo")]
        repos: Vec<PathBuf>,
        /// Where card worktrees go (default: under the user's data directory).
        #[arg(long, env = "RELAY_WORKTREES")]
        worktrees: Option<PathBuf>,
        /// How to start an agent CLI, NAME=COMMAND with {prompt} and {mcp_config} placeholders; repeatable.
        /// A codex command without {prompt} (the default, `codex mcp-server`) is driven over MCP, so
        /// Codex's approvals reach the operator and the human.
        #[arg(long = "agent")]
        agents: Vec<String>,
        /// Milliseconds between looks for work when idle.
        #[arg(long, default_value_t = 5000)]
        poll_ms: u64,
        /// Stop after running one card.
        #[arg(long)]
        once: bool,
        /// Cards run at once, each in its own worktree under its own lease.
        #[arg(long, env = "RELAY_WORKER_CONCURRENCY", default_value_t = 1,
              value_parser = clap::value_parser!(u32).range(1..=64))]
        concurrency: u32,
        /// How to ask the forge about a card's pull request, REPO=COMMAND (or *=COMMAND for every
        /// repository) with {pr} for its URL, answering JSON with a state; repeatable.
        /// Default: gh pr view {pr} --json state,mergedAt,closedAt.
        #[arg(long = "forge")]
        forges: Vec<String>,
    },
    /// Hooks an agent client runs at the end of a turn (`install` sets them up).
    #[command(subcommand)]
    Hook(hook::Event),
    /// Runs a spawned worker and reports its end (started by spawn).
    #[command(hide = true)]
    Supervise {
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Harness {
    Claude,
    Codex,
    Gemini,
    Cursor,
    Other,
}

impl Harness {
    fn name(self) -> &'static str {
        match self {
            Self::Claude => "claude",
            Self::Codex => "codex",
            Self::Gemini => "gemini",
            Self::Cursor => "cursor",
            Self::Other => "other",
        }
    }
}

async fn mcp(handle: Option<String>, harness: Harness, channels: bool) -> anyhow::Result<()> {
    // Watched from the start, so a signal at any point ends the session cleanly.
    let stop = termination()?;
    let config = connection::resolve()?;
    let replicas = Arc::new(relay::replicas::Replicas::new(&config.server, config.ca.as_deref())?);
    let spawn_grant = std::env::var("RELAY_SPAWN_GRANT").ok().filter(|g| !g.is_empty());
    let claim = Claim { handle: handle.filter(|h| !h.is_empty()), harness: harness.name().to_owned(), spawn_grant };
    let keeper = session_file::Keeper { path: session_file::session_path(agent_process()), ca: config.ca.clone() };
    let relay = Arc::new(relay::Relay::new(replicas, config.ca.clone(), config.token, claim).with_watcher(keeper));
    let tools = Arc::new(tools::Tools::new(relay, tools::Host::this_machine()));
    let options = mcp::session::Options { channels, version: env!("CARGO_PKG_VERSION") };
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    mcp::session::run(tools, options, stdin, tokio::io::stdout(), stop).await.context("stdio failed")?;
    // The session said goodbye (or gave up on it) and removed its file. Ended here rather than by
    // returning: a read of stdin may still be blocked in the runtime's thread pool, and calls to a
    // frozen relay may still be pending, either of which would hold up the runtime's shutdown.
    std::process::exit(0);
}

/// The agent process that started this bridge: the one its session file is named after.
fn agent_process() -> u32 {
    #[cfg(unix)]
    return std::os::unix::process::parent_id();
    #[cfg(not(unix))]
    return process::parent(std::process::id()).unwrap_or(0);
}

/// Resolves on SIGTERM, SIGINT or SIGHUP: a client ending, a terminal closing or an operator
/// stopping the bridge, each of which it survives long enough to say goodbye and remove its
/// session file. (SIGKILL cannot be caught; readers of session files skip a dead bridge's.)
#[cfg(unix)]
fn termination() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch for SIGINT")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot watch for SIGHUP")?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = hup.recv() => "SIGHUP",
        };
        tracing::debug!(signal = name, "ending the session");
    })
}

/// Resolves on Ctrl+C, Ctrl+Break or the console closing, each of which the bridge survives long
/// enough to say goodbye and remove its session file.
#[cfg(windows)]
fn termination() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::windows::{ctrl_break, ctrl_c, ctrl_close};
    let mut c = ctrl_c().context("cannot watch for Ctrl+C")?;
    let mut brk = ctrl_break().context("cannot watch for Ctrl+Break")?;
    let mut close = ctrl_close().context("cannot watch for the console closing")?;
    Ok(async move {
        let name = tokio::select! {
            _ = c.recv() => "ctrl-c",
            _ = brk.recv() => "ctrl-break",
            _ = close.recv() => "ctrl-close",
        };
        tracing::debug!(signal = name, "ending the session");
    })
}

async fn login(server: String, token: Option<String>, ca: Option<PathBuf>) -> anyhow::Result<()> {
    let token = match token {
        Some(token) => {
            eprintln!("note: a token in argv is visible to every user of this machine; pipe it in instead");
            token.trim().to_owned()
        }
        None => connection::read_secret("machine token", "RELAY_TOKEN")?,
    };
    let ca = ca.map(|p| std::path::absolute(&p).unwrap_or(p).display().to_string());
    let replicas = relay::replicas::Replicas::new(&server, ca.as_deref())?;
    // Stored as checked: each replica's URL once, in the order given.
    let server = replicas.list_from(0);
    let reply = RelayClient::new(replicas.reachable().await)
        .check_machine(authed(CheckMachineRequest { client_version: relay_proto::release::VERSION.into() }, &token))
        .await
        .map_err(|status| match relay_agent::relay::replicas::untrusted_certificate(&status, ca.as_deref()) {
            Some(why) => anyhow::anyhow!("{why}"),
            None if status.code() == tonic::Code::Unauthenticated => {
                anyhow::anyhow!("the server refused the token: {}", status.message())
            }
            None => anyhow::anyhow!("cannot check the token with {server}: {}", status.message()),
        })?
        .into_inner();
    let path = bridge_config::default_path()?;
    // Login is how a config that cannot be used is mended: it is written anew, said so.
    let human_token = match bridge_config::read(&path) {
        Ok(existing) => existing.and_then(|c| c.human_token),
        Err(e) => {
            eprintln!("note: replacing it: {e}");
            None
        }
    };
    bridge_config::write(&path, &BridgeConfig { server, token, ca, human_token })?;
    eprintln!("logged in as machine {}/{}; config written to {}", reply.account, reply.machine, path.display());
    Ok(())
}

fn init_logging() {
    // stdout belongs to MCP: diagnostics go to stderr only.
    let filter = EnvFilter::try_from_env("RELAY_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
}

#[tokio::main]
async fn main() -> ExitCode {
    init_logging();
    let outcome = match Cli::parse().command {
        Command::Mcp { handle, harness, channels } => mcp(handle, harness, channels).await,
        Command::Login { server, token, ca } => login(server, token, ca).await,
        Command::Install { client, guard } => install::run(client, guard),
        Command::Doctor => match doctor::run().await {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Spawn { harness, scope, command } => spawn::spawn(harness.name().to_owned(), scope, command).await,
        Command::Human(command) => human::run(command).await,
        Command::Hook(event) => match hook::run(event).await {
            // Ended here: a hook's stdin may still be read by a thread of its own.
            Ok(code) => std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 2 }),
            Err(e) => Err(e),
        },
        Command::Worker { repos, worktrees, agents, poll_ms, once, concurrency, forges } => {
            let poll = std::time::Duration::from_millis(poll_ms.max(50));
            let concurrency = concurrency as usize;
            worker::run(worker::Options { repos, worktrees, agents, poll, once, concurrency, forges }).await
        }
        Command::Supervise { command } => spawn::supervise(command).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("agent-bridge: {err:#}");
            ExitCode::FAILURE
        }
    }
}
