//! Trust: peek (turns redacted before they are kept), required replies, and what an account's
//! person does — the human inbox, contacts, holds and their policy.

use super::App;
use super::messaging::{Delivered, NewMessage};
use crate::domain::caller::Human;
use crate::domain::delivery::Kind;
use crate::domain::message::Message;
use crate::domain::redact::RedactedText;
use crate::domain::trust::{Contact, Hold, Peek, PeekTurn, Peeker};
use crate::domain::{Error, Result};
use crate::store::identity::Caller;
use crate::store::trust::KeptTurn;

/// Longest text kept of one peeked turn.
const PEEK_TEXT_BYTES: usize = 4096;

impl App {
    pub async fn set_peek(&self, caller: &Caller, on: bool) -> Result<()> {
        self.store.set_peek(caller, on).await
    }

    /// Keeps the caller's last turns for peek (or adds to them); whether they were kept (peek is on).
    pub async fn put_peek_turns(&self, caller: &Caller, turns: Vec<PeekTurn>, append: bool) -> Result<bool> {
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
        self.store.put_peek_turns(caller, &turns, append).await
    }

    /// Another agent's last turns (3 when `turns` is 0), if it allows peeking and the caller may message it.
    pub async fn peek(&self, caller: &Caller, endpoint: &str, turns: u32) -> Result<Peek> {
        if endpoint.trim().is_empty() {
            return Err(Error::invalid("peek takes endpoint: whose last turns to see"));
        }
        let turns = if turns == 0 { 3 } else { turns as usize };
        self.store.peek(caller, endpoint, turns).await
    }

    pub async fn peekers(&self, caller: &Caller) -> Result<Vec<Peeker>> {
        self.store.peekers(caller).await
    }

    /// Requests waiting for the caller's reply that it can still answer.
    pub async fn pending_replies(&self, caller: &Caller) -> Result<Vec<Message>> {
        self.store.pending_replies(caller).await
    }

    // ---- an account's person -----------------------------------------------------------------

    /// The human inbox `me`, as the sender and recipient a person's commands act for.
    async fn me(&self, person: &Human) -> Result<Caller> {
        self.store.human_caller(person).await
    }

    pub async fn human_inbox(&self, person: &Human, wait_s: u32, limit: u32, ack: bool) -> Result<(Vec<Message>, u64)> {
        let me = self.me(person).await?;
        self.inbox(&me, wait_s, limit, ack).await
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
        let me = self.me(person).await?;
        let message = NewMessage { to, body, thread, kind: Kind::Message, client_id, private, require_reply: false };
        self.send(&me, message).await
    }

    pub async fn human_reply(&self, person: &Human, id: &str, body: &str, client_id: &str) -> Result<Delivered> {
        let me = self.me(person).await?;
        self.reply(&me, id, body, client_id).await
    }

    pub async fn holds(&self, person: &Human, all: bool) -> Result<Vec<Hold>> {
        self.store.holds(person, all).await
    }

    /// Releases a held message to its recipients, or rejects it with a reason its sender reads.
    pub async fn decide_hold(&self, person: &Human, id: &str, release: bool, reason: &str) -> Result<Hold> {
        let view = self.store.decide_hold(person, id, release, &RedactedText::from_agent(reason)).await?;
        tracing::info!(account = %person.account, hold = %view.id, state = %view.state, "hold decided");
        Ok(view)
    }

    /// Turns holding a class of messages on or off; the classes held now.
    pub async fn hold_policy(&self, person: &Human, class: &str, on: bool) -> Result<Vec<String>> {
        self.store.hold_policy(person, class.trim(), on).await
    }

    pub async fn contact_request(&self, person: &Human, account: &str) -> Result<Contact> {
        let view = self.store.contact_request(person, account.trim()).await?;
        tracing::info!(account = %person.account, other = %view.account, state = %view.state, "contact request");
        Ok(view)
    }

    pub async fn contact_accept(&self, person: &Human, account: &str) -> Result<Contact> {
        self.store.contact_accept(person, account.trim()).await
    }

    pub async fn contact_list(&self, person: &Human) -> Result<Vec<Contact>> {
        self.store.contact_list(person).await
    }

    /// Allows or forbids private data across a contact.
    pub async fn contact_private(&self, person: &Human, account: &str, allow: bool) -> Result<Contact> {
        self.store.contact_private(person, account.trim(), allow).await?;
        let state = if allow { "contact, private data allowed" } else { "contact, no private data" };
        Ok(Contact { account: account.trim().to_owned(), state: state.to_owned(), withdrawn: 0 })
    }

    /// Ends a contact: reach is cut at once and what no agent has seen yet is withdrawn.
    pub async fn contact_drop(&self, person: &Human, account: &str) -> Result<Contact> {
        let view = self.store.contact_drop(&person.account, account.trim()).await?;
        tracing::info!(account = %person.account, other = %view.account, withdrawn = view.withdrawn, "contact dropped");
        Ok(view)
    }
}
