//! Permission requests of board agents: the operator endpoint answers, else the account's human.

use crate::domain::trust::{Approval as ApprovalView, ApprovalState, Decision as PermissionDecision};

use super::Store;
use super::error::Col;
use super::identity::{Caller, caller_of};
use super::messages::{DELIVERY_CHANNEL, Outgoing, Target};
use crate::domain::caller::Human;
use crate::domain::delivery::Kind;
use crate::domain::ids::{self, AccountId, EndpointId, TokenKind};
use crate::domain::redact::{RedactedText, redact};
use crate::domain::{EntityKind, Error, Result};

const EXCERPT: usize = 600;

/// Approval states as SQL text spells them: literals in the text, where the partial index
/// `approvals_open` (migration 5) needs them.
const PENDING: &str = ApprovalState::Pending.as_db();
const ESCALATED: &str = ApprovalState::Escalated.as_db();
const ALLOW: &str = ApprovalState::Allow.as_db();
const DENY: &str = ApprovalState::Deny.as_db();

fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

impl Store {
    /// Records a board agent's request and asks the operator endpoint (or, without one, the human).
    pub async fn request_permission(
        &self,
        caller: &Caller,
        job_token: &str,
        tool: &RedactedText,
        input: &RedactedText,
    ) -> Result<String> {
        let (tool, input) = (tool.as_str(), input.as_str());
        ids::check_token(TokenKind::JobToken, job_token)?;
        if tool.trim().is_empty() {
            return Err(Error::invalid("a permission request names the tool"));
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let job = tx
            .query_opt(
                "select j.id, j.title, a.operator from jobs j join accounts a on a.id = j.account_id
                 where j.job_token_hash = $1 and j.account_id = $2 and j.state = 'in_progress'",
                &[&ids::token_hash(job_token), &caller.account_id],
            )
            .await?
            .ok_or_else(|| {
                Error::FailedPrecondition("permission requests come from an agent working a card in progress".into())
            })?;
        let (job_id, title, operator): (String, String, Option<String>) = (job.col(0)?, job.col(1)?, job.col(2)?);
        let id = format!("a{}", &ids::new_message_id()[..9]);
        let operator_id: Option<(EndpointId, String)> = match &operator {
            Some(op) => tx
                .query_opt(
                    "select ea.id, ea.address from endpoint_addresses ea join endpoints e on e.id = ea.id
                     where ea.account_id = $1 and ea.machine || '/' || ea.handle = $2 and e.ended_at is null",
                    &[&caller.account_id, op],
                )
                .await?
                .map(|r| Ok::<_, Error>((r.col(0)?, r.col(1)?)))
                .transpose()?,
            None => None,
        };
        let state = if operator_id.is_some() { ApprovalState::Pending } else { ApprovalState::Escalated };
        tx.execute(
            "insert into approvals (id, account_id, job_id, requester_id, tool, input, state) values ($1, $2, $3, $4, $5, $6, $7)",
            &[&id, &caller.account_id, &job_id, &caller.endpoint_id, &tool.trim(), &excerpt(input), &state.as_db()],
        )
        .await?;
        let body = match &operator_id {
            Some(_) => format!(
                "[Approval {id}] {} working on card {job_id} (\"{title}\") asks to use {}: {}\nAnswer with answer_permission {{id: \"{id}\", decision: allow | deny | owner}}.",
                caller.address(),
                tool.trim(),
                excerpt(input)
            ),
            None => escalation_text(&id, &caller.address(), &job_id, tool, input),
        };
        let target = match operator_id {
            Some((id, address)) => Target { id, address, account_id: caller.account_id },
            None => human_target(&tx, caller.account_id, &caller.account).await?,
        };
        ask_about(&tx, caller, target, &body).await?;
        tx.commit().await?;
        Ok(id)
    }

    pub async fn approval(&self, account_id: AccountId, id: &str) -> Result<PermissionDecision> {
        approval_on(&self.client().await?, account_id, id).await
    }

    /// Hands an unanswered request to the account's human.
    pub async fn escalate(&self, caller: &Caller, id: &str) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let Some(row) = tx
            .query_opt(
                &format!(
                    "update approvals set state = '{ESCALATED}' where id = $1 and state = '{PENDING}' returning job_id, tool, input"
                ),
                &[&id],
            )
            .await?
        else {
            return Ok(());
        };
        let body = escalation_text(id, &caller.address(), row.col(0)?, row.col(1)?, row.col(2)?);
        let target = human_target(&tx, caller.account_id, &caller.account).await?;
        ask_about(&tx, caller, target, &body).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Decides an open request and wakes the agent waiting on it. `owner` hands it to the human.
    async fn decide_approval(
        &self,
        account_id: AccountId,
        id: &str,
        decision: &str,
        reason: &RedactedText,
        by: &str,
        human: bool,
    ) -> Result<PermissionDecision> {
        let reason = reason.as_str();
        let state = match (decision.trim(), human) {
            ("allow", _) => ApprovalState::Allow,
            ("deny", _) => ApprovalState::Deny,
            ("owner", false) => ApprovalState::Escalated,
            _ => {
                return Err(Error::invalid(if human {
                    "decision must be allow or deny"
                } else {
                    "decision must be allow, deny or owner"
                }));
            }
        };
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let open = if human { vec![PENDING, ESCALATED] } else { vec![PENDING] };
        let row = tx
            .query_opt(
                &format!(
                    "update approvals set state = $3, reason = nullif($4, ''), decided_by = $5,
                                          decided_at = case when $3 in ('{ALLOW}', '{DENY}') then now() end
                     where id = $1 and account_id = $2 and state = any($6)
                     returning requester_id, job_id, tool, input"
                ),
                &[&id.trim(), &account_id, &state.as_db(), &reason.trim(), &by, &open],
            )
            .await?;
        let Some(row) = row else {
            let current = approval_on(&tx, account_id, id).await?;
            return Err(Error::FailedPrecondition(format!("permission request {id} is already {}", current.state)));
        };
        let requester: EndpointId = row.col(0)?;
        if state == ApprovalState::Escalated {
            let asker = caller_of(&tx, requester).await?;
            let body = escalation_text(id.trim(), &asker.address(), row.col(1)?, row.col(2)?, row.col(3)?);
            let target = human_target(&tx, account_id, &asker.account).await?;
            ask_about(&tx, &asker, target, &body).await?;
        }
        // Wake the requester's waiting call on whichever replica holds it.
        tx.execute("select pg_notify($1, $2)", &[&DELIVERY_CHANNEL, &format!("{requester}:0")]).await?;
        let decided = approval_on(&tx, account_id, id).await?;
        tx.commit().await?;
        Ok(decided)
    }

    /// Nobody answered in time: the request is refused for good, so nobody can allow it later.
    pub async fn expire_approval(&self, account_id: AccountId, id: &str) -> Result<PermissionDecision> {
        let client = self.client().await?;
        client
            .execute(
                &format!(
                    "update approvals set state = '{DENY}', reason = 'nobody answered in time; try another way or ask again later',
                                          decided_by = 'timeout', decided_at = now()
                     where id = $1 and account_id = $2 and state in ('{PENDING}', '{ESCALATED}')"
                ),
                &[&id, &account_id],
            )
            .await?;
        approval_on(&client, account_id, id).await
    }

    /// The operator's answer.
    pub async fn answer_permission(
        &self,
        caller: &Caller,
        id: &str,
        decision: &str,
        reason: &RedactedText,
    ) -> Result<PermissionDecision> {
        let client = self.client().await?;
        super::board::is_operator(&client, caller).await?;
        drop(client);
        self.decide_approval(caller.account_id, id, decision, reason, &caller.address(), false).await
    }

    /// The human's answer, to a request pending or escalated.
    pub async fn approve(
        &self,
        human: &Human,
        id: &str,
        decision: &str,
        reason: &RedactedText,
    ) -> Result<PermissionDecision> {
        self.decide_approval(
            human.account_id,
            id,
            decision,
            reason,
            &format!("{}/me ({})", human.account, human.name),
            true,
        )
        .await
    }

    pub async fn approvals(&self, human: &Human) -> Result<Vec<ApprovalView>> {
        let client = self.client().await?;
        client
            .query(
                &format!(
                    "select a.id, a.state, a.job_id, ea.address, a.tool, a.input from approvals a
                     join endpoint_addresses ea on ea.id = a.requester_id
                     where a.account_id = $1 and a.state in ('{PENDING}', '{ESCALATED}') order by a.created_at"
                ),
                &[&human.account_id],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(ApprovalView {
                    id: r.col(0)?,
                    state: ApprovalState::from_db(r.col(1)?)?,
                    job_id: r.col(2)?,
                    requester: r.col(3)?,
                    tool: r.col(4)?,
                    input: r.col(5)?,
                })
            })
            .collect()
    }
}

/// The account's human inbox as a recipient.
async fn human_target(
    c: &impl deadpool_postgres::GenericClient,
    account_id: AccountId,
    account: &str,
) -> Result<Target> {
    let id = super::trust::ensure_human(c, account_id).await?;
    Ok(Target { id, address: format!("{account}/me"), account_id })
}

/// Puts a permission question in front of whoever must answer it, from the agent asking.
async fn ask_about(tx: &deadpool_postgres::Transaction<'_>, asker: &Caller, target: Target, body: &str) -> Result<()> {
    // The question quotes the agent's (redacted) input: redacted again as a whole for storing.
    let body = redact(body).text;
    let out = Outgoing {
        to: &[],
        body: &body,
        thread: None,
        kind: Kind::Ask,
        client_id: None,
        private: false,
        require_reply: false,
    };
    super::messages::store_message(tx, asker, &[target], &out, None).await?;
    Ok(())
}

fn escalation_text(id: &str, requester: &str, job_id: &str, tool: &str, input: &str) -> String {
    format!(
        "[Approval {id}] {requester} working on card {job_id} asks to use {}: {}\nThe operator has not answered. Answer with agent-bridge human approve {id} allow|deny.",
        tool.trim(),
        excerpt(input)
    )
}

async fn approval_on(
    client: &impl deadpool_postgres::GenericClient,
    account_id: AccountId,
    id: &str,
) -> Result<PermissionDecision> {
    let row = client
        .query_opt(
            "select state, coalesce(reason, ''), coalesce(decided_by, '') from approvals where id = $1 and account_id = $2",
            &[&id.trim(), &account_id],
        )
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Approval, format!("no permission request {id} in your account")))?;
    Ok(PermissionDecision {
        id: id.trim().to_owned(),
        state: ApprovalState::from_db(row.col(0)?)?,
        reason: row.col(1)?,
        decided_by: row.col(2)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_states_are_the_ones_the_table_allows() {
        let table = include_str!("../../migrations/0005_approvals.sql");
        let all: Vec<String> = ApprovalState::ALL.iter().map(|s| format!("'{s}'")).collect();
        assert!(table.contains(&format!("check (state in ({}))", all.join(", "))), "{all:?}");
        assert!(table.contains(&format!("where state in ('{PENDING}', '{ESCALATED}');")));
    }
}
