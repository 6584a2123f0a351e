//! Accounts, machines, contacts and endpoints: who is who, and who is online.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::board::IN_PROGRESS;
use super::is_unique_violation;
use super::row::{Col, FromRow};
use crate::domain::endpoint::Endpoint;
use crate::domain::ids::{AccountId, EndpointId, JobId, MachineId, ReplicaId, TokenHash};
use crate::domain::presence::{self, OpenStream};
use crate::domain::redact::RedactedText;
use crate::domain::{EntityKind, Error};
use crate::store::{Result, StoreError};

use crate::domain::caller::{Attempt, Caller, MachineIdentity};

/// A caller from the columns `endpoint_id, account_id, account, machine_id, machine, handle`, of no attempt.
fn caller_from_row(row: &Row, session_hash: TokenHash) -> Result<Caller> {
    Ok(Caller {
        endpoint_id: row.col("endpoint_id")?,
        account_id: row.col("account_id")?,
        account: row.col("account")?,
        machine_id: row.col("machine_id")?,
        machine: row.col("machine")?,
        handle: row.col("handle")?,
        session_hash,
        attempt: None,
    })
}

/// An endpoint as the sender of what the server writes on its behalf (a worker's report, a held
/// message re-checked, a permission question): no session of its own is involved.
pub(crate) async fn caller_of(c: &impl GenericClient, endpoint_id: EndpointId) -> Result<Caller> {
    let row = c
        .query_opt(
            "select id as endpoint_id, account_id, account, machine_id, machine, handle from endpoint_addresses where id = $1",
            &[&endpoint_id],
        )
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Endpoint, "that endpoint is gone"))?;
    caller_from_row(&row, TokenHash::from_stored(Vec::new()))
}

/// The endpoint `handle` of a card's agent on the machine that leased the card: made, ended and
/// without a session, when the agent has not said Hello yet (its Hello then claims it).
pub(crate) async fn card_endpoint(
    c: &impl GenericClient,
    machine_id: MachineId,
    handle: &str,
    harness: &str,
) -> Result<EndpointId> {
    c.execute(
        "insert into endpoints (machine_id, handle, harness, ended_at) values ($1, $2, $3, now())
         on conflict (machine_id, handle) do nothing",
        &[&machine_id, &handle, &harness],
    )
    .await?;
    c.query_one("select id from endpoints where machine_id = $1 and handle = $2", &[&machine_id, &handle]).await?.only()
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

/// Whether endpoint `e` is online, as SQL over `endpoints e`: its session lives, its lease holds,
/// and its newest push stream is open or it showed a sign of life within the reconnect grace (so a
/// holder that crashed before or after opening its stream is not shown online for long). The rule
/// is one SQL function (migration 9), shared with the batched send.
pub(super) const ONLINE: &str = "relay_endpoint_online(e)";

/// Columns read by [`Endpoint::from_row`], for `from endpoints e join endpoint_addresses ea on ea.id = e.id`.
pub(super) const ENDPOINT_COLUMNS: &str = "ea.address, ea.account, ea.machine, ea.handle, e.harness, e.status, \
     e.note, e.now_text, e.title, relay_endpoint_online(e) as online, e.ended_at is not null as ended, \
     e.last_seen_at, e.peek_on, \
     coalesce((select a.operator from accounts a where a.id = ea.account_id) = ea.machine || '/' || ea.handle, false) \
     as operator";

impl FromRow for Endpoint {
    fn from_row(row: &Row) -> Result<Self> {
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
}

// ---- accounts, machines and contacts ------------------------------------------------------------

/// Inserts an account; a name already taken is refused.
pub(crate) async fn insert_account(c: &impl GenericClient, name: &str) -> Result<()> {
    let stmt = c.prepare_cached("insert into accounts (name) values ($1)").await?;
    c.execute(&stmt, &[&name]).await.map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::from(Error::AlreadyExists(format!("account {name} already exists")))
        } else {
            StoreError::from(e)
        }
    })?;
    Ok(())
}

/// Inserts an account unless one of that name exists.
pub(crate) async fn ensure_account(c: &impl GenericClient, name: &str) -> Result<()> {
    c.execute("insert into accounts (name) values ($1) on conflict (name) do nothing", &[&name]).await?;
    Ok(())
}

/// The id of the account named `name`.
pub(crate) async fn account_id(c: &impl GenericClient, name: &str) -> Result<Option<AccountId>> {
    c.query_opt("select id from accounts where name = $1", &[&name]).await?.map(|r| r.only()).transpose()
}

/// Inserts a machine with the token hash, or gives an existing one the hash when it is revoked
/// (and cleared of its revocation) or `replace_live`. `false` when a live machine kept its token.
pub(crate) async fn upsert_machine_token(
    c: &impl GenericClient,
    account_id: AccountId,
    machine: &str,
    token_hash: &TokenHash,
    replace_live: bool,
) -> Result<bool> {
    let row = c
        .query_opt(
            "insert into machines (account_id, name, token_hash) values ($1, $2, $3)
             on conflict (account_id, name) do update
                 set token_hash = excluded.token_hash, revoked_at = null
                 where machines.revoked_at is not null or $4
             returning id",
            &[&account_id, &machine, &token_hash, &replace_live],
        )
        .await?;
    Ok(row.is_some())
}

/// Marks `account/machine` revoked (keeping an earlier revocation's time); its id, or `None` when
/// there is no such machine. Locks the machine's row.
pub(crate) async fn revoke_machine(c: &impl GenericClient, account: &str, machine: &str) -> Result<Option<MachineId>> {
    c.query_opt(
        "update machines m set revoked_at = coalesce(m.revoked_at, now())
         from accounts a
         where a.id = m.account_id and a.name = $1 and m.name = $2
         returning m.id",
        &[&account, &machine],
    )
    .await?
    .map(|r| r.only())
    .transpose()
}

/// Ends the sessions of every endpoint of a machine.
pub(crate) async fn end_machine_sessions(c: &impl GenericClient, machine_id: MachineId) -> Result<()> {
    c.execute(
        "update endpoints set session_hash = null, ended_at = coalesce(ended_at, now()), online_until = null
         where machine_id = $1",
        &[&machine_id],
    )
    .await?;
    Ok(())
}

/// The ids and names of the accounts among `names` that exist.
pub(crate) async fn accounts_named(c: &impl GenericClient, names: &[&str]) -> Result<Vec<(AccountId, String)>> {
    c.query("select id, name from accounts where name = any($1)", &[&names])
        .await?
        .iter()
        .map(|r| Ok((r.col("id")?, r.col("name")?)))
        .collect()
}

/// Makes two accounts mutual contacts (one row, the lower id first) unless they are already.
pub(crate) async fn insert_contact(c: &impl GenericClient, a: AccountId, b: AccountId) -> Result<()> {
    c.execute(
        "insert into contacts (account_a, account_b) values (least($1::bigint, $2::bigint), greatest($1::bigint, $2::bigint))
         on conflict do nothing",
        &[&a, &b],
    )
    .await?;
    Ok(())
}

// ---- authentication ------------------------------------------------------------------------------

/// The machine holding a token hash, and whether it is revoked.
pub(crate) async fn machine_by_token(
    c: &impl GenericClient,
    token_hash: &TokenHash,
) -> Result<Option<(MachineIdentity, bool)>> {
    let stmt = c
        .prepare_cached(
            "select m.id as machine_id, m.name as machine, a.id as account_id, a.name as account,
                    m.revoked_at is not null as revoked
             from machines m join accounts a on a.id = m.account_id
             where m.token_hash = $1",
        )
        .await?;
    let Some(row) = c.query_opt(&stmt, &[&token_hash]).await? else {
        return Ok(None);
    };
    Ok(Some((MachineIdentity::from_row(&row)?, row.col("revoked")?)))
}

/// A machine from the columns `machine_id, machine, account_id, account`.
impl FromRow for MachineIdentity {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(MachineIdentity {
            machine_id: row.col("machine_id")?,
            machine: row.col("machine")?,
            account_id: row.col("account_id")?,
            account: row.col("account")?,
        })
    }
}

/// A session as its hash finds it: the endpoint it holds, and whether it still lives.
pub(crate) struct StoredSession {
    pub caller: Caller,
    /// Not ended, its machine not revoked, and (a card's agent's) its attempt in progress under a
    /// live lease.
    pub live: bool,
    /// A card's agent's session whose attempt is over.
    pub attempt_over: bool,
}

/// The endpoint a session hash holds, and whether the session lives. Only the sessions of cards'
/// agents are found once ended (they keep their hash, so a late call learns why).
pub(crate) async fn session_caller(c: &impl GenericClient, session_hash: TokenHash) -> Result<Option<StoredSession>> {
    let stmt = c
        .prepare_cached(&format!(
            "select e.id as endpoint_id, m.account_id, a.name as account, m.id as machine_id, m.name as machine,
                    e.handle, e.job_token_hash, j.id as card,
                    e.ended_at is null and m.revoked_at is null as open,
                    coalesce(j.state = '{IN_PROGRESS}' and j.lease_until > now(), false) as attempt_running
             from endpoints e
             join machines m on m.id = e.machine_id
             join accounts a on a.id = m.account_id
             left join jobs j on j.job_token_hash = e.job_token_hash
             where e.session_hash = $1"
        ))
        .await?;
    let Some(row) = c.query_opt(&stmt, &[&session_hash]).await? else {
        return Ok(None);
    };
    let mut caller = caller_from_row(&row, session_hash)?;
    let (open, attempt_running): (bool, bool) = (row.col("open")?, row.col("attempt_running")?);
    if let Some(token_hash) = row.col::<Option<TokenHash>>("job_token_hash")? {
        // An ended attempt's card is gone from the row; the handle still names it.
        let card = row.col::<Option<JobId>>("card")?.unwrap_or_else(|| JobId::new(caller.handle.clone()));
        caller.attempt = Some(Attempt { card, token_hash });
    }
    let attempt_over = caller.attempt.is_some() && !attempt_running;
    Ok(Some(StoredSession { caller, live: open && !attempt_over, attempt_over }))
}

// ---- claims and presence -------------------------------------------------------------------------

/// Renews the live session `session_hash` holds on the machine (its harness, a sign of life, at
/// least a claim's lease); the endpoint's id, or `None` when no such session lives. With
/// `attempt` (a job token's hash) only that attempt's session is resumed.
pub(crate) async fn resume_session(
    c: &impl GenericClient,
    session_hash: &TokenHash,
    machine_id: MachineId,
    harness: &str,
    attempt: Option<&TokenHash>,
) -> Result<Option<EndpointId>> {
    let stmt = c
        .prepare_cached(
            "update endpoints
             set harness = $3, last_seen_at = now(),
                 online_until = greatest(online_until, now() + $4 * interval '1 second')
             where session_hash = $1 and machine_id = $2 and ended_at is null
               and ($5::bytea is null or job_token_hash = $5)
             returning id",
        )
        .await?;
    let lease = presence::secs(presence::CLAIM_LEASE);
    c.query_opt(&stmt, &[&session_hash, &machine_id, &harness, &lease, &attempt]).await?.map(|r| r.only()).transpose()
}

/// Gives the endpoint a spawn grant reserved to a new session, unless a live session holds it:
/// `false` then.
pub(crate) async fn claim_granted(
    c: &impl GenericClient,
    id: EndpointId,
    harness: &str,
    session_hash: &TokenHash,
) -> Result<bool> {
    let lease = presence::secs(presence::CLAIM_LEASE);
    let claimed = c
        .execute(
            // The presence lease is the rule of migration 9's relay_endpoint_lease.
            "update endpoints
             set harness = $2, session_hash = $3, online_until = now() + $4 * interval '1 second',
                 last_seen_at = now(), ended_at = null, claimed_at = now(), stream_closed_gen = stream_gen,
                 job_token_hash = null
             where id = $1
               and (session_hash is null or ended_at is not null or not relay_endpoint_lease(endpoints))",
            &[&id, &harness, &session_hash, &lease],
        )
        .await?;
    Ok(claimed > 0)
}

/// How many endpoints an account holds at most, and how many of them one machine's agents
/// (cards' endpoints, `job-…`, apart: they come and go with the board).
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndpointCaps {
    pub account: u32,
    pub machine: u32,
}

/// Which cap a new endpoint would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRoom {
    Account,
    Machine,
}

/// Claims `handle` on the machine for a new session: a new endpoint, or one whose handle is free
/// (see [`presence::UNSTREAMED_HOLD`]), which starts its profile afresh. `attempt` (a job token's
/// hash) makes the session a card's agent's; without it the session is a machine's agent's. Its
/// id, or `None` when another session holds the handle (or a new one has no room: [`no_room_for`]).
pub(crate) async fn claim_handle(
    c: &impl GenericClient,
    machine_id: MachineId,
    handle: &str,
    harness: &str,
    session_hash: &TokenHash,
    attempt: Option<&TokenHash>,
    caps: EndpointCaps,
) -> Result<Option<EndpointId>> {
    let claim = c
        .prepare_cached(
            "insert into endpoints (machine_id, handle, harness, session_hash, online_until, last_seen_at, claimed_at,
                                    job_token_hash)
             select $1, $2, $3, $4, now() + $5 * interval '1 second', now(), now(), $8
             -- a new handle only while the account holds fewer endpoints than it may, and the
             -- machine fewer of its agents' (cards' apart)
             where exists (select 1 from endpoints where machine_id = $1 and handle = $2)
                or ((select count(*) from endpoints e join machines m on m.id = e.machine_id
                     where m.account_id = (select account_id from machines where id = $1)) < $7
                    and ($2 like 'job-%'
                         or (select count(*) from endpoints
                             where machine_id = $1 and handle not like 'job-%') < $9))
             on conflict (machine_id, handle) do update
                 set harness = excluded.harness, session_hash = excluded.session_hash,
                     online_until = excluded.online_until, last_seen_at = now(), ended_at = null,
                     status = 'idle', note = '', now_text = '', last_shown = null,
                     -- peeking is the choice of one session: a new one starts with it off
                     peek_on = false,
                     claimed_at = now(), stream_closed_gen = endpoints.stream_gen,
                     job_token_hash = excluded.job_token_hash
                 where endpoints.ended_at is not null
                    or not relay_endpoint_lease(endpoints)
                    -- no stream open and no sign of life for a moment: the holder crashed, or
                    -- claimed and never subscribed
                    or (endpoints.stream_gen <= endpoints.stream_closed_gen
                        and coalesce(endpoints.last_seen_at, endpoints.created_at) < now() - $6 * interval '1 second')
             returning id",
        )
        .await?;
    let (lease, hold) = (presence::secs(presence::CLAIM_LEASE), presence::secs(presence::UNSTREAMED_HOLD));
    let (account_cap, machine_cap) = (i64::from(caps.account), i64::from(caps.machine));
    let params: [&(dyn ToSql + Sync); 9] =
        [&machine_id, &handle, &harness, &session_hash, &lease, &hold, &account_cap, &attempt, &machine_cap];
    c.query_opt(&claim, &params).await?.map(|r| r.only()).transpose()
}

/// Which cap `handle` would pass as a new endpoint of the machine: its account's (counting every
/// endpoint, ended ones too: they keep their inbox and can be claimed again) or the machine's share
/// of it; `None` when it has room, or is not new.
pub(crate) async fn no_room_for(
    c: &impl GenericClient,
    machine_id: MachineId,
    handle: &str,
    caps: EndpointCaps,
) -> Result<Option<NoRoom>> {
    let row = c
        .query_one(
            "select coalesce(bool_or(e.machine_id = $1 and e.handle = $3), false) as exists,
                    count(*) >= $2 as account_full,
                    count(*) filter (where e.machine_id = $1 and e.handle not like 'job-%') >= $4
                        and $3 not like 'job-%' as machine_full
             from endpoints e join machines m on m.id = e.machine_id
             where m.account_id = (select account_id from machines where id = $1)",
            &[&machine_id, &i64::from(caps.account), &handle, &i64::from(caps.machine)],
        )
        .await?;
    let (exists, account_full, machine_full): (bool, bool, bool) =
        (row.col("exists")?, row.col("account_full")?, row.col("machine_full")?);
    Ok(match (exists, account_full, machine_full) {
        (true, _, _) => None,
        (false, true, _) => Some(NoRoom::Account),
        (false, false, true) => Some(NoRoom::Machine),
        (false, false, false) => None,
    })
}

/// Handles of the machine's endpoints whose session has not ended.
pub(crate) async fn live_handles(c: &impl GenericClient, machine_id: MachineId) -> Result<Vec<String>> {
    c.query("select handle from endpoints where machine_id = $1 and ended_at is null", &[&machine_id])
        .await?
        .iter()
        .map(|r| r.only())
        .collect()
}

/// The session holding `handle` on the machine, as a refused claim describes it.
pub(crate) async fn holder(
    c: &impl GenericClient,
    machine_id: MachineId,
    handle: &str,
) -> Result<Option<presence::Holder>> {
    let row = c
        .query_opt(
            "select harness, coalesce(claimed_at, last_seen_at, created_at) as since,
                    stream_gen > stream_closed_gen as stream_open
             from endpoints where machine_id = $1 and handle = $2",
            &[&machine_id, &handle],
        )
        .await?;
    row.map(|row| presence::Holder::from_row(&row)).transpose()
}

impl FromRow for presence::Holder {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(presence::Holder {
            harness: row.col("harness")?,
            since: row.col("since")?,
            stream_open: row.col("stream_open")?,
        })
    }
}

/// Forgets the turns peekers saw of the endpoint's previous session.
pub(crate) async fn clear_peek_turns(c: &impl GenericClient, id: EndpointId) -> Result<()> {
    c.execute("delete from peek_turns where endpoint_id = $1", &[&id]).await?;
    Ok(())
}

/// Ends the endpoint's session: offline at once, its handle free.
pub(crate) async fn end_session(c: &impl GenericClient, id: EndpointId) -> Result<()> {
    c.execute(
        "update endpoints set ended_at = now(), session_hash = null, online_until = null, last_seen_at = now()
         where id = $1",
        &[&id],
    )
    .await?;
    Ok(())
}

/// Makes a stream opening on `replica` the endpoint's newest, and keeps the endpoint online until
/// the replica's next renewal. `None` when the caller's session no longer lives.
pub(crate) async fn open_stream(
    c: &impl GenericClient,
    caller: &Caller,
    replica: ReplicaId,
) -> Result<Option<OpenStream>> {
    let stmt = c
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
                       coalesce((select a.operator from accounts a where a.id = m.account_id) = m.name || '/' || e.handle, false)
                           as operator",
        )
        .await?;
    let lease = presence::secs(presence::REPLICA_LEASE);
    c.query_opt(&stmt, &[&caller.endpoint_id, &caller.session_hash, &lease, &replica])
        .await?
        .map(|row| OpenStream::from_row(&row))
        .transpose()
}

impl FromRow for OpenStream {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(OpenStream {
            generation: row.col("stream_gen")?,
            head: row.col("head_seq")?,
            operator: row.col("operator")?,
        })
    }
}

/// Whether the endpoint is its account's operator while stream `generation` is still its newest,
/// of a live session on a machine not revoked; `None` once it is not.
pub(crate) async fn stream_current(c: &impl GenericClient, caller: &Caller, generation: i64) -> Result<Option<bool>> {
    let stmt = c
        .prepare_cached(
            "select coalesce((select a.operator from accounts a where a.id = m.account_id) = m.name || '/' || e.handle, false)
             from endpoints e join machines m on m.id = e.machine_id
             where e.id = $1 and e.session_hash = $2 and e.stream_gen = $3 and e.ended_at is null
               and m.revoked_at is null",
        )
        .await?;
    c.query_opt(&stmt, &[&caller.endpoint_id, &caller.session_hash, &generation]).await?.map(|r| r.only()).transpose()
}

/// Stream `generation` closed: if it was the newest, the endpoint stays online only for the
/// reconnect grace, and its handle is free for a new claim after [`presence::UNSTREAMED_HOLD`].
pub(crate) async fn close_stream(c: &impl GenericClient, caller: &Caller, generation: i64) -> Result<()> {
    let grace = presence::secs(presence::RECONNECT_GRACE);
    c.execute(
        "update endpoints set online_until = now() + $2 * interval '1 second',
                              last_seen_at = now(), stream_closed_gen = $4
         where id = $1 and session_hash = $3 and stream_gen = $4 and ended_at is null",
        &[&caller.endpoint_id, &grace, &caller.session_hash, &generation],
    )
    .await?;
    Ok(())
}

// ---- profiles and listings -----------------------------------------------------------------------

/// Sets the given fields of the endpoint's profile; `None` leaves a field.
pub(crate) async fn set_profile(
    c: &impl GenericClient,
    id: EndpointId,
    status: Option<&str>,
    note: Option<&RedactedText>,
    now: Option<&RedactedText>,
    title: Option<&RedactedText>,
) -> Result<()> {
    let (note, now, title) =
        (note.map(RedactedText::as_str), now.map(RedactedText::as_str), title.map(RedactedText::as_str));
    let stmt = c
        .prepare_cached(
            "update endpoints
             set status = coalesce($2, status), note = coalesce($3, note),
                 now_text = coalesce($4, now_text), title = coalesce($5, title)
             where id = $1",
        )
        .await?;
    c.execute(&stmt, &[&id, &status, &note, &now, &title]).await?;
    Ok(())
}

/// Endpoints of the accounts on machines not revoked, by address; online ones unless `all`.
pub(crate) async fn endpoints_of(c: &impl GenericClient, accounts: &[AccountId], all: bool) -> Result<Vec<Endpoint>> {
    let sql = format!(
        "select {ENDPOINT_COLUMNS}
         from endpoints e
         join endpoint_addresses ea on ea.id = e.id
         join machines m on m.id = e.machine_id
         where m.account_id = any($1) and m.revoked_at is null
           and ($2 or {ONLINE})
         order by ea.address"
    );
    let stmt = c.prepare_cached(&sql).await?;
    let params: [&(dyn ToSql + Sync); 2] = [&accounts, &all];
    c.query(&stmt, &params).await?.iter().map(Endpoint::from_row).collect()
}

/// An endpoint as everyone sees it, read on a connection the caller already holds.
pub(crate) async fn endpoint_on(client: &impl GenericClient, id: EndpointId) -> Result<Endpoint> {
    let sql = format!(
        "select {ENDPOINT_COLUMNS} from endpoints e join endpoint_addresses ea on ea.id = e.id where e.id = $1"
    );
    let stmt = client.prepare_cached(&sql).await?;
    let row = client
        .query_opt(&stmt, &[&id])
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Endpoint, "no such endpoint"))?;
    Endpoint::from_row(&row)
}

/// An endpoint as everyone sees it and how many messages wait unread in its inbox (the counter
/// the writers keep), in one statement: what whoami answers, and what an agent with no push stream
/// asks with every tool call.
pub(crate) async fn whoami(client: &impl GenericClient, id: EndpointId, account: AccountId) -> Result<WhoAmI> {
    let sql = format!(
        "select {ENDPOINT_COLUMNS}, e.unread + ({posts})::int as unread,
                exists (select 1 from repos r where r.account_id = $2) as board
         from endpoints e join endpoint_addresses ea on ea.id = e.id where e.id = $1",
        posts = super::topics::UNREAD_COUNT
    );
    let stmt = client.prepare_cached(&sql).await?;
    let row = client
        .query_opt(&stmt, &[&id, &account])
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Endpoint, "no such endpoint"))?;
    let unread: i32 = row.col("unread")?;
    Ok(WhoAmI { endpoint: Endpoint::from_row(&row)?, unread: unread.max(0) as u64, board: row.col("board")? })
}

/// An endpoint as it sees itself.
pub struct WhoAmI {
    pub endpoint: Endpoint,
    pub unread: u64,
    /// Its account has a repository on the board.
    pub board: bool,
}

/// Ids of the accounts that are mutual contacts of `account_id`.
pub(crate) async fn contact_accounts(client: &impl GenericClient, account_id: AccountId) -> Result<Vec<AccountId>> {
    let stmt = client
        .prepare_cached(
            "select case when account_a = $1 then account_b else account_a end
             from contacts where account_a = $1 or account_b = $1",
        )
        .await?;
    let rows = client.query(&stmt, &[&account_id]).await?;
    rows.iter().map(|r| r.only()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::token_hash;
    use crate::store::testing;

    const CAPS: EndpointCaps = EndpointCaps { account: 100, machine: 10 };

    #[tokio::test]
    async fn a_granted_endpoint_is_claimed_only_while_free_and_a_revoked_machines_sessions_all_end() {
        let db = testing::db().await;
        let (_, machine) = db.machine("acme", "laptop").await;
        let c = db.store.client().await.unwrap();
        let (first, second) = (TokenHash::from_stored(b"s1".to_vec()), TokenHash::from_stored(b"s2".to_vec()));
        let child = db.endpoint(machine, "lead-1", 0).await;
        assert!(claim_granted(&c, child, "codex", &first).await.unwrap(), "reserved and never claimed");
        assert!(!claim_granted(&c, child, "codex", &second).await.unwrap(), "its live session holds it");
        let other = claim_handle(&c, machine, "ann", "claude-code", &second, None, CAPS).await.unwrap().unwrap();
        db.test
            .sql()
            .await
            .execute("insert into peek_turns (endpoint_id, turns) values ($1, '[]')", &[&other])
            .await
            .unwrap();
        clear_peek_turns(&c, other).await.unwrap();
        let kept: i64 = db.test.sql().await.query_one("select count(*) from peek_turns", &[]).await.unwrap().get(0);
        assert_eq!(kept, 0);

        end_machine_sessions(&c, machine).await.unwrap();
        assert!(live_handles(&c, machine).await.unwrap().is_empty(), "every session of the machine ended");
        assert!(
            session_caller(&c, first).await.unwrap().is_none() && session_caller(&c, second).await.unwrap().is_none()
        );
    }

    #[tokio::test]
    async fn a_profile_changes_only_what_is_given_and_listings_show_the_accounts_live_endpoints() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (globex, boxed) = db.machine("globex", "box").await;
        let c = db.store.client().await.unwrap();
        let session = TokenHash::from_stored(b"session".to_vec());
        let ann = claim_handle(&c, laptop, "ann", "claude-code", &session, None, CAPS).await.unwrap().unwrap();
        let idle = db.endpoint(laptop, "idle", 3).await;
        db.endpoint(boxed, "gus", 0).await;
        let note = RedactedText::from_agent("on the parser");
        set_profile(&c, ann, Some("busy"), Some(&note), None, None).await.unwrap();
        set_profile(&c, ann, None, None, Some(&RedactedText::from_agent("tests")), None).await.unwrap();
        let me = endpoint_on(&c, ann).await.unwrap();
        assert_eq!(
            (me.status.as_str(), me.note.as_str(), me.now.as_str()),
            ("busy", "on the parser", "tests"),
            "what was not given stays"
        );
        assert!(me.online && !me.ended);

        let addresses = |list: Vec<Endpoint>| list.into_iter().map(|e| e.address).collect::<Vec<_>>();
        assert_eq!(addresses(endpoints_of(&c, &[acme], false).await.unwrap()), ["acme/laptop/ann"], "online only");
        assert_eq!(addresses(endpoints_of(&c, &[acme], true).await.unwrap()), ["acme/laptop/ann", "acme/laptop/idle"]);
        assert_eq!(endpoints_of(&c, &[acme, globex], true).await.unwrap().len(), 3, "and a contact's");
        let who = whoami(&c, idle, acme).await.unwrap();
        assert_eq!((who.endpoint.address.as_str(), who.unread, who.board), ("acme/laptop/idle", 3, false));
        db.card(acme, laptop, "c1").await;
        assert!(whoami(&c, idle, acme).await.unwrap().board, "an account with a repository has a board");

        let tight = EndpointCaps { account: 2, machine: 10 };
        assert_eq!(no_room_for(&c, laptop, "new", tight).await.unwrap(), Some(NoRoom::Account));
        assert_eq!(no_room_for(&c, laptop, "ann", tight).await.unwrap(), None, "an existing handle needs no room");
        let narrow = EndpointCaps { account: 100, machine: 2 };
        assert_eq!(no_room_for(&c, laptop, "new", narrow).await.unwrap(), Some(NoRoom::Machine));
        assert_eq!(no_room_for(&c, laptop, "job-c9", narrow).await.unwrap(), None, "cards' endpoints apart");
        assert!(
            claim_handle(&c, laptop, "new", "codex", &TokenHash::from_stored(b"s2".to_vec()), None, narrow)
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_machine_token_finds_its_machine_and_a_session_hash_its_endpoint_until_the_session_ends() {
        let db = testing::db().await;
        let (account, machine) = db.machine("acme", "laptop").await;
        let c = db.store.client().await.unwrap();
        // The test machine's token hash is its account id and name.
        let token = TokenHash::from_stored(format!("{}/laptop", account.0).into_bytes());
        let (found, revoked) = machine_by_token(&c, &token).await.unwrap().expect("the machine of that token");
        assert_eq!(
            (found.machine_id, found.account.as_str(), found.machine.as_str(), revoked),
            (machine, "acme", "laptop", false)
        );
        assert!(machine_by_token(&c, &TokenHash::from_stored(b"unknown".to_vec())).await.unwrap().is_none());

        let session = TokenHash::from_stored(b"session".to_vec());
        let id = claim_handle(&c, machine, "claude-1", "claude-code", &session, None, CAPS).await.unwrap().unwrap();
        let stored = session_caller(&c, session.clone()).await.unwrap().expect("the session's endpoint");
        assert_eq!((stored.caller.endpoint_id, stored.caller.handle.as_str(), stored.live), (id, "claude-1", true));
        assert!(!stored.attempt_over && stored.caller.attempt.is_none());
        assert_eq!(resume_session(&c, &session, machine, "codex", None).await.unwrap(), Some(id));
        let (_, other) = db.machine("acme", "desk").await;
        assert_eq!(resume_session(&c, &session, other, "codex", None).await.unwrap(), None, "only on its own machine");

        end_session(&c, id).await.unwrap();
        assert!(session_caller(&c, session.clone()).await.unwrap().is_none(), "an ended session's hash finds nothing");
        assert_eq!(resume_session(&c, &session, machine, "codex", None).await.unwrap(), None);
        assert_eq!(revoke_machine(&c, "acme", "laptop").await.unwrap(), Some(machine));
        assert!(machine_by_token(&c, &token).await.unwrap().expect("still found").1, "and said to be revoked");
    }

    #[tokio::test]
    async fn a_claimed_handle_is_held_while_its_session_lives_and_its_newest_stream_alone_is_current() {
        let db = testing::db().await;
        let (_, machine) = db.machine("acme", "laptop").await;
        let replica = db.store.register_replica().await.unwrap();
        let c = db.store.client().await.unwrap();
        let (first, second) =
            (TokenHash::from_stored(b"session-1".to_vec()), TokenHash::from_stored(b"session-2".to_vec()));
        let id = claim_handle(&c, machine, "claude-1", "claude-code", &first, None, CAPS).await.unwrap().expect("free");
        assert!(
            claim_handle(&c, machine, "claude-1", "codex", &second, None, CAPS).await.unwrap().is_none(),
            "held by a live session"
        );
        let held = holder(&c, machine, "claude-1").await.unwrap().expect("its holder");
        assert_eq!((held.harness.as_str(), held.stream_open), ("claude-code", false));

        let caller = Caller { session_hash: first.clone(), ..caller_of(&c, id).await.unwrap() };
        let opened = open_stream(&c, &caller, replica).await.unwrap().expect("a live session opens a stream");
        assert_eq!((opened.head, opened.operator), (crate::domain::ids::Seq(0), false));
        let newer = open_stream(&c, &caller, replica).await.unwrap().expect("and another");
        assert_eq!(newer.generation, opened.generation + 1);
        assert_eq!(stream_current(&c, &caller, opened.generation).await.unwrap(), None, "superseded");
        assert_eq!(stream_current(&c, &caller, newer.generation).await.unwrap(), Some(false));
        assert!(holder(&c, machine, "claude-1").await.unwrap().unwrap().stream_open);
        close_stream(&c, &caller, opened.generation).await.unwrap();
        assert!(
            holder(&c, machine, "claude-1").await.unwrap().unwrap().stream_open,
            "closing an older stream closes nothing"
        );
        close_stream(&c, &caller, newer.generation).await.unwrap();
        assert!(!holder(&c, machine, "claude-1").await.unwrap().unwrap().stream_open);

        end_session(&c, id).await.unwrap();
        assert!(live_handles(&c, machine).await.unwrap().is_empty());
        assert!(open_stream(&c, &caller, replica).await.unwrap().is_none(), "an ended session opens nothing");
        let again = claim_handle(&c, machine, "claude-1", "codex", &second, None, CAPS).await.unwrap();
        assert_eq!(again, Some(id), "the handle, and its inbox, go to the next session");
        assert_eq!(live_handles(&c, machine).await.unwrap(), ["claude-1"]);
    }

    #[tokio::test]
    async fn an_account_name_is_taken_once_and_found_by_name() {
        let db = testing::db().await;
        let c = db.store.client().await.unwrap();
        insert_account(&c, "acme").await.unwrap();
        let again = Error::from(insert_account(&c, "acme").await.unwrap_err());
        assert!(matches!(&again, Error::AlreadyExists(m) if m == "account acme already exists"), "{again:?}");
        ensure_account(&c, "acme").await.unwrap();
        ensure_account(&c, "globex").await.unwrap();
        let acme = account_id(&c, "acme").await.unwrap().expect("acme exists");
        assert_eq!(account_id(&c, "initech").await.unwrap(), None);
        let named = accounts_named(&c, &["acme", "initech"]).await.unwrap();
        assert_eq!(named, vec![(acme, "acme".to_owned())], "only the names that exist");
    }

    #[tokio::test]
    async fn a_live_machine_keeps_its_token_unless_replaced_and_a_revoked_one_takes_a_new_one() {
        let db = testing::db().await;
        let c = db.store.client().await.unwrap();
        insert_account(&c, "acme").await.unwrap();
        let acme = account_id(&c, "acme").await.unwrap().unwrap();
        let (first, second, third) = (token_hash("first"), token_hash("second"), token_hash("third"));
        assert!(upsert_machine_token(&c, acme, "laptop", &first, false).await.unwrap(), "a new machine");
        assert!(!upsert_machine_token(&c, acme, "laptop", &second, false).await.unwrap(), "a live one keeps its token");
        assert!(machine_by_token(&c, &second).await.unwrap().is_none());
        let (found, revoked) = machine_by_token(&c, &first).await.unwrap().expect("the first token holds");
        assert_eq!((found.account.as_str(), found.machine.as_str(), revoked), ("acme", "laptop", false));

        let revoked_id = revoke_machine(&c, "acme", "laptop").await.unwrap().expect("it exists");
        assert_eq!(revoked_id, found.machine_id);
        assert!(machine_by_token(&c, &first).await.unwrap().unwrap().1, "found, and revoked");
        assert_eq!(revoke_machine(&c, "acme", "desktop").await.unwrap(), None, "no such machine");
        assert!(upsert_machine_token(&c, acme, "laptop", &second, false).await.unwrap(), "revoked: a new token");
        let (again, revoked) = machine_by_token(&c, &second).await.unwrap().unwrap();
        assert_eq!((again.machine_id, revoked), (found.machine_id, false), "the same machine, live again");
        assert!(upsert_machine_token(&c, acme, "laptop", &third, true).await.unwrap(), "replaced while live");
        assert!(machine_by_token(&c, &second).await.unwrap().is_none(), "the old token holds no more");
    }

    #[tokio::test]
    async fn a_contact_is_one_row_whichever_side_makes_it_and_lists_the_other_account() {
        let db = testing::db().await;
        let c = db.store.client().await.unwrap();
        for name in ["acme", "globex", "initech"] {
            insert_account(&c, name).await.unwrap();
        }
        let id = |name| account_id(&c, name);
        let (acme, globex, initech) = (
            id("acme").await.unwrap().unwrap(),
            id("globex").await.unwrap().unwrap(),
            id("initech").await.unwrap().unwrap(),
        );
        insert_contact(&c, globex, acme).await.unwrap();
        insert_contact(&c, acme, globex).await.unwrap();
        let rows: i64 = c.query_one("select count(*) from contacts", &[]).await.unwrap().get(0);
        assert_eq!(rows, 1, "made twice, from either side, it is one contact");
        assert_eq!(contact_accounts(&c, acme).await.unwrap(), vec![globex]);
        assert_eq!(contact_accounts(&c, globex).await.unwrap(), vec![acme]);
        assert!(contact_accounts(&c, initech).await.unwrap().is_empty());
    }

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
