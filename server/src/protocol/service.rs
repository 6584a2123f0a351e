//! `relay.v1.Relay`: each handler authenticates the caller, checks its input and calls the store.

use std::time::Duration;

use relay_proto::v1::relay_server::Relay;
use relay_proto::v1::*;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::auth::bearer;
use super::convert;
use crate::app::App;
use crate::app::identity::{Claim, ProfileChange};
use crate::app::messaging::NewMessage;
use crate::app::optional;
use crate::domain::redact::{Counts, RedactedText};
use crate::domain::schedule::Schedule;
use crate::domain::scope::GroupView;
use crate::domain::scope::{self, Selector};
use crate::domain::{Error, Result, limits};
use crate::push::Hub;
use crate::store::Store;
use crate::store::board::{JobEdit, NewJob};
use crate::store::identity::Caller;
use crate::store::scope::RuleChange;
use crate::store::trust::KeptTurn;

#[derive(Clone)]
pub struct RelayService {
    app: App,
}

impl RelayService {
    pub fn new(store: Store, hub: Hub, shutdown: CancellationToken) -> Self {
        Self { app: App::new(store, hub, shutdown) }
    }

    async fn caller<T>(&self, request: &Request<T>) -> Result<Caller> {
        self.app.caller(bearer(request)?).await
    }
}

/// A selector list from the wire: absent stays absent.
fn selectors(list: Option<&Selectors>) -> Result<Option<Vec<Selector>>> {
    list.map(|l| Selector::parse_list(&l.selectors)).transpose()
}

/// What `SetRules` changes in each direction: a preset for both, then explicit lists, then `allow`
/// added to whatever is not open.
fn rule_changes(req: &SetRulesRequest) -> Result<(RuleChange, RuleChange)> {
    let base = match req.scope.trim() {
        "" => None,
        name => Some(scope::preset(name)?),
    };
    let rules_in = selectors(req.rules_in.as_ref())?.map(Some).or_else(|| base.clone());
    let rules_out = selectors(req.rules_out.as_ref())?.map(Some).or(base);
    if rules_in.is_none() && rules_out.is_none() {
        return Err(Error::invalid(if req.allow.is_empty() {
            "set takes scope, in or out"
        } else {
            "allow goes with scope, in or out"
        }));
    }
    let allow = Selector::parse_list(&req.allow)?;
    let add = |change: RuleChange| {
        change.map(|rule| {
            rule.map(|mut list| {
                list.extend(allow.iter().filter(|a| !list.contains(a)).cloned().collect::<Vec<_>>());
                list
            })
        })
    };
    Ok((add(rules_in), add(rules_out)))
}

/// A schedule as a card carries it: absent when the expression is empty; read in `zone` (UTC when empty).
fn schedule(expr: &str, zone: &str) -> Result<Option<Schedule>> {
    if expr.trim().is_empty() {
        return Ok(None);
    }
    Schedule::parse(expr, if zone.trim().is_empty() { "UTC" } else { zone.trim() }).map(Some)
}

/// How long the operator, then the human, has to answer a permission request
/// (`RELAY_APPROVAL_WAIT_S`, default 5 minutes each).
fn approval_wait() -> Duration {
    let secs = std::env::var("RELAY_APPROVAL_WAIT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(300u64);
    Duration::from_secs(secs.clamp(1, 3600))
}

/// Longest text kept of one peeked turn.
const PEEK_TEXT_BYTES: usize = 4096;

#[tonic::async_trait]
impl Relay for RelayService {
    type SubscribeStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<Push, Status>> + Send>>;

    async fn check_machine(
        &self,
        request: Request<CheckMachineRequest>,
    ) -> Result<Response<CheckMachineResponse>, Status> {
        let machine = self.app.machine(bearer(&request)?).await?;
        Ok(Response::new(CheckMachineResponse { account: machine.account, machine: machine.machine }))
    }

    async fn hello(&self, request: Request<HelloRequest>) -> Result<Response<HelloResponse>, Status> {
        let machine = self.app.machine(bearer(&request)?).await?;
        let req = request.get_ref();
        let claim =
            Claim { handle: &req.handle, harness: &req.harness, resume: &req.resume, spawn_grant: &req.spawn_grant };
        let outcome = self.app.hello(&machine, claim).await?;
        Ok(Response::new(HelloResponse {
            endpoint: Some(outcome.endpoint.into()),
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
        self.app.goodbye(&caller).await?;
        Ok(Response::new(GoodbyeResponse {}))
    }

    async fn who_am_i(&self, request: Request<WhoAmIRequest>) -> Result<Response<WhoAmIResponse>, Status> {
        let caller = self.caller(&request).await?;
        let (endpoint, unread) = self.app.whoami(&caller).await?;
        Ok(Response::new(WhoAmIResponse { endpoint: Some(endpoint.into()), unread }))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let endpoints = self.app.list(&caller, req.all, req.contacts).await?;
        Ok(Response::new(ListResponse { endpoints: convert::all(endpoints) }))
    }

    async fn send(&self, request: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let send = NewMessage {
            to: &req.to,
            body: &req.body,
            thread: &req.thread,
            kind: convert::kind_from_wire(req.kind()),
            client_id: &req.client_id,
            private: req.private,
            require_reply: req.require_reply,
        };
        Ok(Response::new(self.app.send(&caller, send).await?.into()))
    }

    async fn reply(&self, request: Request<ReplyRequest>) -> Result<Response<SendResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        Ok(Response::new(self.app.reply(&caller, &req.id, &req.body, &req.client_id).await?.into()))
    }

    async fn inbox(&self, request: Request<InboxRequest>) -> Result<Response<InboxResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let (messages, remaining) = self.app.inbox(&caller, req.wait_s, req.limit, req.ack).await?;
        Ok(Response::new(InboxResponse { messages: convert::all(messages), remaining }))
    }

    async fn ask_wait(&self, request: Request<AskWaitRequest>) -> Result<Response<AskWaitResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let (id, replies, recipients) = self.app.ask_wait(&caller, &req.id, req.wait_s).await?;
        Ok(Response::new(AskWaitResponse { id, replies: convert::all(replies), recipients: convert::all(recipients) }))
    }

    async fn track(&self, request: Request<TrackRequest>) -> Result<Response<TrackResponse>, Status> {
        let caller = self.caller(&request).await?;
        let sent = self.app.track(&caller, &request.get_ref().id).await?;
        Ok(Response::new(TrackResponse { id: sent.id, thread: sent.thread, recipients: convert::all(sent.recipients) }))
    }

    async fn update_profile(&self, request: Request<UpdateProfileRequest>) -> Result<Response<Endpoint>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let change = ProfileChange {
            status: req.status.as_deref(),
            note: req.note.as_deref(),
            now: req.now.as_deref(),
            title: req.title.as_deref(),
        };
        Ok(Response::new(self.app.update_profile(&caller, change).await?.into()))
    }

    async fn subscribe(&self, request: Request<SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let caller = self.caller(&request).await?;
        let stream = self.app.subscribe(caller, request.get_ref().after_seq);
        let wire = tokio_stream::StreamExt::map(stream, |item| item.map(convert::push).map_err(Status::from));
        Ok(Response::new(Box::pin(wire)))
    }

    async fn show_rules(&self, request: Request<ShowRulesRequest>) -> Result<Response<RulesView>, Status> {
        let caller = self.caller(&request).await?;
        Ok(Response::new(self.app.store().show_rules(&caller, &request.get_ref().endpoint).await?.into()))
    }

    async fn set_rules(&self, request: Request<SetRulesRequest>) -> Result<Response<RulesView>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let (rules_in, rules_out) = rule_changes(req)?;
        Ok(Response::new(self.app.store().set_rules(&caller, &req.endpoint, rules_in, rules_out).await?.into()))
    }

    async fn widen_rules(&self, request: Request<WidenRulesRequest>) -> Result<Response<RulesView>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let (rules_in, rules_out) = (selectors(req.rules_in.as_ref())?, selectors(req.rules_out.as_ref())?);
        if rules_in.is_none() && rules_out.is_none() {
            return Err(Error::invalid("widen takes in or out").into());
        }
        Ok(Response::new(self.app.store().widen_rules(&caller, &req.endpoint, rules_in, rules_out).await?.into()))
    }

    async fn lift_cap(&self, request: Request<LiftCapRequest>) -> Result<Response<RulesView>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        Ok(Response::new(self.app.store().lift_cap(&caller, &req.endpoint, &req.cap).await?.into()))
    }

    async fn why(&self, request: Request<WhyRequest>) -> Result<Response<WhyResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        if req.to.trim().is_empty() {
            return Err(Error::invalid("why takes to (and optionally from)").into());
        }
        let (from, to, verdict) = self.app.store().why(&caller, &req.from, &req.to).await?;
        Ok(Response::new(WhyResponse { from, to, allowed: verdict.allowed, reasons: verdict.reasons }))
    }

    async fn peers(&self, request: Request<PeersRequest>) -> Result<Response<PeersResponse>, Status> {
        let caller = self.caller(&request).await?;
        let peers = self.app.store().peers(&caller, request.get_ref().all).await?;
        Ok(Response::new(PeersResponse { peers: convert::all(peers) }))
    }

    async fn group(&self, request: Request<GroupRequest>) -> Result<Response<GroupResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let name = req.name.trim();
        let needs_name = || {
            if name.is_empty() { Err(Error::invalid("this group action takes name")) } else { Ok(()) }
        };
        let change = |list: Option<&Selectors>| -> Result<RuleChange> { Ok(selectors(list)?.map(Some)) };
        let one = |g: GroupView| GroupResponse { groups: vec![g.into()], note: String::new() };
        let response = match req.action() {
            GroupAction::Create => {
                needs_name()?;
                let (i, o) = (change(req.rules_in.as_ref())?, change(req.rules_out.as_ref())?);
                one(self.app.store().group_create(&caller, name, i, o).await?)
            }
            GroupAction::Add | GroupAction::Remove => {
                needs_name()?;
                let add = req.action() == GroupAction::Add;
                one(self.app.store().group_member(&caller, name, &req.endpoint, add).await?)
            }
            GroupAction::Rules => {
                needs_name()?;
                let (i, o) = (change(req.rules_in.as_ref())?, change(req.rules_out.as_ref())?);
                if i.is_none() && o.is_none() {
                    return Err(Error::invalid("rules takes in or out").into());
                }
                one(self.app.store().group_rules(&caller, name, i, o).await?)
            }
            GroupAction::Show => {
                needs_name()?;
                one(self.app.store().group_show(&caller, name).await?)
            }
            GroupAction::Ls => {
                GroupResponse { groups: convert::all(self.app.store().group_list(&caller).await?), note: String::new() }
            }
            GroupAction::Drop => {
                needs_name()?;
                self.app.store().group_drop(&caller, name).await?;
                GroupResponse { groups: Vec::new(), note: format!("group {name} dropped") }
            }
            GroupAction::Unspecified => {
                return Err(Error::invalid("action must be create, add, remove, rules, ls, show or drop").into());
            }
        };
        Ok(Response::new(response))
    }

    async fn spawn(&self, request: Request<SpawnRequest>) -> Result<Response<SpawnResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let harness = limits::harness(&req.harness)?;
        let caps = match req.scope.trim() {
            "" => None,
            "open" => return Err(Error::invalid("a worker is open unless you give tree, parent or none").into()),
            name => scope::preset(name)?,
        };
        let (endpoint, grant) = self.app.store().spawn(&caller, harness, caps).await?;
        tracing::info!(parent = %caller.address(), child = %endpoint.address, "spawn reserved");
        Ok(Response::new(SpawnResponse { endpoint: Some(endpoint.into()), grant }))
    }

    async fn spawn_result(&self, request: Request<SpawnResultRequest>) -> Result<Response<SendResponse>, Status> {
        let grant = bearer(&request)?.to_owned();
        let req = request.get_ref();
        let sent = self.app.store().spawn_result(&grant, req.exit_code, &RedactedText::from_agent(&req.output)).await?;
        Ok(Response::new(convert::sent(sent, &Counts::new())))
    }

    async fn post_job(&self, request: Request<PostJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = self.caller(&request).await?;
        let r = request.get_ref();
        let schedule = schedule(&r.schedule, &r.time_zone)?;
        let (title, detail) = (RedactedText::from_agent(&r.title), RedactedText::from_agent(&r.detail));
        let new = NewJob {
            title: &title,
            detail: &detail,
            repo: &r.repo,
            schedule,
            agent: optional(&r.agent),
            requires_pr: r.requires_pr,
            cwd: &r.cwd,
        };
        let job = self.app.store().post_job(&caller, new).await?;
        tracing::info!(card = %job.id, by = %caller.address(), "card posted");
        Ok(Response::new(job.into()))
    }

    async fn list_jobs(&self, request: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        let caller = self.caller(&request).await?;
        let r = request.get_ref();
        let (jobs, archived) = self.app.store().list_jobs(&caller, &r.state, &r.repo, &r.cwd).await?;
        Ok(Response::new(ListJobsResponse { jobs: convert::all(jobs), archived }))
    }

    async fn read_job(&self, request: Request<ReadJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = self.caller(&request).await?;
        Ok(Response::new(self.app.store().read_job(&caller, &request.get_ref().id).await?.into()))
    }

    async fn edit_job(&self, request: Request<EditJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = self.caller(&request).await?;
        let r = request.get_ref();
        let schedule = match &r.schedule {
            None => None,
            Some(expr) => Some(schedule(expr, &r.time_zone)?),
        };
        let redacted = |text: &Option<String>| text.as_deref().map(RedactedText::from_agent);
        let (title, detail) = (redacted(&r.title), redacted(&r.detail));
        let edit = JobEdit {
            title: title.as_ref(),
            detail: detail.as_ref(),
            repo: r.repo.as_deref(),
            schedule,
            requires_pr: r.requires_pr,
            cwd: &r.cwd,
        };
        Ok(Response::new(self.app.store().edit_job(&caller, &r.id, edit).await?.into()))
    }

    async fn finish_job(&self, request: Request<FinishJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = self.caller(&request).await?;
        let r = request.get_ref();
        let (pr_url, summary) = (RedactedText::from_agent(&r.pr_url), RedactedText::from_agent(&r.summary));
        let job = self.app.store().finish_job(&caller, &r.job_token, &pr_url, &summary).await?;
        tracing::info!(card = %job.id, by = %caller.address(), "card finished");
        Ok(Response::new(job.into()))
    }

    async fn close_job(&self, request: Request<CloseJobRequest>) -> Result<Response<JobView>, Status> {
        let caller = self.caller(&request).await?;
        let r = request.get_ref();
        let note = RedactedText::from_agent(&r.note);
        Ok(Response::new(self.app.store().close_job(&caller, &r.id, r.accept, &note).await?.into()))
    }

    async fn add_repo(&self, request: Request<AddRepoRequest>) -> Result<Response<RepoView>, Status> {
        let caller = self.caller(&request).await?;
        Ok(Response::new(self.app.store().add_repo(&caller, &request.get_ref().path).await?.into()))
    }

    async fn set_peek(&self, request: Request<SetPeekRequest>) -> Result<Response<SetPeekResponse>, Status> {
        let caller = self.caller(&request).await?;
        let on = request.get_ref().on;
        self.app.store().set_peek(&caller, on).await?;
        Ok(Response::new(SetPeekResponse { on }))
    }

    async fn put_peek_turns(
        &self,
        request: Request<PutPeekTurnsRequest>,
    ) -> Result<Response<PutPeekTurnsResponse>, Status> {
        let caller = self.caller(&request).await?;
        // Turns are another agent's data to be: redacted like message bodies before they are kept,
        // and cut only after, so that a cut cannot hide a secret's shape from the redactor.
        let request = request.into_inner();
        let turns: Vec<KeptTurn> = request
            .turns
            .into_iter()
            .map(|t| KeptTurn {
                text: RedactedText::from_agent(&t.text).truncated(PEEK_TEXT_BYTES),
                tools: t.tools.iter().map(|tool| RedactedText::from_agent(tool)).collect(),
                role: RedactedText::from_agent(&t.role),
            })
            .collect();
        let kept = self.app.store().put_peek_turns(&caller, &turns, request.append).await?;
        Ok(Response::new(PutPeekTurnsResponse { kept }))
    }

    async fn peek(&self, request: Request<PeekRequest>) -> Result<Response<PeekView>, Status> {
        let caller = self.caller(&request).await?;
        let r = request.get_ref();
        if r.endpoint.trim().is_empty() {
            return Err(Error::invalid("peek takes endpoint: whose last turns to see").into());
        }
        let turns = if r.turns == 0 { 3 } else { r.turns as usize };
        Ok(Response::new(self.app.store().peek(&caller, &r.endpoint, turns).await?.into()))
    }

    async fn peekers(&self, request: Request<PeekersRequest>) -> Result<Response<PeekersResponse>, Status> {
        let caller = self.caller(&request).await?;
        Ok(Response::new(PeekersResponse { peekers: convert::all(self.app.store().peekers(&caller).await?) }))
    }

    async fn pending_replies(
        &self,
        request: Request<PendingRepliesRequest>,
    ) -> Result<Response<PendingRepliesResponse>, Status> {
        let caller = self.caller(&request).await?;
        Ok(Response::new(PendingRepliesResponse {
            requests: convert::all(self.app.store().pending_replies(&caller).await?),
        }))
    }

    async fn request_permission(
        &self,
        request: Request<PermissionRequest>,
    ) -> Result<Response<PermissionDecision>, Status> {
        let caller = self.caller(&request).await?;
        let r = request.get_ref();
        let (tool, input) = (RedactedText::from_agent(&r.tool), RedactedText::from_agent(&r.input));
        let id = self.app.store().request_permission(&caller, &r.job_token, &tool, &input).await?;
        tracing::info!(approval = %id, by = %caller.address(), tool = %r.tool, "permission requested");
        // The operator has its time, then the human; unanswered after both, the answer is no.
        let wait = approval_wait();
        let started = Instant::now();
        let mut waiter = self.app.hub().waiter(caller.endpoint_id);
        loop {
            let decision = self.app.store().approval(caller.account_id, &id).await?;
            match decision.state.as_str() {
                "allow" | "deny" => return Ok(Response::new(decision.into())),
                "pending" if started.elapsed() >= wait => self.app.store().escalate(&caller, &id).await?,
                "escalated" if started.elapsed() >= wait * 2 => {
                    return Ok(Response::new(self.app.store().expire_approval(caller.account_id, &id).await?.into()));
                }
                _ => {}
            }
            if self.app.shutdown().is_cancelled() {
                return Err(Error::Unavailable("the server is shutting down; ask again".into()).into());
            }
            let next = if started.elapsed() < wait { started + wait } else { started + wait * 2 };
            tokio::select! {
                () = waiter.changed() => {}
                () = tokio::time::sleep_until(next) => {}
                () = self.app.shutdown().cancelled() => {}
            }
        }
    }

    async fn answer_permission(
        &self,
        request: Request<AnswerPermissionRequest>,
    ) -> Result<Response<PermissionDecision>, Status> {
        let caller = self.caller(&request).await?;
        let r = request.get_ref();
        let reason = RedactedText::from_agent(&r.reason);
        Ok(Response::new(self.app.store().answer_permission(&caller, &r.id, &r.decision, &reason).await?.into()))
    }

    async fn confirm(&self, request: Request<ConfirmRequest>) -> Result<Response<ConfirmResponse>, Status> {
        let caller = self.caller(&request).await?;
        let req = request.get_ref();
        let updated = self.app.confirm(&caller, &req.seqs, convert::state_from_wire(req.state())).await?;
        Ok(Response::new(ConfirmResponse { updated: updated as u32 }))
    }
}
