//! Path claims across machines: an agent claims paths of a repository, and is told who holds them
//! when another agent's claim stands in the way; the holder hears that someone ran into it. Claims
//! are seen within reach as messages are (the account and its contacts); a claim out of reach is
//! absent. Claims in one repository are decided one at a time (an advisory lock on its key).

use super::Core;
use crate::domain::board::{self as board_rules, Column};
use crate::domain::caller::{Caller, MachineIdentity};
use crate::domain::claims::{self, Claim, PathGlob, RepoKey, Wanted};
use crate::domain::ids::{self as ids_rules, TokenKind};
use crate::domain::ids::{AccountId, ClaimId, EndpointId};
use crate::domain::redact::{RedactedText, redact};
use crate::domain::{EntityKind, Error, Result, limits};
use crate::metrics::{ClaimStep, metrics};
use crate::store;
use crate::store::claims as repo_claims;
use crate::store::messages::{self, Outgoing, Target};

/// Files one guard check names at most: a commit's staged paths.
pub const MAX_GUARD_FILES: usize = 10_000;

/// How a request names a repository.
#[derive(Debug, Clone)]
pub enum RepoRef {
    /// A remote URL, or a key a listing showed.
    Remote(String),
    /// The absolute path of a repository without a remote, on the caller's machine.
    Local(String),
}

/// What a claim came to.
#[derive(Debug)]
pub enum Claimed {
    Granted {
        claim: Claim,
        renewed: bool,
    },
    /// Refused: the standing claims in the way, oldest first.
    Conflicts(Vec<Claim>),
}

#[derive(Clone)]
pub struct ClaimsService {
    core: Core,
}

impl ClaimsService {
    pub(super) fn new(core: Core) -> Self {
        Self { core }
    }

    /// Claims `paths` of the repository for the caller, unless a standing claim of another agent
    /// within reach stops it; then each such holder is told (once in ten minutes per claimant).
    pub async fn claim(
        &self,
        caller: &Caller,
        repo: &RepoRef,
        paths: &[String],
        exclusive: bool,
        ttl_s: Option<u32>,
        reason: &str,
    ) -> Result<Claimed> {
        let wanted = Wanted {
            repo: repo_key(&caller.account, &caller.machine, repo)?,
            paths: claims::parse_paths(paths)?,
            exclusive,
            ttl_s: claims::ttl_s(ttl_s)?,
            reason: RedactedText::from_agent(&claims::reason(reason)?).into_string(),
            attempt: None,
        };
        self.put(caller, &wanted).await
    }

    /// Makes `wanted` for the caller, or answers what stops it.
    pub async fn put(&self, caller: &Caller, wanted: &Wanted) -> Result<Claimed> {
        let mut db = self.core.store.client().await?;
        let reach = reach(&db, caller.account_id).await?;
        let tx = store::begin(&mut db).await?;
        repo_claims::lock_repo(&tx, &wanted.repo).await?;
        repo_claims::purge_lapsed(&tx, Some(&wanted.repo)).await?;
        let standing = repo_claims::standing_in(&tx, &wanted.repo, &reach).await?;
        let conflicts: Vec<Claim> = standing
            .into_iter()
            .filter(|c| c.holder_id != caller.endpoint_id && c.stops(&wanted.paths, wanted.exclusive))
            .collect();
        if !conflicts.is_empty() {
            tell_holders(&tx, caller, wanted, &conflicts).await?;
            store::commit(tx).await?;
            metrics().claims(ClaimStep::refused, 1);
            return Ok(Claimed::Conflicts(conflicts));
        }
        let (claim, renewed) = repo_claims::put(&tx, caller, wanted).await?;
        store::commit(tx).await?;
        let step = if renewed { ClaimStep::renewed } else { ClaimStep::granted };
        metrics().claims(step, 1);
        Ok(Claimed::Granted { claim, renewed })
    }

    /// Ends the caller's claims: the one named; else `paths` of them (in the repository when one is
    /// named), a claim left with none ending; else all of the caller's claims (in the repository
    /// when one is named). What was released; releasing nothing is not an error.
    pub async fn release(
        &self,
        caller: &Caller,
        claim: Option<&str>,
        repo: Option<&RepoRef>,
        paths: &[String],
    ) -> Result<Vec<Claim>> {
        let claim = claim.map(ClaimId::parse).transpose()?;
        let repo = repo.map(|r| repo_key(&caller.account, &caller.machine, r)).transpose()?;
        let mut db = self.core.store.client().await?;
        let released = match (claim, paths.is_empty()) {
            (Some(_), false) => {
                return Err(Error::invalid("give claim or paths, not both: a claim is released whole"));
            }
            (Some(id), true) => {
                let released = repo_claims::release(&db, caller.endpoint_id, Some(id), None).await?;
                if released.is_empty() {
                    return Err(Error::not_found(
                        EntityKind::Claim,
                        format!("you hold no standing claim {} (relay_claims with mine: true lists yours)", id.name()),
                    ));
                }
                released
            }
            (None, false) => {
                let paths = claims::parse_paths(paths)?;
                let tx = store::begin(&mut db).await?;
                if let Some(repo) = &repo {
                    repo_claims::lock_repo(&tx, repo).await?;
                }
                let released = repo_claims::release_paths(&tx, caller, repo.as_ref(), &paths).await?;
                store::commit(tx).await?;
                released
            }
            (None, true) => repo_claims::release(&db, caller.endpoint_id, None, repo.as_ref()).await?,
        };
        metrics().claims(ClaimStep::released, released.len() as u64);
        Ok(released)
    }

    /// The standing claims within the caller's reach: of the repository when named, the caller's own
    /// with `mine`; newest first.
    pub async fn list(&self, caller: &Caller, repo: Option<&RepoRef>, mine: bool) -> Result<Vec<Claim>> {
        let repo = repo.map(|r| repo_key(&caller.account, &caller.machine, r)).transpose()?;
        let db = self.core.store.client().await?;
        let reach = reach(&db, caller.account_id).await?;
        let holder = mine.then_some(caller.endpoint_id);
        Ok(repo_claims::list(&db, &reach, repo.as_ref(), holder, claims::MAX_LISTED).await?)
    }

    /// Claims the paths of the card `machine` leased under `job_token` for the card's agent (its
    /// endpoint made if its agent has not said Hello yet), in the repository as that machine names
    /// it: kept by the attempt, not a session, for as long as a claim may last.
    pub async fn claim_for_card(&self, machine: &MachineIdentity, job_token: &str, repo: &RepoRef) -> Result<Claimed> {
        ids_rules::check_token(TokenKind::JobToken, job_token)?;
        let token_hash = ids_rules::token_hash(job_token);
        let repo = repo_key(&machine.account, &machine.machine, repo)?;
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let leased = store::board::lock_leased(&tx, machine.machine_id, &token_hash).await?.ok_or_else(|| {
            Error::FailedPrecondition("no card of this machine is leased under that job token".into())
        })?;
        let card = store::board::job(&tx, machine.account_id, &leased.id).await?;
        if card.column != Column::InProgress {
            return Err(Error::FailedPrecondition(format!("card {} is not in progress", card.id)));
        }
        if card.paths.is_empty() {
            return Err(Error::FailedPrecondition(format!("card {} names no paths", card.id)));
        }
        let handle = board_rules::agent_handle(&card.id);
        let endpoint = store::identity::card_endpoint(&tx, machine.machine_id, &handle, card.agent.name()).await?;
        let holder = store::identity::caller_of(&tx, endpoint).await?;
        store::commit(tx).await?;
        let wanted = Wanted {
            repo,
            paths: claims::parse_paths(&card.paths)?,
            exclusive: true,
            ttl_s: claims::MAX_TTL_S,
            reason: RedactedText::from_agent(&format!("card {}: {}", card.id, card.title)).into_string(),
            attempt: Some(token_hash),
        };
        self.put(&holder, &wanted).await
    }

    /// The exclusive claims of other agents within reach that cover any of `files` of the
    /// repository: what a commit touching them would run into.
    pub async fn touching(
        &self,
        account_id: AccountId,
        exempt: Option<EndpointId>,
        repo: &RepoKey,
        files: &[String],
    ) -> Result<Vec<Claim>> {
        limits::count("files", files.len(), MAX_GUARD_FILES)?;
        let db = self.core.store.client().await?;
        let reach = reach(&db, account_id).await?;
        let standing = repo_claims::standing_in(&db, repo, &reach).await?;
        Ok(standing
            .into_iter()
            .filter(|c| c.exclusive && Some(c.holder_id) != exempt)
            .filter(|c| files.iter().any(|f| c.paths.iter().any(|p| p.covers(f))))
            .collect())
    }
}

/// The key of the repository `repo` names, for a caller on `account`'s `machine`.
pub fn repo_key(account: &str, machine: &str, repo: &RepoRef) -> Result<RepoKey> {
    match repo {
        RepoRef::Remote(remote) => RepoKey::of_remote(remote),
        RepoRef::Local(path) => RepoKey::local(account, machine, path),
    }
}

/// The accounts whose claims an agent of `account` sees: its own and its contacts'.
async fn reach(db: &impl deadpool_postgres::GenericClient, account: AccountId) -> Result<Vec<AccountId>> {
    let mut accounts = store::identity::contact_accounts(db, account).await?;
    accounts.push(account);
    Ok(accounts)
}

/// Tells each holder of a claim in the way, not told of this claimant lately, who ran into it
/// and with what: a message from the holder's account's board sender.
async fn tell_holders(tx: &store::Tx<'_>, caller: &Caller, wanted: &Wanted, conflicts: &[Claim]) -> Result<()> {
    let mut told: Vec<&Claim> = Vec::new();
    for claim in conflicts {
        if repo_claims::bump(tx, claim.id, caller.endpoint_id).await? {
            told.push(claim);
        }
    }
    if told.is_empty() {
        return Ok(());
    }
    let mut inboxes: Vec<EndpointId> = told.iter().map(|c| c.holder_id).collect();
    inboxes.sort_unstable();
    inboxes.dedup();
    let revoked = messages::lock_inboxes(tx, &inboxes).await?;
    for claim in told.into_iter().filter(|c| !revoked.contains(&c.holder_id)) {
        let met: Vec<&str> =
            claims::meeting(&wanted.paths, &claim.paths).iter().map(|(ours, _)| ours.as_str()).collect();
        let body = redact(&format!(
            "{} asked to claim {} in {}{} ({:?}) and was refused: it meets your claim {} on {}. Release it with \
             relay_release when you are done, or agree with them with relay_send.",
            caller.address(),
            met.join(", "),
            wanted.repo,
            if wanted.exclusive { " exclusively" } else { "" },
            wanted.reason,
            claim.id.name(),
            claim.paths.iter().map(PathGlob::as_str).collect::<Vec<_>>().join(", "),
        ))
        .text;
        let sender = store::notices::board_sender(tx, claim.account_id).await?;
        let thread = format!("claims:{}", claim.id);
        let target = Target { id: claim.holder_id, address: claim.holder.clone(), account_id: claim.account_id };
        let out = Outgoing { thread: Some(&thread), ..Outgoing::notice(&body) };
        messages::write_system(tx, &sender, &[target], &out).await?;
    }
    Ok(())
}
