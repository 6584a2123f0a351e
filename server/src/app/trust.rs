//! Trust: peek (turns redacted before they are kept), required replies, and what an account's
//! person does — the human inbox, contacts, holds and their policy.

use super::Core;
use super::messaging::{Delivered, NewMessage};
use crate::domain::caller::Caller;
use crate::domain::caller::Human;
use crate::domain::delivery::Kind;
use crate::domain::ids::{self, EndpointId, HoldId, TokenKind};
use crate::domain::message::Message;
use crate::domain::names::{NameKind, validate};
use crate::domain::redact::{RedactedText, redact};
use crate::domain::trust::MAX_PEEK_TURNS;
use crate::domain::trust::{self as rules, Contact, Hold, HoldState, Peek, PeekTurn, Peeker};
use crate::domain::{EntityKind, Error, Result, limits};
use crate::store;
use crate::store::identity::contact_accounts;
use crate::store::messages::{self, Outgoing, Target};
use crate::store::trust::{self, KeptTurn};
use crate::store::{Store, contacts, scope};

/// What people decide and keep private: holds, peek, the human inbox, required replies.
#[derive(Clone)]
pub struct TrustService {
    core: Core,
    messaging: super::messaging::MessagingService,
}

impl TrustService {
    pub(super) fn new(core: Core, messaging: super::messaging::MessagingService) -> Self {
        Self { core, messaging }
    }
}

/// Longest text kept of one peeked turn.
const PEEK_TEXT_BYTES: usize = 4096;

impl TrustService {
    /// Turning peek off deletes what was kept.
    pub async fn set_peek(&self, caller: &Caller, on: bool) -> Result<()> {
        let db = self.core.store.client().await?;
        trust::set_peek_on(&db, caller.endpoint_id, on).await?;
        if !on {
            trust::delete_peek_turns(&db, caller.endpoint_id).await?;
        }
        Ok(())
    }

    /// Keeps the caller's last turns for peek (or adds to them); whether they were kept (peek is on).
    pub async fn put_peek_turns(&self, caller: &Caller, turns: Vec<PeekTurn>, append: bool) -> Result<bool> {
        limits::count("turns", turns.len(), MAX_PEEK_TURNS)?;
        for turn in &turns {
            limits::count("tools of one turn", turn.tools.len(), limits::MAX_TURN_TOOLS)?;
        }
        // Turns are another agent's data to be: redacted like message bodies before they are kept,
        // and cut only after, so that a cut cannot hide a secret's shape from the redactor.
        let turns: Vec<KeptTurn> = turns
            .into_iter()
            .map(|t| KeptTurn {
                text: RedactedText::from_agent(&t.text).truncated(PEEK_TEXT_BYTES),
                tools: t.tools.iter().map(|tool| RedactedText::from_agent(tool)).collect(),
                role: RedactedText::from_agent(&t.role),
            })
            .collect();
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let stored = trust::keep_peek_turns(&tx, caller.endpoint_id, &turns, append).await?;
        store::commit(tx).await?;
        Ok(stored)
    }

    /// Another agent's last turns (3 when `turns` is 0), if it allows peeking and the caller may message it.
    pub async fn peek(&self, caller: &Caller, endpoint: &str, turns: u32) -> Result<Peek> {
        if endpoint.trim().is_empty() {
            return Err(Error::invalid("peek takes endpoint: whose last turns to see"));
        }
        let turns = if turns == 0 { 3 } else { turns as usize };
        let db = self.core.store.client().await?;
        let (target, address) = scope::messageable(&db, caller, endpoint).await?;
        let kept = trust::peek_state(&db, target).await?;
        if !kept.peek_on {
            return Err(Error::PermissionDenied(format!(
                "{address} does not allow peeking (relay_set_peek turns it on)"
            )));
        }
        let shown = rules::last_turns(&kept.turns, turns);
        trust::insert_peek(&db, target, &caller.address(), shown.len()).await?;
        Ok(Peek { endpoint: address, turns: shown, updated_at: kept.updated_at })
    }

    /// Who peeked at the caller, newest first.
    pub async fn peekers(&self, caller: &Caller) -> Result<Vec<Peeker>> {
        Ok(trust::peekers(&self.core.store.client().await?, caller.endpoint_id).await?)
    }

    /// Asks to the caller that require a reply it has not given yet, and that it can still answer:
    /// an asker whose machine was revoked, or whose account is out of reach (a contact dropped), can
    /// never get the reply. An ended asker can.
    pub async fn pending_replies(&self, caller: &Caller) -> Result<Vec<Message>> {
        let db = self.core.store.client().await?;
        let mut reach = contact_accounts(&db, caller.account_id).await?;
        reach.push(caller.account_id);
        Ok(trust::unanswered_asks(&db, caller.endpoint_id, &reach).await?)
    }

    // ---- an account's person -----------------------------------------------------------------

    /// The account's person a human token names.
    pub async fn person(&self, token: &str) -> Result<Human> {
        ids::check_token(TokenKind::Human, token)?;
        let db = self.core.store.client().await?;
        let (person, revoked) = contacts::human_by_token(&db, &ids::token_hash(token))
            .await?
            .ok_or_else(|| Error::Unauthenticated("unknown human token".into()))?;
        if revoked {
            return Err(Error::Unauthenticated("this human token was revoked".into()));
        }
        Ok(person)
    }

    pub async fn human_inbox(&self, person: &Human, wait_s: u32, limit: u32, ack: bool) -> Result<(Vec<Message>, u64)> {
        let me = self.core.me(person).await?;
        self.messaging.inbox(&me, wait_s, limit, ack).await
    }

    /// Sends as the account's human: a plain message, limits and redaction as for any sender.
    pub async fn human_send(
        &self,
        person: &Human,
        to: &[String],
        body: &str,
        thread: &str,
        client_id: &str,
        private: bool,
    ) -> Result<Delivered> {
        let me = self.core.me(person).await?;
        let message =
            NewMessage { to, body, thread, kind: Kind::Message, client_id, private, require_reply: false, attach: &[] };
        self.messaging.send(&me, message).await
    }

    pub async fn human_reply(&self, person: &Human, id: &str, body: &str, client_id: &str) -> Result<Delivered> {
        let me = self.core.me(person).await?;
        self.messaging.reply(&me, id, body, client_id).await
    }

    pub async fn holds(&self, person: &Human, all: bool) -> Result<Vec<Hold>> {
        Ok(trust::holds_on(&self.core.store.client().await?, person, all).await?)
    }

    /// Releases a held message to its recipients (delivers it), or rejects it with a reason its
    /// sender reads; either way the sender hears the outcome from the human.
    pub async fn decide_hold(&self, person: &Human, id: &str, release: bool, reason: &str) -> Result<Hold> {
        let reason = RedactedText::from_agent(reason);
        let reason = reason.as_str().trim();
        let mut db = self.core.store.client().await?;
        let me = trust::human_caller(&db, person.account_id).await?;
        let id = &HoldId::new(id.trim());
        let tx = store::begin(&mut db).await?;
        let held = trust::lock_hold(&tx, person.account_id, id).await?.ok_or_else(|| {
            Error::not_found(EntityKind::Hold, format!("no hold {id} in your account: holds lists them"))
        })?;
        rules::check_decision(id, held.state, release, reason)?;
        // The recipients' inboxes and the sender's (it gets the notice), all before writing any.
        let inboxes: Vec<EndpointId> = held.recipients.iter().copied().chain([held.sender_id]).collect();
        let revoked = messages::lock_inboxes(&tx, &inboxes).await?;
        if release {
            let targets = trust::still_reachable(&tx, held.sender_id, &held.message_id, &held.recipients).await?;
            let recipients: Vec<EndpointId> = targets.iter().map(|t| t.id).collect();
            messages::release(&tx, &held.message_id, &recipients).await?;
            // A person let agents the loop guard stopped go on: their count starts over.
            if held.class == crate::domain::loops::HOLD_CLASS {
                for recipient in &held.recipients {
                    crate::store::loops::clear(&tx, held.sender_id, *recipient, &held.thread).await?;
                }
            }
        }
        let decided = if release { HoldState::Released } else { HoldState::Rejected };
        trust::set_decision(&tx, id, decided, reason, &person.name).await?;
        let body = redact(&rules::decision_notice(&held.message_id, release, reason)).text;
        let notice = Outgoing::notice(&body);
        // A sender whose machine was revoked reads nothing any more: the decision is kept on the hold.
        if !revoked.contains(&held.sender_id) {
            let target = [Target { id: held.sender_id, address: held.sender, account_id: person.account_id }];
            messages::write_system(&tx, &me, &target, &notice).await?;
        }
        let view = trust::holds_on(&tx, person, true).await?.into_iter().find(|h| &h.id == id);
        store::commit(tx).await?;
        let view = view.ok_or_else(|| Error::Internal("the decided hold vanished".into()))?;
        tracing::info!(account = %person.account, hold = %view.id, state = %view.state, "hold decided");
        Ok(view)
    }

    /// Turns holding a class of messages on or off; the classes held now.
    pub async fn hold_policy(&self, person: &Human, class: &str, on: bool) -> Result<Vec<String>> {
        let class = class.trim();
        rules::check_hold_class(class)?;
        let classes = trust::set_hold_class(&self.core.store.client().await?, person.account_id, class, on).await?;
        self.messaging.scope_changed();
        Ok(classes)
    }

    /// Asks for a contact; when the other account already asked for one, the contact is made.
    pub async fn contact_request(&self, person: &Human, account: &str) -> Result<Contact> {
        let other = account.trim();
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let other_id = contacts::account_id(&tx, other).await?;
        if other_id == person.account_id {
            return Err(Error::invalid("an account cannot be its own contact"));
        }
        // Two humans asking each other at once must meet: lock both accounts in id order first.
        contacts::lock_accounts(&tx, person.account_id, other_id).await?;
        let state = if contact_accounts(&tx, person.account_id).await?.contains(&other_id) {
            "contact"
        } else if contacts::requested(&tx, other_id, person.account_id).await? {
            contacts::make_contact(&tx, person.account_id, other_id).await?;
            "contact"
        } else {
            contacts::insert_request(&tx, person.account_id, other_id).await?;
            "requested"
        };
        store::commit(tx).await?;
        self.messaging.scope_changed();
        let view = Contact { account: other.to_owned(), state: state.to_owned(), withdrawn: 0 };
        tracing::info!(account = %person.account, other = %view.account, state = %view.state, "contact request");
        Ok(view)
    }

    pub async fn contact_accept(&self, person: &Human, account: &str) -> Result<Contact> {
        let other = account.trim();
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let other_id = contacts::account_id(&tx, other).await?;
        if !contact_accounts(&tx, person.account_id).await?.contains(&other_id) {
            if !contacts::requested(&tx, other_id, person.account_id).await? {
                return Err(Error::not_found(
                    EntityKind::Contact,
                    format!("{other} has not asked {} for a contact: use contact request to ask it", person.account),
                ));
            }
            contacts::make_contact(&tx, person.account_id, other_id).await?;
        }
        store::commit(tx).await?;
        self.messaging.scope_changed();
        Ok(Contact { account: other.to_owned(), state: "contact".to_owned(), withdrawn: 0 })
    }

    pub async fn contact_list(&self, person: &Human) -> Result<Vec<Contact>> {
        Ok(contacts::list_contacts(&self.core.store.client().await?, person.account_id).await?)
    }

    /// Allows or forbids private data across a contact.
    pub async fn contact_private(&self, person: &Human, account: &str, allow: bool) -> Result<Contact> {
        let other = account.trim();
        let updated = trust::set_private_ok(&self.core.store.client().await?, person.account_id, other, allow).await?;
        if updated == 0 {
            return Err(Error::not_found(
                EntityKind::Contact,
                format!("{} and {other} are not contacts", person.account),
            ));
        }
        self.messaging.scope_changed();
        let state = if allow { "contact, private data allowed" } else { "contact, no private data" };
        Ok(Contact { account: other.to_owned(), state: state.to_owned(), withdrawn: 0 })
    }

    /// Ends a contact: reach is cut at once and what no agent has seen yet is withdrawn.
    pub async fn contact_drop(&self, person: &Human, account: &str) -> Result<Contact> {
        let view = drop_contact(&self.core.store, &person.account, account.trim()).await?;
        // Every replica forgets on the database's notice; this one at once, for the next send.
        self.messaging.scope_changed();
        tracing::info!(account = %person.account, other = %view.account, withdrawn = view.withdrawn, "contact dropped");
        Ok(view)
    }
}

// ---- the operator's commands (`relay-server admin`), which hold a store but no server ------------

/// How often a contact's drop is made again after Postgres ended it in a deadlock.
const DROP_TRIES: usize = 3;

/// Ends a contact (or a request) between two accounts. Reach is cut at once: deliveries between
/// them that no agent has seen yet are withdrawn, and their senders can see why.
///
/// The drop locks the inboxes holding such deliveries before it takes the contact, the order a
/// send takes them. A send may still deliver into another inbox while the drop waits for those:
/// withdrawing that delivery then waits for its inbox, whose next send may be waiting for the
/// contact the drop holds. Postgres ends one of the two; a drop it ended is made again, and then
/// finds and locks that inbox first.
pub async fn drop_contact(store: &Store, account: &str, other: &str) -> Result<Contact> {
    let mut tries = 1;
    loop {
        match drop_contact_once(store, account, other).await {
            Err(Error::Conflict(reason)) if tries < DROP_TRIES => {
                tracing::info!(account, other, tries, reason, "contact drop met a concurrent send; making it again");
                tries += 1;
            }
            outcome => return outcome,
        }
    }
}

async fn drop_contact_once(store: &Store, account: &str, other: &str) -> Result<Contact> {
    let mut db = store.client().await?;
    let tx = store::begin(&mut db).await?;
    let (me, other_id) = (contacts::account_id(&tx, account).await?, contacts::account_id(&tx, other).await?);
    // Inboxes first, before the contact and the deliveries: the order a send's batch takes them.
    contacts::lock_inboxes_between(&tx, me, other_id).await?;
    let dropped = contacts::delete_contact(&tx, me, other_id).await?;
    let requests = contacts::delete_requests(&tx, me, other_id).await?;
    if dropped + requests == 0 {
        return Err(Error::not_found(EntityKind::Contact, format!("{account} and {other} are not contacts")));
    }
    // The streams following either account's open topics read them again, and stop at the other's.
    store::topics::reach_changed(&tx, &[me, other_id]).await?;
    // Held messages between the two can no longer be released.
    let held = format!("the contact between {account} and {other} was dropped");
    contacts::reject_holds_between(&tx, me, other_id, &held).await?;
    let reason = format!("withdrawn: the contact between {account} and {other} was dropped before it was seen");
    let withdrawn = contacts::withdraw_between(&tx, me, other_id, &reason).await?;
    store::commit(tx).await?;
    Ok(Contact { account: other.to_owned(), state: "none".to_owned(), withdrawn: withdrawn as u32 })
}

/// Issues a human credential for an account; the token is shown only now.
pub async fn add_human(store: &Store, account: &str, name: &str) -> Result<String> {
    validate(NameKind::Handle, name).map_err(|_| Error::invalid(format!("invalid human name {name:?}")))?;
    let db = store.client().await?;
    let account_id = contacts::account_id(&db, account).await?;
    let token = ids::new_token(TokenKind::Human);
    if !contacts::insert_human(&db, account_id, name, &ids::token_hash(&token)).await? {
        return Err(Error::AlreadyExists(format!("human {name} of {account} already exists")));
    }
    Ok(token)
}

pub async fn revoke_human(store: &Store, account: &str, name: &str) -> Result<()> {
    let db = store.client().await?;
    let account_id = contacts::account_id(&db, account).await?;
    if contacts::revoke_human(&db, account_id, name).await? == 0 {
        return Err(Error::not_found(EntityKind::Human, format!("no human {name} of {account}")));
    }
    Ok(())
}
