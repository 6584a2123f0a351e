//! Trust: the human inbox, private data, holds for the human, required replies and peek.

use deadpool_postgres::GenericClient;

use super::identity::caller_of;
use super::messages::{Target, WITHDRAWN};
use super::row::{Col, FromRow};
use crate::domain::Error;
use crate::domain::caller::Caller;
use crate::domain::caller::Human;
use crate::domain::delivery::Kind;
use crate::domain::ids;
use crate::domain::ids::{AccountId, EndpointId, HoldId, MessageId, Seq};
use crate::domain::message::Message;
use crate::domain::names::HUMAN;
use crate::domain::redact::RedactedText;
use crate::domain::trust::{
    HeldMessage, Hold as HoldView, HoldState, MAX_PEEK_TURNS, PeekState, PeekTurn, Peeker as PeekerView,
};
use crate::store::Result;
use crate::store::Tx;
use tokio_postgres::Row;

/// One turn of an agent's conversation, kept for peeking.
pub struct KeptTurn {
    pub role: RedactedText,
    pub text: RedactedText,
    /// Names of the tools the turn used.
    pub tools: Vec<RedactedText>,
}

/// Hold states as SQL text spells them: literals in the text, where the partial index
/// `holds_pending` (migration 4) needs them.
pub(super) const HOLD_PENDING: &str = HoldState::Pending.as_db();
pub(super) const HOLD_REJECTED: &str = HoldState::Rejected.as_db();

/// The account's human endpoint as a sender and recipient, with the same guarantees as any
/// endpoint; made on first use (see [`ensure_human`]).
pub(crate) async fn human_caller(c: &impl GenericClient, account_id: AccountId) -> Result<Caller> {
    let id = ensure_human(c, account_id).await?;
    caller_of(c, id).await
}

/// Adds `class` to the account's hold classes, or removes it; the classes held after.
pub(crate) async fn set_hold_class(
    c: &impl GenericClient,
    account_id: AccountId,
    class: &str,
    on: bool,
) -> Result<Vec<String>> {
    let row = c
        .query_one(
            "update accounts set hold_classes = case when $3 then array(select distinct unnest(hold_classes || $2::text))
                                                   else array_remove(hold_classes, $2) end
             where id = $1 returning hold_classes",
            &[&account_id, &class, &on],
        )
        .await?;
    row.only()
}

/// Allows or forbids private data across the contact between the account and the account named
/// `other`; how many contacts it changed (0 when they are not contacts).
pub(crate) async fn set_private_ok(
    c: &impl GenericClient,
    account_id: AccountId,
    other: &str,
    on: bool,
) -> Result<u64> {
    Ok(c.execute(
        "update contacts c set private_ok = $3 from accounts o
         where o.name = $2 and c.account_a = least($1::bigint, o.id) and c.account_b = greatest($1::bigint, o.id)",
        &[&account_id, &other, &on],
    )
    .await?)
}

/// The account's hold `id` with its message's sender, locking the hold's row; `None` when the
/// account has no such hold.
pub(crate) async fn lock_hold(c: &Tx<'_>, account_id: AccountId, id: &HoldId) -> Result<Option<HeldMessage>> {
    let Some(row) = c
        .query_opt(
            "select h.message_id, h.recipients, h.state, h.class, m.thread, m.sender_id, s.address as sender
             from holds h join messages m on m.id = h.message_id join endpoint_addresses s on s.id = m.sender_id
             where h.id = $1 and h.account_id = $2 for update of h",
            &[&id, &account_id],
        )
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(HeldMessage::from_row(&row)?))
}

impl FromRow for HeldMessage {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(HeldMessage {
            message_id: row.col("message_id")?,
            recipients: row.col("recipients")?,
            state: HoldState::from_db(row.col("state")?)?,
            sender_id: row.col("sender_id")?,
            sender: row.col("sender")?,
            class: row.col("class")?,
            thread: row.col("thread")?,
        })
    }
}

/// Records the human's decision on hold `id`; an empty reason is stored as none.
pub(crate) async fn set_decision(
    c: &impl GenericClient,
    id: &HoldId,
    decided: HoldState,
    reason: &str,
    decided_by: &str,
) -> Result<()> {
    c.execute(
        "update holds set state = $2, reason = nullif($3, ''), decided_at = now(), decided_by = $4 where id = $1",
        &[&id, &decided.as_db(), &reason, &decided_by],
    )
    .await?;
    Ok(())
}

/// Asks delivered to `endpoint_id` that require a reply it has not given yet, from senders of the
/// accounts in `reach` whose machines are not revoked, in inbox order.
pub(crate) async fn unanswered_asks(
    c: &impl GenericClient,
    endpoint_id: EndpointId,
    reach: &[AccountId],
) -> Result<Vec<Message>> {
    let rows = c
        .query(
            &format!(
                "select m.id, s.address as sender, m.body, m.thread from deliveries d
                 join messages m on m.id = d.message_id join endpoint_addresses s on s.id = m.sender_id
                 join machines sm on sm.id = s.machine_id
                 where d.recipient_id = $1 and m.require_reply and d.state <> {WITHDRAWN}
                   and sm.revoked_at is null and s.account_id = any($2)
                   and not exists (select 1 from messages r where r.reply_to = m.id and r.sender_id = $1)
                 order by d.seq"
            ),
            &[&endpoint_id, &reach],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Message {
                id: r.col("id")?,
                seq: Seq(0),
                from: r.col("sender")?,
                thread: r.col("thread")?,
                kind: Kind::Ask,
                body: r.col("body")?,
                reply_to: None,
                sent_at_ms: 0,
                relation: String::new(),
                require_reply: true,
                private: false,
                attachments: Vec::new(),
                post: None,
            })
        })
        .collect()
}

// ---- peek ------------------------------------------------------------------------------------

/// Sets whether the endpoint allows peeking.
pub(crate) async fn set_peek_on(c: &impl GenericClient, endpoint_id: EndpointId, on: bool) -> Result<()> {
    c.execute("update endpoints set peek_on = $2 where id = $1", &[&endpoint_id, &on]).await?;
    Ok(())
}

/// Deletes the turns kept of the endpoint.
pub(crate) async fn delete_peek_turns(c: &impl GenericClient, endpoint_id: EndpointId) -> Result<()> {
    c.execute("delete from peek_turns where endpoint_id = $1", &[&endpoint_id]).await?;
    Ok(())
}

/// Keeps the endpoint's last [`MAX_PEEK_TURNS`] turns: `turns` after those kept (read and
/// locked first) when `append`, else `turns` alone. Written only while the endpoint allows
/// peeking; whether they were.
pub(crate) async fn keep_peek_turns(
    tx: &Tx<'_>,
    endpoint_id: EndpointId,
    turns: &[KeptTurn],
    append: bool,
) -> Result<bool> {
    let new: Vec<serde_json::Value> = turns
        .iter()
        .map(|t| {
            let tools: Vec<&str> = t.tools.iter().map(RedactedText::as_str).collect();
            serde_json::json!({ "role": t.role.as_str(), "text": t.text.as_str(), "tools": tools })
        })
        .collect();
    let mut all = Vec::new();
    if append {
        let kept: Option<serde_json::Value> = tx
            .query_opt("select turns from peek_turns where endpoint_id = $1 for update", &[&endpoint_id])
            .await?
            .map(|r| r.only())
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
            &[&endpoint_id, &serde_json::Value::Array(all.split_off(start))],
        )
        .await?;
    Ok(stored == 1)
}

/// Whether the endpoint allows peeking, and the turns it keeps.
pub(crate) async fn peek_state(c: &impl GenericClient, endpoint_id: EndpointId) -> Result<PeekState> {
    let row = c
        .query_one(
            "select e.peek_on, p.turns, p.updated_at from endpoints e left join peek_turns p on p.endpoint_id = e.id
             where e.id = $1",
            &[&endpoint_id],
        )
        .await?;
    let stored: Option<serde_json::Value> = row.col("turns")?;
    let turns = stored
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
    let updated: Option<chrono::DateTime<chrono::Utc>> = row.col("updated_at")?;
    Ok(PeekState { peek_on: row.col("peek_on")?, turns, updated_at: updated })
}

/// Records that `peeker` saw `turns` turns of the endpoint.
pub(crate) async fn insert_peek(c: &impl GenericClient, target: EndpointId, peeker: &str, turns: usize) -> Result<()> {
    c.execute("insert into peeks (target_id, peeker, turns) values ($1, $2, $3)", &[&target, &peeker, &(turns as i32)])
        .await?;
    Ok(())
}

/// Who peeked at the endpoint, newest first (the last 50).
pub(crate) async fn peekers(c: &impl GenericClient, endpoint_id: EndpointId) -> Result<Vec<PeekerView>> {
    c.query("select peeker, at, turns from peeks where target_id = $1 order by at desc limit 50", &[&endpoint_id])
        .await?
        .iter()
        .map(PeekerView::from_row)
        .collect()
}

impl FromRow for PeekerView {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(PeekerView { by: row.col("peeker")?, at: row.col("at")?, turns: row.col::<i32>("turns")? as u32 })
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
        return row.only();
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
    c.query_one(&find, &[&account_id, &HUMAN, &handle]).await?.only()
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
        .map(|r| r.only())
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
    )).into())
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
    let classes: Vec<String> = c.query_one(&stmt, &[&caller.account_id]).await?.only()?;
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
    message_id: &MessageId,
    class: &str,
    targets: &[Target],
) -> Result<HoldId> {
    let id = HoldId::new(format!("h{}", ids::random_text(9)));
    let recipients: Vec<EndpointId> = targets.iter().map(|t| t.id).collect();
    c.execute(
        "insert into holds (id, account_id, message_id, class, recipients) values ($1, $2, $3, $4, $5)",
        &[&id, &caller.account_id, &message_id, &class, &recipients],
    )
    .await?;
    Ok(id)
}

/// The account's holds, pending ones only unless `all`, oldest first.
pub(crate) async fn holds_on(client: &impl GenericClient, human: &Human, all: bool) -> Result<Vec<HoldView>> {
    let rows = client
        .query(
            &format!(
                "select h.id, h.class, h.state, coalesce(h.reason, '') as reason, s.address as sender, m.body,
                        m.id as message_id, {files},
                        array(select address from endpoint_addresses where id = any(h.recipients) order by address)
                            as recipients
                 from holds h join messages m on m.id = h.message_id join endpoint_addresses s on s.id = m.sender_id
                 where h.account_id = $1 and ($2 or h.state = '{HOLD_PENDING}') order by h.created_at",
                files = super::messages::files_column!("m.id")
            ),
            &[&human.account_id, &all],
        )
        .await?;
    rows.iter().map(HoldView::from_row).collect()
}

impl FromRow for HoldView {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(HoldView {
            id: row.col("id")?,
            class: row.col("class")?,
            state: HoldState::from_db(row.col("state")?)?,
            reason: row.col("reason")?,
            from: row.col("sender")?,
            body: row.col("body")?,
            message_id: row.col("message_id")?,
            to: row.col("recipients")?,
            files: super::messages::files(row.col("files")?)?,
        })
    }
}

/// A held message's recipients, checked again as a send would be now: reach, rules, private
/// data and revoked machines may all have changed while it waited. A recipient whose session
/// ended meanwhile still gets it, as it would a send.
pub(crate) async fn still_reachable(
    c: &impl GenericClient,
    sender_id: EndpointId,
    message_id: &MessageId,
    recipients: &[EndpointId],
) -> Result<Vec<Target>> {
    let caller = caller_of(c, sender_id).await?;
    let rows = c
        .query(
            "select ea.id, ea.address, ea.account_id, m.revoked_at is null as live
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
        let target = Target::from_row(row)?;
        let why = if !row.col::<bool>("live")? {
            Some("its machine was revoked".to_owned())
        } else {
            verdicts.get(&target.id).and_then(|v| v.refusal().map(str::to_owned))
        };
        match why {
            Some(why) => refused.push(format!("{}: {why}", target.address)),
            None => targets.push(target),
        }
    }
    let private: bool = c.query_one("select private from messages where id = $1", &[&message_id]).await?.only()?;
    if private {
        check_private(c, &caller, &targets).await?;
    }
    if !refused.is_empty() {
        return Err(Error::FailedPrecondition(format!(
            "it can no longer be delivered as it was sent ({}): reject it instead",
            refused.join("; ")
        ))
        .into());
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::trust::MAX_PEEK_TURNS;
    use crate::store::testing;

    fn turn(text: &str) -> KeptTurn {
        let text = RedactedText::from_agent(text);
        KeptTurn {
            role: RedactedText::from_agent("assistant"),
            text,
            tools: vec![RedactedText::from_agent("relay_send")],
        }
    }

    fn texts(state: &PeekState) -> Vec<&str> {
        state.turns.iter().map(|t| t.text.as_str()).collect()
    }

    #[tokio::test]
    async fn turns_are_kept_only_while_peeking_is_allowed_and_only_the_last_ones() {
        let db = testing::db().await;
        let (_, machine) = db.machine("acme", "laptop").await;
        let endpoint = db.endpoint(machine, "claude-1", 0).await;
        let mut c = db.store.client().await.unwrap();

        let tx = c.transaction().await.unwrap();
        assert!(!keep_peek_turns(&tx, endpoint, &[turn("unseen")], false).await.unwrap(), "not while peeking is off");
        tx.commit().await.unwrap();
        let state = peek_state(&c, endpoint).await.unwrap();
        assert!(!state.peek_on && state.turns.is_empty() && state.updated_at.is_none());

        set_peek_on(&c, endpoint, true).await.unwrap();
        let first: Vec<KeptTurn> = (0..MAX_PEEK_TURNS - 1).map(|i| turn(&format!("t{i}"))).collect();
        let tx = c.transaction().await.unwrap();
        assert!(keep_peek_turns(&tx, endpoint, &first, false).await.unwrap());
        assert!(keep_peek_turns(&tx, endpoint, &[turn("x"), turn("y")], true).await.unwrap());
        tx.commit().await.unwrap();
        let state = peek_state(&c, endpoint).await.unwrap();
        assert_eq!(state.turns.len(), MAX_PEEK_TURNS, "only the last ones are kept");
        assert_eq!(texts(&state).first(), Some(&"t1"), "the oldest went first");
        assert_eq!(texts(&state).last(), Some(&"y"));
        assert_eq!(
            (state.turns[0].role.as_str(), state.turns[0].tools.as_slice()),
            ("assistant", &["relay_send".to_owned()][..])
        );

        let tx = c.transaction().await.unwrap();
        assert!(keep_peek_turns(&tx, endpoint, &[turn("alone")], false).await.unwrap(), "without append, replaced");
        tx.commit().await.unwrap();
        assert_eq!(texts(&peek_state(&c, endpoint).await.unwrap()), ["alone"]);
        delete_peek_turns(&c, endpoint).await.unwrap();
        let state = peek_state(&c, endpoint).await.unwrap();
        assert!(state.peek_on && state.turns.is_empty(), "deleted, and peeking still allowed");
    }

    #[tokio::test]
    async fn an_accounts_human_inbox_is_made_once_and_found_after() {
        let db = testing::db().await;
        let (account, _) = db.machine("acme", "laptop").await;
        let c = db.store.client().await.unwrap();
        let made = ensure_human(&c, account).await.unwrap();
        assert_eq!(ensure_human(&c, account).await.unwrap(), made, "the same inbox the second time");
        assert_eq!(human_caller(&c, account).await.unwrap().endpoint_id, made, "the human's caller is that inbox");
        let (other, _) = db.machine("globex", "box").await;
        assert_ne!(ensure_human(&c, other).await.unwrap(), made, "each account has its own");
    }

    #[tokio::test]
    async fn a_hold_keeps_its_message_for_its_own_account_until_decided_then_lists_only_when_asked_for_all() {
        use crate::domain::ids::ReplicaId;
        use crate::store::messages::{Outgoing, write};

        let db = testing::db().await;
        let (acme, machine) = db.machine("acme", "laptop").await;
        let (ann, bob) = (db.endpoint(machine, "ann", 0).await, db.endpoint(machine, "bob", 0).await);
        let (globex, _) = db.machine("globex", "box").await;
        let mut c = db.store.client().await.unwrap();
        assert_eq!(set_hold_class(&c, acme, "contact", true).await.unwrap(), ["contact"]);
        let sender = caller_of(&c, ann).await.unwrap();
        let outside = Target { id: bob, address: "globex/box/bob".into(), account_id: globex };
        let inside = Target { id: bob, address: "acme/laptop/bob".into(), account_id: acme };
        assert_eq!(hold_class(&c, &sender, std::slice::from_ref(&outside), false).await.unwrap(), Some("contact"));
        assert_eq!(hold_class(&c, &sender, std::slice::from_ref(&inside), false).await.unwrap(), None);

        // Written as the send path writes a held message: by the writer, to nobody yet, beside its hold.
        let body = RedactedText::from_agent("may I deploy?");
        let out = Outgoing::notice(&body);
        let id = ids::new_message_id();
        let targets = [inside];
        let message = write::NewMessage {
            recipients: Vec::new(),
            ..write::NewMessage::new(&sender, id.clone(), id.to_string(), &targets, &out, None)
        };
        let tx = c.transaction().await.unwrap();
        assert!(matches!(
            write::write_one(&tx, &message, 10, ReplicaId::NONE).await.unwrap(),
            write::Written::Stored { .. }
        ));
        let hold_id = hold(&tx, &sender, &id, "contact", &targets).await.unwrap();
        tx.commit().await.unwrap();

        let tx = c.transaction().await.unwrap();
        assert!(lock_hold(&tx, globex, &hold_id).await.unwrap().is_none(), "another account's hold is not found");
        let held = lock_hold(&tx, acme, &hold_id).await.unwrap().expect("the account's own hold");
        assert_eq!((held.message_id, held.recipients, held.state), (id.clone(), vec![bob], HoldState::Pending));
        assert_eq!((held.sender_id, held.sender.as_str()), (ann, "acme/laptop/ann"));
        set_decision(&tx, &hold_id, HoldState::Released, "", "pat").await.unwrap();
        tx.commit().await.unwrap();

        let human = Human { account_id: acme, account: "acme".into(), name: "pat".into() };
        assert!(holds_on(&c, &human, false).await.unwrap().is_empty(), "decided: no longer pending");
        let all = holds_on(&c, &human, true).await.unwrap();
        assert_eq!(all.len(), 1);
        let decided = &all[0];
        assert_eq!(
            (decided.state, decided.reason.as_str(), decided.body.as_str()),
            (HoldState::Released, "", "may I deploy?")
        );
        assert_eq!(
            (decided.from.as_str(), decided.to.clone()),
            ("acme/laptop/ann", vec!["acme/laptop/bob".to_owned()])
        );
    }

    #[tokio::test]
    async fn asks_wait_for_an_answer_peeks_are_recorded_and_reserved_endpoints_are_made_once() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (ann, bob) = (db.endpoint(laptop, "ann", 0).await, db.endpoint(laptop, "bob", 0).await);
        let c = db.store.client().await.unwrap();
        let to_bob = [Target { id: bob, address: "acme/laptop/bob".into(), account_id: acme }];
        let ask = db.send(ann, &to_bob, "may I merge?", None, None).await;
        db.send(ann, &to_bob, "just so you know", None, None).await;
        db.test.sql().await.execute("update messages set require_reply = true where id = $1", &[&ask]).await.unwrap();
        let waiting: Vec<MessageId> =
            unanswered_asks(&c, bob, &[acme]).await.unwrap().into_iter().map(|m| m.id).collect();
        assert_eq!(waiting, std::slice::from_ref(&ask), "only what asks for a reply");
        assert!(unanswered_asks(&c, bob, &[]).await.unwrap().is_empty(), "only from the accounts in reach");
        let to_ann = [Target { id: ann, address: "acme/laptop/ann".into(), account_id: acme }];
        db.send(bob, &to_ann, "yes", None, Some(&ask)).await;
        assert!(unanswered_asks(&c, bob, &[acme]).await.unwrap().is_empty(), "answered");

        insert_peek(&c, bob, "acme/laptop/ann", 3).await.unwrap();
        insert_peek(&c, bob, "acme/laptop/cid", 1).await.unwrap();
        let seen: Vec<(String, u32)> = peekers(&c, bob).await.unwrap().into_iter().map(|p| (p.by, p.turns)).collect();
        assert_eq!(seen.len(), 2);
        assert!(seen.contains(&("acme/laptop/ann".to_owned(), 3)) && seen.contains(&("acme/laptop/cid".to_owned(), 1)));

        let board = ensure_reserved(&c, acme, "board").await.unwrap();
        assert_eq!(ensure_reserved(&c, acme, "board").await.unwrap(), board);
        assert_ne!(
            ensure_human(&c, acme).await.unwrap(),
            board,
            "the human's inbox is another endpoint of the same machine"
        );
    }

    #[tokio::test]
    async fn private_data_crosses_only_a_contact_that_allows_it_and_a_held_message_is_checked_again_on_release() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (globex, boxed) = db.machine("globex", "box").await;
        let (ann, gus) = (db.endpoint(laptop, "ann", 0).await, db.endpoint(boxed, "gus", 0).await);
        let c = db.store.client().await.unwrap();
        super::super::contacts::make_contact(&c, acme, globex).await.unwrap();
        let sender = caller_of(&c, ann).await.unwrap();
        let to_gus = [Target { id: gus, address: "globex/box/gus".into(), account_id: globex }];
        let refused = Error::from(check_private(&c, &sender, &to_gus).await.unwrap_err());
        assert!(matches!(&refused, Error::PermissionDenied(m) if m.contains("globex/box/gus")), "{refused:?}");
        assert!(hold_class(&c, &sender, &to_gus, true).await.is_err(), "a private send is refused before any hold");
        assert_eq!(set_private_ok(&c, acme, "globex", true).await.unwrap(), 1);
        assert_eq!(set_private_ok(&c, acme, "initech", true).await.unwrap(), 0, "not a contact");
        check_private(&c, &sender, &to_gus).await.expect("allowed now");

        // A message written for a hold (to nobody yet) is checked again when released.
        let held = db.send(ann, &[], "the keys are in the vault", None, None).await;
        let targets = still_reachable(&c, ann, &held, &[gus]).await.unwrap();
        assert_eq!(targets.iter().map(|t| t.id).collect::<Vec<_>>(), [gus]);
        db.test.sql().await.execute("update machines set revoked_at = now() where id = $1", &[&boxed]).await.unwrap();
        let gone = Error::from(still_reachable(&c, ann, &held, &[gus]).await.unwrap_err());
        assert!(matches!(&gone, Error::FailedPrecondition(m) if m.contains("its machine was revoked")), "{gone:?}");
    }

    #[test]
    fn hold_states_are_the_ones_the_table_allows() {
        let table = include_str!("../../migrations/0004_trust.sql");
        let all: Vec<String> = HoldState::ALL.iter().map(|s| format!("'{s}'")).collect();
        assert!(table.contains(&format!("check (state in ({}))", all.join(", "))), "{all:?}");
        assert!(table.contains(&format!("where state = '{HOLD_PENDING}';")));
    }
}
