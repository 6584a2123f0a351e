//! `relay.v1.Human`: what an account's people do with their human token.

use relay_proto::v1::human_server::Human;
use relay_proto::v1::*;
use tonic::{Request, Response, Status};

use super::auth::bearer;
use super::convert;
use crate::domain::delivery::Kind;
use crate::domain::redact::{RedactedText, redact};
use crate::domain::{Result, limits};
use crate::push::Hub;
use crate::store::Store;
use crate::store::contacts::Human as Person;
use crate::store::messages::Outgoing;

#[derive(Clone)]
pub struct HumanService {
    store: Store,
    hub: Hub,
}

impl HumanService {
    pub fn new(store: Store, hub: Hub) -> Self {
        Self { store, hub }
    }

    async fn person<T>(&self, request: &Request<T>) -> Result<Person> {
        self.store.authenticate_human(bearer(request)?).await
    }
}

#[tonic::async_trait]
impl Human for HumanService {
    async fn contact_request(&self, request: Request<ContactRequestRequest>) -> Result<Response<ContactView>, Status> {
        let person = self.person(&request).await?;
        let view = self.store.contact_request(&person, request.get_ref().account.trim()).await?;
        tracing::info!(account = %person.account, other = %view.account, state = %view.state, "contact request");
        Ok(Response::new(view.into()))
    }

    async fn contact_accept(&self, request: Request<ContactAcceptRequest>) -> Result<Response<ContactView>, Status> {
        let person = self.person(&request).await?;
        Ok(Response::new(self.store.contact_accept(&person, request.get_ref().account.trim()).await?.into()))
    }

    async fn contact_list(
        &self,
        request: Request<ContactListRequest>,
    ) -> Result<Response<ContactListResponse>, Status> {
        let person = self.person(&request).await?;
        Ok(Response::new(ContactListResponse { contacts: convert::all(self.store.contact_list(&person).await?) }))
    }

    async fn contact_private(&self, request: Request<ContactPrivateRequest>) -> Result<Response<ContactView>, Status> {
        let person = self.person(&request).await?;
        let r = request.get_ref();
        self.store.contact_private(&person, r.account.trim(), r.allow).await?;
        let state = if r.allow { "contact, private data allowed" } else { "contact, no private data" };
        Ok(Response::new(ContactView { account: r.account.trim().to_owned(), state: state.to_owned(), withdrawn: 0 }))
    }

    async fn inbox(&self, request: Request<InboxRequest>) -> Result<Response<InboxResponse>, Status> {
        let person = self.person(&request).await?;
        let me = self.store.human_caller(&person).await?;
        let r = request.get_ref();
        let wait = std::time::Duration::from_secs(u64::from(limits::wait_s(r.wait_s)?));
        let deadline = tokio::time::Instant::now() + wait;
        let mut waiter = self.hub.waiter(me.endpoint_id);
        loop {
            let (messages, remaining) = self.store.inbox(&me, limits::inbox_batch(r.limit), r.ack).await?;
            if !messages.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(Response::new(InboxResponse { messages: convert::all(messages), remaining }));
            }
            tokio::select! {
                () = waiter.changed() => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    async fn send(&self, request: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        let person = self.person(&request).await?;
        let me = self.store.human_caller(&person).await?;
        let r = request.get_ref();
        limits::recipients(r.to.len())?;
        limits::body(&r.body)?;
        limits::thread(&r.thread)?;
        let redacted = redact(&r.body);
        let out = Outgoing {
            to: &r.to,
            body: &redacted.text,
            thread: (!r.thread.is_empty()).then_some(r.thread.as_str()),
            kind: Kind::Message,
            client_id: (!r.client_id.is_empty()).then_some(r.client_id.as_str()),
            private: r.private,
            require_reply: false,
        };
        let sent = self.store.send(&me, out).await?;
        Ok(Response::new(SendResponse {
            id: sent.id,
            thread: sent.thread,
            recipients: convert::all(sent.recipients),
            duplicate: sent.duplicate,
            reply_to: String::new(),
            skipped: convert::all(sent.skipped),
            redactions: redacted.counts.iter().map(|(k, n)| Redaction { kind: (*k).to_owned(), count: *n }).collect(),
            hold: String::new(),
        }))
    }

    async fn reply(&self, request: Request<ReplyRequest>) -> Result<Response<SendResponse>, Status> {
        let person = self.person(&request).await?;
        let me = self.store.human_caller(&person).await?;
        let r = request.get_ref();
        limits::body(&r.body)?;
        let redacted = redact(&r.body);
        let client_id = (!r.client_id.is_empty()).then_some(r.client_id.as_str());
        let sent = self.store.reply(&me, &r.id, &redacted.text, client_id).await?;
        Ok(Response::new(SendResponse {
            id: sent.id,
            thread: sent.thread,
            recipients: convert::all(sent.recipients),
            duplicate: sent.duplicate,
            reply_to: sent.reply_to.unwrap_or_default(),
            skipped: Vec::new(),
            redactions: redacted.counts.iter().map(|(k, n)| Redaction { kind: (*k).to_owned(), count: *n }).collect(),
            hold: String::new(),
        }))
    }

    async fn holds(&self, request: Request<HoldsRequest>) -> Result<Response<HoldsResponse>, Status> {
        let person = self.person(&request).await?;
        Ok(Response::new(HoldsResponse {
            holds: convert::all(self.store.holds(&person, request.get_ref().all).await?),
        }))
    }

    async fn decide_hold(&self, request: Request<DecideHoldRequest>) -> Result<Response<HoldView>, Status> {
        let person = self.person(&request).await?;
        let r = request.get_ref();
        let reason = RedactedText::from_agent(&r.reason);
        let view = self.store.decide_hold(&person, &r.id, r.release, &reason).await?;
        tracing::info!(account = %person.account, hold = %view.id, state = %view.state, "hold decided");
        Ok(Response::new(view.into()))
    }

    async fn hold_policy(&self, request: Request<HoldPolicyRequest>) -> Result<Response<HoldPolicyResponse>, Status> {
        let person = self.person(&request).await?;
        let r = request.get_ref();
        Ok(Response::new(HoldPolicyResponse { classes: self.store.hold_policy(&person, r.class.trim(), r.on).await? }))
    }

    async fn approvals(&self, request: Request<ApprovalsRequest>) -> Result<Response<ApprovalsResponse>, Status> {
        let person = self.person(&request).await?;
        Ok(Response::new(ApprovalsResponse { approvals: convert::all(self.store.approvals(&person).await?) }))
    }

    async fn approve(&self, request: Request<AnswerPermissionRequest>) -> Result<Response<PermissionDecision>, Status> {
        let person = self.person(&request).await?;
        let r = request.get_ref();
        let reason = RedactedText::from_agent(&r.reason);
        Ok(Response::new(self.store.approve(&person, &r.id, &r.decision, &reason).await?.into()))
    }

    async fn contact_drop(&self, request: Request<ContactDropRequest>) -> Result<Response<ContactView>, Status> {
        let person = self.person(&request).await?;
        let view = self.store.contact_drop(&person.account, request.get_ref().account.trim()).await?;
        tracing::info!(account = %person.account, other = %view.account, withdrawn = view.withdrawn, "contact dropped");
        Ok(Response::new(view.into()))
    }
}
