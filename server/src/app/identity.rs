//! Who is calling, and the endpoint it holds: claiming and ending it, what it says of itself,
//! and whom it sees. A machine's agent claims any handle of its machine; a card's agent, with its
//! job token, only its card's endpoint and only while the card's attempt runs. The operator's
//! commands (accounts, machines, contacts) run without an App, from `relay-server admin` and
//! `dev`: they take the store.

use std::sync::Arc;

use deadpool_postgres::GenericClient;

use super::quotas::{Call, CallRates};
use super::{Core, optional};
use crate::domain::board as board_rules;
use crate::domain::caller::{Attempt, CardAgent};
use crate::domain::caller::{Caller, MachineIdentity};
use crate::domain::endpoint::Endpoint;
use crate::domain::ids::{self, TokenHash, TokenKind};
use crate::domain::names::{self, NameKind, check_claimable, validate};
use crate::domain::redact::RedactedText;
use crate::domain::{EntityKind, Error, Result, limits, presence};
use crate::store;
use crate::store::identity;
use crate::store::{Store, board, spawn};

/// Who calls: machines, sessions and endpoints, profiles, the list of agents.
#[derive(Clone)]
pub struct IdentityService {
    core: Core,
    calls: Arc<CallRates>,
}

impl IdentityService {
    pub(super) fn new(core: Core) -> Self {
        let calls = Arc::new(CallRates::new(core.quotas));
        Self { core, calls }
    }

    /// Takes one call from its credential's and account's call rates (see [`CallRates::admit`]).
    pub fn admit_call(&self, call: &Call<'_>) -> Result<()> {
        self.calls.admit(call)
    }
}

/// A profile change; `None` leaves a field as it is.
#[derive(Default)]
pub struct ProfileChange<'a> {
    pub status: Option<&'a str>,
    pub note: Option<&'a str>,
    pub now: Option<&'a str>,
    pub title: Option<&'a str>,
}

/// A claim on a handle of the caller's machine.
pub struct Claim<'a> {
    pub handle: &'a str,
    pub harness: &'a str,
    pub resume: &'a str,
    pub spawn_grant: &'a str,
}

/// A claim, checked: a handle (or a picked one), a session to resume, a spawn grant, and for a
/// card's agent the hash of its job token.
struct Wanted<'a> {
    handle: Option<&'a str>,
    /// The session token to claim with, when the caller derived one (else a new one is made).
    token: Option<&'a str>,
    harness: &'a str,
    resume: Option<&'a str>,
    spawn_grant: Option<&'a str>,
    attempt: Option<&'a TokenHash>,
}

/// The endpoint a Hello claimed or resumed, and the session token that holds it.
pub struct HelloOutcome {
    pub endpoint: Endpoint,
    pub session_token: String,
    pub resumed: bool,
}

impl IdentityService {
    /// The machine a machine token names.
    pub async fn machine(&self, token: &str) -> Result<MachineIdentity> {
        authenticate_machine(&self.core.store, token).await
    }

    /// The endpoint a session token names: the sender of everything it sends. Read from memory
    /// while the store hears every change to sessions, else from the database (and kept).
    pub async fn caller(&self, token: &str) -> Result<Caller> {
        ids::check_token(TokenKind::Session, token)?;
        let hash = ids::token_hash(token);
        let ticket = match self.core.store.sessions().get(&hash) {
            Ok(caller) => return Ok(caller),
            Err(ticket) => ticket,
        };
        let session = identity::session_caller(&self.core.store.client().await?, hash)
            .await?
            .ok_or_else(|| Error::Unauthenticated("session unknown, ended or revoked: call Hello again".into()))?;
        if session.attempt_over {
            return Err(Error::Unauthenticated(format!(
                "the session of {} ended with its card's attempt (finished, released, lease expired or closed): a card's agent acts only while its card is in progress",
                session.caller.address()
            )));
        }
        if !session.live {
            return Err(Error::Unauthenticated("session unknown, ended or revoked: call Hello again".into()));
        }
        self.core.store.sessions().put(ticket, &session.caller);
        Ok(session.caller)
    }

    /// The card's agent a job token names: the attempt must be in progress under a live lease, on
    /// a machine not revoked.
    pub async fn card_agent(&self, token: &str) -> Result<CardAgent> {
        ids::check_token(TokenKind::JobToken, token)?;
        let token_hash = ids::token_hash(token);
        let holder = board::attempt_holder(&self.core.store.client().await?, &token_hash).await?.ok_or_else(|| {
            Error::Unauthenticated(
                "unknown job token: the attempt it was issued for has ended (released, lease expired or closed); a card's agent acts only while its card is in progress"
                    .into(),
            )
        })?;
        if holder.revoked {
            return Err(Error::Unauthenticated(format!(
                "the machine token of {}/{} was revoked, and with it the job tokens of its cards",
                holder.machine.account, holder.machine.machine
            )));
        }
        board_rules::check_attempt_live(&holder.card, holder.column, holder.lease_live)?;
        Ok(CardAgent { machine: holder.machine, attempt: Attempt { card: holder.card, token_hash } })
    }

    pub async fn hello(&self, machine: &MachineIdentity, claim: Claim<'_>) -> Result<HelloOutcome> {
        let harness = limits::harness(claim.harness)?;
        let handle = optional(claim.handle);
        if let Some(handle) = handle {
            check_claimable(NameKind::Handle, handle)?;
        }
        let db = self.core.store.client().await?;
        let wanted = Wanted {
            handle,
            token: None,
            harness,
            resume: optional(claim.resume),
            spawn_grant: optional(claim.spawn_grant),
            attempt: None,
        };
        let outcome = self.claim_endpoint(&db, machine, wanted).await?;
        tracing::info!(endpoint = %outcome.endpoint.address, resumed = outcome.resumed, harness, "hello");
        Ok(outcome)
    }

    /// An agent served over HTTP claims its endpoint under `token`, a session token derived from
    /// its machine token (`ids::derived_session_token`): the session is resumed while it lives,
    /// on whichever replica; else the handle (or a picked one) is claimed under the same token.
    pub async fn hello_derived(
        &self,
        machine: &MachineIdentity,
        claim: Claim<'_>,
        token: &str,
    ) -> Result<HelloOutcome> {
        let harness = limits::harness(claim.harness)?;
        let handle = optional(claim.handle);
        if let Some(handle) = handle {
            check_claimable(NameKind::Handle, handle)?;
        }
        ids::check_token(TokenKind::Session, token)?;
        let db = self.core.store.client().await?;
        let wanted =
            Wanted { handle, token: Some(token), harness, resume: Some(token), spawn_grant: None, attempt: None };
        let outcome = self.claim_endpoint(&db, machine, wanted).await?;
        if !outcome.resumed {
            tracing::info!(endpoint = %outcome.endpoint.address, harness, "hello over http");
        }
        Ok(outcome)
    }

    /// A card's agent claims (or resumes) its card's endpoint, `job-<card id>` on the machine that
    /// leased the card; no other handle, no spawn grant.
    pub async fn hello_card(&self, agent: &CardAgent, claim: Claim<'_>) -> Result<HelloOutcome> {
        let harness = limits::harness(claim.harness)?;
        let card = &agent.attempt.card;
        let handle = board_rules::agent_handle(card);
        if optional(claim.spawn_grant).is_some() {
            return Err(Error::PermissionDenied(format!(
                "a job token claims only the endpoint of card {card} ({handle}): spawn grants are for a machine's agents"
            )));
        }
        if let Some(asked) = optional(claim.handle).filter(|h| *h != handle) {
            return Err(Error::PermissionDenied(format!(
                "a job token claims only the endpoint of card {card}, {handle}, not {asked}: leave the handle out"
            )));
        }
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        if !board::hold_attempt(&tx, &agent.attempt.token_hash).await? {
            return Err(Error::Unauthenticated(format!(
                "the attempt at card {card} ended as this agent said hello: a card's agent acts only while its card is in progress"
            )));
        }
        let wanted = Wanted {
            handle: Some(&handle),
            token: None,
            harness,
            resume: optional(claim.resume),
            spawn_grant: None,
            attempt: Some(&agent.attempt.token_hash),
        };
        let outcome = self.claim_endpoint(&tx, &agent.machine, wanted).await?;
        store::commit(tx).await?;
        tracing::info!(endpoint = %outcome.endpoint.address, card = %card, resumed = outcome.resumed, harness, "hello");
        Ok(outcome)
    }

    /// Claims an endpoint on the machine, or resumes the one `resume` names. With `attempt` (a job
    /// token's hash) the session is that card attempt's agent's, and only its session is resumed.
    ///
    /// A handle is free when nobody holds it, its session ended, its presence lease lapsed, or none
    /// of its push streams is open and it showed no sign of life for [`presence::UNSTREAMED_HOLD`]:
    /// a restarted (or crashed) agent that claims its old handle takes over its inbox.
    async fn claim_endpoint(
        &self,
        db: &impl GenericClient,
        machine: &MachineIdentity,
        wanted: Wanted<'_>,
    ) -> Result<HelloOutcome> {
        let Wanted { handle, token, harness, resume, spawn_grant, attempt } = wanted;
        if let Some(token) = resume.filter(|t| ids::check_token(TokenKind::Session, t).is_ok())
            && let Some(id) =
                identity::resume_session(db, &ids::token_hash(token), machine.machine_id, harness, attempt).await?
        {
            let endpoint = identity::endpoint_on(db, id).await?;
            return Ok(HelloOutcome { endpoint, session_token: token.to_owned(), resumed: true });
        }

        let token = token.map_or_else(|| ids::new_token(TokenKind::Session), str::to_owned);
        let hash = ids::token_hash(&token);
        if let Some(grant) = spawn_grant {
            // A spawned worker takes the endpoint reserved for it, whatever handle it asked for.
            let id = spawn::granted_endpoint(db, machine, grant).await?;
            // A grant claims its endpoint once; again only when that worker's session is gone.
            if !identity::claim_granted(db, id, harness, &hash).await? {
                return Err(Error::AlreadyExists("the worker this grant was issued for is connected already".into()));
            }
            self.core.store.sessions().forget_endpoint(id);
            let endpoint = identity::endpoint_on(db, id).await?;
            return Ok(HelloOutcome { endpoint, session_token: token, resumed: false });
        }
        let caps = self.core.endpoint_caps();
        let id = match handle {
            Some(handle) => {
                match identity::claim_handle(db, machine.machine_id, handle, harness, &hash, attempt, caps).await? {
                    Some(id) => id,
                    None => match identity::no_room_for(db, machine.machine_id, handle, caps).await? {
                        Some(full) => return Err(self.core.no_room(&machine.account, &machine.machine, full)),
                        None => return Err(held(db, machine, handle).await?),
                    },
                }
            }
            None => {
                // Pick `<harness>-<n>`, the lowest n not held by a live endpoint; retry if another claim races us.
                let mut found = None;
                for _ in 0..8 {
                    // A picked name is one nobody holds: never used, or ended. An endpoint that is only
                    // offline keeps its name (and inbox) for the agent that claims it by name.
                    let live = identity::live_handles(db, machine.machine_id).await?;
                    let candidate = names::free_handle(harness, &live);
                    if let Some(id) =
                        identity::claim_handle(db, machine.machine_id, &candidate, harness, &hash, None, caps).await?
                    {
                        found = Some(id);
                        break;
                    }
                    if let Some(full) = identity::no_room_for(db, machine.machine_id, &candidate, caps).await? {
                        return Err(self.core.no_room(&machine.account, &machine.machine, full));
                    }
                }
                found.ok_or_else(|| Error::Unavailable("could not pick a free handle; try again".into()))?
            }
        };
        // A session this claim took the handle from is over here at once, elsewhere when heard.
        self.core.store.sessions().forget_endpoint(id);
        identity::clear_peek_turns(db, id).await?;
        let endpoint = identity::endpoint_on(db, id).await?;
        Ok(HelloOutcome { endpoint, session_token: token, resumed: false })
    }

    /// Ends a session: the endpoint goes offline at once and its handle is free.
    pub async fn goodbye(&self, caller: &Caller) -> Result<()> {
        identity::end_session(&self.core.store.client().await?, caller.endpoint_id).await?;
        // Other replicas hear of it from the database; this one forgets the session now.
        self.core.store.sessions().forget_endpoint(caller.endpoint_id);
        tracing::info!(endpoint = %caller.address(), "goodbye");
        Ok(())
    }

    /// The caller's endpoint and how many messages wait unread.
    pub async fn whoami(&self, caller: &Caller) -> Result<identity::WhoAmI> {
        Ok(identity::whoami(&self.core.store.client().await?, caller.endpoint_id, caller.account_id).await?)
    }

    /// Endpoints of the caller's account, or of its contact accounts; online ones unless `all`.
    pub async fn list(&self, caller: &Caller, all: bool, contacts: bool) -> Result<Vec<Endpoint>> {
        let db = self.core.store.client().await?;
        let accounts =
            if contacts { identity::contact_accounts(&db, caller.account_id).await? } else { vec![caller.account_id] };
        Ok(identity::endpoints_of(&db, &accounts, all).await?)
    }

    /// Status, note, now and title: checked against the limits and redacted, since others read them.
    pub async fn update_profile(&self, caller: &Caller, change: ProfileChange<'_>) -> Result<Endpoint> {
        if let Some(status) = change.status {
            limits::status(status)?;
        }
        for (what, value) in [("note", change.note), ("now", change.now)] {
            if let Some(value) = value {
                limits::short_text(what, value, limits::MAX_NOTE_CHARS)?;
            }
        }
        if let Some(title) = change.title {
            limits::short_text("title", title, limits::MAX_TITLE_CHARS)?;
        }
        let redacted = |text: Option<&str>| text.map(RedactedText::from_agent);
        let (note, now, title) = (redacted(change.note), redacted(change.now), redacted(change.title));
        let db = self.core.store.client().await?;
        identity::set_profile(&db, caller.endpoint_id, change.status, note.as_ref(), now.as_ref(), title.as_ref())
            .await?;
        Ok(identity::endpoint_on(&db, caller.endpoint_id).await?)
    }
}

/// The refusal of a claim on `handle`, naming the session that holds it.
async fn held(db: &impl GenericClient, machine: &MachineIdentity, handle: &str) -> Result<Error> {
    let at = format!("{}/{}", machine.account, machine.machine);
    Ok(match identity::holder(db, machine.machine_id, handle).await? {
        Some(holder) => presence::handle_held(handle, &at, &holder),
        // Freed between the claim and this read: a second try will take it.
        None => Error::Unavailable(format!("handle {handle} on {at} was changing hands; try again")),
    })
}

/// The machine a live machine token names: from memory while the store hears every change to
/// machines, else from the database (and kept).
async fn authenticate_machine(store: &Store, token: &str) -> Result<MachineIdentity> {
    ids::check_token(TokenKind::Machine, token)?;
    let hash = ids::token_hash(token);
    let ticket = match store.sessions().machine(&hash) {
        Ok(identity) => return Ok(identity),
        Err(ticket) => ticket,
    };
    let (identity, revoked) = identity::machine_by_token(&store.client().await?, &hash)
        .await?
        .ok_or_else(|| Error::Unauthenticated("unknown machine token".into()))?;
    if revoked {
        return Err(Error::Unauthenticated(format!(
            "the machine token of {}/{} was revoked",
            identity.account, identity.machine
        )));
    }
    store.sessions().put_machine(ticket, &hash, &identity);
    Ok(identity)
}

// ---- operator commands ---------------------------------------------------------------------------

pub async fn create_account(store: &Store, name: &str) -> Result<()> {
    validate(NameKind::Account, name)?;
    Ok(identity::insert_account(&store.client().await?, name).await?)
}

/// Creates the account if it does not exist yet.
pub async fn ensure_account(store: &Store, name: &str) -> Result<()> {
    validate(NameKind::Account, name)?;
    Ok(identity::ensure_account(&store.client().await?, name).await?)
}

/// Registers a machine (or re-admits a revoked one) and returns its new token, shown only now.
pub async fn add_machine(store: &Store, path: &str) -> Result<String> {
    let (account, machine) = split_machine_path(path)?;
    issue_machine_token(store, account, machine, false).await
}

/// Issues a fresh token for a machine, creating it when needed; the old token stops working.
pub async fn reissue_machine_token(store: &Store, account: &str, machine: &str) -> Result<String> {
    validate(NameKind::Account, account)?;
    check_claimable(NameKind::Machine, machine)?;
    issue_machine_token(store, account, machine, true).await
}

async fn issue_machine_token(store: &Store, account: &str, machine: &str, replace_live: bool) -> Result<String> {
    let token = ids::new_token(TokenKind::Machine);
    let hash = ids::token_hash(&token);
    let db = store.client().await?;
    let account_id = identity::account_id(&db, account)
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Account, format!("no account {account}: create it first")))?;
    if identity::upsert_machine_token(&db, account_id, machine, &hash, replace_live).await? {
        Ok(token)
    } else {
        Err(Error::AlreadyExists(format!(
            "machine {account}/{machine} already exists and is active: revoke it first to issue a new token"
        )))
    }
}

/// Revokes a machine's token: its next call is refused and its endpoints' sessions end.
pub async fn revoke_machine(store: &Store, path: &str) -> Result<()> {
    let (account, machine) = split_machine_path(path)?;
    let mut db = store.client().await?;
    let tx = store::begin(&mut db).await?;
    let machine_id = identity::revoke_machine(&tx, account, machine)
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Machine, format!("no machine {account}/{machine}")))?;
    identity::end_machine_sessions(&tx, machine_id).await?;
    store::commit(tx).await?;
    // Replicas forget the machine's sessions and what they resolved on the database's notices.
    store.sessions().forget_machine(machine_id);
    Ok(())
}

/// Makes two accounts mutual contacts.
pub async fn add_contact(store: &Store, first: &str, second: &str) -> Result<()> {
    validate(NameKind::Account, first)?;
    validate(NameKind::Account, second)?;
    if first == second {
        return Err(Error::invalid("an account cannot be its own contact"));
    }
    let db = store.client().await?;
    let rows = identity::accounts_named(&db, &[first, second]).await?;
    let id_of = |name: &str| {
        rows.iter()
            .find(|(_, n)| n == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| Error::not_found(EntityKind::Account, format!("no account {name}")))
    };
    let (a, b) = (id_of(first)?, id_of(second)?);
    Ok(identity::insert_contact(&db, a, b).await?)
}

/// Whether `token` is the live token of `account/machine` (the dev command reuses a valid config).
pub async fn machine_token_is(store: &Store, token: &str, account: &str, machine: &str) -> Result<bool> {
    if ids::check_token(TokenKind::Machine, token).is_err() {
        return Ok(false);
    }
    match authenticate_machine(store, token).await {
        Ok(m) => Ok(m.account == account && m.machine == machine),
        Err(Error::Unauthenticated(_)) => Ok(false),
        Err(other) => Err(other),
    }
}

fn split_machine_path(path: &str) -> Result<(&str, &str)> {
    let (account, machine) = path
        .split_once('/')
        .ok_or_else(|| Error::invalid(format!("invalid machine {path:?}: write ACCOUNT/MACHINE")))?;
    validate(NameKind::Account, account)?;
    check_claimable(NameKind::Machine, machine)?;
    Ok((account, machine))
}
