//! `agent-bridge spawn -- COMMAND…`: starts a worker agent as a child of the calling agent.
//!
//! The calling agent's bridge leaves a session file named after the agent's process id; `spawn`
//! (run from that agent's shell) finds it by walking up its own process ancestry. The server
//! reserves the child endpoint and hands back a one-time grant; a detached supervisor runs the
//! worker with that grant in its environment (so the worker's own bridge claims the child
//! endpoint) and, when the worker ends, reports its final output to the parent as the child.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::{SpawnRequest, SpawnResultRequest};

use crate::connection;
use crate::session_file::find_session;
use relay_agent::relay::replicas::Replicas;
use relay_agent::relay::session::authed;

pub async fn spawn(harness: String, scope: Option<String>, command: Vec<String>) -> anyhow::Result<()> {
    if command.is_empty() {
        bail!("give the worker's command after --, e.g. agent-bridge spawn -- codex exec \"…\"");
    }
    let machine = connection::resolve()?;
    let session = find_session()?;
    let replicas = Replicas::new(&session.server, session.ca.as_deref())?;
    let request = SpawnRequest { harness: harness.clone(), scope: scope.unwrap_or_default() };
    let reserved = RelayClient::new(replicas.reachable().await)
        .spawn(authed(request, &session.session_token))
        .await
        .map_err(|s| anyhow::anyhow!("the server refused the spawn: {}", s.message()))?
        .into_inner();
    let child = reserved.endpoint.context("spawn answered without an endpoint")?;

    let me = std::env::current_exe().context("cannot find agent-bridge itself")?;
    let mut supervisor = Command::new(me);
    supervisor
        .arg("supervise")
        .arg("--")
        .args(&command)
        .env("RELAY_SERVER", replicas.list_from(replicas.current().0))
        .env("RELAY_TOKEN", &machine.token)
        .env("RELAY_HANDLE", &child.handle)
        .env("RELAY_HARNESS", &harness)
        .env("RELAY_SPAWN_GRANT", &reserved.grant)
        .env_remove("RELAY_SESSION_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // The worker outlives the shell command that started it.
    crate::process::detach(&mut supervisor);
    if let Some(ca) = &session.ca {
        supervisor.env("RELAY_CA", ca);
    }
    supervisor.spawn().context("cannot start the worker")?;
    println!(
        "spawned {} (child of {}); its final output will reach you as a relay message",
        child.address, session.address
    );
    Ok(())
}

/// Most of the worker's output kept for its final report.
const TAIL: usize = 16 * 1024;

/// Runs the worker, keeps the tail of its output, and reports its end to the parent.
pub async fn supervise(command: Vec<String>) -> anyhow::Result<()> {
    let grant = std::env::var("RELAY_SPAWN_GRANT").context("supervise runs only under agent-bridge spawn")?;
    let (program, args) = command.split_first().context("no worker command")?;
    let outcome = tokio::task::spawn_blocking({
        // Found as a shell would (on Windows an npm shim, `codex.cmd`, answers to `codex`).
        let program = crate::process::find_program(program).unwrap_or_else(|| program.into());
        let args = args.to_vec();
        move || -> std::io::Result<(i32, String)> {
            let mut child = Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            let mut err = child.stderr.take().expect("piped stderr");
            let errs = std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = err.read_to_end(&mut buf);
                buf
            });
            let mut out = Vec::new();
            child.stdout.take().expect("piped stdout").read_to_end(&mut out)?;
            let status = child.wait()?;
            out.extend(errs.join().unwrap_or_default());
            let start = out.len().saturating_sub(TAIL);
            Ok((status.code().unwrap_or(-1), String::from_utf8_lossy(&out[start..]).into_owned()))
        }
    })
    .await?;
    let (exit_code, output) = match outcome {
        Ok(done) => done,
        Err(e) => (-1, format!("the worker could not be started: {e}")),
    };
    let server = std::env::var("RELAY_SERVER").context("no RELAY_SERVER")?;
    let replicas = Replicas::new(&server, std::env::var("RELAY_CA").ok().as_deref())?;
    // The parent must hear of the end: retry for a while if the server is briefly away, on each
    // replica in turn.
    for attempt in 0..30 {
        let reported = replicas.call(false, |channel| {
            let request = authed(SpawnResultRequest { exit_code, output: output.clone() }, &grant);
            async move { RelayClient::new(channel).spawn_result(request).await }
        });
        match reported.await {
            Ok(_) => return Ok(()),
            Err(status) if status.code() == tonic::Code::Unavailable && attempt < 29 => {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(status) => bail!("cannot report the worker's end: {}", status.message()),
        }
    }
    Ok(())
}
