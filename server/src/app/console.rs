//! The web console: a person's sessions, signed in with the account's human token and kept in the
//! database so that any replica serves them, and the views its pages show. What a person does
//! from it are the operations of `trust`, `approvals` and `board`, as the human `me`.

use std::sync::Arc;

use super::Core;
use super::quotas::SignInRates;
use crate::domain::activity::{self, Activity, Filter};
use crate::domain::artifact::Attached;
use crate::domain::caller::Human;
use crate::domain::claims::{self, RepoKey};
use crate::domain::console::{self as rules, Agents, Board, ContactRow, DONE_SHOWN, Inbox, MESSAGES_SHOWN, Received};
use crate::domain::delivery::{self, State};
use crate::domain::ids::{self, AccountId, TokenKind};
use crate::domain::names::HUMAN;
use crate::domain::{Error, Result};
use crate::push::hub::Waiter;
use crate::store::{self, board, console, contacts, identity, messages};

/// The web console's sessions and views.
#[derive(Clone)]
pub struct ConsoleService {
    core: Core,
    trust: super::trust::TrustService,
    approvals: super::approvals::ApprovalsService,
    sign_ins: Arc<SignInRates>,
}

impl ConsoleService {
    pub(super) fn new(
        core: Core,
        trust: super::trust::TrustService,
        approvals: super::approvals::ApprovalsService,
    ) -> Self {
        let sign_ins = Arc::new(SignInRates::new(core.quotas));
        Self { core, trust, approvals, sign_ins }
    }
}

/// What a console's live page waits on: the account (cards, holds, permission requests) and the
/// human's inbox.
pub struct Watch {
    /// A card, hold or permission request of the account changed.
    pub account: Waiter<AccountId>,
    /// A console session of the account ended: time to check this page's.
    pub sessions: Waiter<AccountId>,
    pub inbox: Waiter,
}

impl ConsoleService {
    /// Signs a person in with the account's human token, checked as the Human service checks it:
    /// a new session's token (for the cookie, shown only now) and the person.
    /// Signs a person in from `address`: an address that keeps failing waits, and so does an
    /// account that opens sessions faster than people do.
    pub async fn sign_in(&self, human_token: &str, address: std::net::IpAddr) -> Result<(String, Human)> {
        self.sign_ins.may_sign_in(address)?;
        let person = match self.trust.person(human_token.trim()).await {
            Ok(person) => person,
            Err(e) => {
                if matches!(e, Error::Unauthenticated(_)) {
                    self.sign_ins.failed(address);
                }
                return Err(e);
            }
        };
        self.sign_ins.sign_in(person.account_id, &person.account)?;
        let session = ids::new_token(TokenKind::Console);
        let db = self.core.store.client().await?;
        let ttl = rules::SESSION_TTL.as_secs_f64();
        if !console::insert_session(&db, &ids::token_hash(&session), &person, ttl).await? {
            return Err(Error::Unauthenticated("this human token was revoked".into()));
        }
        tracing::info!(account = %person.account, human = %person.name, "console signed in");
        Ok((session, person))
    }

    /// The person a console session belongs to, while it lasts and its human token stands.
    pub async fn session(&self, session: &str) -> Result<Human> {
        Ok(self.session_left(session).await?.0)
    }

    /// The person a console session belongs to, and how long the session has left: its pages end
    /// their feeds then.
    pub async fn session_left(&self, session: &str) -> Result<(Human, std::time::Duration)> {
        ids::check_token(TokenKind::Console, session)?;
        let db = self.core.store.client().await?;
        let (person, left) = console::session_person(&db, &ids::token_hash(session))
            .await?
            .ok_or_else(|| Error::Unauthenticated("the console session ended: sign in again".into()))?;
        Ok((person, std::time::Duration::from_secs_f64(left)))
    }

    pub async fn sign_out(&self, session: &str) -> Result<()> {
        ids::check_token(TokenKind::Console, session)?;
        Ok(console::delete_session(&self.core.store.client().await?, &ids::token_hash(session)).await?)
    }

    /// The account's board: open cards, the newest done ones, and its repositories.
    pub async fn board(&self, person: &Human) -> Result<Board> {
        let db = self.core.store.client().await?;
        Ok(Board {
            open: board::list(&db, person.account_id, None, None).await?,
            done: board::recently_done(&db, person.account_id, DONE_SHOWN).await?,
            archived: board::archived(&db, person.account_id, None).await?,
            repos: board::repos(&db, person.account_id).await?,
        })
    }

    /// The human's newest messages (read or not; reading them here marks nothing), its holds and
    /// the permission requests open in the account.
    pub async fn inbox(&self, person: &Human) -> Result<Inbox> {
        // Each of these takes a pooled connection of its own and gives it back before the next:
        // none is held while waiting for another.
        let me = self.core.me(person).await?;
        let holds = self.trust.holds(person, false).await?;
        let approvals = self.approvals.approvals(person).await?;
        let db = self.core.store.client().await?;
        let messages = messages::recent(&db, me.endpoint_id, MESSAGES_SHOWN).await?;
        Ok(Inbox {
            messages: messages.into_iter().map(|(message, read)| Received { message, read }).collect(),
            unread: messages::unread_count(&db, me.endpoint_id).await?,
            holds,
            approvals,
        })
    }

    /// Marks messages of the human's inbox read, by their sequence numbers.
    pub async fn mark_read(&self, person: &Human, seqs: &[u64]) -> Result<u64> {
        if seqs.is_empty() {
            return Err(Error::invalid("no message to mark read"));
        }
        let me = self.core.me(person).await?;
        let seqs = delivery::seqs(seqs)?;
        let db = self.core.store.client().await?;
        let (moved, _) = messages::advance(&db, me.endpoint_id, &seqs, State::Read).await?;
        Ok(moved)
    }

    /// The account's agents, online or not, and its contacts' online agents.
    pub async fn agents(&self, person: &Human) -> Result<Agents> {
        let db = self.core.store.client().await?;
        let mut own = identity::endpoints_of(&db, &[person.account_id], true).await?;
        own.retain(|e| e.machine != HUMAN && !e.ended);
        own.sort_by(|a, b| b.online.cmp(&a.online).then_with(|| a.address.cmp(&b.address)));
        let contacts = identity::contact_accounts(&db, person.account_id).await?;
        let contacts =
            if contacts.is_empty() { Vec::new() } else { identity::endpoints_of(&db, &contacts, false).await? };
        Ok(Agents { own, contacts: contacts.into_iter().filter(|e| e.machine != HUMAN).collect() })
    }

    /// The activity page: the account's agents' conversations, narrowed by `filter`; the claims in
    /// force within the account's reach (of the repository asked for); who talked to whom in the
    /// last hour.
    pub async fn activity(&self, person: &Human, filter: &Filter) -> Result<Activity> {
        let db = self.core.store.client().await?;
        let mut reach = identity::contact_accounts(&db, person.account_id).await?;
        reach.push(person.account_id);
        let repo = match filter.repo.as_str() {
            "" => None,
            given => Some(RepoKey::of_remote(given)?),
        };
        let claims = store::claims::list(&db, &reach, repo.as_ref(), None, claims::MAX_LISTED).await?;
        let holders: Option<Vec<String>> = repo.as_ref().map(|_| claims.iter().map(|c| c.holder.clone()).collect());
        let recent = store::activity::recent(&db, person.account_id).await?;
        let shown = recent.into_iter().filter(|m| filter.admits(m, holders.as_deref())).collect();
        let edges = store::activity::edges(&db, person.account_id, activity::GRAPH_WINDOW_S).await?;
        let mut agents: Vec<String> = identity::endpoints_of(&db, &[person.account_id], true)
            .await?
            .into_iter()
            .filter(|e| e.machine != HUMAN && !e.ended)
            .map(|e| e.address)
            .collect();
        agents.sort();
        let mut topics = store::topics::of_account(&db, person.account_id, activity::POSTS_PER_TOPIC).await?;
        topics.retain(|t| filter.admits_topic(&t.topic));
        Ok(Activity { threads: activity::threads(shown), topics, claims, agents, edges })
    }

    /// A file of a message the person's account's agents exchanged, to download.
    pub async fn file(&self, person: &Human, message: &str, name: &str) -> Result<(Attached, Vec<u8>)> {
        let db = self.core.store.client().await?;
        Ok(store::artifacts::fetch_for_account(&db, person.account_id, message, name).await?)
    }

    /// The account's contacts and requests, with their private-data setting.
    pub async fn contacts(&self, person: &Human) -> Result<Vec<ContactRow>> {
        let db = self.core.store.client().await?;
        let private = contacts::private_ok(&db, person.account_id).await?;
        let listed = contacts::list_contacts(&db, person.account_id).await?;
        Ok(listed
            .into_iter()
            .map(|contact| ContactRow {
                private_data: contact.state == "contact" && private.contains(&contact.account),
                contact,
            })
            .collect())
    }

    /// Wake-ups for a live page, taken before it reads what it shows so that no change is missed.
    pub async fn watch(&self, person: &Human) -> Result<Watch> {
        let account = self.core.hub.account_waiter(person.account_id);
        let sessions = self.core.hub.console_sessions_waiter(person.account_id);
        let me = self.core.me(person).await?;
        Ok(Watch { account, sessions, inbox: self.core.hub.waiter(me.endpoint_id) })
    }
}
