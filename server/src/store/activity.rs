//! What the console's activity page reads: the messages the account's agents received from other
//! agents (the newest of each inbox, private ones left out, bodies as stored), and who sent how
//! many to whom lately. Reads start from the account's inboxes, so they cost the same whatever
//! other accounts do.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::row::{Col, FromRow};
use crate::domain::activity::{Edge, Exchanged, PER_INBOX};
use crate::domain::ids::AccountId;
use crate::domain::names::HUMAN;
use crate::store::Result;

/// The account's agents' newest received messages from other agents: at most `PER_INBOX` of each
/// inbox, newest first.
pub(crate) async fn recent(c: &impl GenericClient, account: AccountId) -> Result<Vec<Exchanged>> {
    let stmt = c
        .prepare_cached(&format!(
            "select m.id, m.thread, m.body, m.created_at, s.address as sender,
                    array_agg(distinct r.address order by r.address) as recipients
             from endpoint_addresses r
             cross join lateral (
                 select message_id from deliveries where recipient_id = r.id order by seq desc limit $2
             ) d
             join messages m on m.id = d.message_id
             join endpoint_addresses s on s.id = m.sender_id
             where r.account_id = $1 and r.machine <> '{HUMAN}' and s.machine <> '{HUMAN}' and not m.private
             group by m.id, s.address
             order by m.created_at desc"
        ))
        .await?;
    let mut recent: Vec<Exchanged> =
        c.query(&stmt, &[&account, &PER_INBOX]).await?.iter().map(Exchanged::from_row).collect::<Result<_>>()?;
    let ids: Vec<&str> = recent.iter().map(|m| m.id.as_str()).collect();
    let mut files = super::artifacts::files_of(c, &ids).await?;
    for m in &mut recent {
        m.files = files.remove(m.id.as_str()).unwrap_or_default();
    }
    Ok(recent)
}

impl FromRow for Exchanged {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Exchanged {
            id: row.col("id")?,
            thread: row.col("thread")?,
            from: row.col("sender")?,
            to: row.col("recipients")?,
            body: row.col("body")?,
            at: row.col("created_at")?,
            files: Vec::new(),
        })
    }
}

/// Messages from one agent to another received by the account's agents in the last `window_s`
/// seconds, by pair (each inbox's newest thousand at most).
pub(crate) async fn edges(c: &impl GenericClient, account: AccountId, window_s: f64) -> Result<Vec<Edge>> {
    let stmt = c
        .prepare_cached(&format!(
            "select s.address as sender, r.address as recipient, count(*) as n
             from endpoint_addresses r
             join endpoints e on e.id = r.id
             join deliveries d on d.recipient_id = r.id and d.seq > e.head_seq - 1000
             join messages m on m.id = d.message_id
             join endpoint_addresses s on s.id = m.sender_id
             where r.account_id = $1 and r.machine <> '{HUMAN}' and s.machine <> '{HUMAN}' and not m.private
               and m.created_at > now() - make_interval(secs => $2)
             group by s.address, r.address
             order by s.address, r.address"
        ))
        .await?;
    c.query(&stmt, &[&account, &window_s])
        .await?
        .iter()
        .map(|r| {
            Ok(Edge {
                from: r.col("sender")?,
                to: r.col("recipient")?,
                count: u32::try_from(r.col::<i64>("n")?).unwrap_or(u32::MAX),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::messages::Target;
    use crate::store::testing;

    #[tokio::test]
    async fn the_page_reads_what_agents_wrote_each_other_leaving_private_and_peoples_out() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (_, ci) = db.machine("acme", "ci").await;
        let ann = db.endpoint(laptop, "ann", 0).await;
        let bob = db.endpoint(ci, "bob", 0).await;
        let to_bob = Target { id: bob, address: "acme/ci/bob".into(), account_id: acme };
        let to_ann = Target { id: ann, address: "acme/laptop/ann".into(), account_id: acme };
        let hello = db.send(ann, std::slice::from_ref(&to_bob), "hello", None, None).await;
        db.send(bob, std::slice::from_ref(&to_ann), "hi", None, Some(&hello)).await;
        let secret = db.send(ann, &[to_bob], "secret", None, None).await;
        let sql = db.test.sql().await;
        sql.execute("update messages set private = true where id = $1", &[&secret]).await.unwrap();
        let c = db.store.client().await.unwrap();
        let me = crate::store::trust::human_caller(&c, acme).await.unwrap();
        db.send(me.endpoint_id, &[to_ann], "from a person", None, None).await;

        let read = recent(&c, acme).await.unwrap();
        let bodies: Vec<&str> = read.iter().map(|m| m.body.as_str()).collect();
        assert_eq!(bodies, ["hi", "hello"], "newest first, private and people's left out");
        assert_eq!((read[1].from.as_str(), read[1].to.clone()), ("acme/laptop/ann", vec!["acme/ci/bob".to_owned()]));
        assert_eq!(read[0].thread, read[1].thread);

        let edges = edges(&c, acme, 3600.0).await.unwrap();
        let pairs: Vec<(&str, &str, u32)> = edges.iter().map(|e| (e.from.as_str(), e.to.as_str(), e.count)).collect();
        assert_eq!(pairs, [("acme/ci/bob", "acme/laptop/ann", 1), ("acme/laptop/ann", "acme/ci/bob", 1)]);
        sql.execute("update messages set created_at = now() - interval '2 hours' where id = $1", &[&hello])
            .await
            .unwrap();
        let lately = super::edges(&c, acme, 3600.0).await.unwrap();
        assert_eq!(lately.len(), 1, "only what was said in the window: {lately:?}");
    }
}
