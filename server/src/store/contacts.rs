//! The people of an account and the contacts they make between accounts.

use deadpool_postgres::GenericClient;

use super::error::Col;
use super::messages::{SURFACED, WITHDRAWN};
use super::trust::{HOLD_PENDING, HOLD_REJECTED};
use super::{Store, is_unique_violation};
use crate::domain::ids::{self, AccountId, TokenKind};
use crate::domain::names::{NameKind, validate};
use crate::domain::trust::Contact as ContactView;
use crate::domain::{EntityKind, Error, Result};

use crate::domain::caller::Human;

fn view(account: &str, state: &str, withdrawn: u64) -> ContactView {
    ContactView { account: account.to_owned(), state: state.to_owned(), withdrawn: withdrawn as u32 }
}

async fn account_id(c: &impl GenericClient, name: &str) -> Result<AccountId> {
    validate(NameKind::Account, name)?;
    c.query_opt("select id from accounts where name = $1", &[&name])
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Account, format!("no account {name}")))?
        .col(0)
}

async fn make_contact(c: &impl GenericClient, a: AccountId, b: AccountId) -> Result<()> {
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

impl Store {
    /// Issues a human credential for an account; the token is shown only now.
    pub async fn add_human(&self, account: &str, name: &str) -> Result<String> {
        validate(NameKind::Handle, name).map_err(|_| Error::invalid(format!("invalid human name {name:?}")))?;
        let client = self.client().await?;
        let account_id = account_id(&client, account).await?;
        let token = ids::new_token(TokenKind::Human);
        client
            .execute(
                "insert into humans (account_id, name, token_hash) values ($1, $2, $3)",
                &[&account_id, &name, &ids::token_hash(&token)],
            )
            .await
            .map_err(|e| {
                if is_unique_violation(&e) {
                    Error::AlreadyExists(format!("human {name} of {account} already exists"))
                } else {
                    e.into()
                }
            })?;
        Ok(token)
    }

    pub async fn revoke_human(&self, account: &str, name: &str) -> Result<()> {
        let client = self.client().await?;
        let account_id = account_id(&client, account).await?;
        let revoked = client
            .execute(
                "update humans set revoked_at = coalesce(revoked_at, now()) where account_id = $1 and name = $2",
                &[&account_id, &name],
            )
            .await?;
        if revoked == 0 {
            return Err(Error::not_found(EntityKind::Human, format!("no human {name} of {account}")));
        }
        Ok(())
    }

    pub async fn authenticate_human(&self, token: &str) -> Result<Human> {
        ids::check_token(TokenKind::Human, token)?;
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "select a.id, a.name, h.name, h.revoked_at is not null
                 from humans h join accounts a on a.id = h.account_id where h.token_hash = $1",
            )
            .await?;
        let row = client
            .query_opt(&stmt, &[&ids::token_hash(token)])
            .await?
            .ok_or_else(|| Error::Unauthenticated("unknown human token".into()))?;
        if row.col::<bool>(3)? {
            return Err(Error::Unauthenticated("this human token was revoked".into()));
        }
        Ok(Human { account_id: row.col(0)?, account: row.col(1)?, name: row.col(2)? })
    }

    /// Asks for a contact; when the other account already asked for one, the contact is made.
    pub async fn contact_request(&self, human: &Human, other: &str) -> Result<ContactView> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let other_id = account_id(&tx, other).await?;
        if other_id == human.account_id {
            return Err(Error::invalid("an account cannot be its own contact"));
        }
        // Two humans asking each other at once must meet: lock both accounts in id order first.
        tx.execute(
            "select id from accounts where id in ($1, $2) order by id for update",
            &[&human.account_id, &other_id],
        )
        .await?;
        let state = if super::identity::contact_accounts(&tx, human.account_id).await?.contains(&other_id) {
            "contact"
        } else if tx
            .query_opt(
                "select 1 from contact_requests where from_account = $1 and to_account = $2",
                &[&other_id, &human.account_id],
            )
            .await?
            .is_some()
        {
            make_contact(&tx, human.account_id, other_id).await?;
            "contact"
        } else {
            tx.execute(
                "insert into contact_requests (from_account, to_account) values ($1, $2) on conflict do nothing",
                &[&human.account_id, &other_id],
            )
            .await?;
            "requested"
        };
        tx.commit().await?;
        self.scope_changed();
        Ok(view(other, state, 0))
    }

    pub async fn contact_accept(&self, human: &Human, other: &str) -> Result<ContactView> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let other_id = account_id(&tx, other).await?;
        if !super::identity::contact_accounts(&tx, human.account_id).await?.contains(&other_id) {
            let asked = tx
                .query_opt(
                    "select 1 from contact_requests where from_account = $1 and to_account = $2",
                    &[&other_id, &human.account_id],
                )
                .await?
                .is_some();
            if !asked {
                return Err(Error::not_found(
                    EntityKind::Contact,
                    format!("{other} has not asked {} for a contact: use contact request to ask it", human.account),
                ));
            }
            make_contact(&tx, human.account_id, other_id).await?;
        }
        tx.commit().await?;
        self.scope_changed();
        Ok(view(other, "contact", 0))
    }

    pub async fn contact_list(&self, human: &Human) -> Result<Vec<ContactView>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "select a.name, 'contact' from contacts c
                 join accounts a on a.id = case when c.account_a = $1 then c.account_b else c.account_a end
                 where c.account_a = $1 or c.account_b = $1
                 union all
                 select a.name, 'requested' from contact_requests r join accounts a on a.id = r.to_account where r.from_account = $1
                 union all
                 select a.name, 'pending' from contact_requests r join accounts a on a.id = r.from_account where r.to_account = $1
                 order by 1",
                &[&human.account_id],
            )
            .await?;
        rows.iter().map(|r| Ok(view(r.col(0)?, r.col(1)?, 0))).collect()
    }

    /// Ends a contact (or a request) between two accounts. Reach is cut at once: deliveries between
    /// them that no agent has seen yet are withdrawn, and their senders can see why.
    pub async fn contact_drop(&self, account: &str, other: &str) -> Result<ContactView> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let (me, other_id) = (account_id(&tx, account).await?, account_id(&tx, other).await?);
        // Inboxes first, before the contact and the deliveries: the order a send's batch takes them.
        tx.execute(
            &format!(
                "select 1 from endpoints e
                 where e.id in (select d.recipient_id from deliveries d
                                join messages m on m.id = d.message_id
                                join endpoint_addresses s on s.id = m.sender_id
                                join endpoint_addresses r on r.id = d.recipient_id
                                where d.state < {SURFACED}
                                  and ((s.account_id = $1 and r.account_id = $2) or (s.account_id = $2 and r.account_id = $1)))
                 order by e.id for update"
            ),
            &[&me, &other_id],
        )
        .await?;
        let dropped = tx
            .execute(
                "delete from contacts where account_a = least($1::bigint, $2::bigint) and account_b = greatest($1::bigint, $2::bigint)",
                &[&me, &other_id],
            )
            .await?;
        let requests = tx
            .execute(
                "delete from contact_requests
                 where (from_account = $1 and to_account = $2) or (from_account = $2 and to_account = $1)",
                &[&me, &other_id],
            )
            .await?;
        if dropped + requests == 0 {
            return Err(Error::not_found(EntityKind::Contact, format!("{account} and {other} are not contacts")));
        }
        let reason = format!("withdrawn: the contact between {account} and {other} was dropped before it was seen");
        // Held messages between the two can no longer be released.
        tx.execute(
            &format!(
                "update holds h set state = '{HOLD_REJECTED}', reason = $3, decided_at = now(), decided_by = 'contact drop'
                 where h.state = '{HOLD_PENDING}' and h.account_id in ($1, $2)
                   and exists (select 1 from endpoint_addresses r where r.id = any(h.recipients)
                               and r.account_id in ($1, $2) and r.account_id <> h.account_id)"
            ),
            &[&me, &other_id, &format!("the contact between {account} and {other} was dropped")],
        )
        .await?;
        let withdrawn = tx
            .execute(
                &format!(
                    "update deliveries d set state = {WITHDRAWN}, reason = $3, updated_at = now()
                     from messages m, endpoint_addresses s, endpoint_addresses r
                     where m.id = d.message_id and s.id = m.sender_id and r.id = d.recipient_id and d.state < {SURFACED}
                       and ((s.account_id = $1 and r.account_id = $2) or (s.account_id = $2 and r.account_id = $1))"
                ),
                &[&me, &other_id, &reason],
            )
            .await?;
        tx.commit().await?;
        self.scope_changed();
        Ok(view(other, "none", withdrawn))
    }
}
