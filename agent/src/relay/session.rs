//! The endpoint this bridge holds on the server, and calls made in its name.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::{Endpoint, GoodbyeRequest, HelloRequest};
use tokio::sync::Mutex;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use super::replicas::{Failure, Replicas};

/// A failed relay call, as the tool layer words it for the model.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The server answered and refused: the model can act on its reason.
    #[error("{}", .0.message())]
    Refused(Status),
    /// The server could not be reached or did not answer in time.
    #[error("the relay server cannot be reached ({0}); try again shortly")]
    Unreachable(String),
    /// The server went away during a call that is not safe to repeat: it may have been done.
    #[error("the relay server did not finish this call ({0}), and it may have taken effect: check before trying again")]
    Unanswered(String),
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
    /// The replica that granted or last resumed it.
    pub replica: usize,
}

pub type Client = RelayClient<Channel>;

/// The largest answer read: a fetched file at the largest files' limit a server may set, and its
/// frame.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024 + 64 * 1024;

/// Most a plain call may take beyond its own waiting; a silent server becomes an error, not a hang.
const CALL_SLACK: Duration = Duration::from_secs(20);

pub struct Relay {
    replicas: Arc<Replicas>,
    /// The CA file trusted beside the system's roots, named when a certificate is refused.
    ca: Option<String>,
    /// What `Hello` presents: the machine token, or a card's agent's job token.
    credential: String,
    claim: Mutex<Claim>,
    /// Claims the session in place of `Hello`, when set.
    claimer: Option<Arc<dyn Claimer>>,
    session: Mutex<Option<Session>>,
    /// Told when a session begins and ends (the bridge keeps a file for programs its agent starts).
    watcher: Option<Box<dyn SessionWatcher>>,
}

/// A future as the traits below return it.
pub type Claiming<'a> = Pin<Box<dyn Future<Output = Result<Claimed, Status>> + Send + 'a>>;

/// What a claim gave: the session's token, its endpoint, and whether it was resumed.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub token: String,
    pub endpoint: Endpoint,
    pub resumed: bool,
}

/// Claims (or resumes) the endpoint's session by other means than a `Hello` call: the server does
/// so for the agents it serves over HTTP, by a call into its own identity service.
pub trait Claimer: Send + Sync {
    /// `previous` is the session last held, which may still be live.
    fn claim<'a>(&'a self, previous: Option<&'a Session>) -> Claiming<'a>;
}

/// Told when the session begins (or is claimed again) and when it ends.
pub trait SessionWatcher: Send + Sync {
    /// `server` lists the replicas from the one that granted it.
    fn began(&self, server: &str, session: &Session);
    fn ended(&self);
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
    pub fn new(replicas: Arc<Replicas>, ca: Option<String>, credential: String, claim: Claim) -> Self {
        Self {
            replicas,
            ca,
            credential,
            claim: Mutex::new(claim),
            claimer: None,
            session: Mutex::new(None),
            watcher: None,
        }
    }

    /// Tells `watcher` when the session begins and ends.
    pub fn with_watcher(mut self, watcher: impl SessionWatcher + 'static) -> Self {
        self.watcher = Some(Box::new(watcher));
        self
    }

    /// Claims sessions with `claimer` instead of calling `Hello`.
    pub fn with_claimer(mut self, claimer: Arc<dyn Claimer>) -> Self {
        self.claimer = Some(claimer);
        self
    }

    pub fn replicas(&self) -> &Replicas {
        &self.replicas
    }

    /// The replica in use, and a client of it.
    pub fn client(&self) -> (usize, Client) {
        let (index, channel) = self.replicas.current();
        // A fetched file comes in one answer; the server bounds it by its files' limit.
        (index, RelayClient::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES))
    }

    /// The current session, claiming the endpoint first when there is none, and resuming it on
    /// the replica now in use when the bridge moved since it was granted: any replica knows the
    /// session (they share one database), and the resume renews its lease over the move.
    pub async fn session(&self) -> Result<Session, RelayError> {
        let mut slot = self.session.lock().await;
        let previous = match slot.as_ref() {
            Some(session) if session.replica == self.replicas.current().0 => return Ok(session.clone()),
            other => other.cloned(),
        };
        let session = self.hello(previous.as_ref()).await?;
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
        let (replica, claimed) = match &self.claimer {
            Some(claimer) => {
                let claimed = claimer.claim(previous).await.map_err(|status| self.error(status))?;
                (self.replicas.current().0, claimed)
            }
            None => {
                let request = HelloRequest {
                    handle: claim.handle.clone().unwrap_or_default(),
                    harness: claim.harness.clone(),
                    resume: previous.map(|s| s.token.clone()).unwrap_or_default(),
                    spawn_grant: claim.spawn_grant.clone().unwrap_or_default(),
                    client_version: relay_proto::release::VERSION.to_owned(),
                };
                // A resume is safe to repeat; a first claim answered but lost holds its handle for a
                // while, so it is not made again at once.
                let (replica, reply) = self
                    .replicas
                    .call_on(previous.is_some(), |channel| {
                        let request = authed(request.clone(), &self.credential);
                        async move { with_deadline(Duration::ZERO, RelayClient::new(channel).hello(request)).await }
                    })
                    .await
                    .map_err(|status| self.error(status))?;
                let reply = reply.into_inner();
                let endpoint =
                    reply.endpoint.ok_or_else(|| RelayError::Unreachable("hello without an endpoint".into()))?;
                (replica, Claimed { token: reply.session_token, endpoint, resumed: reply.resumed })
            }
        };
        // A picked handle is kept, so reconnecting claims the same name.
        claim.handle = Some(claimed.endpoint.handle.clone());
        tracing::info!(
            endpoint = %claimed.endpoint.address,
            resumed = claimed.resumed,
            replica = %self.replicas.url(replica),
            "relay session ready"
        );
        let session = Session { token: claimed.token, endpoint: claimed.endpoint, replica };
        if let Some(watcher) = &self.watcher {
            // The replica that answered first in the list: programs the agent starts begin there.
            watcher.began(&self.replicas.list_from(replica), &session);
        }
        Ok(session)
    }

    /// Makes a call in the endpoint's name. A lost session is repaired and the call tried once
    /// more; a replica that cannot be reached or fails under the call is left for the next, where
    /// the call is tried once more (the server makes retried sends idempotent by their client id).
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
    /// doing anything, or on the next replica when no connection could be made; never after a lost
    /// answer, which might have been acted on.
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
        let mut unsent = self.replicas.count();
        let mut repeat = retry_lost;
        let mut renewed = false;
        loop {
            // Resumed on the replica in use first, should the last attempt have moved the bridge.
            let session = self.session().await?;
            let (index, client) = self.client();
            let status = match with_deadline(wait, call(client, authed(message.clone(), &session.token))).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            if status.code() == Code::Unauthenticated && !renewed {
                renewed = true;
                self.renew(&session).await?;
                continue;
            }
            match self.replicas.failed(index, &status) {
                Failure::NotSent if unsent > 1 => unsent -= 1,
                Failure::Lost if repeat => {
                    tracing::debug!(error = %status.message(), "relay call failed; retrying once");
                    repeat = false;
                }
                Failure::Lost if !retry_lost => return Err(RelayError::Unanswered(status.message().to_owned())),
                _ => return Err(self.error(status)),
            }
        }
    }

    /// A failed call as the tools word it; a refused certificate says so, and names the CA.
    pub fn error(&self, status: Status) -> RelayError {
        match super::replicas::untrusted_certificate(&status, self.ca.as_deref()) {
            Some(why) => RelayError::Untrusted(why),
            None => status.into(),
        }
    }

    /// Ends the session on the server, taking at most `within` whatever the server does: the
    /// endpoint goes offline and its handle is free. A server that does not answer in time frees
    /// the handle by itself once the connection is gone (its keepalive notices a silent one).
    pub async fn goodbye(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        // Taken first: a claim in flight finishes (and writes the file) before the file goes. One
        // the server does not answer in time holds the slot; the process ends before it could.
        let session = match tokio::time::timeout_at(deadline, self.session.lock()).await {
            Ok(mut slot) => slot.take(),
            Err(_) => None,
        };
        if let Some(watcher) = &self.watcher {
            watcher.ended();
        }
        let Some(session) = session else { return };
        let goodbye = self.replicas.call(false, |channel| {
            let request = authed(GoodbyeRequest {}, &session.token);
            async move { RelayClient::new(channel).goodbye(request).await }
        });
        if tokio::time::timeout_at(deadline, goodbye).await.is_err() {
            tracing::info!("the relay did not answer goodbye in time; it frees the handle when the connection goes");
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
