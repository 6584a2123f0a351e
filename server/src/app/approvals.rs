//! Permission requests of board agents: the operator has its time, then the account's human; with
//! no answer after both, the answer is no. The deadlines live with the request in the database,
//! and the scheduler keeps them, so a request never waits forever for a call that is gone.

use std::time::Duration;

use deadpool_postgres::Transaction;
use tokio::time::Instant;

use super::Core;
use super::board::is_operator;
use crate::domain::caller::Caller;
use crate::domain::caller::Human;
use crate::domain::ids::{self, AccountId, ApprovalId};
use crate::domain::redact::RedactedText;
use crate::domain::trust::{self as rules, Approval, ApprovalState, Decision};
use crate::domain::{Error, Result};
use crate::store;
use crate::store::approvals::{self, NewApproval, Verdict};

/// Permission requests of board agents, to the operator and then the human.
#[derive(Clone)]
pub struct ApprovalsService {
    core: Core,
}

impl ApprovalsService {
    pub(super) fn new(core: Core) -> Self {
        Self { core }
    }
}

impl ApprovalsService {
    /// Asks for a tool on behalf of the card the caller works, and waits for the decision.
    pub async fn request_permission(
        &self,
        caller: &Caller,
        job_token: &str,
        tool: &str,
        input: &str,
    ) -> Result<Decision> {
        let (tool_text, input) = (RedactedText::from_agent(tool), RedactedText::from_agent(input));
        let wait = self.core.timings.approval_wait;
        let id = self.ask_permission(caller, job_token, tool_text.as_str(), input.as_str(), wait).await?;
        tracing::info!(approval = %id, by = %caller.address(), tool, "permission requested");
        // The deadlines are the database's: the scheduler of any replica escalates and refuses the
        // request, and wakes this call. The timer here only re-reads once the last one has passed.
        let last = Instant::now() + wait * 2 + Duration::from_secs(2);
        let mut waiter = self.core.hub.waiter(caller.endpoint_id);
        loop {
            let decision = approvals::decision(&self.core.store.client().await?, caller.account_id, &id).await?;
            if matches!(decision.state, ApprovalState::Allow | ApprovalState::Deny) {
                return Ok(decision);
            }
            if self.core.shutdown.is_cancelled() {
                return Err(Error::Unavailable(format!(
                    "the server is shutting down; permission request {id} stays open: ask again"
                )));
            }
            tokio::select! {
                () = waiter.changed() => {}
                () = tokio::time::sleep_until(last.max(Instant::now() + Duration::from_secs(1))) => {}
                () = self.core.shutdown.cancelled() => {}
            }
        }
    }

    /// One round of the scheduler: requests past the operator's time go to the human, requests past
    /// the human's are refused and their callers woken. How many were due. One request that cannot
    /// be moved on does not hold up the others.
    pub async fn approval_round(&self) -> Result<usize> {
        let mut db = self.core.store.client().await?;
        let wait_s = self.core.timings.approval_wait.as_secs_f64();
        let due = approvals::due(&db, wait_s, 100).await?;
        for request in &due {
            if let Err(e) = settle(&mut db, request, wait_s).await {
                tracing::warn!(approval = %request.id, error = %e, "cannot move a permission request on");
            }
        }
        Ok(due.len())
    }

    /// Records a board agent's request and asks the operator endpoint (or, without a live one, the
    /// human); the request's id.
    async fn ask_permission(
        &self,
        caller: &Caller,
        job_token: &str,
        tool: &str,
        input: &str,
        wait: Duration,
    ) -> Result<ApprovalId> {
        let not_working =
            || Error::FailedPrecondition("permission requests come from an agent working a card in progress".into());
        // A card's agent asks for its own card; a machine's agent names one by its job token.
        let token_hash = caller.attempt_hash(job_token)?.ok_or_else(not_working)?;
        if tool.trim().is_empty() {
            return Err(Error::invalid("a permission request names the tool"));
        }
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let card = approvals::worked_card(&tx, caller.account_id, &token_hash).await?.ok_or_else(not_working)?;
        let id = ApprovalId::new(format!("a{}", ids::random_text(9)));
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
        approvals::insert(&tx, &new, wait.as_secs_f64()).await?;
        let requester = caller.address();
        let (target, body) = match operator {
            Some(target) => (target, rules::approval_question(&id, &requester, &card.id, &card.title, tool, input)),
            None => (
                approvals::human_target(&tx, caller.account_id, &caller.account).await?,
                rules::approval_escalation(&id, &requester, &card.id, tool, input),
            ),
        };
        approvals::ask(&tx, caller, target, &body).await?;
        store::commit(tx).await?;
        Ok(id)
    }

    /// The operator's answer: allow, deny, or owner (leave it to the human).
    pub async fn answer_permission(&self, caller: &Caller, id: &str, decision: &str, reason: &str) -> Result<Decision> {
        let reason = RedactedText::from_agent(reason);
        let mut db = self.core.store.client().await?;
        is_operator(&db, caller).await?;
        let state = rules::decision(decision, false)?;
        let verdict = Verdict { state, reason: reason.as_str(), by: &caller.address() };
        decide(&mut db, caller.account_id, id, &verdict, false, self.core.timings.approval_wait).await
    }

    /// The human's answer, to a request pending or escalated.
    pub async fn approve(&self, person: &Human, id: &str, decision: &str, reason: &str) -> Result<Decision> {
        let reason = RedactedText::from_agent(reason);
        let state = rules::decision(decision, true)?;
        let by = format!("{}/me ({})", person.account, person.name);
        let mut db = self.core.store.client().await?;
        decide(
            &mut db,
            person.account_id,
            id,
            &Verdict { state, reason: reason.as_str(), by: &by },
            true,
            self.core.timings.approval_wait,
        )
        .await
    }

    /// The account's open requests, oldest first.
    pub async fn approvals(&self, person: &Human) -> Result<Vec<Approval>> {
        let db = self.core.store.client().await?;
        Ok(approvals::open(&db, person.account_id).await?)
    }
}

/// Refuses a request with the human that is past its last deadline, and hands one still with the
/// operator to the human. Should that fail once its last deadline has passed too, it is refused
/// instead: no request waits forever.
async fn settle(db: &mut deadpool_postgres::Object, request: &approvals::Due, wait_s: f64) -> Result<()> {
    if !request.with_human {
        match hand_to_human(db, request, wait_s).await {
            Err(e) if request.overdue => {
                tracing::warn!(approval = %request.id, error = %e, "cannot hand an overdue permission request to the human; refusing it");
            }
            handed => return handed,
        }
    }
    if approvals::expire(&*db, request.account_id, &request.id, wait_s).await? {
        approvals::wake(&*db, request.requester).await?;
    }
    Ok(())
}

/// Hands a request still with the operator to the account's human, with the whole wait to answer.
async fn hand_to_human(db: &mut deadpool_postgres::Object, request: &approvals::Due, wait_s: f64) -> Result<()> {
    let tx = store::begin(db).await?;
    if let Some(handed) = approvals::escalate(&tx, &request.id, wait_s).await? {
        ask_the_human(&tx, &request.id, &handed).await?;
    }
    store::commit(tx).await?;
    Ok(())
}

/// Puts request `id`, just handed on, before the account's human, in its asker's name.
async fn ask_the_human(tx: &Transaction<'_>, id: &ApprovalId, handed: &approvals::Decided) -> Result<()> {
    let asker = approvals::requester(tx, handed.requester).await?;
    let body = rules::approval_escalation(id, &asker.address(), &handed.job_id, &handed.tool, &handed.input);
    let target = approvals::human_target(tx, asker.account_id, &asker.account).await?;
    Ok(approvals::ask(tx, &asker, target, &body).await?)
}

/// Decides an open request (`human`: pending or escalated; else pending only) and wakes the agent
/// waiting on it. `Escalated` hands it to the human, with the whole wait to answer.
async fn decide(
    db: &mut deadpool_postgres::Object,
    account_id: AccountId,
    id: &str,
    verdict: &Verdict<'_>,
    human: bool,
    wait: Duration,
) -> Result<Decision> {
    let wait_s = wait.as_secs_f64();
    let id = &ApprovalId::new(id.trim());
    let tx = store::begin(db).await?;
    let Some(decided) = approvals::decide(&tx, account_id, id, verdict, &approvals::open_states(human), wait_s).await?
    else {
        let current = approvals::decision(&tx, account_id, id).await?;
        return Err(Error::FailedPrecondition(format!("permission request {id} is already {}", current.state)));
    };
    if verdict.state == ApprovalState::Escalated {
        ask_the_human(&tx, id, &decided).await?;
    }
    approvals::wake(&tx, decided.requester).await?;
    let decision = approvals::decision(&tx, account_id, id).await?;
    store::commit(tx).await?;
    Ok(decision)
}
