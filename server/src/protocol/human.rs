//! `relay.v1.Human`: what an account's people do with their human token.

use relay_proto::v1::human_server::Human;
use relay_proto::v1::*;
use tonic::{Request, Response, Status};

use super::auth;
use super::convert::{self, IntoWire};
use super::status::to_status;

use crate::app::App;
use crate::app::approvals::ApprovalsService;
use crate::app::trust::TrustService;
use crate::domain::Result;

#[derive(Clone)]
pub struct HumanService {
    trust: TrustService,
    approvals: ApprovalsService,
}

impl HumanService {
    pub fn new(app: &App) -> Self {
        Self { trust: app.trust.clone(), approvals: app.approvals.clone() }
    }
}

#[tonic::async_trait]
impl Human for HumanService {
    async fn contact_request(&self, request: Request<ContactRequestRequest>) -> Result<Response<ContactView>, Status> {
        let person = auth::person(&request)?;
        Ok(Response::new(
            self.trust.contact_request(&person, &request.get_ref().account).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn contact_accept(&self, request: Request<ContactAcceptRequest>) -> Result<Response<ContactView>, Status> {
        let person = auth::person(&request)?;
        Ok(Response::new(
            self.trust.contact_accept(&person, &request.get_ref().account).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn contact_list(
        &self,
        request: Request<ContactListRequest>,
    ) -> Result<Response<ContactListResponse>, Status> {
        let person = auth::person(&request)?;
        Ok(Response::new(ContactListResponse {
            contacts: convert::all(self.trust.contact_list(&person).await.map_err(to_status)?),
        }))
    }

    async fn contact_private(&self, request: Request<ContactPrivateRequest>) -> Result<Response<ContactView>, Status> {
        let person = auth::person(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.trust.contact_private(&person, &r.account, r.allow).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn inbox(&self, request: Request<InboxRequest>) -> Result<Response<InboxResponse>, Status> {
        let person = auth::person(&request)?;
        let r = request.get_ref();
        let (messages, remaining) =
            self.trust.human_inbox(&person, r.wait_s, r.limit, r.ack).await.map_err(to_status)?;
        Ok(Response::new(InboxResponse { messages: convert::all(messages), remaining }))
    }

    async fn send(&self, request: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        let person = auth::person(&request)?;
        let r = request.get_ref();
        let sent = self
            .trust
            .human_send(&person, &r.to, &r.body, &r.thread, &r.client_id, r.private)
            .await
            .map_err(to_status)?;
        Ok(Response::new(sent.into_wire()))
    }

    async fn reply(&self, request: Request<ReplyRequest>) -> Result<Response<SendResponse>, Status> {
        let person = auth::person(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.trust.human_reply(&person, &r.id, &r.body, &r.client_id).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn holds(&self, request: Request<HoldsRequest>) -> Result<Response<HoldsResponse>, Status> {
        let person = auth::person(&request)?;
        Ok(Response::new(HoldsResponse {
            holds: convert::all(self.trust.holds(&person, request.get_ref().all).await.map_err(to_status)?),
        }))
    }

    async fn decide_hold(&self, request: Request<DecideHoldRequest>) -> Result<Response<HoldView>, Status> {
        let person = auth::person(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.trust.decide_hold(&person, &r.id, r.release, &r.reason).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn hold_policy(&self, request: Request<HoldPolicyRequest>) -> Result<Response<HoldPolicyResponse>, Status> {
        let person = auth::person(&request)?;
        let r = request.get_ref();
        Ok(Response::new(HoldPolicyResponse {
            classes: self.trust.hold_policy(&person, &r.class, r.on).await.map_err(to_status)?,
        }))
    }

    async fn approvals(&self, request: Request<ApprovalsRequest>) -> Result<Response<ApprovalsResponse>, Status> {
        let person = auth::person(&request)?;
        Ok(Response::new(ApprovalsResponse {
            approvals: convert::all(self.approvals.approvals(&person).await.map_err(to_status)?),
        }))
    }

    async fn approve(&self, request: Request<AnswerPermissionRequest>) -> Result<Response<PermissionDecision>, Status> {
        let person = auth::person(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.approvals.approve(&person, &r.id, &r.decision, &r.reason).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn contact_drop(&self, request: Request<ContactDropRequest>) -> Result<Response<ContactView>, Status> {
        let person = auth::person(&request)?;
        Ok(Response::new(
            self.trust.contact_drop(&person, &request.get_ref().account).await.map_err(to_status)?.into_wire(),
        ))
    }
}
