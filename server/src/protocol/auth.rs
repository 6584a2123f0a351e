//! Who a call comes from, established in one place before any handler runs: a layer reads the
//! bearer credential the method takes (a session token for an agent's calls, the machine token for
//! `Hello`, `CheckMachine` and the worker's calls, a human token for a person's; `Hello` also takes
//! a card's job token, told apart by its prefix), authenticates it, names the caller on the call's
//! span and hands it to the handler in the request's extensions. A call without a valid credential
//! never reaches a handler, and a job token reaches nothing but `Hello`.

use futures_util::future::BoxFuture;
use tonic::Status;

use super::admission::Gatekeeper;
use super::credential::Credential;
use super::layers;
use super::status::to_status;
use crate::app::App;
use crate::app::identity::IdentityService;
use crate::app::quotas::Call;
use crate::app::trust::TrustService;
use crate::domain::caller::{Caller, CardAgent, Human, MachineIdentity};
use crate::domain::ids::TokenKind;
use crate::domain::{Error, Result};

/// The credential each method takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// An agent's session token.
    Session,
    /// A machine token.
    Machine,
    /// A machine token, or a card's job token (its agent claims the card's endpoint).
    MachineOrJob,
    /// A human token.
    Person,
    /// Checked by the handler itself: a spawn grant, spent by the call.
    Own,
    /// Health and reflection.
    Nothing,
}

impl Needs {
    fn of(path: &str) -> Self {
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or((path, ""));
        match (service, method) {
            ("relay.v1.Relay", "Hello") => Self::MachineOrJob,
            ("relay.v1.Relay", "CheckMachine") => Self::Machine,
            ("relay.v1.Relay", "SpawnResult") => Self::Own,
            ("relay.v1.Relay", _) => Self::Session,
            ("relay.v1.Worker", _) => Self::Machine,
            ("relay.v1.Human", _) => Self::Person,
            _ => Self::Nothing,
        }
    }
}

/// The bearer token of a call's metadata.
pub fn bearer<T>(request: &tonic::Request<T>) -> Result<&str> {
    token(request.metadata().get("authorization").map(|v| v.as_bytes()))
}

fn token(value: Option<&[u8]>) -> Result<&str> {
    let value = value.ok_or_else(|| Error::Unauthenticated("missing authorization metadata (Bearer token)".into()))?;
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| Error::Unauthenticated("authorization must be \"Bearer <token>\"".into()))
}

/// A job token offered where the method takes another credential: refused by its kind alone, with
/// what a card's agent does instead.
fn misplaced_job_token(needs: Needs, token: &str, path: &str) -> Option<Error> {
    if TokenKind::of(token) != Some(TokenKind::JobToken) {
        return None;
    }
    Some(match needs {
        Needs::MachineOrJob | Needs::Own | Needs::Nothing => return None,
        Needs::Session => Error::Unauthenticated(
            "a job token is not a session token: say Hello with it, then call with the session token Hello returns"
                .into(),
        ),
        _ => Error::PermissionDenied(format!(
            "a job token acts only as its card's endpoint (Hello, then that session's calls): {} needs {}",
            path.trim_start_matches('/'),
            if needs == Needs::Person { "a human token" } else { "the machine's token" }
        )),
    })
}

async fn authenticate(gate: &Gate, needs: Needs, token: &str) -> Result<Option<Credential>> {
    Ok(Some(match needs {
        Needs::MachineOrJob if TokenKind::of(token) == Some(TokenKind::JobToken) => {
            let agent = gate.identity.card_agent(token).await?;
            let at = &agent.machine;
            layers::record_caller(&format_args!("{}/{} (card {})", at.account, at.machine, agent.attempt.card));
            Credential::Card(agent)
        }
        Needs::Session => {
            let caller = gate.identity.caller(token).await?;
            layers::record_caller(&caller.address());
            Credential::Session(caller)
        }
        Needs::Machine | Needs::MachineOrJob => {
            let machine = gate.identity.machine(token).await?;
            layers::record_caller(&format_args!("{}/{}", machine.account, machine.machine));
            Credential::Machine(machine)
        }
        Needs::Person => {
            let person = gate.trust.person(token).await?;
            layers::record_caller(&format_args!("{}/me ({})", person.account, person.name));
            Credential::Person(person)
        }
        Needs::Own | Needs::Nothing => return Ok(None),
    }))
}

fn missing() -> Error {
    Error::Internal("the call reached its handler unauthenticated".into())
}

/// The agent the layer authenticated by its session token.
pub fn caller<T>(request: &tonic::Request<T>) -> std::result::Result<Caller, Status> {
    match request.extensions().get::<Credential>() {
        Some(Credential::Session(caller)) => Ok(caller.clone()),
        _ => Err(to_status(missing())),
    }
}

/// The machine the layer authenticated by its machine token.
pub fn machine<T>(request: &tonic::Request<T>) -> std::result::Result<MachineIdentity, Status> {
    match request.extensions().get::<Credential>() {
        Some(Credential::Machine(machine)) => Ok(machine.clone()),
        _ => Err(to_status(missing())),
    }
}

/// Whoever the layer authenticated for `Hello`: a machine, or a card's agent.
pub fn hello_credential<T>(request: &tonic::Request<T>) -> std::result::Result<Credential, Status> {
    match request.extensions().get::<Credential>() {
        Some(credential @ (Credential::Machine(_) | Credential::Card(_))) => Ok(credential.clone()),
        _ => Err(to_status(missing())),
    }
}

/// The person the layer authenticated by a human token.
pub fn person<T>(request: &tonic::Request<T>) -> std::result::Result<Human, Status> {
    match request.extensions().get::<Credential>() {
        Some(Credential::Person(person)) => Ok(person.clone()),
        _ => Err(to_status(missing())),
    }
}

/// What admission asks of the application: who a credential is (identity; trust for a person's
/// token), and whether its rates allow one more call.
pub struct Gate {
    identity: IdentityService,
    trust: TrustService,
}

impl Gate {
    pub fn new(app: &App) -> Self {
        Self { identity: app.identity.clone(), trust: app.trust.clone() }
    }
}

impl Gatekeeper for Gate {
    fn authenticate<'a>(
        &'a self,
        path: &'a str,
        headers: &'a http::HeaderMap,
    ) -> BoxFuture<'a, Result<Option<Credential>>> {
        Box::pin(async move {
            let needs = Needs::of(path);
            if matches!(needs, Needs::Own | Needs::Nothing) {
                return Ok(None);
            }
            let token = token(headers.get(http::header::AUTHORIZATION).map(|v| v.as_bytes()))?;
            if let Some(refused) = misplaced_job_token(needs, token, path) {
                return Err(refused);
            }
            authenticate(self, needs, token).await
        })
    }

    fn admit_rate(&self, credential: &Credential, path: &str) -> Result<()> {
        let who = match credential {
            Credential::Session(caller) => caller.address(),
            Credential::Machine(m) => format!("machine {}/{}", m.account, m.machine),
            Credential::Card(agent) => format!("card {}'s agent", agent.attempt.card),
            Credential::Person(p) => format!("{}/me ({})", p.account, p.name),
        };
        // A Hello with a machine's (or a card's) token opens a session of that machine.
        let opens_session = match credential {
            Credential::Machine(m) | Credential::Card(CardAgent { machine: m, .. }) if path.ends_with("/Hello") => {
                Some(m.machine_id)
            }
            _ => None,
        };
        let call = Call { account: credential.account_id(), holder: credential.holder(), who: &who, opens_session };
        self.identity.admit_call(&call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_takes_its_credential() {
        assert_eq!(Needs::of("/relay.v1.Relay/Hello"), Needs::MachineOrJob);
        assert_eq!(Needs::of("/relay.v1.Relay/CheckMachine"), Needs::Machine);
        assert_eq!(Needs::of("/relay.v1.Relay/Send"), Needs::Session);
        assert_eq!(Needs::of("/relay.v1.Relay/Subscribe"), Needs::Session);
        assert_eq!(Needs::of("/relay.v1.Relay/SpawnResult"), Needs::Own);
        assert_eq!(Needs::of("/relay.v1.Worker/Claim"), Needs::Machine);
        assert_eq!(Needs::of("/relay.v1.Human/Holds"), Needs::Person);
        assert_eq!(Needs::of("/grpc.health.v1.Health/Check"), Needs::Nothing);
        assert_eq!(Needs::of("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"), Needs::Nothing);
    }

    #[test]
    fn a_job_token_reaches_nothing_but_hello() {
        let job = crate::domain::ids::new_token(TokenKind::JobToken);
        let path = "/relay.v1.Worker/Claim";
        assert!(misplaced_job_token(Needs::MachineOrJob, &job, path).is_none());
        let refused = misplaced_job_token(Needs::Machine, &job, path).unwrap();
        assert!(
            matches!(&refused, Error::PermissionDenied(m) if m.contains("relay.v1.Worker/Claim needs the machine's token")),
            "{refused}"
        );
        assert!(matches!(misplaced_job_token(Needs::Person, &job, path), Some(Error::PermissionDenied(_))));
        assert!(matches!(misplaced_job_token(Needs::Session, &job, path), Some(Error::Unauthenticated(_))));
        let machine = crate::domain::ids::new_token(TokenKind::Machine);
        assert!(misplaced_job_token(Needs::Machine, &machine, path).is_none());
    }

    #[test]
    fn a_bearer_token_is_read_or_refused_clearly() {
        assert_eq!(token(Some(b"Bearer rls_abc")).unwrap(), "rls_abc");
        assert!(token(None).unwrap_err().to_string().contains("missing authorization"));
        assert!(token(Some(b"Basic x")).unwrap_err().to_string().contains("Bearer <token>"));
    }
}
