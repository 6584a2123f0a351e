//! The endpoint this bridge holds on the server, and calls made in its name.

use std::future::Future;
use std::time::Duration;

use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::{Endpoint, GoodbyeRequest, HelloRequest};
use tokio::sync::Mutex;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

/// A failed relay call, as the tool layer words it for the model.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The server answered and refused: the model can act on its reason.
    #[error("{}", .0.message())]
    Refused(Status),
    /// The server could not be reached or did not answer in time.
    #[error("the relay server cannot be reached ({0}); try again shortly")]
    Unreachable(String),
    /// The server's certificate was not trusted: retrying will not help.
    #[error("{0}")]
    Untrusted(String),
}

impl From<Status> for RelayError {
    fn from(status: Status) -> Self {
        match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                Self::Unreachable(status.message().to_owned())
            }
            _ => Self::Refused(status),
        }
    }
}

/// What this bridge claims: a handle (or a picked one) under a harness.
#[derive(Debug, Clone)]
pub struct Claim {
    pub handle: Option<String>,
    pub harness: String,
    /// Set for a spawned worker: claims the endpoint its parent reserved.
    pub spawn_grant: Option<String>,
}

/// The session `Hello` granted.
#[derive(Debug, Clone)]
pub struct Session {
    pub token: String,
    pub endpoint: Endpoint,
}

pub type Client = RelayClient<Channel>;

/// Most a plain call may take beyond its own waiting; a silent server becomes an error, not a hang.
const CALL_SLACK: Duration = Duration::from_secs(20);

pub struct Relay {
    client: Client,
    /// The CA file trusted beside the system's roots, named when a certificate is refused.
    ca: Option<String>,
    machine_token: String,
    claim: Mutex<Claim>,
    session: Mutex<Option<Session>>,
    /// Where to leave the session for `agent-bridge spawn` run from the agent's shell.
    session_file: Option<SessionFileSpec>,
}

struct SessionFileSpec {
    path: std::path::PathBuf,
    server: String,
    ca: Option<String>,
}

/// A request carrying a bearer token.
pub fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    if let Ok(value) = MetadataValue::try_from(format!("Bearer {token}")) {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

impl Relay {
    pub fn new(channel: Channel, ca: Option<String>, machine_token: String, claim: Claim) -> Self {
        Self {
            client: RelayClient::new(channel),
            ca,
            machine_token,
            claim: Mutex::new(claim),
            session: Mutex::new(None),
            session_file: None,
        }
    }

    /// Keeps a session file at `path` for as long as the session lives.
    pub fn with_session_file(mut self, path: std::path::PathBuf, server: String, ca: Option<String>) -> Self {
        self.session_file = Some(SessionFileSpec { path, server, ca });
        self
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The current session, claiming (or resuming) the endpoint first when there is none.
    pub async fn session(&self) -> Result<Session, RelayError> {
        let mut slot = self.session.lock().await;
        if let Some(session) = slot.as_ref() {
            return Ok(session.clone());
        }
        let session = self.hello(None).await?;
        *slot = Some(session.clone());
        Ok(session)
    }

    /// Drops `stale` (if it is still current) so the next call claims again: resuming when the
    /// server still knows the session token, else claiming the same handle afresh.
    pub async fn renew(&self, stale: &Session) -> Result<Session, RelayError> {
        let mut slot = self.session.lock().await;
        if let Some(current) = slot.as_ref()
            && current.token != stale.token
        {
            return Ok(current.clone());
        }
        let session = self.hello(Some(stale)).await?;
        *slot = Some(session.clone());
        Ok(session)
    }

    async fn hello(&self, previous: Option<&Session>) -> Result<Session, RelayError> {
        let mut claim = self.claim.lock().await;
        let request = HelloRequest {
            handle: claim.handle.clone().unwrap_or_default(),
            harness: claim.harness.clone(),
            resume: previous.map(|s| s.token.clone()).unwrap_or_default(),
            spawn_grant: claim.spawn_grant.clone().unwrap_or_default(),
        };
        let reply = with_deadline(Duration::ZERO, self.client.clone().hello(authed(request, &self.machine_token)))
            .await
            .map_err(|status| self.error(status))?
            .into_inner();
        let endpoint = reply.endpoint.ok_or_else(|| RelayError::Unreachable("hello without an endpoint".into()))?;
        // A picked handle is kept, so reconnecting claims the same name.
        claim.handle = Some(endpoint.handle.clone());
        tracing::info!(endpoint = %endpoint.address, resumed = reply.resumed, "relay session ready");
        if let Some(spec) = &self.session_file {
            let file = super::session_file::SessionFile {
                server: spec.server.clone(),
                ca: spec.ca.clone(),
                session_token: reply.session_token.clone(),
                address: endpoint.address.clone(),
            };
            super::session_file::write_session_at(&spec.path, &file);
        }
        Ok(Session { token: reply.session_token, endpoint })
    }

    /// Makes a call in the endpoint's name. A dropped connection or a lost session is repaired and
    /// the call tried once more; the server makes retried sends idempotent by their client id.
    pub async fn call<Req, T, F, Fut>(&self, wait: Duration, message: Req, call: F) -> Result<T, RelayError>
    where
        Req: Clone,
        F: Fn(Client, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.call_with(wait, message, call, true).await
    }

    /// Like [`Relay::call`], for calls that change state without an idempotency key (an inbox that
    /// acknowledges, a permission request): retried only when the server refused the session before
    /// doing anything, never after a lost answer, which might have been acted on.
    pub async fn call_once<Req, T, F, Fut>(&self, wait: Duration, message: Req, call: F) -> Result<T, RelayError>
    where
        Req: Clone,
        F: Fn(Client, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.call_with(wait, message, call, false).await
    }

    async fn call_with<Req, T, F, Fut>(
        &self,
        wait: Duration,
        message: Req,
        call: F,
        retry_lost: bool,
    ) -> Result<T, RelayError>
    where
        Req: Clone,
        F: Fn(Client, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let session = self.session().await?;
        let first = call(self.client.clone(), authed(message.clone(), &session.token));
        let retry_with = match with_deadline(wait, first).await {
            Ok(response) => return Ok(response.into_inner()),
            Err(status) if status.code() == Code::Unauthenticated => self.renew(&session).await?,
            Err(status) => match self.error(status) {
                RelayError::Unreachable(why) if retry_lost => {
                    tracing::debug!(error = %why, "relay call failed; retrying once");
                    session
                }
                other => return Err(other),
            },
        };
        let again = call(self.client.clone(), authed(message, &retry_with.token));
        Ok(with_deadline(wait, again).await.map_err(|status| self.error(status))?.into_inner())
    }

    /// A failed call as the tools word it; a refused certificate says so, and names the CA.
    pub fn error(&self, status: Status) -> RelayError {
        match super::connection::untrusted_certificate(&status, self.ca.as_deref()) {
            Some(why) => RelayError::Untrusted(why),
            None => status.into(),
        }
    }

    /// Ends the session on the server: the endpoint goes offline and its handle is free.
    pub async fn goodbye(&self) {
        // Taken first: a claim in flight finishes (and writes the file) before the file goes.
        let session = self.session.lock().await.take();
        if let Some(spec) = &self.session_file {
            let _ = std::fs::remove_file(&spec.path);
        }
        let Some(session) = session else { return };
        let request = authed(GoodbyeRequest {}, &session.token);
        if let Err(e) = tokio::time::timeout(Duration::from_secs(3), self.client.clone().goodbye(request)).await {
            tracing::debug!(error = %e, "goodbye timed out");
        }
    }
}

async fn with_deadline<T>(
    wait: Duration,
    call: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<Response<T>, Status> {
    match tokio::time::timeout(wait + CALL_SLACK, call).await {
        Ok(result) => result,
        Err(_) => Err(Status::deadline_exceeded("no answer in time")),
    }
}
