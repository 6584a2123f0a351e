//! The board's notices: what happened to a card, told to the account's operator and the card's
//! poster as messages from the account's board sender, in the transaction that made it happen.

use deadpool_postgres::Transaction;

use crate::domain::Result;
use crate::domain::board::{self, Event, Reader};
use crate::domain::ids::{AccountId, EndpointId, JobId};
use crate::domain::redact::redact;
use crate::store::messages::{self, Outgoing, Target};
use crate::store::notices;

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
    let card = notices::audience(tx, account_id, job_id).await?;
    let operator = card.operator.map(|op| format!("{}/{op}", card.account));
    let wanted: Vec<&str> = operator.iter().map(String::as_str).chain([card.poster.as_str()]).collect();
    let found = notices::live_at(tx, account_id, &wanted).await?;
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
    if let Some(p) = endpoint(&card.poster)
        && !readers.iter().any(|(t, _)| t.id == p.id)
    {
        readers.push((p, Reader::Poster));
    }
    readers.retain(|(t, _)| Some(t.id) != actor);
    if readers.is_empty() {
        return Ok(());
    }
    let inboxes: Vec<EndpointId> = readers.iter().map(|(t, _)| t.id).collect();
    // Found live above; should a machine be revoked since, its agent no longer reads anything.
    let revoked = messages::lock_inboxes(tx, &inboxes).await?;
    readers.retain(|(t, _)| !revoked.contains(&t.id));
    let sender = notices::board_sender(tx, account_id).await?;
    let thread = format!("card:{job_id}");
    for (target, reader) in readers {
        let targets = [target];
        if let Err(e) = messages::check_room(tx, &targets, cap).await {
            tracing::warn!(card = %job_id, error = %e, "board notice not sent");
            continue;
        }
        // Redacted again as a whole: the notice quotes agent text, and only redacted text is stored.
        let body = redact(&board::notice(job_id, &card.title, event, reader, operator.as_deref())).text;
        let out = Outgoing { thread: Some(&thread), ..Outgoing::notice(&body) };
        messages::write_system(tx, &sender, &targets, &out).await?;
    }
    Ok(())
}
