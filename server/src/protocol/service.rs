//! `relay.v1.Relay`: each handler authenticates the caller, checks its input and calls the store.

use std::future::Future;
use std::time::Duration;

use relay_proto::v1::relay_server::Relay;
use relay_proto::v1::*;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::auth::bearer;
use crate::domain::delivery::{Kind, State};
use crate::domain::{Result, limits};
use crate::push::stream::{self, PushStream};
use crate::push::{Hub, hub::Waiter};
use crate::store::Store;
use crate::store::identity::Caller;
use crate::store::messages::{Outgoing, Sent};

#[derive(Clone)]
pub struct RelayService {
    store: Store,
    hub: Hub,
    shutdown: CancellationToken,
}

impl RelayService {
    pub fn new(store: Store, hub: Hub, shutdown: CancellationToken) -> Self {
        Self { store, hub, shutdown }
    }

    async fn caller<T>(&self, request: &Request<T>) -> Result<Caller> {
        self.store.authenticate_session(bearer(request)?).await
    }

    /// Runs `attempt` until `ready` holds for its result or `wait_s` passes, re-running it whenever the
    /// caller's inbox changes. The waiter is taken before the first attempt, so no change is missed.
    async fn wait_for<T, F, Fut>(
        &self,
        caller: &Caller,
        wait_s: u32,
        ready: impl Fn(&T) -> bool,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + Duration::from_secs(u64::from(limits::wait_s(wait_s)?));
        let mut waiter: Waiter = self.hub.waiter(caller.endpoint_id);
        loop {
            let value = attempt().await?;
            if ready(&value) || Instant::now() >= deadline || self.shutdown.is_cancelled() {
                return Ok(value);
            }
            tokio::select! {
                () = waiter.changed() => {}
                () = tokio::time::sleep_until(deadline) => {}
                () = self.shutdown.cancelled() => {}
            }
        }
    }
}

fn sent_response(sent: Sent) -> SendResponse {
    SendResponse {
        id: sent.id,
        thread: sent.thread,
        recipients: sent.recipients,
        duplicate: sent.duplicate,
        reply_to: sent.reply_to.unwrap_or_default(),
    }
}

fn optional(value: &str) -> Option<&str> {
    (!value.is_empty()).then_some(value)
}

fn check_profile(req: &UpdateProfileRequest) -> Result<()> {
    if let Some(status) = &req.status {
        limits::status(status)?;
    }
    for (what, value) in [("note", &req.note), ("now", &req.now)] {
        if let Some(value) = value {
            limits::short_text(what, value, limits::MAX_NOTE_CHARS)?;
        }
    }
    if let Some(title) = &req.title {
        limits::short_text("title", title, limits::MAX_TITLE_CHARS)?;
    }
    Ok(())
}

#[tonic::async_trait]
impl Relay for RelayService {
    type SubscribeStream = PushStream;

    async fn check_machine(
        &self,
        request: Request<CheckMachineRequest>,
    ) -> Result<Response<CheckMachineResponse>, Status> {
        let machine = self.store.authenticate_machine(bearer(&request)?).await?;
        Ok(Response::new(CheckMachineResponse { account: machine.account, machine: machine.machine }))
    }

    async fn hello(&self, request: Request<HelloRequest>) -> Result<Response<HelloResponse>, Status> {
        let machine = self.store.authenticate_machine(bearer(&request)?).await?;
        let req = request.get_ref();
        let harness = limits::harness(&req.harness)?;
        let outcome = self.store.hello(&machine, optional(&req.handle), harness, optional(&req.resume)).await?;
        tracing::info!(endpoint = %outcome.endpoint.address, resumed = outcome.resumed, harness, "hello");
        Ok(Response::new(HelloResponse {
            endpoint: Some(outcome.endpoint),
            session_token: outcome.session_token,
            resumed: outcome.resumed,
            limits: Some(Limits {
                max_body_bytes: limits::MAX_BODY_BYTES as u32,
                max_recipients: limits::MAX_RECIPIENTS as u32,
                max_wait_s: limits::MAX_WAIT_S,
                max_note_chars: limits::MAX_NOTE_CHARS as u32,
            }),
        }))
    }

    async fn goodbye(&self, request: Request<GoodbyeRequest>) -> Result<Response<GoodbyeResponse>, Status> {
        let caller = self.caller(&request).await?;
        self.store.goodbye(&caller).await?;
        tracing::info!(endpoint = %caller.address(), "goodbye");
        Ok(Response::new(GoodbyeResponse {}))
    }

    async fn who_am_i(&self, request: Request<WhoAmIRequest>) -> Result<Response<WhoAmIResponse>, Status> {
        let caller = self.caller(&request).await?;
        let endpoint = self.store.endpoint(caller.endpoint_id).await?;
        let unread = self.store.unread(&caller).await?;
        Ok(Response::new(WhoAmIResponse { endpoint: Some(endpoint), unread }))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let endpoints = self.store.list(&caller, req.all, req.contacts).await?;
        Ok(Response::new(ListResponse { endpoints }))
    }

    async fn send(&self, request: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        limits::recipients(req.to.len())?;
        limits::body(&req.body)?;
        limits::thread(&req.thread)?;
        limits::client_id(&req.client_id)?;
        let kind = Kind::for_send(req.kind())?;
        let out = Outgoing {
            to: &req.to,
            body: &req.body,
            thread: optional(&req.thread),
            kind,
            client_id: optional(&req.client_id),
        };
        let sent = self.store.send(&caller, out).await?;
        tracing::debug!(from = %caller.address(), id = %sent.id, recipients = sent.recipients.len(), duplicate = sent.duplicate, "sent");
        Ok(Response::new(sent_response(sent)))
    }

    async fn reply(&self, request: Request<ReplyRequest>) -> Result<Response<SendResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        limits::body(&req.body)?;
        limits::client_id(&req.client_id)?;
        let sent = self.store.reply(&caller, &req.id, &req.body, optional(&req.client_id)).await?;
        Ok(Response::new(sent_response(sent)))
    }

    async fn inbox(&self, request: Request<InboxRequest>) -> Result<Response<InboxResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let batch = limits::inbox_batch(req.limit);
        let (messages, remaining) = self
            .wait_for(
                &caller,
                req.wait_s,
                |(messages, _): &(Vec<Message>, u64)| !messages.is_empty(),
                || self.store.inbox(&caller, batch, req.ack),
            )
            .await?;
        Ok(Response::new(InboxResponse { messages, remaining }))
    }

    async fn ask_wait(&self, request: Request<AskWaitRequest>) -> Result<Response<AskWaitResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let (id, replies, recipients) = self
            .wait_for(
                &caller,
                req.wait_s,
                |(_, replies, _): &(String, Vec<Message>, Vec<RecipientState>)| !replies.is_empty(),
                || self.store.replies(&caller, &req.id),
            )
            .await?;
        Ok(Response::new(AskWaitResponse { id, replies, recipients }))
    }

    async fn track(&self, request: Request<TrackRequest>) -> Result<Response<TrackResponse>, Status> {
        let caller = self.caller(&request).await?;
        let sent = self.store.track(&caller, &request.get_ref().id).await?;
        Ok(Response::new(TrackResponse { id: sent.id, thread: sent.thread, recipients: sent.recipients }))
    }

    async fn update_profile(&self, request: Request<UpdateProfileRequest>) -> Result<Response<Endpoint>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        check_profile(req)?;
        let endpoint = self
            .store
            .update_profile(
                &caller,
                req.status.as_deref(),
                req.note.as_deref(),
                req.now.as_deref(),
                req.title.as_deref(),
            )
            .await?;
        Ok(Response::new(endpoint))
    }

    async fn subscribe(&self, request: Request<SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let caller = self.caller(&request).await?;
        let after = request.get_ref().after_seq;
        let stream = stream::open(self.store.clone(), self.hub.clone(), caller, after, self.shutdown.clone());
        Ok(Response::new(stream))
    }

    async fn confirm(&self, request: Request<ConfirmRequest>) -> Result<Response<ConfirmResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let state = State::confirmable(req.state())?;
        let updated = self.store.confirm(&caller, &req.seqs, state).await?;
        Ok(Response::new(ConfirmResponse { updated: updated as u32 }))
    }
}
