//! `relay.v1.Relay`: each handler takes the caller the auth layer established, checks its input and
//! calls the application.

use relay_proto::v1::relay_server::Relay;
use relay_proto::v1::*;
use tonic::{Request, Response, Status};

use super::auth::{self, bearer};
use super::convert::{self, IntoWire, selector_list as selectors};
use super::credential::Credential;
use super::credential::Issued;
use super::status::to_status;
use crate::app::App;
use crate::app::approvals::ApprovalsService;
use crate::app::board::BoardService;
use crate::app::board::{Edit, Post};
use crate::app::claims::{ClaimsService, repo_key};
use crate::app::identity::IdentityService;
use crate::app::identity::{Claim, ProfileChange};
use crate::app::messaging::MessagingService;
use crate::app::messaging::NewMessage;
use crate::app::scope::RuleSet;
use crate::app::scope::ScopeService;
use crate::app::trust::TrustService;
use crate::domain::redact::Counts;
use crate::domain::scope::GroupView;
use crate::domain::{Error, Result, delivery, limits};

#[derive(Clone)]
pub struct RelayService {
    identity: IdentityService,
    messaging: MessagingService,
    scope: ScopeService,
    trust: TrustService,
    board: BoardService,
    approvals: ApprovalsService,
    claims: ClaimsService,
}

impl RelayService {
    pub fn new(app: &App) -> Self {
        Self {
            identity: app.identity.clone(),
            messaging: app.messaging.clone(),
            scope: app.scope.clone(),
            trust: app.trust.clone(),
            board: app.board.clone(),
            approvals: app.approvals.clone(),
            claims: app.claims.clone(),
        }
    }
}

/// Refuses a bridge outside this server's release window, naming both versions and the mend.
fn within_window(client_version: &str) -> Result<(), Status> {
    relay_proto::release::check(client_version, relay_proto::release::VERSION)
        .map_err(|mismatch| Status::failed_precondition(mismatch.to_string()))
}

#[tonic::async_trait]
impl Relay for RelayService {
    type SubscribeStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<Push, Status>> + Send>>;
    type AnnounceStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<AnnounceEvent, Status>> + Send>>;

    async fn check_machine(
        &self,
        request: Request<CheckMachineRequest>,
    ) -> Result<Response<CheckMachineResponse>, Status> {
        let machine = auth::machine(&request)?;
        within_window(&request.get_ref().client_version)?;
        Ok(Response::new(CheckMachineResponse {
            account: machine.account,
            machine: machine.machine,
            server_version: relay_proto::release::VERSION.to_owned(),
            server_time_ms: chrono::Utc::now().timestamp_millis(),
        }))
    }

    async fn hello(&self, request: Request<HelloRequest>) -> Result<Response<HelloResponse>, Status> {
        let req = request.get_ref();
        let claim =
            Claim { handle: &req.handle, harness: &req.harness, resume: &req.resume, spawn_grant: &req.spawn_grant };
        // Authenticated first: the server's release is told to its own callers only.
        let credential = auth::hello_credential(&request)?;
        within_window(&req.client_version)?;
        let outcome = match credential {
            Credential::Card(agent) => self.identity.hello_card(&agent, claim).await.map_err(to_status)?,
            _ => self.identity.hello(&auth::machine(&request)?, claim).await.map_err(to_status)?,
        };
        let issued = Issued::bearer(&outcome.session_token);
        let mut response = Response::new(HelloResponse {
            endpoint: Some(outcome.endpoint.into_wire()),
            session_token: outcome.session_token,
            resumed: outcome.resumed,
            limits: Some(Limits {
                max_body_bytes: limits::MAX_BODY_BYTES as u32,
                max_recipients: limits::MAX_RECIPIENTS as u32,
                max_wait_s: limits::MAX_WAIT_S,
                max_note_chars: limits::MAX_NOTE_CHARS as u32,
            }),
            server_version: relay_proto::release::VERSION.to_owned(),
        });
        if let Some(issued) = issued {
            response.extensions_mut().insert(issued);
        }
        Ok(response)
    }

    async fn goodbye(&self, request: Request<GoodbyeRequest>) -> Result<Response<GoodbyeResponse>, Status> {
        let caller = auth::caller(&request)?;
        self.identity.goodbye(&caller).await.map_err(to_status)?;
        Ok(Response::new(GoodbyeResponse {}))
    }

    async fn who_am_i(&self, request: Request<WhoAmIRequest>) -> Result<Response<WhoAmIResponse>, Status> {
        let caller = auth::caller(&request)?;
        let me = self.identity.whoami(&caller).await.map_err(to_status)?;
        Ok(Response::new(WhoAmIResponse {
            endpoint: Some(me.endpoint.into_wire()),
            unread: me.unread,
            board: me.board,
        }))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let endpoints = self.identity.list(&caller, req.all, req.contacts).await.map_err(to_status)?;
        Ok(Response::new(ListResponse { endpoints: convert::all(endpoints) }))
    }

    async fn send(&self, request: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let send = NewMessage {
            to: &req.to,
            body: &req.body,
            thread: &req.thread,
            kind: convert::kind_from_wire(req.kind).map_err(to_status)?,
            client_id: &req.client_id,
            private: req.private,
            require_reply: req.require_reply,
            attach: &req.attach,
        };
        Ok(Response::new(self.messaging.send(&caller, send).await.map_err(to_status)?.into_wire()))
    }

    async fn upload(&self, request: Request<UploadRequest>) -> Result<Response<Uploaded>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.into_inner();
        let up = self.messaging.upload(&caller, &req.name, req.size, &req.sha256, req.data).await.map_err(to_status)?;
        Ok(Response::new(Uploaded {
            upload: up.id,
            attachment: Some(convert::WireFrom::wire_from(up.attached)),
            redactions: convert::redactions(&up.redacted),
        }))
    }

    async fn follow(&self, request: Request<FollowRequest>) -> Result<Response<FollowResponse>, Status> {
        let caller = auth::caller(&request)?;
        let followed = self.messaging.follow(&caller, &request.get_ref().topic).await.map_err(to_status)?;
        Ok(Response::new(FollowResponse {
            topic: followed.topic,
            backlog: followed.backlog,
            already: followed.already,
        }))
    }

    async fn unfollow(&self, request: Request<UnfollowRequest>) -> Result<Response<UnfollowResponse>, Status> {
        let caller = auth::caller(&request)?;
        let (topic, followed) = self.messaging.unfollow(&caller, &request.get_ref().topic).await.map_err(to_status)?;
        Ok(Response::new(UnfollowResponse { topic, followed }))
    }

    async fn publish(&self, request: Request<PublishRequest>) -> Result<Response<PublishResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let post = crate::app::messaging::NewPost {
            topic: &req.topic,
            body: &req.body,
            thread: &req.thread,
            client_id: &req.client_id,
        };
        let p = self.messaging.publish(&caller, post).await.map_err(to_status)?;
        Ok(Response::new(PublishResponse {
            id: p.id.into(),
            topic: p.topic,
            seq: p.seq.max(0) as u64,
            thread: p.thread,
            followers: p.followers,
            redactions: convert::redactions(&p.redacted),
            duplicate: p.duplicate,
        }))
    }

    async fn fetch(&self, request: Request<FetchRequest>) -> Result<Response<Fetched>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let (id, attached, data) = self.messaging.fetch(&caller, &req.message, &req.name).await.map_err(to_status)?;
        Ok(Response::new(Fetched {
            message: id.into(),
            attachment: Some(convert::WireFrom::wire_from(attached)),
            data,
        }))
    }

    async fn reply(&self, request: Request<ReplyRequest>) -> Result<Response<SendResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        Ok(Response::new(
            self.messaging.reply(&caller, &req.id, &req.body, &req.client_id).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn inbox(&self, request: Request<InboxRequest>) -> Result<Response<InboxResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let (messages, remaining) =
            self.messaging.inbox(&caller, req.wait_s, req.limit, req.ack).await.map_err(to_status)?;
        Ok(Response::new(InboxResponse { messages: convert::all(messages), remaining }))
    }

    async fn ask_wait(&self, request: Request<AskWaitRequest>) -> Result<Response<AskWaitResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let (id, replies, recipients) =
            self.messaging.ask_wait(&caller, &req.id, req.wait_s).await.map_err(to_status)?;
        Ok(Response::new(AskWaitResponse {
            id: id.into_string(),
            replies: convert::all(replies),
            recipients: convert::all(recipients),
        }))
    }

    async fn track(&self, request: Request<TrackRequest>) -> Result<Response<TrackResponse>, Status> {
        let caller = auth::caller(&request)?;
        let sent = self.messaging.track(&caller, &request.get_ref().id).await.map_err(to_status)?;
        Ok(Response::new(TrackResponse {
            id: sent.id.into_string(),
            thread: sent.thread,
            recipients: convert::all(sent.recipients),
        }))
    }

    async fn search(&self, request: Request<SearchRequest>) -> Result<Response<SearchResponse>, Status> {
        let caller = auth::caller(&request)?;
        let search = convert::search(request.get_ref()).map_err(to_status)?;
        let found = self.messaging.search(&caller, &search).await.map_err(to_status)?;
        Ok(Response::new(SearchResponse { found: convert::all(found) }))
    }

    async fn update_profile(&self, request: Request<UpdateProfileRequest>) -> Result<Response<Endpoint>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let change = ProfileChange {
            status: req.status.as_deref(),
            note: req.note.as_deref(),
            now: req.now.as_deref(),
            title: req.title.as_deref(),
        };
        Ok(Response::new(self.identity.update_profile(&caller, change).await.map_err(to_status)?.into_wire()))
    }

    async fn subscribe(&self, request: Request<SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let caller = auth::caller(&request)?;
        let stream = self.messaging.subscribe(caller, delivery::seq(request.get_ref().after_seq).map_err(to_status)?);
        let wire = tokio_stream::StreamExt::map(stream, |item| item.map(convert::push).map_err(to_status));
        Ok(Response::new(Box::pin(wire)))
    }

    async fn announce(&self, request: Request<AnnounceRequest>) -> Result<Response<Self::AnnounceStream>, Status> {
        let caller = auth::caller(&request)?;
        let stream = self.messaging.announce(caller, bearer(&request).map_err(to_status)?, request.get_ref().wait);
        let wire = tokio_stream::StreamExt::map(stream, |item| item.map(convert::announce_event).map_err(to_status));
        Ok(Response::new(Box::pin(wire)))
    }

    async fn show_rules(&self, request: Request<ShowRulesRequest>) -> Result<Response<RulesView>, Status> {
        let caller = auth::caller(&request)?;
        Ok(Response::new(
            self.scope.show_rules(&caller, &request.get_ref().endpoint).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn set_rules(&self, request: Request<SetRulesRequest>) -> Result<Response<RulesView>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let set = RuleSet {
            scope: &req.scope,
            rules_in: selectors(&req.rules_in),
            rules_out: selectors(&req.rules_out),
            allow: &req.allow,
        };
        Ok(Response::new(self.scope.set_rules(&caller, &req.endpoint, set).await.map_err(to_status)?.into_wire()))
    }

    async fn widen_rules(&self, request: Request<WidenRulesRequest>) -> Result<Response<RulesView>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let (rules_in, rules_out) = (selectors(&req.rules_in), selectors(&req.rules_out));
        Ok(Response::new(
            self.scope.widen_rules(&caller, &req.endpoint, rules_in, rules_out).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn lift_cap(&self, request: Request<LiftCapRequest>) -> Result<Response<RulesView>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        Ok(Response::new(self.scope.lift_cap(&caller, &req.endpoint, &req.cap).await.map_err(to_status)?.into_wire()))
    }

    async fn why(&self, request: Request<WhyRequest>) -> Result<Response<WhyResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let (from, to, verdict) = self.scope.why(&caller, &req.from, &req.to).await.map_err(to_status)?;
        Ok(Response::new(WhyResponse { from, to, allowed: verdict.allowed, reasons: verdict.reasons }))
    }

    async fn peers(&self, request: Request<PeersRequest>) -> Result<Response<PeersResponse>, Status> {
        let caller = auth::caller(&request)?;
        let peers = self.scope.peers(&caller, request.get_ref().all).await.map_err(to_status)?;
        Ok(Response::new(PeersResponse { peers: convert::all(peers) }))
    }

    async fn group(&self, request: Request<GroupRequest>) -> Result<Response<GroupResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let (name, rules_in, rules_out) = (&req.name, selectors(&req.rules_in), selectors(&req.rules_out));
        let one = |g: GroupView| GroupResponse { groups: vec![g.into_wire()], note: String::new() };
        let response = match convert::known::<GroupAction>("action", req.action).map_err(to_status)? {
            GroupAction::Create => {
                one(self.scope.group_create(&caller, name, rules_in, rules_out).await.map_err(to_status)?)
            }
            action @ (GroupAction::Add | GroupAction::Remove) => one(self
                .scope
                .group_member(&caller, name, &req.endpoint, action == GroupAction::Add)
                .await
                .map_err(to_status)?),
            GroupAction::Rules => {
                one(self.scope.group_rules(&caller, name, rules_in, rules_out).await.map_err(to_status)?)
            }
            GroupAction::Show => one(self.scope.group_show(&caller, name).await.map_err(to_status)?),
            GroupAction::Ls => GroupResponse {
                groups: convert::all(self.scope.group_list(&caller).await.map_err(to_status)?),
                note: String::new(),
            },
            GroupAction::Drop => {
                let name = self.scope.group_drop(&caller, name).await.map_err(to_status)?;
                GroupResponse { groups: Vec::new(), note: format!("group {name} dropped") }
            }
            GroupAction::Unspecified => {
                return Err(to_status(Error::invalid("action must be create, add, remove, rules, ls, show or drop")));
            }
        };
        Ok(Response::new(response))
    }

    async fn spawn(&self, request: Request<SpawnRequest>) -> Result<Response<SpawnResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let (endpoint, grant) = self.scope.spawn(&caller, &req.harness, &req.scope).await.map_err(to_status)?;
        Ok(Response::new(SpawnResponse { endpoint: Some(endpoint.into_wire()), grant }))
    }

    async fn spawn_result(&self, request: Request<SpawnResultRequest>) -> Result<Response<SendResponse>, Status> {
        let grant = bearer(&request).map_err(to_status)?.to_owned();
        let req = request.get_ref();
        let sent = self.scope.spawn_result(&grant, req.exit_code, &req.output).await.map_err(to_status)?;
        Ok(Response::new(convert::sent(sent, &Counts::new())))
    }

    async fn post_job(&self, request: Request<PostJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.get_ref();
        let post = Post {
            title: &r.title,
            detail: &r.detail,
            repo: &r.repo,
            schedule: &r.schedule,
            time_zone: &r.time_zone,
            agent: &r.agent,
            requires_pr: r.requires_pr,
            cwd: &r.cwd,
            paths: &r.paths,
        };
        Ok(Response::new(self.board.post_job(&caller, post).await.map_err(to_status)?.into_wire()))
    }

    async fn list_jobs(&self, request: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.get_ref();
        let (jobs, archived) = self.board.list_jobs(&caller, &r.state, &r.repo, &r.cwd).await.map_err(to_status)?;
        Ok(Response::new(ListJobsResponse { jobs: convert::all(jobs), archived }))
    }

    async fn read_job(&self, request: Request<ReadJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = auth::caller(&request)?;
        Ok(Response::new(self.board.read_job(&caller, &request.get_ref().id).await.map_err(to_status)?.into_wire()))
    }

    async fn edit_job(&self, request: Request<EditJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.get_ref();
        let edit = Edit {
            title: r.title.as_deref(),
            detail: r.detail.as_deref(),
            repo: r.repo.as_deref(),
            schedule: r.schedule.as_deref(),
            time_zone: &r.time_zone,
            requires_pr: r.requires_pr,
            cwd: &r.cwd,
        };
        Ok(Response::new(self.board.edit_job(&caller, &r.id, edit).await.map_err(to_status)?.into_wire()))
    }

    async fn finish_job(&self, request: Request<FinishJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.board.finish_job(&caller, &r.job_token, &r.pr_url, &r.summary).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn close_job(&self, request: Request<CloseJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.get_ref();
        Ok(Response::new(self.board.close_job(&caller, &r.id, r.accept, &r.note).await.map_err(to_status)?.into_wire()))
    }

    async fn add_repo(&self, request: Request<AddRepoRequest>) -> Result<Response<RepoView>, Status> {
        let caller = auth::caller(&request)?;
        Ok(Response::new(self.board.add_repo(&caller, &request.get_ref().path).await.map_err(to_status)?.into_wire()))
    }

    async fn set_peek(&self, request: Request<SetPeekRequest>) -> Result<Response<SetPeekResponse>, Status> {
        let caller = auth::caller(&request)?;
        let on = request.get_ref().on;
        self.trust.set_peek(&caller, on).await.map_err(to_status)?;
        Ok(Response::new(SetPeekResponse { on }))
    }

    async fn put_peek_turns(
        &self,
        request: Request<PutPeekTurnsRequest>,
    ) -> Result<Response<PutPeekTurnsResponse>, Status> {
        let caller = auth::caller(&request)?;
        let request = request.into_inner();
        let kept = self
            .trust
            .put_peek_turns(&caller, request.turns.into_iter().map(convert::peek_turn).collect(), request.append)
            .await
            .map_err(to_status)?;
        Ok(Response::new(PutPeekTurnsResponse { kept }))
    }

    async fn peek(&self, request: Request<PeekRequest>) -> Result<Response<PeekView>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.get_ref();
        Ok(Response::new(self.trust.peek(&caller, &r.endpoint, r.turns).await.map_err(to_status)?.into_wire()))
    }

    async fn peekers(&self, request: Request<PeekersRequest>) -> Result<Response<PeekersResponse>, Status> {
        let caller = auth::caller(&request)?;
        Ok(Response::new(PeekersResponse {
            peekers: convert::all(self.trust.peekers(&caller).await.map_err(to_status)?),
        }))
    }

    async fn pending_replies(
        &self,
        request: Request<PendingRepliesRequest>,
    ) -> Result<Response<PendingRepliesResponse>, Status> {
        let caller = auth::caller(&request)?;
        Ok(Response::new(PendingRepliesResponse {
            requests: convert::all(self.trust.pending_replies(&caller).await.map_err(to_status)?),
        }))
    }

    async fn request_permission(
        &self,
        request: Request<PermissionRequest>,
    ) -> Result<Response<PermissionDecision>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.approvals
                .request_permission(&caller, &r.job_token, &r.tool, &r.input)
                .await
                .map_err(to_status)?
                .into_wire(),
        ))
    }

    async fn answer_permission(
        &self,
        request: Request<AnswerPermissionRequest>,
    ) -> Result<Response<PermissionDecision>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.approvals
                .answer_permission(&caller, &r.id, &r.decision, &r.reason)
                .await
                .map_err(to_status)?
                .into_wire(),
        ))
    }

    async fn claim_paths(&self, request: Request<ClaimPathsRequest>) -> Result<Response<ClaimPathsResponse>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.into_inner();
        let repo = convert::required_repo(r.repo)?;
        let claimed =
            self.claims.claim(&caller, &repo, &r.paths, r.exclusive, r.ttl_s, &r.reason).await.map_err(to_status)?;
        Ok(Response::new(convert::claimed(claimed)))
    }

    async fn release_paths(
        &self,
        request: Request<ReleasePathsRequest>,
    ) -> Result<Response<ReleasePathsResponse>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.into_inner();
        let repo = convert::repo_ref(r.repo);
        let claim = crate::app::optional(r.claim.trim());
        let released = self.claims.release(&caller, claim, repo.as_ref(), &r.paths).await.map_err(to_status)?;
        Ok(Response::new(ReleasePathsResponse { released: convert::all(released) }))
    }

    async fn list_claims(&self, request: Request<ListClaimsRequest>) -> Result<Response<ListClaimsResponse>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.into_inner();
        let repo = convert::repo_ref(r.repo);
        let claims = self.claims.list(&caller, repo.as_ref(), r.mine).await.map_err(to_status)?;
        Ok(Response::new(ListClaimsResponse { claims: convert::all(claims) }))
    }

    async fn claims_touching(
        &self,
        request: Request<ClaimsTouchingRequest>,
    ) -> Result<Response<ListClaimsResponse>, Status> {
        let caller = auth::caller(&request)?;
        let r = request.into_inner();
        let repo = convert::required_repo(r.repo)?;
        let key = repo_key(&caller.account, &caller.machine, &repo).map_err(to_status)?;
        let claims = self
            .claims
            .touching(caller.account_id, Some(caller.endpoint_id), &key, &r.files)
            .await
            .map_err(to_status)?;
        Ok(Response::new(ListClaimsResponse { claims: convert::all(claims) }))
    }

    async fn confirm(&self, request: Request<ConfirmRequest>) -> Result<Response<ConfirmResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.get_ref();
        let state = convert::known::<DeliveryState>("state", req.state).map_err(to_status)?;
        let updated =
            self.messaging.confirm(&caller, &req.seqs, convert::state_from_wire(state)).await.map_err(to_status)?;
        Ok(Response::new(ConfirmResponse { updated: updated as u32 }))
    }
}
