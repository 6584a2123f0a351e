//! Accounts, machines, contacts and endpoints: who is who, and who is online.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::error::Col;
use super::{Store, is_unique_violation};
use crate::domain::endpoint::Endpoint;
use crate::domain::ids::{self, AccountId, EndpointId, MachineId, TokenKind};
use crate::domain::names::{NameKind, check_claimable, validate};
use crate::domain::redact::RedactedText;
use crate::domain::{EntityKind, Error, Result, presence};

pub use crate::domain::caller::{Caller, MachineIdentity};

/// A caller from `endpoint id, account id, account, machine id, machine, handle`.
fn caller_from_row(row: &Row, session_hash: Vec<u8>) -> Result<Caller> {
    Ok(Caller {
        endpoint_id: row.col(0)?,
        account_id: row.col(1)?,
        account: row.col(2)?,
        machine_id: row.col(3)?,
        machine: row.col(4)?,
        handle: row.col(5)?,
        session_hash,
    })
}

/// An endpoint as the sender of what the server writes on its behalf (a worker's report, a held
/// message re-checked, a permission question): no session of its own is involved.
pub(super) async fn caller_of(c: &impl deadpool_postgres::GenericClient, endpoint_id: EndpointId) -> Result<Caller> {
    let row = c
        .query_opt(
            "select id, account_id, account, machine_id, machine, handle from endpoint_addresses where id = $1",
            &[&endpoint_id],
        )
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Endpoint, "that endpoint is gone"))?;
    caller_from_row(&row, Vec::new())
}

/// Channel on which the database announces changes to sessions and machines (migration 9's triggers).
pub const CONTROL_CHANNEL: &str = "relay_control";

/// A change announced on [`CONTROL_CHANNEL`].
#[derive(Debug, PartialEq, Eq)]
pub enum Control {
    /// The endpoint's session ended or changed hands, or a stream of it opened.
    Endpoint(EndpointId),
    /// The machine was revoked, restored or removed.
    Machine(MachineId),
    /// Names, rules, caps, groups, contacts or hold classes changed (migration 11).
    Scope,
}

impl Control {
    pub fn parse(payload: &str) -> Option<Self> {
        if payload == "scope" {
            return Some(Self::Scope);
        }
        let (kind, id) = payload.split_once(':')?;
        let id = id.parse().ok()?;
        match kind {
            "endpoint" => Some(Self::Endpoint(EndpointId(id))),
            "machine" => Some(Self::Machine(MachineId(id))),
            _ => None,
        }
    }
}

/// A push stream just opened: its generation, the inbox head, and the endpoint's role.
pub struct OpenStream {
    pub generation: i64,
    pub head: i64,
    pub operator: bool,
}

pub struct HelloOutcome {
    pub endpoint: Endpoint,
    pub session_token: String,
    pub resumed: bool,
}

/// Whether endpoint `e` is online, as SQL over `endpoints e`: its session lives, its lease holds,
/// and its newest push stream is open or it showed a sign of life within the reconnect grace (so a
/// holder that crashed before or after opening its stream is not shown online for long). The rule
/// is one SQL function (migration 9), shared with the batched send.
pub(super) const ONLINE: &str = "relay_endpoint_online(e)";

/// Columns read by [`endpoint_from_row`], for `from endpoints e join endpoint_addresses ea on ea.id = e.id`.
pub(super) const ENDPOINT_COLUMNS: &str = "ea.address, ea.account, ea.machine, ea.handle, e.harness, e.status, \
     e.note, e.now_text, e.title, relay_endpoint_online(e) as online, e.ended_at is not null as ended, \
     e.last_seen_at, e.peek_on, \
     coalesce((select a.operator from accounts a where a.id = ea.account_id) = ea.machine || '/' || ea.handle, false) \
     as operator";

pub(super) fn endpoint_from_row(row: &Row) -> Result<Endpoint> {
    let last_seen: Option<DateTime<Utc>> = row.col("last_seen_at")?;
    Ok(Endpoint {
        address: row.col("address")?,
        account: row.col("account")?,
        machine: row.col("machine")?,
        handle: row.col("handle")?,
        harness: row.col("harness")?,
        status: row.col("status")?,
        note: row.col("note")?,
        now: row.col("now_text")?,
        title: row.col("title")?,
        online: row.col("online")?,
        ended: row.col("ended")?,
        last_seen_ms: last_seen.map_or(0, |t| t.timestamp_millis()),
        peek: row.col("peek_on")?,
        operator: row.col("operator")?,
    })
}

fn split_machine_path(path: &str) -> Result<(&str, &str)> {
    let (account, machine) = path
        .split_once('/')
        .ok_or_else(|| Error::invalid(format!("invalid machine {path:?}: write ACCOUNT/MACHINE")))?;
    validate(NameKind::Account, account)?;
    check_claimable(NameKind::Machine, machine)?;
    Ok((account, machine))
}

impl Store {
    // ---- operator commands -------------------------------------------------------------------

    pub async fn create_account(&self, name: &str) -> Result<()> {
        validate(NameKind::Account, name)?;
        let client = self.client().await?;
        let stmt = client.prepare_cached("insert into accounts (name) values ($1)").await?;
        client.execute(&stmt, &[&name]).await.map_err(|e| {
            if is_unique_violation(&e) {
                Error::AlreadyExists(format!("account {name} already exists"))
            } else {
                e.into()
            }
        })?;
        Ok(())
    }

    /// Creates the account if it does not exist yet.
    pub async fn ensure_account(&self, name: &str) -> Result<()> {
        validate(NameKind::Account, name)?;
        let client = self.client().await?;
        client.execute("insert into accounts (name) values ($1) on conflict (name) do nothing", &[&name]).await?;
        Ok(())
    }

    /// Registers a machine (or re-admits a revoked one) and returns its new token, shown only now.
    pub async fn add_machine(&self, path: &str) -> Result<String> {
        let (account, machine) = split_machine_path(path)?;
        self.issue_machine_token(account, machine, false).await
    }

    /// Issues a fresh token for a machine, creating it when needed; the old token stops working.
    pub async fn reissue_machine_token(&self, account: &str, machine: &str) -> Result<String> {
        validate(NameKind::Account, account)?;
        check_claimable(NameKind::Machine, machine)?;
        self.issue_machine_token(account, machine, true).await
    }

    async fn issue_machine_token(&self, account: &str, machine: &str, replace_live: bool) -> Result<String> {
        let token = ids::new_token(TokenKind::Machine);
        let hash = ids::token_hash(&token);
        let client = self.client().await?;
        let account_id: AccountId = client
            .query_opt("select id from accounts where name = $1", &[&account])
            .await?
            .ok_or_else(|| Error::not_found(EntityKind::Account, format!("no account {account}: create it first")))?
            .col(0)?;
        let row = client
            .query_opt(
                "insert into machines (account_id, name, token_hash) values ($1, $2, $3)
                 on conflict (account_id, name) do update
                     set token_hash = excluded.token_hash, revoked_at = null
                     where machines.revoked_at is not null or $4
                 returning id",
                &[&account_id, &machine, &hash, &replace_live],
            )
            .await?;
        match row {
            Some(_) => Ok(token),
            None => Err(Error::AlreadyExists(format!(
                "machine {account}/{machine} already exists and is active: revoke it first to issue a new token"
            ))),
        }
    }

    /// Revokes a machine's token: its next call is refused and its endpoints' sessions end.
    pub async fn revoke_machine(&self, path: &str) -> Result<()> {
        let (account, machine) = split_machine_path(path)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let machine_id: MachineId = tx
            .query_opt(
                "update machines m set revoked_at = coalesce(m.revoked_at, now())
                 from accounts a
                 where a.id = m.account_id and a.name = $1 and m.name = $2
                 returning m.id",
                &[&account, &machine],
            )
            .await?
            .ok_or_else(|| Error::not_found(EntityKind::Machine, format!("no machine {account}/{machine}")))?
            .col(0)?;
        tx.execute(
            "update endpoints set session_hash = null, ended_at = coalesce(ended_at, now()), online_until = null
             where machine_id = $1",
            &[&machine_id],
        )
        .await?;
        tx.commit().await?;
        self.sessions.forget_machine(machine_id);
        self.scope_changed();
        Ok(())
    }

    /// Makes two accounts mutual contacts.
    pub async fn add_contact(&self, first: &str, second: &str) -> Result<()> {
        validate(NameKind::Account, first)?;
        validate(NameKind::Account, second)?;
        if first == second {
            return Err(Error::invalid("an account cannot be its own contact"));
        }
        let client = self.client().await?;
        let rows: Vec<(AccountId, String)> = client
            .query("select id, name from accounts where name = any($1)", &[&vec![first, second]])
            .await?
            .iter()
            .map(|r| Ok((r.col(0)?, r.col(1)?)))
            .collect::<Result<_>>()?;
        let id_of = |name: &str| {
            rows.iter()
                .find(|(_, n)| n == name)
                .map(|(id, _)| *id)
                .ok_or_else(|| Error::not_found(EntityKind::Account, format!("no account {name}")))
        };
        let (a, b) = (id_of(first)?, id_of(second)?);
        client
            .execute(
                "insert into contacts (account_a, account_b) values (least($1::bigint, $2::bigint), greatest($1::bigint, $2::bigint))
                 on conflict do nothing",
                &[&a, &b],
            )
            .await?;
        Ok(())
    }

    /// Whether `token` is the live token of `account/machine` (the dev command reuses a valid config).
    pub async fn machine_token_is(&self, token: &str, account: &str, machine: &str) -> Result<bool> {
        if ids::check_token(TokenKind::Machine, token).is_err() {
            return Ok(false);
        }
        match self.authenticate_machine(token).await {
            Ok(m) => Ok(m.account == account && m.machine == machine),
            Err(Error::Unauthenticated(_)) => Ok(false),
            Err(other) => Err(other),
        }
    }

    // ---- authentication ----------------------------------------------------------------------

    pub async fn authenticate_machine(&self, token: &str) -> Result<MachineIdentity> {
        ids::check_token(TokenKind::Machine, token)?;
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "select m.id, m.name, a.id, a.name, m.revoked_at is not null
                 from machines m join accounts a on a.id = m.account_id
                 where m.token_hash = $1",
            )
            .await?;
        let row = client
            .query_opt(&stmt, &[&ids::token_hash(token)])
            .await?
            .ok_or_else(|| Error::Unauthenticated("unknown machine token".into()))?;
        let identity = MachineIdentity {
            machine_id: row.col(0)?,
            machine: row.col(1)?,
            account_id: row.col(2)?,
            account: row.col(3)?,
        };
        if row.col::<bool>(4)? {
            return Err(Error::Unauthenticated(format!(
                "the machine token of {}/{} was revoked",
                identity.account, identity.machine
            )));
        }
        Ok(identity)
    }

    pub async fn authenticate_session(&self, token: &str) -> Result<Caller> {
        ids::check_token(TokenKind::Session, token)?;
        let hash = ids::token_hash(token);
        let ticket = match self.sessions.get(&hash) {
            Ok(caller) => return Ok(caller),
            Err(ticket) => ticket,
        };
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "select e.id, m.account_id, a.name, m.id, m.name, e.handle
                 from endpoints e
                 join machines m on m.id = e.machine_id
                 join accounts a on a.id = m.account_id
                 where e.session_hash = $1 and e.ended_at is null and m.revoked_at is null",
            )
            .await?;
        let row = client
            .query_opt(&stmt, &[&hash])
            .await?
            .ok_or_else(|| Error::Unauthenticated("session unknown, ended or revoked: call Hello again".into()))?;
        let caller = caller_from_row(&row, hash)?;
        self.sessions.put(ticket, &caller);
        Ok(caller)
    }

    // ---- endpoints ---------------------------------------------------------------------------

    /// Claims an endpoint on the machine, or resumes the one `resume` names.
    ///
    /// A handle is free when nobody holds it, its session ended, its presence lease lapsed, or none
    /// of its push streams is open and it showed no sign of life for [`presence::UNSTREAMED_HOLD`]:
    /// a restarted (or crashed) agent that claims its old handle takes over its inbox.
    pub async fn hello(
        &self,
        machine: &MachineIdentity,
        handle: Option<&str>,
        harness: &str,
        resume: Option<&str>,
        spawn_grant: Option<&str>,
    ) -> Result<HelloOutcome> {
        if let Some(handle) = handle {
            check_claimable(NameKind::Handle, handle)?;
        }
        let client = self.client().await?;
        let lease = presence::secs(presence::CLAIM_LEASE);

        if let Some(token) = resume.filter(|t| ids::check_token(TokenKind::Session, t).is_ok()) {
            let stmt = client
                .prepare_cached(
                    "update endpoints
                     set harness = $3, last_seen_at = now(),
                         online_until = greatest(online_until, now() + $4 * interval '1 second')
                     where session_hash = $1 and machine_id = $2 and ended_at is null
                     returning id",
                )
                .await?;
            if let Some(row) =
                client.query_opt(&stmt, &[&ids::token_hash(token), &machine.machine_id, &harness, &lease]).await?
            {
                let endpoint = endpoint_on(&client, row.col(0)?).await?;
                return Ok(HelloOutcome { endpoint, session_token: token.to_owned(), resumed: true });
            }
        }

        let token = ids::new_token(TokenKind::Session);
        let hash = ids::token_hash(&token);
        if let Some(grant) = spawn_grant {
            // A spawned worker takes the endpoint reserved for it, whatever handle it asked for.
            let id = super::spawn::granted_endpoint(&client, machine, grant).await?;
            // A grant claims its endpoint once; again only when that worker's session is gone.
            let claimed = client
                .execute(
                    // The presence lease is the rule of migration 9's relay_endpoint_lease.
                    "update endpoints
                     set harness = $2, session_hash = $3, online_until = now() + $4 * interval '1 second',
                         last_seen_at = now(), ended_at = null, claimed_at = now(), stream_closed_gen = stream_gen
                     where id = $1
                       and (session_hash is null or ended_at is not null or not relay_endpoint_lease(endpoints))",
                    &[&id, &harness, &hash, &lease],
                )
                .await?;
            if claimed == 0 {
                return Err(Error::AlreadyExists("the worker this grant was issued for is connected already".into()));
            }
            self.sessions.forget_endpoint(id);
            let endpoint = endpoint_on(&client, id).await?;
            return Ok(HelloOutcome { endpoint, session_token: token, resumed: false });
        }
        let claim = client
            .prepare_cached(
                "insert into endpoints (machine_id, handle, harness, session_hash, online_until, last_seen_at, claimed_at)
                 values ($1, $2, $3, $4, now() + $5 * interval '1 second', now(), now())
                 on conflict (machine_id, handle) do update
                     set harness = excluded.harness, session_hash = excluded.session_hash,
                         online_until = excluded.online_until, last_seen_at = now(), ended_at = null,
                         status = 'idle', note = '', now_text = '', last_shown = null,
                         -- peeking is the choice of one session: a new one starts with it off
                         peek_on = false,
                         claimed_at = now(), stream_closed_gen = endpoints.stream_gen
                     where endpoints.ended_at is not null
                        or not relay_endpoint_lease(endpoints)
                        -- no stream open and no sign of life for a moment: the holder crashed, or
                        -- claimed and never subscribed
                        or (endpoints.stream_gen <= endpoints.stream_closed_gen
                            and coalesce(endpoints.last_seen_at, endpoints.created_at) < now() - $6 * interval '1 second')
                 returning id",
            )
            .await?;
        let hold = presence::secs(presence::UNSTREAMED_HOLD);
        let claimed = match handle {
            Some(handle) => {
                match client.query_opt(&claim, &[&machine.machine_id, &handle, &harness, &hash, &lease, &hold]).await? {
                    Some(row) => row,
                    None => return Err(held(&client, machine, handle).await?),
                }
            }
            None => {
                // Pick `<harness>-<n>`, the lowest n not held by a live endpoint; retry if another claim races us.
                let mut found = None;
                for _ in 0..8 {
                    // A picked name is one nobody holds: never used, or ended. An endpoint that is only
                    // offline keeps its name (and inbox) for the agent that claims it by name.
                    let live: Vec<String> = client
                        .query(
                            "select handle from endpoints where machine_id = $1 and ended_at is null",
                            &[&machine.machine_id],
                        )
                        .await?
                        .iter()
                        .map(|r| r.col(0))
                        .collect::<Result<_>>()?;
                    let candidate = (1..)
                        .map(|n| format!("{harness}-{n}"))
                        .find(|h| !live.contains(h))
                        .expect("an unbounded range always has a free name");
                    if let Some(row) = client
                        .query_opt(&claim, &[&machine.machine_id, &candidate, &harness, &hash, &lease, &hold])
                        .await?
                    {
                        found = Some(row);
                        break;
                    }
                }
                found.ok_or_else(|| Error::Unavailable("could not pick a free handle; try again".into()))?
            }
        };
        let id: EndpointId = claimed.col(0)?;
        // A session this claim took the handle from is over here at once, elsewhere when heard.
        self.sessions.forget_endpoint(id);
        client.execute("delete from peek_turns where endpoint_id = $1", &[&id]).await?;
        let endpoint = endpoint_on(&client, id).await?;
        Ok(HelloOutcome { endpoint, session_token: token, resumed: false })
    }

    /// Ends a session: the endpoint goes offline at once and its handle is free.
    pub async fn goodbye(&self, caller: &Caller) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "update endpoints set ended_at = now(), session_hash = null, online_until = null, last_seen_at = now()
                 where id = $1",
                &[&caller.endpoint_id],
            )
            .await?;
        // Other replicas hear of it from the database; this one forgets the session now.
        self.sessions.forget_endpoint(caller.endpoint_id);
        Ok(())
    }

    pub async fn endpoint(&self, id: EndpointId) -> Result<Endpoint> {
        endpoint_on(&self.client().await?, id).await
    }

    /// A push stream opens on this replica: it becomes the endpoint's newest stream, and the endpoint
    /// stays online while this replica is alive. Returns its generation and the newest seq, or `None`
    /// when the session is no longer valid.
    pub async fn open_presence(&self, caller: &Caller) -> Result<Option<OpenStream>> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "update endpoints e
                 set stream_gen = e.stream_gen + 1, stream_replica = $4, last_seen_at = now(),
                     -- the replica keeps the stream's presence from now on; this lease only bridges
                     -- to its next renewal (and is what a release without replica presence reads)
                     online_until = now() + $3 * interval '1 second'
                 from machines m
                 where e.id = $1 and e.session_hash = $2 and e.ended_at is null
                   and m.id = e.machine_id and m.revoked_at is null
                 returning e.stream_gen, e.head_seq,
                           coalesce((select a.operator from accounts a where a.id = m.account_id) = m.name || '/' || e.handle, false)",
            )
            .await?;
        let lease = presence::secs(presence::REPLICA_LEASE);
        let replica = self.replica();
        client
            .query_opt(&stmt, &[&caller.endpoint_id, &caller.session_hash, &lease, &replica])
            .await?
            .map(|r| Ok(OpenStream { generation: r.col(0)?, head: r.col(1)?, operator: r.col(2)? }))
            .transpose()
    }

    /// Whether the endpoint is its account's operator while the stream is still its newest, of a live
    /// session on a machine not revoked; `None` once it is not. Read only when the endpoint or its
    /// machine changed, never on a timer.
    pub async fn stream_current(&self, caller: &Caller, generation: i64) -> Result<Option<bool>> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "select coalesce((select a.operator from accounts a where a.id = m.account_id) = m.name || '/' || e.handle, false)
                 from endpoints e join machines m on m.id = e.machine_id
                 where e.id = $1 and e.session_hash = $2 and e.stream_gen = $3 and e.ended_at is null
                   and m.revoked_at is null",
            )
            .await?;
        client
            .query_opt(&stmt, &[&caller.endpoint_id, &caller.session_hash, &generation])
            .await?
            .map(|r| r.col(0))
            .transpose()
    }

    /// The newest stream closed: the endpoint stays online only for the reconnect grace, and its
    /// handle is free for a new claim after [`presence::UNSTREAMED_HOLD`]. An older stream closing
    /// changes nothing.
    pub async fn release_presence(&self, caller: &Caller, generation: i64) -> Result<()> {
        let client = self.client().await?;
        let grace = presence::secs(presence::RECONNECT_GRACE);
        client
            .execute(
                "update endpoints set online_until = now() + $2 * interval '1 second',
                                      last_seen_at = now(), stream_closed_gen = $4
                 where id = $1 and session_hash = $3 and stream_gen = $4 and ended_at is null",
                &[&caller.endpoint_id, &grace, &caller.session_hash, &generation],
            )
            .await?;
        Ok(())
    }

    pub async fn update_profile(
        &self,
        caller: &Caller,
        status: Option<&str>,
        note: Option<&RedactedText>,
        now: Option<&RedactedText>,
        title: Option<&RedactedText>,
    ) -> Result<Endpoint> {
        let (note, now, title) =
            (note.map(RedactedText::as_str), now.map(RedactedText::as_str), title.map(RedactedText::as_str));
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "update endpoints
                 set status = coalesce($2, status), note = coalesce($3, note),
                     now_text = coalesce($4, now_text), title = coalesce($5, title)
                 where id = $1",
            )
            .await?;
        client.execute(&stmt, &[&caller.endpoint_id, &status, &note, &now, &title]).await?;
        endpoint_on(&client, caller.endpoint_id).await
    }

    /// Endpoints of the caller's account, or of its contact accounts; online ones unless `all`.
    pub async fn list(&self, caller: &Caller, all: bool, contacts: bool) -> Result<Vec<Endpoint>> {
        let client = self.client().await?;
        let accounts =
            if contacts { contact_accounts(&client, caller.account_id).await? } else { vec![caller.account_id] };
        let sql = format!(
            "select {ENDPOINT_COLUMNS}
             from endpoints e
             join endpoint_addresses ea on ea.id = e.id
             join machines m on m.id = e.machine_id
             where m.account_id = any($1) and m.revoked_at is null
               and ($2 or {ONLINE})
             order by ea.address"
        );
        let stmt = client.prepare_cached(&sql).await?;
        let params: [&(dyn ToSql + Sync); 2] = [&accounts, &all];
        client.query(&stmt, &params).await?.iter().map(endpoint_from_row).collect()
    }
}

/// The refusal of a claim on `handle`, naming the session that holds it.
async fn held(
    client: &impl deadpool_postgres::GenericClient,
    machine: &MachineIdentity,
    handle: &str,
) -> Result<Error> {
    let row = client
        .query_opt(
            "select harness, coalesce(claimed_at, last_seen_at, created_at), stream_gen > stream_closed_gen
             from endpoints where machine_id = $1 and handle = $2",
            &[&machine.machine_id, &handle],
        )
        .await?;
    let at = format!("{}/{}", machine.account, machine.machine);
    Ok(match row {
        Some(row) => presence::handle_held(
            handle,
            &at,
            &presence::Holder { harness: row.col(0)?, since: row.col(1)?, stream_open: row.col(2)? },
        ),
        // Freed between the claim and this read: a second try will take it.
        None => Error::Unavailable(format!("handle {handle} on {at} was changing hands; try again")),
    })
}

/// An endpoint as everyone sees it, read on a connection the caller already holds.
pub(crate) async fn endpoint_on(client: &impl deadpool_postgres::GenericClient, id: EndpointId) -> Result<Endpoint> {
    let sql = format!(
        "select {ENDPOINT_COLUMNS} from endpoints e join endpoint_addresses ea on ea.id = e.id where e.id = $1"
    );
    let stmt = client.prepare_cached(&sql).await?;
    let row = client
        .query_opt(&stmt, &[&id])
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Endpoint, "no such endpoint"))?;
    endpoint_from_row(&row)
}

/// Ids of the accounts that are mutual contacts of `account_id`.
pub(crate) async fn contact_accounts(
    client: &impl deadpool_postgres::GenericClient,
    account_id: AccountId,
) -> Result<Vec<AccountId>> {
    let stmt = client
        .prepare_cached(
            "select case when account_a = $1 then account_b else account_a end
             from contacts where account_a = $1 or account_b = $1",
        )
        .await?;
    let rows = client.query(&stmt, &[&account_id]).await?;
    rows.iter().map(|r| r.col(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_read_online_as_everywhere_else() {
        assert!(ENDPOINT_COLUMNS.contains(&format!("{ONLINE} as online")), "{ENDPOINT_COLUMNS}");
        let rule = include_str!("../../migrations/0009_replica_presence_and_unread.sql");
        let grace = format!("interval '{} seconds'", presence::RECONNECT_GRACE.as_secs());
        assert!(rule.contains(&grace), "the online rule must use the reconnect grace");
    }

    #[test]
    fn control_notifications_parse() {
        assert_eq!(Control::parse("endpoint:12"), Some(Control::Endpoint(EndpointId(12))));
        assert_eq!(Control::parse("machine:3"), Some(Control::Machine(MachineId(3))));
        assert_eq!(Control::parse("machine:x"), None);
        assert_eq!(Control::parse("other:3"), None);
        assert_eq!(Control::parse("scope"), Some(Control::Scope));
    }
}
