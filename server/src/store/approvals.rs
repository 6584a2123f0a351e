//! Permission requests of board agents in the database. Free repository functions on a client or
//! transaction the application layer (`app::approvals`) holds.

use deadpool_postgres::{GenericClient, Transaction};

use super::board::IN_PROGRESS;
use super::messages::{DELIVERY_CHANNEL, Outgoing, Target};
use super::row::{Col, FromRow};
use crate::domain::caller::Caller;
use crate::domain::delivery::Kind;
use crate::domain::ids::{AccountId, ApprovalId, EndpointId, JobId, TokenHash};
use crate::domain::redact::redact;
use crate::domain::trust::{Approval as ApprovalView, ApprovalState, Decision as PermissionDecision};
use crate::domain::{EntityKind, Error};
use crate::store::Result;
use tokio_postgres::Row;

/// Approval states as SQL text spells them: literals in the text, where the partial index
/// `approvals_open` (migration 5) needs them.
const PENDING: &str = ApprovalState::Pending.as_db();
const ESCALATED: &str = ApprovalState::Escalated.as_db();
const ALLOW: &str = ApprovalState::Allow.as_db();
const DENY: &str = ApprovalState::Deny.as_db();

/// The in-progress card of the account whose current attempt holds the job token `token_hash`.
pub(crate) struct WorkedCard {
    pub id: JobId,
    pub title: String,
    /// The account's operator endpoint (`machine/handle`), if it has one.
    pub operator: Option<String>,
}

/// A decision on a permission request, as its decider gives it.
pub(crate) struct Verdict<'a> {
    pub state: ApprovalState,
    pub reason: &'a str,
    /// Who decided: the operator's address, or the account's human.
    pub by: &'a str,
}

/// A request just decided or handed on, as its asker sent it.
pub(crate) struct Decided {
    pub requester: EndpointId,
    pub job_id: JobId,
    pub tool: String,
    pub input: String,
}

/// A [`Decided`] from a row of `requester_id, job_id, tool, input`.
impl FromRow for Decided {
    fn from_row(row: &tokio_postgres::Row) -> Result<Self> {
        Ok(Decided {
            requester: row.col("requester_id")?,
            job_id: row.col("job_id")?,
            tool: row.col("tool")?,
            input: row.col("input")?,
        })
    }
}

/// The account's in-progress card worked under job token `token_hash`, with the account's operator.
pub(crate) async fn worked_card(
    c: &impl GenericClient,
    account_id: AccountId,
    token_hash: &TokenHash,
) -> Result<Option<WorkedCard>> {
    c.query_opt(
        &format!(
            "select j.id, j.title, a.operator from jobs j join accounts a on a.id = j.account_id
             where j.job_token_hash = $1 and j.account_id = $2 and j.state = '{IN_PROGRESS}'"
        ),
        &[&token_hash, &account_id],
    )
    .await?
    .map(|row| WorkedCard::from_row(&row))
    .transpose()
}

impl FromRow for WorkedCard {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(WorkedCard { id: row.col("id")?, title: row.col("title")?, operator: row.col("operator")? })
    }
}

/// The inbox of the account's operator endpoint (`machine/handle`) as a recipient, while the
/// endpoint lives.
pub(crate) async fn operator_target(
    c: &impl GenericClient,
    account_id: AccountId,
    operator: &str,
) -> Result<Option<Target>> {
    c.query_opt(
        "select ea.id, ea.address, ea.account_id from endpoint_addresses ea join endpoints e on e.id = ea.id
         where ea.account_id = $1 and ea.machine || '/' || ea.handle = $2 and e.ended_at is null",
        &[&account_id, &operator],
    )
    .await?
    .map(|r| Target::from_row(&r))
    .transpose()
}

/// A permission request to record: `requester`, working card `job_id`, asks to use `tool` with
/// `input` (an excerpt).
pub(crate) struct NewApproval<'a> {
    pub id: &'a ApprovalId,
    pub account_id: AccountId,
    pub job_id: &'a JobId,
    pub requester: EndpointId,
    pub tool: &'a str,
    pub input: &'a str,
    pub state: ApprovalState,
}

/// Records a permission request.
pub(crate) async fn insert(c: &impl GenericClient, new: &NewApproval<'_>, wait_s: f64) -> Result<()> {
    c.execute(
        &format!(
            "insert into approvals (id, account_id, job_id, requester_id, tool, input, state, escalate_at, expire_at)
             values ($1, $2, $3, $4, $5, $6, $7,
                     case when $7 = '{PENDING}' then now() + make_interval(secs => $8::float8) end,
                     now() + make_interval(secs => 2 * $8::float8))"
        ),
        &[&new.id, &new.account_id, &new.job_id, &new.requester, &new.tool, &new.input, &new.state.as_db(), &wait_s],
    )
    .await?;
    Ok(())
}

/// The account's human inbox as a recipient, made on first use.
pub(crate) async fn human_target(c: &impl GenericClient, account_id: AccountId, account: &str) -> Result<Target> {
    let id = super::trust::ensure_human(c, account_id).await?;
    Ok(Target { id, address: format!("{account}/me"), account_id })
}

/// Puts a permission question in front of whoever must answer it, from the agent asking.
pub(crate) async fn ask(tx: &Transaction<'_>, asker: &Caller, target: Target, body: &str) -> Result<()> {
    // The question quotes the agent's (redacted) input: redacted again as a whole for storing.
    let body = redact(body).text;
    let out = Outgoing { kind: Kind::Ask, ..Outgoing::notice(&body) };
    super::messages::write_system(tx, asker, &[target], &out).await
}

/// The endpoint that asked, as the sender of its question.
pub(crate) async fn requester(c: &impl GenericClient, requester: EndpointId) -> Result<Caller> {
    super::identity::caller_of(c, requester).await
}

/// A request's last deadline, `wait` being the parameter that holds the wait in seconds (`$2`):
/// requests of the previous release carry none and expire twice the wait after they were made.
fn last_deadline(wait: &str) -> String {
    format!("coalesce(expire_at, created_at + make_interval(secs => 2 * {wait}::float8))")
}

/// The last deadline of a request that reaches the human now: the human has at least the whole
/// wait, however late it reaches them (no replica may have run when it fell due, or the operator
/// handed it on at the last moment).
fn human_deadline(wait: &str) -> String {
    format!("greatest({}, now() + make_interval(secs => {wait}::float8))", last_deadline(wait))
}

/// Hands request `id` to the human if it is still with the operator; as its asker sent it then,
/// `None` when it was not pending. The human has at least `wait_s` from now to answer.
pub(crate) async fn escalate(c: &impl GenericClient, id: &ApprovalId, wait_s: f64) -> Result<Option<Decided>> {
    c.query_opt(
        &format!(
            "update approvals set state = '{ESCALATED}', expire_at = {}
             where id = $1 and state = '{PENDING}'
             returning requester_id, job_id, tool, input",
            human_deadline("$2")
        ),
        &[&id, &wait_s],
    )
    .await?
    .map(|r| Decided::from_row(&r))
    .transpose()
}

/// Decides request `id` of the account as `verdict` says if it is still in one of the `open`
/// states; `None` when it was not. Handed to the human (`Escalated`), it gives them the whole
/// `wait_s`.
pub(crate) async fn decide(
    c: &impl GenericClient,
    account_id: AccountId,
    id: &ApprovalId,
    verdict: &Verdict<'_>,
    open: &[&str],
    wait_s: f64,
) -> Result<Option<Decided>> {
    let Verdict { state, reason, by } = verdict;
    c.query_opt(
        &format!(
            "update approvals set state = $3, reason = nullif($4, ''), decided_by = $5,
                                  decided_at = case when $3 in ('{ALLOW}', '{DENY}') then now() end,
                                  expire_at = case when $3 = '{ESCALATED}' then {} else expire_at end
             where id = $1 and account_id = $2 and state = any($6)
             returning requester_id, job_id, tool, input",
            human_deadline("$7")
        ),
        &[&id, &account_id, &state.as_db(), &reason.trim(), &by, &open, &wait_s],
    )
    .await?
    .map(|r| Decided::from_row(&r))
    .transpose()
}

/// The open states from which an answer decides a request: the human's answer also takes one
/// the operator has not given.
pub(crate) fn open_states(human: bool) -> Vec<&'static str> {
    if human { vec![PENDING, ESCALATED] } else { vec![PENDING] }
}

/// An open request whose deadline has passed.
pub(crate) struct Due {
    pub id: ApprovalId,
    pub account_id: AccountId,
    pub requester: EndpointId,
    /// With the human (past its last deadline: refuse it), or still with the operator (past its
    /// deadline: hand it to the human, even if the last one has passed too).
    pub with_human: bool,
    /// Past its last deadline.
    pub overdue: bool,
}

/// An open request past a deadline, of `approvals` as `a`, with `$1` the default wait in seconds
/// (the scheduler's probe reads the same).
pub(crate) fn request_due() -> String {
    format!(
        "a.state in ('{PENDING}', '{ESCALATED}')
         and ({} <= now()
              or (a.state = '{PENDING}' and coalesce(a.escalate_at, a.created_at + make_interval(secs => $1::float8)) <= now()))",
        last_deadline("$1")
    )
}

/// Open requests past a deadline, oldest first. Nothing is locked: what is done with each is
/// guarded by its state, so two replicas acting on one request act once. Requests without
/// deadlines (the previous release's) are due `wait_s` and twice `wait_s` after they were made.
pub(crate) async fn due(c: &impl GenericClient, wait_s: f64, limit: i64) -> Result<Vec<Due>> {
    let rows = c
        .query(
            &format!(
                "select id, account_id, requester_id, state = '{ESCALATED}' as with_human, {} <= now() as overdue
                 from approvals a
                 where {}
                 order by created_at
                 limit $2",
                last_deadline("$1"),
                request_due()
            ),
            &[&wait_s, &limit],
        )
        .await?;
    rows.iter().map(Due::from_row).collect()
}

impl FromRow for Due {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Due {
            id: row.col("id")?,
            account_id: row.col("account_id")?,
            requester: row.col("requester_id")?,
            with_human: row.col("with_human")?,
            overdue: row.col("overdue")?,
        })
    }
}

/// Wakes the requester's waiting call on whichever replica holds it (at commit).
pub(crate) async fn wake(c: &impl GenericClient, requester: EndpointId) -> Result<()> {
    c.execute("select pg_notify($1, $2)", &[&DELIVERY_CHANNEL, &format!("{requester}:0")]).await?;
    Ok(())
}

/// Refuses an open request for good: nobody answered in time. Whether it was still open and past its
/// last deadline (read again here: another replica may have handed it to the human since).
pub(crate) async fn expire(
    c: &impl GenericClient,
    account_id: AccountId,
    id: &ApprovalId,
    wait_s: f64,
) -> Result<bool> {
    let refused = c.execute(
        &format!(
            "update approvals set state = '{DENY}', reason = 'nobody answered in time; try another way or ask again later',
                                  decided_by = 'timeout', decided_at = now()
             where id = $1 and account_id = $3 and state in ('{PENDING}', '{ESCALATED}') and {} <= now()",
            last_deadline("$2")
        ),
        &[&id, &wait_s, &account_id],
    )
    .await?;
    Ok(refused == 1)
}

/// Where request `id` of the account stands.
pub(crate) async fn decision(
    c: &impl GenericClient,
    account_id: AccountId,
    id: &ApprovalId,
) -> Result<PermissionDecision> {
    let row = c
        .query_opt(
            "select state, coalesce(reason, '') as reason, coalesce(decided_by, '') as decided_by from approvals where id = $1 and account_id = $2",
            &[&id, &account_id],
        )
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Approval, format!("no permission request {id} in your account")))?;
    Ok(PermissionDecision {
        id: id.clone(),
        state: ApprovalState::from_db(row.col("state")?)?,
        reason: row.col("reason")?,
        decided_by: row.col("decided_by")?,
    })
}

/// The account's open requests, oldest first.
pub(crate) async fn open(c: &impl GenericClient, account_id: AccountId) -> Result<Vec<ApprovalView>> {
    c.query(
        &format!(
            "select a.id, a.state, a.job_id, ea.address as requester, a.tool, a.input from approvals a
             join endpoint_addresses ea on ea.id = a.requester_id
             where a.account_id = $1 and a.state in ('{PENDING}', '{ESCALATED}') order by a.created_at"
        ),
        &[&account_id],
    )
    .await?
    .iter()
    .map(ApprovalView::from_row)
    .collect()
}

impl FromRow for ApprovalView {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(ApprovalView {
            id: row.col("id")?,
            state: ApprovalState::from_db(row.col("state")?)?,
            job_id: row.col("job_id")?,
            requester: row.col("requester")?,
            tool: row.col("tool")?,
            input: row.col("input")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[tokio::test]
    async fn a_card_being_worked_names_its_operator_and_a_question_reaches_the_operator_or_the_human() {
        let db = testing::db().await;
        let (account, machine) = db.machine("acme", "laptop").await;
        let card = db.card(account, machine, "c1").await;
        let worker = db.endpoint(machine, "job-c1", 0).await;
        let lead = db.endpoint(machine, "lead", 0).await;
        let mut c = db.store.client().await.unwrap();
        let token = TokenHash::from_stored(b"job-token".to_vec());
        assert!(worked_card(&c, account, &token).await.unwrap().is_none(), "not claimed yet");
        let tx = c.transaction().await.unwrap();
        crate::store::board::claim_next(&tx, machine, 60.0, &token).await.unwrap();
        tx.commit().await.unwrap();
        crate::store::board::set_operator(&c, "acme", "laptop/lead").await.unwrap();
        let worked = worked_card(&c, account, &token).await.unwrap().expect("in progress under that token");
        assert_eq!((&worked.id, worked.operator.as_deref()), (&card, Some("laptop/lead")));
        let (other, _) = db.machine("globex", "box").await;
        assert!(worked_card(&c, other, &token).await.unwrap().is_none(), "only in its own account");

        let operator = operator_target(&c, account, "laptop/lead").await.unwrap().expect("a live operator");
        assert_eq!((operator.id, operator.address.as_str()), (lead, "acme/laptop/lead"));
        assert!(operator_target(&c, account, "laptop/nobody").await.unwrap().is_none());
        let human = human_target(&c, account, "acme").await.unwrap();
        assert_eq!(human.address, "acme/me");
        let asker = requester(&c, worker).await.unwrap();
        let tx = c.transaction().await.unwrap();
        ask(&tx, &asker, operator, "may I run the migration?").await.unwrap();
        ask(&tx, &asker, human.clone(), "may I run the migration?").await.unwrap();
        tx.commit().await.unwrap();
        for inbox in [lead, human.id] {
            let unread: i32 =
                c.query_one("select unread from endpoints where id = $1", &[&inbox]).await.unwrap().get(0);
            assert_eq!(unread, 1, "each asked once");
        }
        let kind: i16 = c.query_one("select kind from messages limit 1", &[]).await.unwrap().get(0);
        assert_eq!(kind, Kind::Ask.to_db());
    }

    #[tokio::test]
    async fn a_request_goes_to_the_human_once_is_decided_once_and_one_past_its_deadline_is_refused() {
        let db = testing::db().await;
        let (account, machine) = db.machine("acme", "laptop").await;
        let worker = db.endpoint(machine, "job-c1", 0).await;
        let card = db.card(account, machine, "c1").await;
        let c = db.store.client().await.unwrap();
        let ask = async |id: &ApprovalId| {
            let new = NewApproval {
                id,
                account_id: account,
                job_id: &card,
                requester: worker,
                tool: "Bash",
                input: "rm -rf build",
                state: ApprovalState::Pending,
            };
            insert(&c, &new, 60.0).await.unwrap();
        };
        let (first, second) = (ApprovalId::new("a1"), ApprovalId::new("a2"));
        ask(&first).await;
        let listed: Vec<(ApprovalId, ApprovalState)> =
            open(&c, account).await.unwrap().into_iter().map(|a| (a.id, a.state)).collect();
        assert_eq!(listed, [(first.clone(), ApprovalState::Pending)]);
        assert!(due(&c, 60.0, 10).await.unwrap().is_empty(), "nothing is past its deadline");

        let handed = escalate(&c, &first, 60.0).await.unwrap().expect("pending: handed to the human");
        assert_eq!((handed.requester, handed.tool.as_str(), &handed.job_id), (worker, "Bash", &card));
        assert!(escalate(&c, &first, 60.0).await.unwrap().is_none(), "handed on once");
        let allow = Verdict { state: ApprovalState::Allow, reason: " fine ", by: "pat" };
        assert!(
            decide(&c, account, &first, &allow, &open_states(false), 60.0).await.unwrap().is_none(),
            "no longer the operator's"
        );
        assert!(decide(&c, account, &first, &allow, &open_states(true), 60.0).await.unwrap().is_some());
        assert!(decide(&c, account, &first, &allow, &open_states(true), 60.0).await.unwrap().is_none(), "decided once");
        let decided = decision(&c, account, &first).await.unwrap();
        assert_eq!(
            (decided.state, decided.reason.as_str(), decided.decided_by.as_str()),
            (ApprovalState::Allow, "fine", "pat")
        );
        let (other, _) = db.machine("globex", "box").await;
        assert!(matches!(Error::from(decision(&c, other, &first).await.unwrap_err()), Error::NotFound { .. }));

        // One whose deadlines have passed: due and overdue, refused once.
        ask(&second).await;
        let moved = "update approvals set escalate_at = now() - interval '2 minutes', expire_at = now() - interval '1 minute' where id = 'a2'";
        db.test.sql().await.execute(moved, &[]).await.unwrap();
        let late: Vec<(ApprovalId, bool, bool)> =
            due(&c, 60.0, 10).await.unwrap().into_iter().map(|d| (d.id, d.with_human, d.overdue)).collect();
        assert_eq!(late, [(second.clone(), false, true)]);
        assert!(expire(&c, account, &second, 60.0).await.unwrap());
        assert!(!expire(&c, account, &second, 60.0).await.unwrap(), "refused once");
        let refused = decision(&c, account, &second).await.unwrap();
        assert_eq!((refused.state, refused.decided_by.as_str()), (ApprovalState::Deny, "timeout"));
        assert!(open(&c, account).await.unwrap().is_empty());
    }

    #[test]
    fn approval_states_are_the_ones_the_table_allows() {
        let table = include_str!("../../migrations/0005_approvals.sql");
        let all: Vec<String> = ApprovalState::ALL.iter().map(|s| format!("'{s}'")).collect();
        assert!(table.contains(&format!("check (state in ({}))", all.join(", "))), "{all:?}");
        assert!(table.contains(&format!("where state in ('{PENDING}', '{ESCALATED}');")));
    }
}
