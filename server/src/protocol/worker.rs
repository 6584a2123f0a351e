//! `relay.v1.Worker`: what `agent-bridge worker` calls, authenticated by its machine token.

use relay_proto::v1::worker_server::Worker;
use relay_proto::v1::*;
use tonic::{Request, Response, Status};

use super::auth;
use super::convert::{self, IntoWire};
use super::status::to_status;

use crate::app::App;
use crate::app::board::BoardService;
use crate::app::claims::{ClaimsService, repo_key};
use crate::domain::Result;

#[derive(Clone)]
pub struct WorkerService {
    board: BoardService,
    claims: ClaimsService,
}

impl WorkerService {
    pub fn new(app: &App) -> Self {
        Self { board: app.board.clone(), claims: app.claims.clone() }
    }

    async fn follow(&self, machine: &crate::domain::caller::MachineIdentity) -> Result<Vec<FollowPr>, Status> {
        let follow = self.board.prs_to_follow(machine).await.map_err(to_status)?;
        Ok(follow
            .into_iter()
            .map(|f| FollowPr { id: f.id.into_string(), pr_url: f.pr_url, repo_path: f.repo_path, repo: f.repo })
            .collect())
    }
}

#[tonic::async_trait]
impl Worker for WorkerService {
    async fn register_repo(&self, request: Request<RegisterRepoRequest>) -> Result<Response<RepoView>, Status> {
        let machine = auth::machine(&request)?;
        Ok(Response::new(
            self.board.register_repo(&machine, &request.get_ref().path).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn claim(&self, request: Request<ClaimRequest>) -> Result<Response<ClaimResponse>, Status> {
        let machine = auth::machine(&request)?;
        if request.get_ref().follow_only {
            let follow = self.follow(&machine).await?;
            return Ok(Response::new(ClaimResponse { claimed: None, cleanup: Vec::new(), follow }));
        }
        let (claimed, cleanup) = self.board.claim(&machine).await.map_err(to_status)?;
        let lease_s = self.board.lease_s();
        let claimed = claimed.map(|(job, job_token)| ClaimedJob { job: Some(job.into_wire()), job_token, lease_s });
        // Pull requests are asked for apart (`follow_only`), on the worker's own beat.
        Ok(Response::new(ClaimResponse { claimed, cleanup: convert::all(cleanup), follow: Vec::new() }))
    }

    async fn pr_checked(&self, request: Request<PrCheckedRequest>) -> Result<Response<JobView>, Status> {
        let machine = auth::machine(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.board.pr_checked(&machine, &r.id, &r.state, &r.error).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn renew(&self, request: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        let machine = auth::machine(&request)?;
        let r = request.get_ref();
        let (in_progress, state) = self
            .board
            .renew(&machine, &r.job_token, &r.agent_state, &r.worktree, &r.branch)
            .await
            .map_err(to_status)?;
        Ok(Response::new(RenewResponse { in_progress, state, lease_s: self.board.lease_s() }))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<JobView>, Status> {
        let machine = auth::machine(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.board.release(&machine, &r.job_token, r.exit_code, &r.error).await.map_err(to_status)?.into_wire(),
        ))
    }

    async fn cleaned(&self, request: Request<CleanedRequest>) -> Result<Response<CleanedResponse>, Status> {
        let machine = auth::machine(&request)?;
        self.board.cleaned(&machine, &request.get_ref().ids).await.map_err(to_status)?;
        Ok(Response::new(CleanedResponse {}))
    }

    async fn claims_touching(
        &self,
        request: Request<ClaimsTouchingRequest>,
    ) -> Result<Response<ListClaimsResponse>, Status> {
        let machine = auth::machine(&request)?;
        let r = request.into_inner();
        let repo = convert::required_repo(r.repo)?;
        let key = repo_key(&machine.account, &machine.machine, &repo).map_err(to_status)?;
        let claims = self.claims.touching(machine.account_id, None, &key, &r.files).await.map_err(to_status)?;
        Ok(Response::new(ListClaimsResponse { claims: convert::all(claims) }))
    }

    async fn claim_card_paths(
        &self,
        request: Request<ClaimCardPathsRequest>,
    ) -> Result<Response<ClaimPathsResponse>, Status> {
        let machine = auth::machine(&request)?;
        let r = request.into_inner();
        let repo = convert::required_repo(r.repo)?;
        let claimed = self.claims.claim_for_card(&machine, &r.job_token, &repo).await.map_err(to_status)?;
        Ok(Response::new(convert::claimed(claimed)))
    }
}
