//! `relay.v1.Worker`: what `agent-bridge worker` calls, authenticated by its machine token.

use relay_proto::v1::worker_server::Worker;
use relay_proto::v1::*;
use tonic::{Request, Response, Status};

use super::auth::bearer;
use super::convert;
use crate::domain::Result;
use crate::domain::redact::RedactedText;
use crate::store::Store;
use crate::store::identity::MachineIdentity;

#[derive(Clone)]
pub struct WorkerService {
    store: Store,
}

impl WorkerService {
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    async fn machine<T>(&self, request: &Request<T>) -> Result<MachineIdentity> {
        self.store.authenticate_machine(bearer(request)?).await
    }
}

#[tonic::async_trait]
impl Worker for WorkerService {
    async fn register_repo(&self, request: Request<RegisterRepoRequest>) -> Result<Response<RepoView>, Status> {
        let machine = self.machine(&request).await?;
        Ok(Response::new(self.store.register_repo(&machine, &request.get_ref().path).await?.into()))
    }

    async fn claim(&self, request: Request<ClaimRequest>) -> Result<Response<ClaimResponse>, Status> {
        let machine = self.machine(&request).await?;
        let (claimed, cleanup) = self.store.claim(&machine).await?;
        if let Some((job, _)) = &claimed {
            tracing::info!(card = %job.id, machine = %machine.machine, attempt = job.attempts, "card claimed");
        }
        let claimed = claimed.map(|(job, job_token)| ClaimedJob { job: Some(job.into()), job_token });
        Ok(Response::new(ClaimResponse { claimed, cleanup: convert::all(cleanup) }))
    }

    async fn renew(&self, request: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        let machine = self.machine(&request).await?;
        let r = request.get_ref();
        let agent_state = RedactedText::from_agent(&r.agent_state);
        let (in_progress, state) =
            self.store.renew(&machine, &r.job_token, &agent_state, &r.worktree, &r.branch).await?;
        Ok(Response::new(RenewResponse { in_progress, state }))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<JobView>, Status> {
        let machine = self.machine(&request).await?;
        let r = request.get_ref();
        // The worker reports what its agent printed last: redacted like everything agents write.
        let error = RedactedText::from_agent(&r.error);
        let job = self.store.release(&machine, &r.job_token, r.exit_code, &error).await?;
        tracing::info!(card = %job.id, state = %job.state, exit_code = r.exit_code, "card agent ended");
        Ok(Response::new(job.into()))
    }

    async fn cleaned(&self, request: Request<CleanedRequest>) -> Result<Response<CleanedResponse>, Status> {
        let machine = self.machine(&request).await?;
        self.store.cleaned(&machine, &request.get_ref().ids).await?;
        Ok(Response::new(CleanedResponse {}))
    }
}
