//! Trust: the human inbox, private data, holds for the human, required replies and peek.

use deadpool_postgres::GenericClient;

use super::Store;
use super::error::Col;
use super::identity::{Caller, caller_of};
use super::messages::{Outgoing, Target, WITHDRAWN};
use crate::domain::address::HUMAN;
use crate::domain::caller::Human;
use crate::domain::delivery::Kind;
use crate::domain::ids;
use crate::domain::ids::{AccountId, EndpointId};
use crate::domain::message::Message;
use crate::domain::redact::{RedactedText, redact};
use crate::domain::trust::{Hold as HoldView, HoldState, Peek as PeekView, PeekTurn, Peeker as PeekerView};
use crate::domain::{EntityKind, Error, Result};

/// One turn of an agent's conversation, kept for peeking.
pub struct KeptTurn {
    pub role: RedactedText,
    pub text: RedactedText,
    /// Names of the tools the turn used.
    pub tools: Vec<RedactedText>,
}

/// Hold classes an account can turn on.
pub const HOLD_CLASSES: [&str; 2] = ["private-outbound", "contact"];
/// Most turns a peek keeps and returns.
pub const MAX_PEEK_TURNS: usize = 10;

/// Hold states as SQL text spells them: literals in the text, where the partial index
/// `holds_pending` (migration 4) needs them.
pub(super) const HOLD_PENDING: &str = HoldState::Pending.as_db();
pub(super) const HOLD_REJECTED: &str = HoldState::Rejected.as_db();

impl Store {
    /// The human as a sender and recipient, with the same guarantees as any endpoint.
    pub async fn human_caller(&self, human: &Human) -> Result<Caller> {
        let client = self.client().await?;
        let id = ensure_human(&client, human.account_id).await?;
        caller_of(&client, id).await
    }

    pub async fn hold_policy(&self, human: &Human, class: &str, on: bool) -> Result<Vec<String>> {
        if !HOLD_CLASSES.contains(&class) {
            return Err(Error::invalid(format!("unknown hold class {class:?}: use {}", HOLD_CLASSES.join(" or "))));
        }
        let client = self.client().await?;
        let row = client
            .query_one(
                "update accounts set hold_classes = case when $3 then array(select distinct unnest(hold_classes || $2::text))
                                                       else array_remove(hold_classes, $2) end
                 where id = $1 returning hold_classes",
                &[&human.account_id, &class, &on],
            )
            .await?;
        self.scope_changed();
        row.col(0)
    }

    pub async fn contact_private(&self, human: &Human, other: &str, on: bool) -> Result<()> {
        let client = self.client().await?;
        let updated = client
            .execute(
                "update contacts c set private_ok = $3 from accounts o
                 where o.name = $2 and c.account_a = least($1::bigint, o.id) and c.account_b = greatest($1::bigint, o.id)",
                &[&human.account_id, &other, &on],
            )
            .await?;
        if updated == 0 {
            return Err(Error::not_found(
                EntityKind::Contact,
                format!("{} and {other} are not contacts", human.account),
            ));
        }
        self.scope_changed();
        Ok(())
    }

    pub async fn holds(&self, human: &Human, all: bool) -> Result<Vec<HoldView>> {
        holds_on(&self.client().await?, human, all).await
    }

    /// Releases (delivers) or rejects a held message; its sender hears the outcome from the human.
    pub async fn decide_hold(&self, human: &Human, id: &str, release: bool, reason: &RedactedText) -> Result<HoldView> {
        let reason = reason.as_str();
        let me = self.human_caller(human).await?;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "select h.message_id, h.recipients, h.state, m.sender_id, s.address
                 from holds h join messages m on m.id = h.message_id join endpoint_addresses s on s.id = m.sender_id
                 where h.id = $1 and h.account_id = $2 for update of h",
                &[&id.trim(), &human.account_id],
            )
            .await?
            .ok_or_else(|| {
                Error::not_found(EntityKind::Hold, format!("no hold {id} in your account: holds lists them"))
            })?;
        let (message_id, recipients, sender_id, sender): (String, Vec<EndpointId>, EndpointId, String) =
            (row.col(0)?, row.col(1)?, row.col(3)?, row.col(4)?);
        let state = HoldState::from_db(row.col(2)?)?;
        if state != HoldState::Pending {
            return Err(Error::FailedPrecondition(format!("hold {id} was already {state}")));
        }
        if !release && reason.trim().is_empty() {
            return Err(Error::invalid("rejecting a hold needs a reason: the sender reads it"));
        }
        // The recipients' inboxes and the sender's (it gets the notice), all before writing any.
        super::messages::lock_inboxes(&tx, recipients.iter().copied().chain([sender_id]).collect()).await?;
        if release {
            let targets = still_reachable(&tx, sender_id, &message_id, &recipients).await?;
            super::messages::deliver(&tx, &message_id, &targets).await?;
        }
        let decided = if release { HoldState::Released } else { HoldState::Rejected };
        tx.execute(
            "update holds set state = $2, reason = nullif($3, ''), decided_at = now(), decided_by = $4 where id = $1",
            &[&id.trim(), &decided.as_db(), &reason.trim(), &human.name],
        )
        .await?;
        let short = &message_id[..8];
        let body = if release {
            format!("Your held message {short} was released by your account's human and delivered.")
        } else {
            format!(
                "Your held message {short} was rejected by your account's human and delivered to nobody: {}",
                reason.trim()
            )
        };
        let body = redact(&body).text;
        let notice = Outgoing {
            to: &[],
            body: &body,
            thread: None,
            kind: Kind::Message,
            client_id: None,
            private: false,
            require_reply: false,
        };
        let target = [Target { id: sender_id, address: sender, account_id: human.account_id }];
        super::messages::store_message(&tx, &me, &target, &notice, None).await?;
        let view = holds_on(&tx, human, true).await?.into_iter().find(|h| h.id == id.trim());
        tx.commit().await?;
        view.ok_or_else(|| Error::Internal("the decided hold vanished".into()))
    }

    /// Asks to the caller that require a reply it has not given yet, and that it can still answer:
    /// an asker whose machine was revoked, or whose account is out of reach (a contact dropped), can
    /// never get the reply. An ended asker can.
    pub async fn pending_replies(&self, caller: &Caller) -> Result<Vec<Message>> {
        let client = self.client().await?;
        let mut reach = super::identity::contact_accounts(&client, caller.account_id).await?;
        reach.push(caller.account_id);
        let rows = client
            .query(
                &format!(
                    "select m.id, s.address, m.body, m.thread from deliveries d
                     join messages m on m.id = d.message_id join endpoint_addresses s on s.id = m.sender_id
                     join machines sm on sm.id = s.machine_id
                     where d.recipient_id = $1 and m.require_reply and d.state <> {WITHDRAWN}
                       and sm.revoked_at is null and s.account_id = any($2)
                       and not exists (select 1 from messages r where r.reply_to = m.id and r.sender_id = $1)
                     order by d.seq"
                ),
                &[&caller.endpoint_id, &reach],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Message {
                    id: r.col(0)?,
                    seq: 0,
                    from: r.col(1)?,
                    thread: r.col(3)?,
                    kind: Kind::Ask,
                    body: r.col(2)?,
                    reply_to: String::new(),
                    sent_at_ms: 0,
                    relation: String::new(),
                    require_reply: true,
                    private: false,
                })
            })
            .collect()
    }

    // ---- peek --------------------------------------------------------------------------------

    /// Turning peek off deletes what was kept.
    pub async fn set_peek(&self, caller: &Caller, on: bool) -> Result<()> {
        let client = self.client().await?;
        client.execute("update endpoints set peek_on = $2 where id = $1", &[&caller.endpoint_id, &on]).await?;
        if !on {
            client.execute("delete from peek_turns where endpoint_id = $1", &[&caller.endpoint_id]).await?;
        }
        Ok(())
    }

    /// Keeps the caller's last turns, only while it allows peeking.
    pub async fn put_peek_turns(&self, caller: &Caller, turns: &[KeptTurn], append: bool) -> Result<bool> {
        let new: Vec<serde_json::Value> = turns
            .iter()
            .map(|t| {
                let tools: Vec<&str> = t.tools.iter().map(RedactedText::as_str).collect();
                serde_json::json!({ "role": t.role.as_str(), "text": t.text.as_str(), "tools": tools })
            })
            .collect();
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let mut all = Vec::new();
        if append {
            let kept: Option<serde_json::Value> = tx
                .query_opt("select turns from peek_turns where endpoint_id = $1 for update", &[&caller.endpoint_id])
                .await?
                .map(|r| r.col(0))
                .transpose()?;
            all.extend(kept.and_then(|v| v.as_array().cloned()).unwrap_or_default());
        }
        all.extend(new);
        let start = all.len().saturating_sub(MAX_PEEK_TURNS);
        let stored = tx
            .execute(
                "insert into peek_turns (endpoint_id, turns, updated_at)
                 select id, $2, now() from endpoints where id = $1 and peek_on
                 on conflict (endpoint_id) do update set turns = excluded.turns, updated_at = now()",
                &[&caller.endpoint_id, &serde_json::Value::Array(all.split_off(start))],
            )
            .await?;
        tx.commit().await?;
        Ok(stored == 1)
    }

    /// The target's last turns, for a caller that may message it, when the target allows it.
    pub async fn peek(&self, caller: &Caller, endpoint: &str, turns: usize) -> Result<PeekView> {
        let client = self.client().await?;
        let (target, address) = super::scope::messageable(&client, caller, endpoint).await?;
        let address = address.as_str();
        let row = client
            .query_one(
                "select e.peek_on, p.turns, p.updated_at from endpoints e left join peek_turns p on p.endpoint_id = e.id
                 where e.id = $1",
                &[&target],
            )
            .await?;
        if !row.col::<bool>(0)? {
            return Err(Error::PermissionDenied(format!(
                "{address} does not allow peeking (relay_set_peek turns it on)"
            )));
        }
        let stored: Option<serde_json::Value> = row.col(1)?;
        let all: Vec<PeekTurn> = stored
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|t| PeekTurn {
                role: t["role"].as_str().unwrap_or_default().to_owned(),
                text: t["text"].as_str().unwrap_or_default().to_owned(),
                tools: t["tools"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
                    .unwrap_or_default(),
            })
            .collect();
        let shown: Vec<PeekTurn> = all.iter().rev().take(turns.clamp(1, MAX_PEEK_TURNS)).rev().cloned().collect();
        client
            .execute(
                "insert into peeks (target_id, peeker, turns) values ($1, $2, $3)",
                &[&target, &caller.address(), &(shown.len() as i32)],
            )
            .await?;
        let updated: Option<chrono::DateTime<chrono::Utc>> = row.col(2)?;
        Ok(PeekView {
            endpoint: address.to_owned(),
            turns: shown,
            updated_at: updated.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)).unwrap_or_default(),
        })
    }

    /// Who peeked at the caller, newest first.
    pub async fn peekers(&self, caller: &Caller) -> Result<Vec<PeekerView>> {
        let client = self.client().await?;
        client
            .query(
                "select peeker, at, turns from peeks where target_id = $1 order by at desc limit 50",
                &[&caller.endpoint_id],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(PeekerView {
                    by: r.col(0)?,
                    at: r.col::<chrono::DateTime<chrono::Utc>>(1)?.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    turns: r.col::<i32>(2)? as u32,
                })
            })
            .collect()
    }
}

/// The account's human endpoint (`account/me`), made on first use.
pub(crate) async fn ensure_human(c: &impl GenericClient, account_id: AccountId) -> Result<EndpointId> {
    ensure_reserved(c, account_id, HUMAN).await
}

/// An endpoint `handle` on the account's reserved machine `me` (the human inbox, the board's
/// sender), made on first use. The reserved machine can never authenticate: its token hash is of
/// random bytes nobody has.
pub(crate) async fn ensure_reserved(c: &impl GenericClient, account_id: AccountId, handle: &str) -> Result<EndpointId> {
    // Found by a read: an upsert would lock the inbox's row and, as an update of `handle`,
    // announce a scope change to every replica on each use.
    let find = c
        .prepare_cached(
            "select e.id from endpoints e join machines m on m.id = e.machine_id
             where m.account_id = $1 and m.name = $2 and e.handle = $3",
        )
        .await?;
    if let Some(row) = c.query_opt(&find, &[&account_id, &HUMAN, &handle]).await? {
        return row.col(0);
    }
    let unusable = ids::token_hash(&ids::new_token(ids::TokenKind::Machine));
    c.execute(
        "insert into machines (account_id, name, token_hash) values ($1, $2, $3) on conflict (account_id, name) do nothing",
        &[&account_id, &HUMAN, &unusable],
    )
    .await?;
    // A concurrent first use may win the insert; either way the endpoint exists after it.
    c.execute(
        "insert into endpoints (machine_id, handle, harness)
         select id, $3, 'other' from machines where account_id = $1 and name = $2
         on conflict (machine_id, handle) do nothing",
        &[&account_id, &HUMAN, &handle],
    )
    .await?;
    c.query_one(&find, &[&account_id, &HUMAN, &handle]).await?.col(0)
}

/// Refuses private data for any target outside the sender's account whose contact does not
/// allow private data.
pub(crate) async fn check_private(c: &impl GenericClient, caller: &Caller, targets: &[Target]) -> Result<()> {
    let outside: Vec<&Target> = targets.iter().filter(|t| t.account_id != caller.account_id).collect();
    if outside.is_empty() {
        return Ok(());
    }
    let allowed: Vec<AccountId> = c
        .query(
            "select case when account_a = $1 then account_b else account_a end from contacts
             where (account_a = $1 or account_b = $1) and private_ok",
            &[&caller.account_id],
        )
        .await?
        .iter()
        .map(|r| r.col(0))
        .collect::<Result<_>>()?;
    let refused: Vec<&str> =
        outside.iter().filter(|t| !allowed.contains(&t.account_id)).map(|t| t.address.as_str()).collect();
    if refused.is_empty() {
        return Ok(());
    }
    Err(Error::PermissionDenied(format!(
        "private data may not leave account {} for {}: that contact does not allow private data (the accounts' humans can allow it); nothing was sent",
        caller.account,
        refused.join(", ")
    )))
}

/// Refuses private data that may not reach a target, and says which hold class, if any, keeps
/// the message for the sender's human. The human's own messages are never held.
pub(crate) async fn hold_class(
    c: &impl GenericClient,
    caller: &Caller,
    targets: &[Target],
    private: bool,
) -> Result<Option<&'static str>> {
    if private {
        check_private(c, caller, targets).await?;
    }
    let outside = targets.iter().any(|t| t.account_id != caller.account_id);
    if caller.machine == HUMAN || !outside {
        return Ok(None);
    }
    let stmt = c.prepare_cached("select hold_classes from accounts where id = $1").await?;
    let classes: Vec<String> = c.query_one(&stmt, &[&caller.account_id]).await?.col(0)?;
    let has = |class: &str| classes.iter().any(|c| c == class);
    Ok(if private && has("private-outbound") {
        Some("private-outbound")
    } else if has("contact") {
        Some("contact")
    } else {
        None
    })
}

/// Keeps a stored message from everyone until the human decides.
pub(crate) async fn hold(
    c: &impl GenericClient,
    caller: &Caller,
    message_id: &str,
    class: &str,
    targets: &[Target],
) -> Result<String> {
    let id = format!("h{}", &ids::new_message_id()[..9]);
    let recipients: Vec<EndpointId> = targets.iter().map(|t| t.id).collect();
    c.execute(
        "insert into holds (id, account_id, message_id, class, recipients) values ($1, $2, $3, $4, $5)",
        &[&id, &caller.account_id, &message_id, &class, &recipients],
    )
    .await?;
    Ok(id)
}

async fn holds_on(client: &impl deadpool_postgres::GenericClient, human: &Human, all: bool) -> Result<Vec<HoldView>> {
    let rows = client
        .query(
            &format!(
                "select h.id, h.class, h.state, coalesce(h.reason, ''), s.address, m.body, m.id,
                        array(select address from endpoint_addresses where id = any(h.recipients) order by address)
                 from holds h join messages m on m.id = h.message_id join endpoint_addresses s on s.id = m.sender_id
                 where h.account_id = $1 and ($2 or h.state = '{HOLD_PENDING}') order by h.created_at"
            ),
            &[&human.account_id, &all],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(HoldView {
                id: r.col(0)?,
                class: r.col(1)?,
                state: HoldState::from_db(r.col(2)?)?,
                reason: r.col(3)?,
                from: r.col(4)?,
                body: r.col(5)?,
                message_id: r.col(6)?,
                to: r.col(7)?,
            })
        })
        .collect()
}

/// A held message's recipients, checked again as a send would be now: reach, rules, private
/// data and revoked machines may all have changed while it waited. A recipient whose session
/// ended meanwhile still gets it, as it would a send.
async fn still_reachable(
    c: &impl GenericClient,
    sender_id: EndpointId,
    message_id: &str,
    recipients: &[EndpointId],
) -> Result<Vec<Target>> {
    let caller = caller_of(c, sender_id).await?;
    let rows = c
        .query(
            "select ea.id, ea.address, ea.account_id, m.revoked_at is null
             from endpoint_addresses ea join endpoints e on e.id = ea.id join machines m on m.id = e.machine_id
             where ea.id = any($1)",
            &[&recipients],
        )
        .await?;
    let contacts = super::identity::contact_accounts(c, caller.account_id).await?;
    let verdicts = super::scope::decide_many(c, &caller, &contacts, recipients).await?;
    let mut targets = Vec::new();
    let mut refused = Vec::new();
    for row in &rows {
        let target = Target { id: row.col(0)?, address: row.col(1)?, account_id: row.col(2)? };
        let why = if !row.col::<bool>(3)? {
            Some("its machine was revoked".to_owned())
        } else {
            verdicts.get(&target.id).and_then(|v| v.refusal().map(str::to_owned))
        };
        match why {
            Some(why) => refused.push(format!("{}: {why}", target.address)),
            None => targets.push(target),
        }
    }
    let private: bool = c.query_one("select private from messages where id = $1", &[&message_id]).await?.col(0)?;
    if private {
        check_private(c, &caller, &targets).await?;
    }
    if !refused.is_empty() {
        return Err(Error::FailedPrecondition(format!(
            "it can no longer be delivered as it was sent ({}): reject it instead",
            refused.join("; ")
        )));
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_states_are_the_ones_the_table_allows() {
        let table = include_str!("../../migrations/0004_trust.sql");
        let all: Vec<String> = HoldState::ALL.iter().map(|s| format!("'{s}'")).collect();
        assert!(table.contains(&format!("check (state in ({}))", all.join(", "))), "{all:?}");
        assert!(table.contains(&format!("where state = '{HOLD_PENDING}';")));
    }
}
