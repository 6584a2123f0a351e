//! Resolving a send or a reply: the reads, outside any transaction, that turn what the sender
//! named into recipients it may message.

use deadpool_postgres::GenericClient;

use super::{Recipient, Target};
use crate::domain::address::{self, Address, Origin};
use crate::domain::caller::Caller;
use crate::domain::ids::{AccountId, EndpointId, MessageId, MessageRef};
use crate::domain::message::pick_named;
use crate::domain::names::{BOARD, HUMAN};
use crate::domain::scope::{Reach, Verdict};
use crate::domain::{EntityKind, Error};
use crate::store::row::Col;
use crate::store::{Result, StoreError};
use crate::store::{identity, scope, trust};

/// A thread continued by a send must be one the caller took part in: it sent or received a
/// message in it. Anything else is refused as not found, whoever else's thread it may be.
pub(crate) async fn check_thread(c: &impl GenericClient, caller: &Caller, thread: &str) -> Result<()> {
    let stmt = c
        .prepare_cached(
            "select exists (select 1 from messages where thread = $1 and sender_id = $2)
                 or exists (select 1 from messages m join deliveries d on d.message_id = m.id
                            where m.thread = $1 and d.recipient_id = $2)",
        )
        .await?;
    if c.query_one(&stmt, &[&thread, &caller.endpoint_id]).await?.only()? {
        return Ok(());
    }
    Err(Error::not_found(
        EntityKind::Thread,
        format!(
            "no thread {thread:?} among your messages: leave thread out to start one, or use a thread id from a message you sent or received"
        ),
    ).into())
}

/// The refusal of a send to `unknown` addresses, each with the nearest address the caller can
/// reach: its own account's endpoints and its contacts', never another account's.
pub(crate) async fn unknown_addresses(
    c: &impl GenericClient,
    caller: &Caller,
    contacts: &[AccountId],
    unknown: &[String],
    sending: bool,
) -> Result<Error> {
    let mut accounts = contacts.to_vec();
    accounts.push(caller.account_id);
    let stmt = c
        .prepare_cached(&format!(
            "select ea.address from endpoint_addresses ea join machines m on m.id = ea.machine_id
             where ea.account_id = any($1) and m.revoked_at is null and ea.id <> $2
               and not (m.name = '{HUMAN}' and ea.handle = '{BOARD}')
             order by ea.address limit 10000"
        ))
        .await?;
    let reachable: Vec<String> =
        c.query(&stmt, &[&accounts, &caller.endpoint_id]).await?.iter().map(|r| r.only()).collect::<Result<_>>()?;
    let named: Vec<(String, Option<&str>)> =
        unknown.iter().map(|a| (a.clone(), address::did_you_mean(a, &reachable))).collect();
    Ok(address::unknown(&named, sending))
}

/// Turns addresses into endpoints the caller may message. Every named address must resolve and
/// be allowed, or nothing is sent; `group:<name>` fans out to the members the caller may message,
/// and the others come back as skipped with the reason.
pub(crate) async fn resolve_addresses(
    tx: &impl GenericClient,
    caller: &Caller,
    to: &[String],
) -> Result<(Vec<Target>, Vec<Recipient>)> {
    let origin = Origin { account: &caller.account, machine: &caller.machine };
    let mut wanted: Vec<Address> = Vec::with_capacity(to.len());
    let mut groups: Vec<&str> = Vec::new();
    for raw in to {
        if let Some(name) = raw.trim().strip_prefix("group:") {
            groups.push(name.trim());
            continue;
        }
        let address = Address::parse(raw, origin)?;
        if address.is_board() {
            return Err(address::board_reads_nothing(&address.to_string()).into());
        }
        if !wanted.contains(&address) {
            wanted.push(address);
        }
    }
    let accounts: Vec<&str> = wanted.iter().map(|a| a.account.as_str()).collect();
    let machines: Vec<&str> = wanted.iter().map(|a| a.machine.as_str()).collect();
    let handles: Vec<&str> = wanted.iter().map(|a| a.handle.as_str()).collect();
    let stmt = tx
        .prepare_cached(
            "select ea.id, ea.address, ea.account_id
             from unnest($1::text[], $2::text[], $3::text[]) as t(account, machine, handle)
             join endpoint_addresses ea
               on ea.account = t.account and ea.machine = t.machine and ea.handle = t.handle
             join endpoints e on e.id = ea.id
             join machines m on m.id = e.machine_id
             where m.revoked_at is null",
        )
        .await?;
    // Issued together: one round trip for both.
    let (contacts, mut rows) = tokio::try_join!(identity::contact_accounts(tx, caller.account_id), async {
        Ok(tx.query(&stmt, &[&accounts, &machines, &handles]).await?)
    },)?;
    // A human inbox in reach exists from the first message to it.
    let humans: Vec<&str> = wanted.iter().filter(|a| a.is_human()).map(|a| a.account.as_str()).collect();
    if !humans.is_empty() {
        let mut made = false;
        for row in tx.query("select id from accounts where name = any($1)", &[&humans]).await? {
            let account: AccountId = row.only()?;
            if scope::reach(caller.account_id, &contacts, account) != Reach::None {
                trust::ensure_human(tx, account).await?;
                made = true;
            }
        }
        if made {
            rows = tx.query(&stmt, &[&accounts, &machines, &handles]).await?;
        }
    }

    // An endpoint that is offline or ended is a target like any other: its mail waits for it.
    let mut targets = Vec::with_capacity(wanted.len());
    let mut unknown = Vec::new();
    for address in &wanted {
        let text = address.to_string();
        // An endpoint outside the caller's reach is reported exactly like one that does not exist.
        let mut row = None;
        for r in &rows {
            if r.col::<&str>("address")? == text
                && scope::reach(caller.account_id, &contacts, r.col("account_id")?) != Reach::None
            {
                row = Some(r);
                break;
            }
        }
        match row {
            None => unknown.push(text),
            Some(row) => {
                let id: EndpointId = row.col("id")?;
                if id == caller.endpoint_id {
                    return Err(Error::invalid("you cannot message yourself").into());
                }
                targets.push(Target { id, address: text, account_id: row.col("account_id")? });
            }
        }
    }
    if !unknown.is_empty() {
        return Err(unknown_addresses(tx, caller, &contacts, &unknown, true).await?.into());
    }

    let mut members: Vec<Target> = Vec::new();
    for name in &groups {
        for (id, address) in scope::group_members_for_send(tx, caller, name).await? {
            if !targets.iter().chain(&members).any(|t| t.id == id) {
                members.push(Target { id, address, account_id: caller.account_id });
            }
        }
    }
    let ids: Vec<EndpointId> = targets.iter().chain(&members).map(|t| t.id).collect();
    let verdicts = scope::decide_many(tx, caller, &contacts, &ids).await?;
    let refusal = |t: &Target| verdicts.get(&t.id).and_then(|v| v.refusal().map(str::to_owned));

    let refused: Vec<String> =
        targets.iter().filter_map(|t| refusal(t).map(|why| format!("{}: {why}", t.address))).collect();
    if !refused.is_empty() {
        return Err(Error::PermissionDenied(format!("not allowed, nothing was sent: {}", refused.join("; "))).into());
    }
    let mut skipped = Vec::new();
    for member in members {
        match refusal(&member) {
            None => targets.push(member),
            Some(reason) => skipped.push(Recipient { address: member.address, state: None, reason, online: false }),
        }
    }
    if targets.is_empty() {
        let why: Vec<String> = skipped.iter().map(|s| format!("{}: {}", s.address, s.reason)).collect();
        return Err(Error::FailedPrecondition(if why.is_empty() {
            format!("group:{} has no other live members; nothing was sent", groups.join(", group:"))
        } else {
            format!("no member you may message, nothing was sent: {}", why.join("; "))
        })
        .into());
    }
    Ok((targets, skipped))
}

/// The endpoint at `address`, whatever its scope: for reports the system sends.
pub(crate) async fn endpoint_at(c: &impl GenericClient, address: &str) -> Result<EndpointId> {
    c.query_opt("select id from endpoint_addresses where address = $1", &[&address])
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Endpoint, format!("no agent at {address}")))?
        .only()
}

/// The id of a message the caller received, named by id, short id, suffix or `last`.
pub(crate) async fn resolve_received(
    c: &impl GenericClient,
    caller: &Caller,
    reference: &MessageRef,
) -> Result<MessageId> {
    match reference {
        MessageRef::Last => Ok(c
            .query_one("select last_shown from endpoints where id = $1", &[&caller.endpoint_id])
            .await?
            .only::<Option<MessageId>>()?
            .ok_or_else(|| {
                Error::not_found(EntityKind::Message, "no message was shown to you yet, so there is no last one")
            })?),
        MessageRef::Text(text) => {
            let stmt = c
                .prepare_cached(
                    "select message_id from deliveries
                     where recipient_id = $1 and (message_id like $2 || '%' or message_id like '%' || $2)
                     order by seq desc limit 20",
                )
                .await?;
            let candidates: Vec<MessageId> = c
                .query(&stmt, &[&caller.endpoint_id, &text.as_str()])
                .await?
                .iter()
                .map(|r| r.only::<MessageId>())
                .collect::<Result<_>>()?;
            Ok(pick_named(text, candidates)?)
        }
    }
}

/// Whom a reply to message `original` goes to, and in which thread.
#[derive(Debug)]
pub(crate) struct ReplyTo {
    pub thread: String,
    pub target: Target,
    /// The hold class that keeps it for the account's human before anyone sees it.
    pub held: Option<&'static str>,
}

/// Resolves a reply to message `original`: its sender, who must still be reachable and allowed.
/// Two round trips, each of reads issued together.
pub(crate) async fn reply_to(c: &impl GenericClient, caller: &Caller, original: &MessageId) -> Result<ReplyTo> {
    let asked = c
        .prepare_cached(
            "select m.thread, m.sender_id, ea.address, ea.account_id, mc.revoked_at is not null as revoked
             from messages m
             join endpoint_addresses ea on ea.id = m.sender_id
             join endpoints e on e.id = m.sender_id
             join machines mc on mc.id = e.machine_id
             where m.id = $1",
        )
        .await?;
    let (row, contacts) = tokio::try_join!(
        async { Ok::<_, StoreError>(c.query_one(&asked, &[&original]).await?) },
        identity::contact_accounts(c, caller.account_id),
    )?;
    let (thread, sender_id, sender_address): (String, EndpointId, String) =
        (row.col("thread")?, row.col("sender_id")?, row.col("address")?);
    if address::is_board_address(&sender_address) {
        return Err(address::board_reads_nothing(&sender_address).into());
    }
    if scope::reach(caller.account_id, &contacts, row.col("account_id")?) == Reach::None
        || row.col::<bool>("revoked")?
    {
        return Err(Error::FailedPrecondition(format!(
            "{sender_address} is no longer reachable from your account (its machine was revoked or the contact ended), so the reply was not sent"
        )).into());
    }
    // An asker that ended its session still gets the reply: it waits in its inbox for its return.
    let target = Target { id: sender_id, address: sender_address, account_id: row.col("account_id")? };
    let asker = [sender_id];
    let (verdicts, hold) = tokio::try_join!(
        scope::decide_many(c, caller, &contacts, &asker),
        trust::hold_class(c, caller, std::slice::from_ref(&target), false),
    )?;
    if let Some(why) = verdicts.get(&sender_id).and_then(Verdict::refusal) {
        return Err(Error::PermissionDenied(format!("not allowed, the reply was not sent: {why}")).into());
    }
    Ok(ReplyTo { thread, target, held: hold })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::MessageRef;
    use crate::store::messages::take_unread;
    use crate::store::testing;

    #[tokio::test]
    async fn a_reply_goes_to_the_asker_in_its_thread_and_a_thread_is_continued_only_by_who_took_part() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (ann, bob, cid) = (
            db.endpoint(laptop, "ann", 0).await,
            db.endpoint(laptop, "bob", 0).await,
            db.endpoint(laptop, "cid", 0).await,
        );
        let c = db.store.client().await.unwrap();
        let to_bob = [Target { id: bob, address: "acme/laptop/bob".into(), account_id: acme }];
        let question = db.send(ann, &to_bob, "which branch?", None, None).await;
        let (from_bob, from_cid) =
            (identity::caller_of(&c, bob).await.unwrap(), identity::caller_of(&c, cid).await.unwrap());

        let reply = reply_to(&c, &from_bob, &question).await.unwrap();
        assert_eq!(
            (reply.thread.as_str(), reply.target.id, reply.target.address.as_str()),
            (question.as_str(), ann, "acme/laptop/ann")
        );
        assert!(reply.held.is_none(), "within one account nothing is held");
        check_thread(&c, &from_bob, question.as_str()).await.expect("bob received a message in it");
        let outsider = Error::from(check_thread(&c, &from_cid, question.as_str()).await.unwrap_err());
        assert!(matches!(outsider, Error::NotFound { kind: EntityKind::Thread, .. }), "{outsider:?}");

        db.test.sql().await.execute("update machines set revoked_at = now() where id = $1", &[&laptop]).await.unwrap();
        let gone = Error::from(reply_to(&c, &from_bob, &question).await.unwrap_err());
        assert!(matches!(gone, Error::FailedPrecondition(_)), "the asker's machine was revoked: {gone:?}");
        assert_eq!(endpoint_at(&c, "acme/laptop/ann").await.unwrap(), ann, "the system still finds it by address");
    }

    #[tokio::test]
    async fn addresses_resolve_all_or_nothing_within_reach_and_a_received_message_by_any_of_its_names() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (_, boxed) = db.machine("globex", "box").await;
        let (ann, bob) = (db.endpoint(laptop, "ann", 0).await, db.endpoint(laptop, "bob", 0).await);
        db.endpoint(boxed, "gus", 0).await;
        let c = db.store.client().await.unwrap();
        let caller = identity::caller_of(&c, ann).await.unwrap();
        let to = |list: &[&str]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();

        let (targets, skipped) = resolve_addresses(&c, &caller, &to(&["bob", "acme/laptop/bob"])).await.unwrap();
        assert_eq!(targets.iter().map(|t| (t.id, t.address.as_str())).collect::<Vec<_>>(), [(bob, "acme/laptop/bob")]);
        assert!(skipped.is_empty());
        let refused = |e: StoreError| Error::from(e);
        let missing = refused(resolve_addresses(&c, &caller, &to(&["bob", "nobody"])).await.unwrap_err());
        assert!(
            matches!(&missing, Error::NotFound { .. }) && missing.to_string().contains("acme/laptop/nobody"),
            "{missing}"
        );
        let stranger = refused(resolve_addresses(&c, &caller, &to(&["globex/box/gus"])).await.unwrap_err());
        assert!(matches!(&stranger, Error::NotFound { .. }), "out of reach reads as absent: {stranger}");
        let myself = refused(resolve_addresses(&c, &caller, &to(&["ann"])).await.unwrap_err());
        assert!(matches!(&myself, Error::Invalid(_)), "{myself}");

        // A message bob received, named by its whole id, its short id, a suffix, or as the last shown.
        let to_bob = [Target { id: bob, address: "acme/laptop/bob".into(), account_id: acme }];
        let sent = db.send(ann, &to_bob, "ship it", None, None).await;
        let reader = identity::caller_of(&c, bob).await.unwrap();
        let id = sent.as_str();
        for name in [id, &id[..8], &id[id.len() - 6..]] {
            let named = MessageRef::parse(name).unwrap();
            assert_eq!(resolve_received(&c, &reader, &named).await.unwrap(), sent, "{name}");
        }
        let last = MessageRef::parse("last").unwrap();
        assert!(matches!(Error::from(resolve_received(&c, &reader, &last).await.unwrap_err()), Error::NotFound { .. }));
        take_unread(&c, bob, 10, crate::domain::delivery::State::Surfaced).await.unwrap();
        assert_eq!(resolve_received(&c, &reader, &last).await.unwrap(), sent, "shown: now the last");
        let not_hers = MessageRef::parse(&id[..8]).unwrap();
        assert!(resolve_received(&c, &caller, &not_hers).await.is_err(), "ann did not receive it");
    }
}
