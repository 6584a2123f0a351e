//! What a sender reads about the messages it sent: each recipient's delivery, the replies it got,
//! and the stored result of an earlier send with the same client id.

use deadpool_postgres::GenericClient;

use super::{MESSAGE_COLUMNS, MESSAGE_JOINS, WITHDRAWN};
use crate::domain::delivery::State;
use crate::domain::ids::{EndpointId, MessageId};
use crate::domain::message::{Message, Recipient, Sent};
use crate::domain::names::HUMAN;
use crate::domain::presence;
use crate::store::Result;
use crate::store::identity::ONLINE;
use crate::store::row::{Col, FromRow};

/// Ids of up to 20 messages `sender` sent whose id starts or ends with `text`, newest first: the
/// candidates a reference names (see [`crate::domain::message::pick_named`]).
pub(crate) async fn sent_like(c: &impl GenericClient, sender: EndpointId, text: &str) -> Result<Vec<MessageId>> {
    let stmt = c
        .prepare_cached(
            "select id from messages
             where sender_id = $1 and (id like $2 || '%' or id like '%' || $2)
             order by created_at desc limit 20",
        )
        .await?;
    c.query(&stmt, &[&sender, &text]).await?.iter().map(|r| r.only::<MessageId>()).collect()
}

/// The thread of message `id` and the message it answers, if any.
pub(crate) async fn thread_of(c: &impl GenericClient, id: &MessageId) -> Result<(String, Option<MessageId>)> {
    let row = c.query_one("select thread, reply_to from messages where id = $1", &[&id]).await?;
    Ok((row.col("thread")?, row.col("reply_to")?))
}

/// Each recipient's delivery of message `message_id`, by address, its state with its inbox's
/// pushed mark applied (`relay_delivery_state`, migration 29); a delivery still waiting for an
/// absent recipient says since when it is away.
pub(crate) async fn recipient_states(c: &impl GenericClient, message_id: &MessageId) -> Result<Vec<Recipient>> {
    let stmt = c
        .prepare_cached(&format!(
            "select ea.address, relay_delivery_state(d) as state, coalesce(d.reason, '') as reason,
                    {ONLINE} or m.name = '{HUMAN}' as present, e.last_seen_at
             from deliveries d
             join endpoint_addresses ea on ea.id = d.recipient_id
             join endpoints e on e.id = d.recipient_id
             join machines m on m.id = e.machine_id
             where d.message_id = $1 order by ea.address"
        ))
        .await?;
    c.query(&stmt, &[&message_id])
        .await?
        .iter()
        .map(|r| {
            let state = State::from_db(r.col("state")?)?;
            let mut reason: String = r.col("reason")?;
            let online: bool = r.col("present")?;
            if state == State::Queued && reason.is_empty() && !online {
                reason = presence::offline_reason(r.col("last_seen_at")?);
            }
            Ok(Recipient { address: r.col("address")?, state: Some(state), reason, online })
        })
        .collect()
}

/// The replies to message `id` delivered to `recipient` and not withdrawn, in seq order. Locks
/// nothing.
pub(crate) async fn replies_to(c: &impl GenericClient, id: &MessageId, recipient: EndpointId) -> Result<Vec<Message>> {
    let sql = format!(
        "select {MESSAGE_COLUMNS} from {MESSAGE_JOINS}
         where m.reply_to = $1 and d.recipient_id = $2 and d.state <> {WITHDRAWN}
         order by d.seq"
    );
    let stmt = c.prepare_cached(&sql).await?;
    c.query(&stmt, &[&id, &recipient]).await?.iter().map(Message::from_row).collect()
}

/// The stored result of an earlier send by `sender` with this client id, if there was one.
pub(crate) async fn previous_send(c: &impl GenericClient, sender: EndpointId, client_id: &str) -> Result<Option<Sent>> {
    let stmt =
        c.prepare_cached("select id, thread, reply_to from messages where sender_id = $1 and client_id = $2").await?;
    let Some(row) = c.query_opt(&stmt, &[&sender, &client_id]).await? else {
        return Ok(None);
    };
    let id: MessageId = row.col("id")?;
    let recipients = recipient_states(c, &id).await?;
    let hold =
        c.query_opt("select id from holds where message_id = $1", &[&id]).await?.map(|r| r.only()).transpose()?;
    Ok(Some(Sent {
        id,
        thread: row.col("thread")?,
        recipients,
        duplicate: true,
        reply_to: row.col("reply_to")?,
        skipped: Vec::new(),
        hold,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::messages::Target;
    use crate::store::testing;

    #[tokio::test]
    async fn a_sender_reads_its_earlier_send_by_client_id_and_the_replies_it_got() {
        let db = testing::db().await;
        let (account, machine) = db.machine("acme", "laptop").await;
        let (ann, bob) = (db.endpoint(machine, "ann", 0).await, db.endpoint(machine, "bob", 0).await);
        let c = db.store.client().await.unwrap();
        let target = |id, handle: &str| Target { id, address: format!("acme/laptop/{handle}"), account_id: account };
        assert!(previous_send(&c, ann, "c1").await.unwrap().is_none());

        let question = db.send(ann, &[target(bob, "bob")], "which branch?", Some("c1"), None).await;
        let earlier = previous_send(&c, ann, "c1").await.unwrap().expect("the send with that client id");
        assert_eq!((&earlier.id, earlier.duplicate, earlier.hold.is_none()), (&question, true, true));
        let to: Vec<(&str, Option<State>)> = earlier.recipients.iter().map(|r| (r.address.as_str(), r.state)).collect();
        assert_eq!(to, [("acme/laptop/bob", Some(State::Queued))]);
        assert!(previous_send(&c, bob, "c1").await.unwrap().is_none(), "client ids are the sender's own");

        let reply = db.send(bob, &[target(ann, "ann")], "main", None, Some(&question)).await;
        let replies = replies_to(&c, &question, ann).await.unwrap();
        assert_eq!(replies.iter().map(|m| &m.id).collect::<Vec<_>>(), [&reply]);
        assert_eq!(thread_of(&c, &reply).await.unwrap(), (question.to_string(), Some(question.clone())));
        assert_eq!(sent_like(&c, ann, &question.as_str()[..8]).await.unwrap(), std::slice::from_ref(&question));
        assert!(sent_like(&c, bob, &question.as_str()[..8]).await.unwrap().is_empty(), "only what the sender sent");
    }
}
