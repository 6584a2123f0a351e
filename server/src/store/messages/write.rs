//! Writing a message in a transaction the caller holds: sends and replies held for a human, board
//! notices, hold decisions and the reports the system sends. Batched sends are written by
//! `relay_write_sends_numbered` (see `batch`), which takes the same locks in the same order: every
//! inbox in id order before any of its deliveries.

use std::collections::HashMap;

use deadpool_postgres::GenericClient;

use super::{Outgoing, READ, Target};
use crate::domain::caller::Caller;
use crate::domain::delivery::State;
use crate::domain::ids::{self, AccountId, EndpointId, MessageId};
use crate::domain::message::{Recipient, Sent};
use crate::domain::names::HUMAN;
use crate::domain::{EntityKind, Error, Result, limits, presence};
use crate::store::Tx;
use crate::store::identity::ONLINE;
use crate::store::messages::DELIVERY_CHANNEL;
use crate::store::row::Col;
use crate::store::trust;

/// Locks the contact rows a send to other accounts relies on (`for key share`, which only a
/// drop conflicts with), so a contact dropped while the send is under way cannot let it through:
/// the drop waits for the send, or the send sees the contact gone and is refused like an unknown
/// address.
pub(crate) async fn hold_contacts(tx: &Tx<'_>, caller: &Caller, targets: &[Target]) -> Result<()> {
    let mut others: Vec<AccountId> = targets.iter().map(|t| t.account_id).filter(|a| *a != caller.account_id).collect();
    if others.is_empty() {
        return Ok(());
    }
    others.sort_unstable();
    others.dedup();
    let stmt = tx
        .prepare_cached(
            "select case when c.account_a = $1 then c.account_b else c.account_a end
             from contacts c
             where (c.account_a = $1 and c.account_b = any($2)) or (c.account_b = $1 and c.account_a = any($2))
             for key share",
        )
        .await?;
    let held: Vec<AccountId> =
        tx.query(&stmt, &[&caller.account_id, &others]).await?.iter().map(|r| r.only()).collect::<Result<_>>()?;
    let gone: Vec<&str> = targets
        .iter()
        .filter(|t| t.account_id != caller.account_id && !held.contains(&t.account_id))
        .map(|t| t.address.as_str())
        .collect();
    if !gone.is_empty() {
        return Err(Error::not_found(
            EntityKind::Endpoint,
            format!("no agent you can reach at {}: nothing was sent", gone.join(", ")),
        ));
    }
    Ok(())
}

/// Locks every inbox a transaction is about to write, in id order and before any of their
/// deliveries: the order a send's batch takes them, so the two never wait on each other in
/// opposite orders (a writer that locked one inbox, then another, could deadlock with a batch).
pub(crate) async fn lock_inboxes(tx: &Tx<'_>, mut inboxes: Vec<EndpointId>) -> Result<()> {
    inboxes.sort_unstable();
    inboxes.dedup();
    let stmt = tx.prepare_cached("select 1 from endpoints where id = any($1) order by id for no key update").await?;
    tx.execute(&stmt, &[&inboxes]).await?;
    Ok(())
}

/// Inserts the message and its deliveries. `None` when a concurrent send with the same client id
/// already stored it.
pub(crate) async fn store_message(
    tx: &deadpool_postgres::Transaction<'_>,
    caller: &Caller,
    targets: &[Target],
    out: &Outgoing<'_>,
    reply_to: Option<&MessageId>,
) -> Result<Option<Sent>> {
    let id = ids::new_message_id();
    let thread = out.thread.map_or_else(|| id.to_string(), str::to_owned);
    let insert = tx
        .prepare_cached(
            "insert into messages (id, sender_id, client_id, thread, kind, body, reply_to, private, require_reply)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             on conflict (sender_id, client_id) do nothing",
        )
        .await?;
    let inserted = tx
        .execute(
            &insert,
            &[
                &id,
                &caller.endpoint_id,
                &out.client_id,
                &thread,
                &out.kind.to_db(),
                &out.body.as_str(),
                &reply_to,
                &out.private,
                &out.require_reply,
            ],
        )
        .await?;
    if inserted == 0 {
        return Ok(None);
    }
    let (hold, offline) = match trust::hold_class(tx, caller, targets, out.private).await? {
        Some(class) => (Some(trust::hold(tx, caller, &id, class, targets).await?), HashMap::new()),
        None => (None, deliver(tx, &id, targets).await?),
    };
    let recipients = targets
        .iter()
        .map(|t| match hold {
            Some(_) => Recipient {
                address: t.address.clone(),
                state: None,
                reason: "held for the account's human".to_owned(),
                online: false,
            },
            None => Recipient {
                address: t.address.clone(),
                state: Some(State::Queued),
                reason: offline.get(&t.id).cloned().unwrap_or_default(),
                online: !offline.contains_key(&t.id),
            },
        })
        .collect();
    Ok(Some(Sent { id, thread, recipients, duplicate: false, reply_to: reply_to.cloned(), skipped: Vec::new(), hold }))
}

/// Gives each target a delivery of the message with the next seq of its inbox, and announces it.
/// Returns, for each recipient that is offline, what its sender is told about that.
pub(crate) async fn deliver(
    tx: &Tx<'_>,
    message_id: &MessageId,
    targets: &[Target],
) -> Result<HashMap<EndpointId, String>> {
    // Lock the recipients' inbox heads in id order (no deadlock between concurrent sends),
    // then take the next seq of each. The same read says who is offline.
    let mut ids: Vec<EndpointId> = targets.iter().map(|t| t.id).collect();
    ids.sort_unstable();
    let lock = tx
        .prepare_cached(&format!(
            "select e.id, {ONLINE} as online, e.last_seen_at, m.name = '{HUMAN}' as system
             from endpoints e join machines m on m.id = e.machine_id
             where e.id = any($1) order by e.id for no key update of e"
        ))
        .await?;
    let mut offline: HashMap<EndpointId, String> = HashMap::new();
    for r in tx.query(&lock, &[&ids]).await? {
        if !r.col::<bool>("online")? && !r.col::<bool>("system")? {
            offline.insert(r.col("id")?, presence::offline_reason(r.col("last_seen_at")?));
        }
    }
    let bump = tx
        .prepare_cached("update endpoints set head_seq = head_seq + 1 where id = any($1) returning id, head_seq")
        .await?;
    let heads = tx.query(&bump, &[&ids]).await?;
    let (recipients, seqs): (Vec<i64>, Vec<i64>) = heads
        .iter()
        .map(|r| Ok((r.col::<i64>("id")?, r.col::<i64>("head_seq")?)))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();

    let deliver = tx
        .prepare_cached(
            "insert into deliveries (recipient_id, seq, message_id)
             select r, s, $3 from unnest($1::bigint[], $2::bigint[]) as t(r, s)",
        )
        .await?;
    tx.execute(&deliver, &[&recipients, &seqs, &message_id]).await?;
    // Sent with the transaction: listeners hear of it only once it is committed.
    let notify = tx
        .prepare_cached(&format!(
            "select pg_notify('{DELIVERY_CHANNEL}', r::text || ':' || s::text) from unnest($1::bigint[], $2::bigint[]) as t(r, s)"
        ))
        .await?;
    tx.query(&notify, &[&recipients, &seqs]).await?;
    Ok(offline)
}

/// Refuses a send that would take a target's unread messages past `cap`: one read of the
/// inboxes' unread counters.
pub(crate) async fn check_room(c: &impl GenericClient, targets: &[Target], cap: u32) -> Result<()> {
    let ids: Vec<EndpointId> = targets.iter().map(|t| t.id).collect();
    let stmt = c.prepare_cached("select id from endpoints where id = any($1) and unread >= $2").await?;
    let cap_db = i32::try_from(cap).unwrap_or(i32::MAX);
    let full = c.query(&stmt, &[&ids, &cap_db]).await?;
    let Some(row) = full.first() else {
        return Ok(());
    };
    let id: EndpointId = row.only()?;
    match targets.iter().find(|t| t.id == id) {
        Some(target) => Err(limits::inbox_full(&target.address, cap)),
        None => Ok(()),
    }
}

/// Marks the delivery of message `message_id` to `recipient` read, if it was not yet: the message
/// a held reply answers. The caller has locked the recipient's inbox first.
pub(crate) async fn mark_read(c: &impl GenericClient, message_id: &MessageId, recipient: EndpointId) -> Result<()> {
    c.execute(
        &format!(
            "update deliveries set state = {READ}, updated_at = now()
             where message_id = $1 and recipient_id = $2 and state < {READ}"
        ),
        &[&message_id, &recipient],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[tokio::test]
    async fn a_send_is_refused_when_a_targets_unread_reach_the_cap_and_names_that_target() {
        let db = testing::db().await;
        let (account, machine) = db.machine("acme", "laptop").await;
        let mut targets = Vec::new();
        for (handle, unread) in [("roomy", 2), ("full", 3)] {
            let id = db.endpoint(machine, handle, unread).await;
            targets.push(Target { id, address: format!("acme/laptop/{handle}"), account_id: account });
        }
        let c = db.store.client().await.unwrap();
        check_room(&c, &targets[..1], 3).await.expect("two unread of three: room");
        let refused = check_room(&c, &targets, 3).await.unwrap_err();
        assert_eq!(refused.to_string(), limits::inbox_full("acme/laptop/full", 3).to_string());
        check_room(&c, &targets, 4).await.expect("a higher cap has room for both");
    }
}
