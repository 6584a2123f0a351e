//! Who is calling, and the endpoint it holds: claiming and ending it, what it says of itself,
//! and whom it sees.

use super::{App, optional};
use crate::domain::caller::Human;
use crate::domain::endpoint::Endpoint;
use crate::domain::redact::RedactedText;
use crate::domain::{Result, limits};
use crate::store::identity::{Caller, HelloOutcome, MachineIdentity};

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

impl App {
    /// The machine a machine token names.
    pub async fn machine(&self, token: &str) -> Result<MachineIdentity> {
        self.store.authenticate_machine(token).await
    }

    /// The endpoint a session token names: the sender of everything it sends.
    pub async fn caller(&self, token: &str) -> Result<Caller> {
        self.store.authenticate_session(token).await
    }

    /// The account's person a human token names.
    pub async fn person(&self, token: &str) -> Result<Human> {
        self.store.authenticate_human(token).await
    }

    pub async fn hello(&self, machine: &MachineIdentity, claim: Claim<'_>) -> Result<HelloOutcome> {
        let harness = limits::harness(claim.harness)?;
        let outcome = self
            .store
            .hello(machine, optional(claim.handle), harness, optional(claim.resume), optional(claim.spawn_grant))
            .await?;
        tracing::info!(endpoint = %outcome.endpoint.address, resumed = outcome.resumed, harness, "hello");
        Ok(outcome)
    }

    pub async fn goodbye(&self, caller: &Caller) -> Result<()> {
        self.store.goodbye(caller).await?;
        tracing::info!(endpoint = %caller.address(), "goodbye");
        Ok(())
    }

    /// The caller's endpoint and how many messages wait unread.
    pub async fn whoami(&self, caller: &Caller) -> Result<(Endpoint, u64)> {
        let endpoint = self.store.endpoint(caller.endpoint_id).await?;
        let unread = crate::store::messages::unread_count(&self.store.client().await?, caller.endpoint_id).await?;
        Ok((endpoint, unread))
    }

    pub async fn list(&self, caller: &Caller, all: bool, contacts: bool) -> Result<Vec<Endpoint>> {
        self.store.list(caller, all, contacts).await
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
        self.store.update_profile(caller, change.status, note.as_ref(), now.as_ref(), title.as_ref()).await
    }
}
