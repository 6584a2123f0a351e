//! The agents this replica serves over HTTP, each a client of the replica's own gRPC service: the
//! relay tools (from `relay-agent`, as the bridge runs them) over an in-process connection, in the
//! name of a session claimed with a token derived from the agent's machine token. So a remote
//! agent's calls take the path a bridge's take — authentication, admission, rates, scope, trust,
//! holds, redaction — and any replica resumes its session, since every replica derives the same
//! token and the session lives in the database. What a replica keeps here is a cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use relay_agent::relay::Relay;
use relay_agent::relay::replicas::Replicas;
use relay_agent::relay::session::{Claim as ClientClaim, Claimed, Claimer, Claiming, Session};
use relay_agent::tools::{Host, Tools};
use tonic::transport::Endpoint;

use crate::app::identity::{Claim, IdentityService};
use crate::domain::caller::MachineIdentity;
use crate::domain::ids::{self, TokenHash};
use crate::metrics::metrics;
use crate::protocol::connections::InProcess;
use crate::protocol::convert::IntoWire;
use crate::protocol::status::to_status;

/// Agents kept at most; past it, the one idle longest is dropped (its session lives on). Each holds
/// an in-process connection, one of the replica's places: this leaves most of them to others.
const MAX_AGENTS: usize = 2048;
/// An agent unused this long is dropped when another is made, and its connection closed.
const IDLE: Duration = Duration::from_secs(15 * 60);

/// Who a request is from, as its credentials say: set by authentication, read by the handler.
#[derive(Clone)]
pub struct Remote {
    pub machine: MachineIdentity,
    /// The bearer token; kept only to derive the session token, never logged.
    pub machine_token: Arc<str>,
    /// `Relay-Handle`, when given.
    pub handle: Option<String>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("machine", &format_args!("{}/{}", self.machine.account, self.machine.machine))
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

/// What the agent is, besides its credentials: its harness (from the client's name) and, for a
/// client of the 2025 revisions without `Relay-Handle`, its MCP session (a handle is picked per
/// session; without one, per machine token).
pub struct Seat<'a> {
    pub harness: &'static str,
    pub mcp_session: Option<&'a str>,
}

struct Kept {
    tools: Arc<Tools>,
    used: Instant,
}

pub struct Agents {
    identity: IdentityService,
    in_process: InProcess,
    kept: Mutex<HashMap<TokenHash, Kept>>,
}

impl Agents {
    pub fn new(identity: IdentityService, in_process: InProcess) -> Self {
        Self { identity, in_process, kept: Mutex::default() }
    }

    /// The session token of the agent `remote` is in `seat`: derived, so any replica finds it.
    fn token(remote: &Remote, seat: &Seat<'_>) -> String {
        let purpose = match (&remote.handle, seat.mcp_session) {
            // A named handle is one agent whatever client speaks for it (the harness is updated).
            (Some(handle), _) => format!("handle\0{handle}"),
            (None, Some(session)) => format!("{}\0picked\0{session}", seat.harness),
            (None, None) => format!("{}\0picked", seat.harness),
        };
        ids::derived_session_token(&remote.machine_token, &purpose)
    }

    /// Ends the relay session of the agent `remote` is in `seat`, as a bridge's goodbye does: it
    /// goes offline at once and its handle is free. Whichever replica claimed it.
    pub async fn end(&self, remote: &Remote, seat: &Seat<'_>) {
        let token = Self::token(remote, seat);
        self.kept.lock().expect("agents lock poisoned").remove(&ids::token_hash(&token));
        // An agent that never called a tool has no session to end.
        if let Ok(caller) = self.identity.caller(&token).await
            && let Err(e) = self.identity.goodbye(&caller).await
        {
            tracing::warn!(error = %e, "cannot end the relay session of an ended MCP session");
        }
    }

    /// The tools of the agent `remote` is in `seat`, made on first use.
    pub fn tools(&self, remote: &Remote, seat: &Seat<'_>) -> Arc<Tools> {
        let token = Self::token(remote, seat);
        let key = ids::token_hash(&token);
        let now = Instant::now();
        let mut kept = self.kept.lock().expect("agents lock poisoned");
        if let Some(agent) = kept.get_mut(&key) {
            agent.used = now;
            return agent.tools.clone();
        }
        kept.retain(|_, agent| now.duration_since(agent.used) < IDLE);
        if kept.len() >= MAX_AGENTS
            && let Some(oldest) = kept.iter().min_by_key(|(_, agent)| agent.used).map(|(key, _)| key.clone())
        {
            kept.remove(&oldest);
        }
        let tools = Arc::new(self.make(remote, seat.harness, token));
        kept.insert(key, Kept { tools: tools.clone(), used: now });
        metrics().mcp_agents.set(kept.len() as i64);
        tools
    }

    fn make(&self, remote: &Remote, harness: &'static str, token: String) -> Tools {
        let in_process = self.in_process.clone();
        let endpoint = Endpoint::from_static("http://in-process.relay");
        let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let in_process = in_process.clone();
            async move { in_process.connect().await.map(TokioIo::new) }
        }));
        let replicas = Arc::new(Replicas::one("in-process", endpoint, channel));
        let claimer = Derived {
            identity: self.identity.clone(),
            machine: remote.machine.clone(),
            handle: remote.handle.clone(),
            harness,
            token,
        };
        let claim = ClientClaim { handle: remote.handle.clone(), harness: harness.to_owned(), spawn_grant: None };
        // The credential is never presented: the claimer claims in its place.
        let relay = Relay::new(replicas, None, String::new(), claim).with_claimer(Arc::new(claimer));
        Tools::new(Arc::new(relay), Host::default())
    }
}

/// Claims the agent's session under its derived token, by a call into the identity service.
struct Derived {
    identity: IdentityService,
    machine: MachineIdentity,
    handle: Option<String>,
    harness: &'static str,
    token: String,
}

impl Claimer for Derived {
    fn claim<'a>(&'a self, previous: Option<&'a Session>) -> Claiming<'a> {
        Box::pin(async move {
            // A picked handle is kept: claimed again, the agent keeps its name and inbox.
            let picked = previous.map(|s| s.endpoint.handle.as_str());
            let claim = Claim {
                handle: self.handle.as_deref().or(picked).unwrap_or_default(),
                harness: self.harness,
                resume: "",
                spawn_grant: "",
            };
            let outcome = self.identity.hello_derived(&self.machine, claim, &self.token).await.map_err(to_status)?;
            Ok(Claimed {
                token: outcome.session_token,
                endpoint: outcome.endpoint.into_wire(),
                resumed: outcome.resumed,
            })
        })
    }
}

/// The harness a client's name says it is.
pub fn harness_of(client: &str) -> &'static str {
    let client = client.to_ascii_lowercase();
    ["claude", "codex", "gemini", "cursor"].into_iter().find(|h| client.contains(h)).unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_name_says_its_harness() {
        assert_eq!(harness_of("claude-code"), "claude");
        assert_eq!(harness_of("Claude.ai"), "claude");
        assert_eq!(harness_of("codex-mcp-client"), "codex");
        assert_eq!(harness_of("gemini-cli-mcp-client"), "gemini");
        assert_eq!(harness_of("Cursor"), "cursor");
        assert_eq!(harness_of("my-ci-job"), "other");
    }
}
