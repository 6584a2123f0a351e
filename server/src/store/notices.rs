//! The board's notices: what happened to a card, told to the account's operator and the card's
//! poster as messages from the account's board sender, in the transaction that made it happen.

use deadpool_postgres::{GenericClient, Transaction};

use super::identity::caller_of;
use super::messages::{Outgoing, Target};
use super::row::Col;
use crate::domain::Result;
use crate::domain::address::BOARD;
use crate::domain::board::{self, Event, Reader};
use crate::domain::delivery::Kind;
use crate::domain::ids::{AccountId, EndpointId, JobId};
use crate::domain::redact::redact;

/// The account's board sender (`account/me/board`), made on first use on the reserved machine
/// that no token can claim.
async fn ensure_board(c: &impl GenericClient, account_id: AccountId) -> Result<EndpointId> {
    super::trust::ensure_reserved(c, account_id, BOARD).await
}

/// Tells the operator and the card's poster (of a run card: its schedule's poster) what happened
/// to card `job_id`: one message each, none to `actor`, who made it happen. A recipient whose
/// inbox is full misses the notice rather than blocking the board. Locks the notified inboxes in
/// id order before writing any.
pub(crate) async fn notify_board(
    tx: &Transaction<'_>,
    account_id: AccountId,
    job_id: &JobId,
    event: Event<'_>,
    actor: Option<EndpointId>,
    cap: u32,
) -> Result<()> {
    let card = tx
        .query_one(
            "select j.title, coalesce(s.posted_by, j.posted_by) as poster, a.name as account, a.operator
             from jobs j join accounts a on a.id = j.account_id left join jobs s on s.id = j.schedule_id
             where j.id = $1 and j.account_id = $2",
            &[&job_id, &account_id],
        )
        .await?;
    let (title, poster, account, operator): (String, String, String, Option<String>) =
        (card.col("title")?, card.col("poster")?, card.col("account")?, card.col("operator")?);
    let operator = operator.map(|op| format!("{account}/{op}"));
    let wanted: Vec<&str> = operator.iter().map(String::as_str).chain([poster.as_str()]).collect();
    let found: Vec<(EndpointId, String)> = tx
        .query(
            "select ea.id, ea.address from endpoint_addresses ea join machines m on m.id = ea.machine_id
             where ea.address = any($1) and ea.account_id = $2 and m.revoked_at is null",
            &[&wanted, &account_id],
        )
        .await?
        .iter()
        .map(|r| Ok((r.col("id")?, r.col("address")?)))
        .collect::<Result<_>>()?;
    let endpoint = |address: &str| {
        found.iter().find(|(_, a)| a == address).map(|(id, _)| Target {
            id: *id,
            address: address.to_owned(),
            account_id,
        })
    };
    let mut readers: Vec<(Target, Reader)> = Vec::new();
    if let Some(op) = operator.as_deref().and_then(endpoint) {
        readers.push((op, Reader::Operator));
    }
    if let Some(p) = endpoint(&poster)
        && !readers.iter().any(|(t, _)| t.id == p.id)
    {
        readers.push((p, Reader::Poster));
    }
    readers.retain(|(t, _)| Some(t.id) != actor);
    if readers.is_empty() {
        return Ok(());
    }
    super::messages::lock_inboxes(tx, readers.iter().map(|(t, _)| t.id).collect()).await?;
    let board_id = ensure_board(tx, account_id).await?;
    let sender = caller_of(tx, board_id).await?;
    let thread = format!("card:{job_id}");
    for (target, reader) in readers {
        let targets = [target];
        if let Err(e) = super::messages::check_room(tx, &targets, cap).await {
            tracing::warn!(card = %job_id, error = %e, "board notice not sent");
            continue;
        }
        // Redacted again as a whole: the notice quotes agent text, and only redacted text is stored.
        let body = redact(&board::notice(job_id, &title, event, reader, operator.as_deref())).text;
        let out = Outgoing {
            to: &[],
            body: &body,
            thread: Some(&thread),
            kind: Kind::Message,
            client_id: None,
            private: false,
            require_reply: false,
        };
        super::messages::store_message(tx, &sender, &targets, &out, None).await?;
    }
    Ok(())
}
