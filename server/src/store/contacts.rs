//! The people of an account and the contacts they make between accounts.

use deadpool_postgres::GenericClient;

use super::is_unique_violation;
use super::messages::{SURFACED, WITHDRAWN};
use super::row::{Col, FromRow};
use super::trust::{HOLD_PENDING, HOLD_REJECTED};
use crate::domain::caller::Human;
use crate::domain::ids::{AccountId, TokenHash};
use crate::domain::names::{NameKind, validate};
use crate::domain::trust::Contact as ContactView;
use crate::domain::{EntityKind, Error};
use crate::store::Result;
use crate::store::Tx;
use tokio_postgres::Row;

/// The id of the account named `name`.
pub(crate) async fn account_id(c: &impl GenericClient, name: &str) -> Result<AccountId> {
    validate(NameKind::Account, name)?;
    c.query_opt("select id from accounts where name = $1", &[&name])
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Account, format!("no account {name}")))?
        .only()
}

/// Makes the two accounts contacts (if they are not yet) and deletes the requests between them.
pub(crate) async fn make_contact(c: &impl GenericClient, a: AccountId, b: AccountId) -> Result<()> {
    c.execute(
        "insert into contacts (account_a, account_b) values (least($1::bigint, $2::bigint), greatest($1::bigint, $2::bigint))
         on conflict do nothing",
        &[&a, &b],
    )
    .await?;
    c.execute(
        "delete from contact_requests where (from_account = $1 and to_account = $2) or (from_account = $2 and to_account = $1)",
        &[&a, &b],
    )
    .await?;
    Ok(())
}

// ---- humans ------------------------------------------------------------------------------------

/// Inserts a human of the account with its token's hash; false when the account already has a
/// human of that name.
pub(crate) async fn insert_human(
    c: &impl GenericClient,
    account_id: AccountId,
    name: &str,
    token_hash: &TokenHash,
) -> Result<bool> {
    match c
        .execute(
            "insert into humans (account_id, name, token_hash) values ($1, $2, $3)",
            &[&account_id, &name, &token_hash],
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_unique_violation(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Marks the account's human revoked (keeping the first time it was); how many it matched.
pub(crate) async fn revoke_human(c: &impl GenericClient, account_id: AccountId, name: &str) -> Result<u64> {
    Ok(c.execute(
        "update humans set revoked_at = coalesce(revoked_at, now()) where account_id = $1 and name = $2",
        &[&account_id, &name],
    )
    .await?)
}

/// The human whose token hashes to `token_hash`, and whether it was revoked.
pub(crate) async fn human_by_token(c: &impl GenericClient, token_hash: &TokenHash) -> Result<Option<(Human, bool)>> {
    let stmt = c
        .prepare_cached(
            "select a.id as account_id, a.name as account, h.name, h.revoked_at is not null as revoked
             from humans h join accounts a on a.id = h.account_id where h.token_hash = $1",
        )
        .await?;
    let Some(row) = c.query_opt(&stmt, &[&token_hash]).await? else {
        return Ok(None);
    };
    Ok(Some((Human::from_row(&row)?, row.col("revoked")?)))
}

/// A person from the columns `account_id, account, name`.
impl FromRow for Human {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Human { account_id: row.col("account_id")?, account: row.col("account")?, name: row.col("name")? })
    }
}

// ---- contacts ----------------------------------------------------------------------------------

/// Locks both accounts' rows, in id order.
pub(crate) async fn lock_accounts(c: &Tx<'_>, a: AccountId, b: AccountId) -> Result<()> {
    c.execute("select id from accounts where id in ($1, $2) order by id for update", &[&a, &b]).await?;
    Ok(())
}

/// Whether account `from` asked account `to` for a contact.
pub(crate) async fn requested(c: &impl GenericClient, from: AccountId, to: AccountId) -> Result<bool> {
    Ok(c.query_opt("select 1 from contact_requests where from_account = $1 and to_account = $2", &[&from, &to])
        .await?
        .is_some())
}

/// Records that account `from` asks account `to` for a contact (once).
pub(crate) async fn insert_request(c: &impl GenericClient, from: AccountId, to: AccountId) -> Result<()> {
    c.execute(
        "insert into contact_requests (from_account, to_account) values ($1, $2) on conflict do nothing",
        &[&from, &to],
    )
    .await?;
    Ok(())
}

/// The account's contacts, the requests it made and those made to it, by account name.
pub(crate) async fn list_contacts(c: &impl GenericClient, account_id: AccountId) -> Result<Vec<ContactView>> {
    let rows = c
        .query(
            "select a.name as account, 'contact' as state from contacts c
             join accounts a on a.id = case when c.account_a = $1 then c.account_b else c.account_a end
             where c.account_a = $1 or c.account_b = $1
             union all
             select a.name, 'requested' from contact_requests r join accounts a on a.id = r.to_account where r.from_account = $1
             union all
             select a.name, 'pending' from contact_requests r join accounts a on a.id = r.from_account where r.to_account = $1
             order by 1",
            &[&account_id],
        )
        .await?;
    rows.iter().map(ContactView::from_row).collect()
}

impl FromRow for ContactView {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(ContactView { account: row.col("account")?, state: row.col("state")?, withdrawn: 0 })
    }
}

/// Names of the account's contacts across which private data may go.
pub(crate) async fn private_ok(c: &impl GenericClient, account_id: AccountId) -> Result<Vec<String>> {
    let rows = c
        .query(
            "select a.name from contacts c
             join accounts a on a.id = case when c.account_a = $1 then c.account_b else c.account_a end
             where (c.account_a = $1 or c.account_b = $1) and c.private_ok",
            &[&account_id],
        )
        .await?;
    rows.iter().map(|r| r.only()).collect()
}

/// Locks, in id order, the inboxes that hold deliveries between the two accounts no agent has
/// seen yet. `no key update`, as a send's writer locks an inbox: the drop waits for the writers of
/// those inboxes, but not for a send whose foreign key holds a `key share` of one of them (its
/// sender's row), which would otherwise wait for an inbox the drop holds.
pub(crate) async fn lock_inboxes_between(c: &Tx<'_>, a: AccountId, b: AccountId) -> Result<()> {
    c.execute(
        &format!(
            "select 1 from endpoints e
             where e.id in (select d.recipient_id from deliveries d
                            join messages m on m.id = d.message_id
                            join endpoint_addresses s on s.id = m.sender_id
                            join endpoint_addresses r on r.id = d.recipient_id
                            where d.state < {SURFACED}
                              and ((s.account_id = $1 and r.account_id = $2) or (s.account_id = $2 and r.account_id = $1)))
             order by e.id for no key update"
        ),
        &[&a, &b],
    )
    .await?;
    Ok(())
}

/// Deletes the contact between the two accounts; how many it deleted.
pub(crate) async fn delete_contact(c: &impl GenericClient, a: AccountId, b: AccountId) -> Result<u64> {
    Ok(c.execute(
        "delete from contacts where account_a = least($1::bigint, $2::bigint) and account_b = greatest($1::bigint, $2::bigint)",
        &[&a, &b],
    )
    .await?)
}

/// Deletes the requests between the two accounts, either way; how many it deleted.
pub(crate) async fn delete_requests(c: &impl GenericClient, a: AccountId, b: AccountId) -> Result<u64> {
    Ok(c.execute(
        "delete from contact_requests
         where (from_account = $1 and to_account = $2) or (from_account = $2 and to_account = $1)",
        &[&a, &b],
    )
    .await?)
}

/// Rejects, with `reason`, the pending holds of either account on a message to the other.
pub(crate) async fn reject_holds_between(
    c: &impl GenericClient,
    a: AccountId,
    b: AccountId,
    reason: &str,
) -> Result<()> {
    c.execute(
        &format!(
            "update holds h set state = '{HOLD_REJECTED}', reason = $3, decided_at = now(), decided_by = 'contact drop'
             where h.state = '{HOLD_PENDING}' and h.account_id in ($1, $2)
               and exists (select 1 from endpoint_addresses r where r.id = any(h.recipients)
                           and r.account_id in ($1, $2) and r.account_id <> h.account_id)"
        ),
        &[&a, &b, &reason],
    )
    .await?;
    Ok(())
}

/// Withdraws, with `reason`, the deliveries between the two accounts that no agent has seen yet,
/// and their recipients' search entries; how many. Indexing rounds under way are waited for first
/// (`relay_search_readers_change`), so no entry for a withdrawn delivery is written behind it.
pub(crate) async fn withdraw_between(c: &impl GenericClient, a: AccountId, b: AccountId, reason: &str) -> Result<u64> {
    c.execute("select relay_search_readers_change()", &[]).await?;
    let row = c
        .query_one(
            &format!(
                "with withdrawn as (
                     update deliveries d set state = {WITHDRAWN}, reason = $3, updated_at = now()
                     from messages m, endpoint_addresses s, endpoint_addresses r
                     where m.id = d.message_id and s.id = m.sender_id and r.id = d.recipient_id
                       and d.state < {SURFACED}
                       and ((s.account_id = $1 and r.account_id = $2) or (s.account_id = $2 and r.account_id = $1))
                     returning d.recipient_id, d.message_id),
                 unsearched as (
                     delete from search_entries e using withdrawn w
                     where e.reader = w.recipient_id and e.message_id = w.message_id)
                 select count(*) as withdrawn from withdrawn"
            ),
            &[&a, &b, &reason],
        )
        .await?;
    Ok(u64::try_from(row.col::<i64>("withdrawn")?).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::delivery::State;
    use crate::store::messages::{Target, recipient_states, unread_count};
    use crate::store::testing;

    #[tokio::test]
    async fn a_drop_locks_the_inboxes_it_withdraws_from_rejects_the_holds_between_and_clears_the_requests() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (globex, boxed) = db.machine("globex", "box").await;
        let (ann, gus) = (db.endpoint(laptop, "ann", 0).await, db.endpoint(boxed, "gus", 0).await);
        let mut c = db.store.client().await.unwrap();
        make_contact(&c, acme, globex).await.unwrap();
        c.execute("update contacts set private_ok = true", &[]).await.unwrap();
        assert_eq!(private_ok(&c, acme).await.unwrap(), ["globex"]);
        assert_eq!(private_ok(&c, globex).await.unwrap(), ["acme"]);
        let to_gus = [Target { id: gus, address: "globex/box/gus".into(), account_id: globex }];
        db.send(ann, &to_gus, "unseen", None, None).await;
        let held = db.send(ann, &[], "held", None, None).await;
        c.execute(
            "insert into holds (id, account_id, message_id, class, recipients) values ('h1', $1, $2, 'contact', $3)",
            &[&acme, &held, &vec![gus]],
        )
        .await
        .unwrap();
        insert_request(&c, globex, acme).await.unwrap();

        let tx = c.transaction().await.unwrap();
        lock_accounts(&tx, globex, acme).await.unwrap();
        lock_inboxes_between(&tx, acme, globex).await.unwrap();
        let other = db.test.sql().await;
        let inbox = other.execute("select 1 from endpoints where id = $1 for no key update nowait", &[&gus]).await;
        assert_eq!(
            inbox.unwrap_err().code(),
            Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE),
            "gus's inbox is held"
        );
        let account = other.execute("select 1 from accounts where id = $1 for update nowait", &[&acme]).await;
        assert!(account.is_err(), "and both accounts");
        reject_holds_between(&tx, acme, globex, "the contact ended").await.unwrap();
        assert_eq!(delete_requests(&tx, acme, globex).await.unwrap(), 1);
        tx.commit().await.unwrap();
        other
            .execute("select 1 from endpoints where id = $1 for no key update nowait", &[&gus])
            .await
            .expect("released");
        let (state, reason): (String, String) = c
            .query_one("select state, reason from holds where id = 'h1'", &[])
            .await
            .map(|r| (r.get(0), r.get(1)))
            .unwrap();
        assert_eq!((state.as_str(), reason.as_str()), ("rejected", "the contact ended"));
    }

    #[tokio::test]
    async fn a_request_answered_makes_one_contact_and_dropping_it_withdraws_what_was_not_seen() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (globex, boxed) = db.machine("globex", "box").await;
        let (ann, gus) = (db.endpoint(laptop, "ann", 0).await, db.endpoint(boxed, "gus", 0).await);
        let c = db.store.client().await.unwrap();
        assert_eq!(account_id(&c, "globex").await.unwrap(), globex);
        assert!(matches!(Error::from(account_id(&c, "nobody").await.unwrap_err()), Error::NotFound { .. }));
        assert!(matches!(Error::from(account_id(&c, "Not A Name").await.unwrap_err()), Error::Invalid(_)));

        insert_request(&c, acme, globex).await.unwrap();
        insert_request(&c, acme, globex).await.unwrap();
        assert!(requested(&c, acme, globex).await.unwrap() && !requested(&c, globex, acme).await.unwrap());
        let states = |list: Vec<ContactView>| list.into_iter().map(|v| (v.account, v.state)).collect::<Vec<_>>();
        assert_eq!(states(list_contacts(&c, acme).await.unwrap()), [("globex".to_owned(), "requested".to_owned())]);
        assert_eq!(states(list_contacts(&c, globex).await.unwrap()), [("acme".to_owned(), "pending".to_owned())]);
        make_contact(&c, globex, acme).await.unwrap();
        assert_eq!(states(list_contacts(&c, acme).await.unwrap()), [("globex".to_owned(), "contact".to_owned())]);

        let to_gus = [Target { id: gus, address: "globex/box/gus".into(), account_id: globex }];
        let sent = db.send(ann, &to_gus, "the api moved", None, None).await;
        assert_eq!(unread_count(&c, gus).await.unwrap(), 1);
        assert_eq!(withdraw_between(&c, acme, globex, "the contact ended").await.unwrap(), 1);
        assert_eq!(unread_count(&c, gus).await.unwrap(), 0, "a withdrawn message is not unread");
        let recipient = &recipient_states(&c, &sent).await.unwrap()[0];
        assert_eq!((recipient.state, recipient.reason.as_str()), (Some(State::Withdrawn), "the contact ended"));
        assert_eq!(delete_contact(&c, acme, globex).await.unwrap(), 1);
        assert_eq!(delete_contact(&c, globex, acme).await.unwrap(), 0, "one row, whichever side drops it");
    }
}
