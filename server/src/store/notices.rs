//! What the board's notices read: a card's audience, the live endpoints at its addresses, and the
//! account's board sender. Who is told what is the application's (`app::notices`).

use deadpool_postgres::GenericClient;

use super::identity::caller_of;
use super::row::{Col, FromRow};
use crate::domain::caller::Caller;
use crate::domain::ids::{AccountId, EndpointId, JobId};
use crate::domain::names::BOARD;
use crate::store::Result;
use tokio_postgres::Row;

/// Who a card's notices may go to, and what they name.
pub(crate) struct Audience {
    pub title: String,
    /// Who posted the card (of a run card: its schedule's poster), by address.
    pub poster: String,
    pub account: String,
    /// The account's operator endpoint (`machine/handle`), if it has one.
    pub operator: Option<String>,
}

/// The audience of card `job_id` of the account.
pub(crate) async fn audience(c: &impl GenericClient, account_id: AccountId, job_id: &JobId) -> Result<Audience> {
    let row = c
        .query_one(
            "select j.title, coalesce(s.posted_by, j.posted_by) as poster, a.name as account, a.operator
             from jobs j join accounts a on a.id = j.account_id left join jobs s on s.id = j.schedule_id
             where j.id = $1 and j.account_id = $2",
            &[&job_id, &account_id],
        )
        .await?;
    Audience::from_row(&row)
}

impl FromRow for Audience {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Audience {
            title: row.col("title")?,
            poster: row.col("poster")?,
            account: row.col("account")?,
            operator: row.col("operator")?,
        })
    }
}

/// The account's endpoints at `addresses` on machines not revoked, with their addresses.
pub(crate) async fn live_at(
    c: &impl GenericClient,
    account_id: AccountId,
    addresses: &[&str],
) -> Result<Vec<(EndpointId, String)>> {
    c.query(
        "select ea.id, ea.address from endpoint_addresses ea join machines m on m.id = ea.machine_id
         where ea.address = any($1) and ea.account_id = $2 and m.revoked_at is null",
        &[&addresses, &account_id],
    )
    .await?
    .iter()
    .map(|r| Ok((r.col("id")?, r.col("address")?)))
    .collect()
}

/// The account's board sender (`account/me/board`), made on first use on the reserved machine
/// that no token can claim.
pub(crate) async fn board_sender(c: &impl GenericClient, account_id: AccountId) -> Result<Caller> {
    let id = super::trust::ensure_reserved(c, account_id, BOARD).await?;
    caller_of(c, id).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[tokio::test]
    async fn a_cards_audience_its_live_readers_and_the_boards_sender() {
        let db = testing::db().await;
        let (account_id, laptop) = db.machine("acme", "laptop").await;
        let (_, old) = db.machine("acme", "old").await;
        let card = db.card(account_id, laptop, "c1").await;
        let ann = db.endpoint(laptop, "ann", 0).await;
        db.endpoint(old, "bob", 0).await;
        let c = db.store.client().await.unwrap();
        db.test.sql().await.execute("update machines set revoked_at = now() where id = $1", &[&old]).await.unwrap();
        crate::store::board::set_operator(&c, "acme", "laptop/ann").await.unwrap();

        let audience = audience(&c, account_id, &card).await.unwrap();
        assert_eq!(
            (audience.title.as_str(), audience.poster.as_str(), audience.account.as_str()),
            ("fix the build", "pat", "acme")
        );
        assert_eq!(audience.operator.as_deref(), Some("laptop/ann"));
        let live = live_at(&c, account_id, &["acme/laptop/ann", "acme/old/bob", "acme/laptop/nobody"]).await.unwrap();
        assert_eq!(live, [(ann, "acme/laptop/ann".to_owned())], "not a revoked machine's, not a missing one");

        let sender = board_sender(&c, account_id).await.unwrap();
        assert_eq!(sender.address(), "acme/me/board");
        assert_eq!(board_sender(&c, account_id).await.unwrap().endpoint_id, sender.endpoint_id, "made once");
    }
}
