//! The application layer: one service per area, between the protocol (which authenticates the
//! caller and speaks `relay.v1`) and the store (which holds the SQL). Each operation checks its
//! input against the product's limits, redacts what agents wrote, waits where a call waits, and
//! calls the store; it knows no wire types and builds no gRPC status. [`App`] holds the services;
//! each protocol handler holds the ones it needs and calls them by area (`self.messaging.send(…)`).

pub mod approvals;
pub mod board;
pub mod claims;
pub mod console;
pub mod identity;
pub mod messaging;
mod notices;
pub mod observe;
pub mod quotas;
pub mod remote;
pub mod retention;
pub mod scope;
pub mod send;
pub mod trust;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::domain::caller::Caller;
use crate::domain::limits::Quotas;
use crate::domain::retention::Retention;
use crate::domain::timings::Timings;
use crate::domain::{Result, limits};
use crate::push::Hub;
use crate::store::Store;

/// Every area's service.
#[derive(Clone)]
pub struct App {
    pub identity: identity::IdentityService,
    pub messaging: messaging::MessagingService,
    pub scope: scope::ScopeService,
    pub trust: trust::TrustService,
    pub board: board::BoardService,
    pub claims: claims::ClaimsService,
    pub approvals: approvals::ApprovalsService,
    pub console: console::ConsoleService,
    pub ops: observe::OpsService,
    pub remote: remote::RemoteService,
}

impl App {
    /// The services over `core`, each with its own state: messaging starts the replica's send
    /// writer (a thread of its own), whose committed sends wake their recipients' waiters.
    pub fn start(core: Core, retention: Retention) -> Result<Self> {
        let identity = identity::IdentityService::new(core.clone());
        let messaging = messaging::MessagingService::start(core.clone(), identity.clone())?;
        let trust = trust::TrustService::new(core.clone(), messaging.clone());
        let approvals = approvals::ApprovalsService::new(core.clone());
        Ok(Self {
            console: console::ConsoleService::new(core.clone(), trust.clone(), approvals.clone()),
            scope: scope::ScopeService::new(core.clone(), messaging.clone()),
            board: board::BoardService::new(core.clone()),
            claims: claims::ClaimsService::new(core.clone()),
            remote: remote::RemoteService::new(core.clone()),
            ops: observe::OpsService::new(core, retention),
            identity,
            messaging,
            trust,
            approvals,
        })
    }
}

/// What every service works with: the database, the local wake-ups, the server's shutdown, and
/// the operator's settings. What a service changes as it runs (rates, caches, the send writer)
/// is its own.
#[derive(Clone)]
pub struct Core {
    store: Store,
    hub: Hub,
    shutdown: CancellationToken,
    timings: Timings,
    quotas: Quotas,
}

impl Core {
    pub fn new(store: Store, hub: Hub, shutdown: CancellationToken) -> Self {
        Self { store, hub, shutdown, timings: Timings::default(), quotas: Quotas::default() }
    }

    /// Holds every endpoint and account to `quotas`.
    pub fn with_quotas(mut self, quotas: Quotas) -> Self {
        self.quotas = quotas;
        self
    }

    /// Keeps the board's and the scheduler's periods at `timings`.
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }

    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// A worker's lease on a card, in seconds.
    pub fn lease_s(&self) -> f64 {
        self.timings.lease.as_secs_f64()
    }

    /// What the scheduler's round has to do now (one read).
    pub async fn due_work(&self) -> Result<crate::store::due::DueWork> {
        let db = self.store.client().await?;
        Ok(crate::store::due::probe(&db, self.timings.approval_wait.as_secs_f64()).await?)
    }

    /// The human inbox of `person`'s account, as the sender and recipient a person's commands act for.
    pub(crate) async fn me(&self, person: &crate::domain::caller::Human) -> Result<Caller> {
        Ok(crate::store::trust::human_caller(&self.store.client().await?, person.account_id).await?)
    }

    /// How many endpoints an account, and one machine's agents, may hold.
    pub(crate) fn endpoint_caps(&self) -> crate::store::identity::EndpointCaps {
        crate::store::identity::EndpointCaps {
            account: self.quotas.max_endpoints,
            machine: self.quotas.max_endpoints_per_machine,
        }
    }

    /// Why a new endpoint of `account`'s `machine` was refused.
    pub(crate) fn no_room(
        &self,
        account: &str,
        machine: &str,
        full: crate::store::identity::NoRoom,
    ) -> crate::domain::Error {
        use crate::store::identity::NoRoom;
        match full {
            NoRoom::Account => limits::no_room_for_endpoints(account, self.quotas.max_endpoints),
            NoRoom::Machine => {
                limits::no_room_on_machine(&format!("{account}/{machine}"), self.quotas.max_endpoints_per_machine)
            }
        }
    }

    /// [`Self::wait_for`] for the caller's mail: a post of a topic it follows wakes it too. Only a
    /// call that waits, and found nothing at once, reads what the caller follows.
    pub(crate) async fn wait_for_mail<T, F, Fut>(
        &self,
        caller: &Caller,
        wait_s: u32,
        ready: impl Fn(&T) -> bool,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + Duration::from_secs(u64::from(limits::wait_s(wait_s)?));
        let mut waiter = self.hub.waiter(caller.endpoint_id);
        // Its place among the waits for posts first, then what it follows (a change meanwhile wakes
        // it), read again after each such wake-up.
        let posts = self.hub.announcer(caller.endpoint_id, Vec::new());
        let mut follows_read = false;
        loop {
            let value = attempt().await?;
            if ready(&value) || Instant::now() >= deadline || self.shutdown.is_cancelled() {
                return Ok(value);
            }
            if !std::mem::replace(&mut follows_read, true) {
                let follows = crate::store::topics::follows_of(&self.store.client().await?, caller.endpoint_id).await?;
                posts.set_topics(follows.into_iter().map(|(topic, _)| topic).collect());
                // A post made before its topics were known here is read now.
                continue;
            }
            let _waiting = InboxWaiting::new();
            tokio::select! {
                () = waiter.changed() => {}
                () = posts.woken() => follows_read = false,
                () = tokio::time::sleep_until(deadline) => {}
                () = self.shutdown.cancelled() => {}
            }
        }
    }

    /// Runs `attempt` until `ready` holds for its result or `wait_s` passes, re-running it whenever
    /// the caller's inbox changes. The waiter is taken before the first attempt, so no change is
    /// missed.
    pub(crate) async fn wait_for<T, F, Fut>(
        &self,
        caller: &Caller,
        wait_s: u32,
        ready: impl Fn(&T) -> bool,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + Duration::from_secs(u64::from(limits::wait_s(wait_s)?));
        let mut waiter = self.hub.waiter(caller.endpoint_id);
        loop {
            let value = attempt().await?;
            if ready(&value) || Instant::now() >= deadline || self.shutdown.is_cancelled() {
                return Ok(value);
            }
            tokio::select! {
                () = waiter.changed() => {}
                () = tokio::time::sleep_until(deadline) => {}
                () = self.shutdown.cancelled() => {}
            }
        }
    }
}

/// Counts an inbox read in `relay_inbox_waiters` while it waits.
struct InboxWaiting;

impl InboxWaiting {
    fn new() -> Self {
        crate::metrics::metrics().inbox_waiting.inc();
        Self
    }
}

impl Drop for InboxWaiting {
    fn drop(&mut self) {
        crate::metrics::metrics().inbox_waiting.dec();
    }
}

/// An empty string from a caller means "not given".
pub fn optional(value: &str) -> Option<&str> {
    (!value.is_empty()).then_some(value)
}
