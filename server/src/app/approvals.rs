//! Permission requests of board agents: the operator has its time, then the account's human; with
//! no answer after both, the answer is no.

use std::time::Duration;

use tokio::time::Instant;

use super::App;
use super::board::is_operator;
use crate::domain::caller::Human;
use crate::domain::ids::{self, AccountId, TokenKind};
use crate::domain::redact::RedactedText;
use crate::domain::trust::{self as rules, Approval, ApprovalState, Decision};
use crate::domain::{Error, Result};
use crate::store::approvals::{self, NewApproval};
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
        let id = self.ask_permission(caller, job_token, tool_text.as_str(), input.as_str()).await?;
        tracing::info!(approval = %id, by = %caller.address(), tool, "permission requested");
        let wait = approval_wait();
        let started = Instant::now();
        let mut waiter = self.hub.waiter(caller.endpoint_id);
        loop {
            let decision = approvals::decision(&self.store.client().await?, caller.account_id, &id).await?;
            match decision.state {
                ApprovalState::Allow | ApprovalState::Deny => return Ok(decision),
                ApprovalState::Pending if started.elapsed() >= wait => self.escalate(caller, &id).await?,
                ApprovalState::Escalated if started.elapsed() >= wait * 2 => {
                    return self.expire_approval(caller.account_id, &id).await;
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

    /// Records a board agent's request and asks the operator endpoint (or, without a live one, the
    /// human); the request's id.
    async fn ask_permission(&self, caller: &Caller, job_token: &str, tool: &str, input: &str) -> Result<String> {
        ids::check_token(TokenKind::JobToken, job_token)?;
        if tool.trim().is_empty() {
            return Err(Error::invalid("a permission request names the tool"));
        }
        let mut db = self.store.client().await?;
        let tx = db.transaction().await?;
        let card =
            approvals::worked_card(&tx, caller.account_id, &ids::token_hash(job_token)).await?.ok_or_else(|| {
                Error::FailedPrecondition("permission requests come from an agent working a card in progress".into())
            })?;
        let id = format!("a{}", &ids::new_message_id()[..9]);
        let operator = match &card.operator {
            Some(op) => approvals::operator_target(&tx, caller.account_id, op).await?,
            None => None,
        };
        let state = if operator.is_some() { ApprovalState::Pending } else { ApprovalState::Escalated };
        let new = NewApproval {
            id: &id,
            account_id: caller.account_id,
            job_id: &card.id,
            requester: caller.endpoint_id,
            tool: tool.trim(),
            input: &rules::excerpt(input),
            state,
        };
        approvals::insert(&tx, &new).await?;
        let requester = caller.address();
        let (target, body) = match operator {
            Some(target) => (target, rules::approval_question(&id, &requester, &card.id, &card.title, tool, input)),
            None => (
                approvals::human_target(&tx, caller.account_id, &caller.account).await?,
                rules::approval_escalation(&id, &requester, &card.id, tool, input),
            ),
        };
        approvals::ask(&tx, caller, target, &body).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Hands an unanswered request to the account's human.
    async fn escalate(&self, caller: &Caller, id: &str) -> Result<()> {
        let mut db = self.store.client().await?;
        let tx = db.transaction().await?;
        let Some((job_id, tool, input)) = approvals::escalate(&tx, id).await? else {
            return Ok(());
        };
        let body = rules::approval_escalation(id, &caller.address(), &job_id, &tool, &input);
        let target = approvals::human_target(&tx, caller.account_id, &caller.account).await?;
        approvals::ask(&tx, caller, target, &body).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Nobody answered in time: the request is refused for good, so nobody can allow it later.
    async fn expire_approval(&self, account_id: AccountId, id: &str) -> Result<Decision> {
        let db = self.store.client().await?;
        approvals::expire(&db, account_id, id).await?;
        approvals::decision(&db, account_id, id).await
    }

    /// The operator's answer: allow, deny, or owner (leave it to the human).
    pub async fn answer_permission(&self, caller: &Caller, id: &str, decision: &str, reason: &str) -> Result<Decision> {
        let reason = RedactedText::from_agent(reason);
        let mut db = self.store.client().await?;
        is_operator(&db, caller).await?;
        let state = rules::decision(decision, false)?;
        decide(&mut db, caller.account_id, id, state, reason.as_str(), &caller.address(), false).await
    }

    /// The human's answer, to a request pending or escalated.
    pub async fn approve(&self, person: &Human, id: &str, decision: &str, reason: &str) -> Result<Decision> {
        let reason = RedactedText::from_agent(reason);
        let state = rules::decision(decision, true)?;
        let by = format!("{}/me ({})", person.account, person.name);
        let mut db = self.store.client().await?;
        decide(&mut db, person.account_id, id, state, reason.as_str(), &by, true).await
    }

    /// The account's open requests, oldest first.
    pub async fn approvals(&self, person: &Human) -> Result<Vec<Approval>> {
        let db = self.store.client().await?;
        approvals::open(&db, person.account_id).await
    }
}

/// Decides an open request (`human`: pending or escalated; else pending only) and wakes the agent
/// waiting on it. `Escalated` hands it to the human.
async fn decide(
    db: &mut deadpool_postgres::Object,
    account_id: AccountId,
    id: &str,
    state: ApprovalState,
    reason: &str,
    by: &str,
    human: bool,
) -> Result<Decision> {
    let tx = db.transaction().await?;
    let Some(decided) =
        approvals::decide(&tx, account_id, id, state, reason, by, &approvals::open_states(human)).await?
    else {
        let current = approvals::decision(&tx, account_id, id).await?;
        return Err(Error::FailedPrecondition(format!("permission request {id} is already {}", current.state)));
    };
    if state == ApprovalState::Escalated {
        let asker = approvals::requester(&tx, decided.requester).await?;
        let body =
            rules::approval_escalation(id.trim(), &asker.address(), &decided.job_id, &decided.tool, &decided.input);
        let target = approvals::human_target(&tx, account_id, &asker.account).await?;
        approvals::ask(&tx, &asker, target, &body).await?;
    }
    approvals::wake(&tx, decided.requester).await?;
    let decision = approvals::decision(&tx, account_id, id).await?;
    tx.commit().await?;
    Ok(decision)
}
