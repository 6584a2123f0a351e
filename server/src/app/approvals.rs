//! Permission requests of board agents: the operator has its time, then the account's human; with
//! no answer after both, the answer is no.

use std::time::Duration;

use tokio::time::Instant;

use super::App;
use crate::domain::caller::Human;
use crate::domain::redact::RedactedText;
use crate::domain::trust::{Approval, ApprovalState, Decision};
use crate::domain::{Error, Result};
use crate::store::identity::Caller;

/// How long the operator, then the human, has to answer a permission request
/// (`RELAY_APPROVAL_WAIT_S`, default 5 minutes each).
fn approval_wait() -> Duration {
    let secs = std::env::var("RELAY_APPROVAL_WAIT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(300u64);
    Duration::from_secs(secs.clamp(1, 3600))
}

impl App {
    /// Asks for a tool on behalf of the card the caller works, and waits for the decision.
    pub async fn request_permission(
        &self,
        caller: &Caller,
        job_token: &str,
        tool: &str,
        input: &str,
    ) -> Result<Decision> {
        let (tool_text, input) = (RedactedText::from_agent(tool), RedactedText::from_agent(input));
        let id = self.store.request_permission(caller, job_token, &tool_text, &input).await?;
        tracing::info!(approval = %id, by = %caller.address(), tool, "permission requested");
        let wait = approval_wait();
        let started = Instant::now();
        let mut waiter = self.hub.waiter(caller.endpoint_id);
        loop {
            let decision = self.store.approval(caller.account_id, &id).await?;
            match decision.state {
                ApprovalState::Allow | ApprovalState::Deny => return Ok(decision),
                ApprovalState::Pending if started.elapsed() >= wait => self.store.escalate(caller, &id).await?,
                ApprovalState::Escalated if started.elapsed() >= wait * 2 => {
                    return self.store.expire_approval(caller.account_id, &id).await;
                }
                ApprovalState::Pending | ApprovalState::Escalated => {}
            }
            if self.shutdown.is_cancelled() {
                return Err(Error::Unavailable("the server is shutting down; ask again".into()));
            }
            let next = if started.elapsed() < wait { started + wait } else { started + wait * 2 };
            tokio::select! {
                () = waiter.changed() => {}
                () = tokio::time::sleep_until(next) => {}
                () = self.shutdown.cancelled() => {}
            }
        }
    }

    /// The operator's answer: allow, deny, or owner (leave it to the human).
    pub async fn answer_permission(&self, caller: &Caller, id: &str, decision: &str, reason: &str) -> Result<Decision> {
        self.store.answer_permission(caller, id, decision, &RedactedText::from_agent(reason)).await
    }

    /// The human's answer, to a request pending or escalated.
    pub async fn approve(&self, person: &Human, id: &str, decision: &str, reason: &str) -> Result<Decision> {
        self.store.approve(person, id, decision, &RedactedText::from_agent(reason)).await
    }

    pub async fn approvals(&self, person: &Human) -> Result<Vec<Approval>> {
        self.store.approvals(person).await
    }
}
