//! The git pre-commit guard: refuses a commit that touches paths another agent holds exclusively,
//! naming holder and reason. It asks as the agent whose bridge runs the commit (its own claims do
//! not stop it), else as this machine (every agent's claims do). It never stands in the way of
//! work because of the relay itself: `RELAY_GUARD=off` passes it, and when the server cannot be
//! asked within [`WAIT`] it warns and lets the commit through.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use relay_agent::relay::replicas::Replicas;
use relay_agent::relay::session::authed;
use relay_agent::{frame, repo};
use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::worker_client::WorkerClient;
use relay_proto::v1::{ClaimsTouchingRequest, PathClaim};

use super::Agent;

/// Longest the guard holds a commit to ask the relay.
pub const WAIT: Duration = Duration::from_secs(2);

/// What the guard says: `Some(refusal)` when the commit must not go on.
pub async fn run() -> ExitCode {
    if std::env::var("RELAY_GUARD").is_ok_and(|v| v.trim().eq_ignore_ascii_case("off")) {
        return ExitCode::SUCCESS;
    }
    match tokio::time::timeout(WAIT, check(Path::new("."))).await {
        Ok(Ok(held)) if held.is_empty() => ExitCode::SUCCESS,
        Ok(Ok(held)) => {
            eprintln!("{}", refusal(&held));
            ExitCode::FAILURE
        }
        Ok(Err(why)) => {
            eprintln!("relay guard: {why}; the commit goes on unchecked");
            ExitCode::SUCCESS
        }
        Err(_) => {
            eprintln!(
                "relay guard: the relay did not answer within {} s; the commit goes on unchecked",
                WAIT.as_secs()
            );
            ExitCode::SUCCESS
        }
    }
}

/// The exclusive claims of others that the staged files run into.
async fn check(dir: &Path) -> Result<Vec<PathClaim>, String> {
    let found = repo::locate(dir).await?;
    let files = repo::staged(Path::new(&found.root)).await?;
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let request = ClaimsTouchingRequest { repo: Some(found.to_ref()), files };
    let refused = |e: tonic::Status| format!("the relay refused the check: {}", e.message());
    if let Some(agent) = Agent::find() {
        let mut client = RelayClient::new(agent.replicas.reachable().await);
        let answer = client.claims_touching(authed(request, agent.token())).await.map_err(refused)?;
        return Ok(answer.into_inner().claims);
    }
    let config = crate::connection::resolve().map_err(|e| format!("no relay credential here ({e})"))?;
    let replicas = Replicas::new(&config.server, config.ca.as_deref()).map_err(|e| e.to_string())?;
    let mut client = WorkerClient::new(replicas.reachable().await);
    let answer = client.claims_touching(authed(request, &config.token)).await.map_err(refused)?;
    Ok(answer.into_inner().claims)
}

/// Why the commit is refused: each claim in the way, its holder and reason (another agent's text,
/// shown neutralised), and the ways on.
fn refusal(held: &[PathClaim]) -> String {
    let mut lines = vec!["relay guard: this commit touches paths other agents hold exclusively:".to_owned()];
    for claim in held {
        lines.push(format!(
            "  {} ({}): {} holds it until {}, for: {}",
            claim.paths.join(", "),
            claim.id,
            claim.holder,
            claim.until,
            frame::quote(&claim.reason),
        ));
    }
    lines.push(
        "Agree with the holder (relay_send), or wait for its relay_release. RELAY_GUARD=off passes the guard."
            .to_owned(),
    );
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_holder_paths_and_reason_with_the_reason_neutralised() {
        let claim = PathClaim {
            id: "claim-3".into(),
            holder: "acme/laptop/ann".into(),
            repo: "github.com/acme/api".into(),
            paths: vec!["src/auth".into()],
            exclusive: true,
            reason: "login \u{1b}[2Jrework".into(),
            since: "2026-12-07T15:00:00Z".into(),
            until: "2026-12-07T16:00:00Z".into(),
            kept: false,
        };
        let said = refusal(&[claim]);
        assert!(said.contains("src/auth (claim-3): acme/laptop/ann holds it until 2026-12-07T16:00:00Z"), "{said}");
        assert!(!said.contains('\u{1b}'), "no escape reaches the terminal: {said:?}");
        assert!(said.contains("RELAY_GUARD=off"));
    }
}
