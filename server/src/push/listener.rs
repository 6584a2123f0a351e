//! The replica's one LISTEN connection. It is dedicated, never pooled: a pooled connection would be
//! handed to other work and its notifications discarded.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use relay_proto::timing::Backoff;
use tokio::task::JoinHandle;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, Client, NoTls, Socket};
use tokio_util::sync::CancellationToken;

use super::Hub;
use crate::domain::ids::{AccountId, ReplicaId};
use crate::domain::{Error, Result};
use crate::store::console::{ACCOUNT_CHANNEL, CONSOLE_CHANNEL};
use crate::store::identity::{CONTROL_CHANNEL, Control};
use crate::store::messages::{DELIVERY_CHANNEL, DeliveryNotice};
use crate::store::topics::{self, TOPIC_CHANNEL, TopicNotice};
use crate::store::{DbConfig, DbTls, Store};

/// How soon the notification connection is reopened: at once after a blip, every 10 s at most.
const REOPENING: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
const PROBE_EVERY: Duration = Duration::from_secs(30);
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

type Driver = JoinHandle<std::result::Result<(), tokio_postgres::Error>>;

/// Memory the application keeps true by what this listener hears (the send pipeline's resolved
/// recipients): told when every change is heard, when changes may go unheard, and when scope
/// changed.
pub trait Kept: Send + Sync {
    fn changes_heard(&self);
    fn changes_unheard(&self);
    fn scope_changed(&self);
}

/// What this replica keeps in memory while it hears every change: the store's sessions and what
/// the application keeps.
#[derive(Clone)]
struct Memory {
    store: Store,
    kept: Arc<dyn Kept>,
}

impl Memory {
    fn heard(&self) {
        self.store.changes_heard();
        self.kept.changes_heard();
    }

    fn unheard(&self) {
        self.store.changes_unheard();
        self.kept.changes_unheard();
    }
}

/// Connects and listens before returning, so the server never serves without push; afterwards it
/// reconnects by itself and wakes every waiter to re-read what it may have missed meanwhile.
///
/// While it listens, sessions may be held in memory: every change to one is heard. While it is
/// away, they are not, and every call reads the database.
pub async fn start(store: Store, hub: Hub, kept: Arc<dyn Kept>, shutdown: CancellationToken) -> Result<JoinHandle<()>> {
    let config = store.config().clone();
    let memory = Memory { store, kept };
    let first = listen(&config, &hub, &memory)
        .await
        .map_err(|e| Error::Unavailable(format!("cannot open the notification connection: {e}")))?;
    memory.heard();
    Ok(tokio::spawn(async move {
        let mut current = Some(first);
        let mut backoff = REOPENING;
        let mut retry = backoff.next_wait();
        loop {
            if let Some((client, mut driver)) = current.take() {
                // A half-open connection would swallow notifications silently: probe it now and then.
                let mut probe = tokio::time::interval_at(tokio::time::Instant::now() + PROBE_EVERY, PROBE_EVERY);
                loop {
                    tokio::select! {
                        ended = &mut driver => {
                            match ended {
                                Ok(Ok(())) => tracing::warn!("notification connection closed"),
                                Ok(Err(e)) => tracing::warn!(error = %e, "notification connection failed"),
                                Err(e) => tracing::error!(error = %e, "notification task failed"),
                            }
                            memory.unheard();
                            break;
                        }
                        _ = probe.tick() => {
                            let alive = tokio::time::timeout(PROBE_TIMEOUT, client.simple_query("select 1")).await;
                            if !matches!(alive, Ok(Ok(_))) {
                                tracing::warn!("notification connection stopped answering; reconnecting");
                                memory.unheard();
                                driver.abort();
                                break;
                            }
                        }
                        () = shutdown.cancelled() => return,
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(retry) => {}
                () = shutdown.cancelled() => return,
            }
            match listen(&config, &hub, &memory).await {
                Ok(session) => {
                    tracing::info!("notification connection restored");
                    crate::metrics::metrics().listen_reconnects.inc();
                    current = Some(session);
                    backoff.reset();
                    retry = backoff.next_wait();
                    memory.heard();
                    // Notifications sent while we were away are gone: everyone re-reads and rechecks.
                    hub.wake_all();
                    hub.all_changed();
                }
                Err(e) => {
                    retry = backoff.next_wait();
                    tracing::warn!(error = %e, retry_ms = retry.as_millis() as u64, "cannot reopen the notification connection");
                }
            }
        }
    }))
}

async fn listen(
    config: &DbConfig,
    hub: &Hub,
    memory: &Memory,
) -> std::result::Result<(Client, Driver), tokio_postgres::Error> {
    match &config.tls {
        DbTls::None => listen_with(&config.pg, NoTls, hub, memory).await,
        DbTls::Rustls(tls) => listen_with(&config.pg, tls.clone(), hub, memory).await,
    }
}

async fn listen_with<T>(
    config: &tokio_postgres::Config,
    tls: T,
    hub: &Hub,
    memory: &Memory,
) -> std::result::Result<(Client, Driver), tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = config.connect(tls).await?;
    let hub = hub.clone();
    let memory = memory.clone();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            if let AsyncMessage::Notification(n) = message? {
                heard(&hub, &memory, n.channel(), n.payload());
            }
        }
        Ok(())
    });
    client
        .batch_execute(&format!(
            "listen {DELIVERY_CHANNEL}; listen {CONTROL_CHANNEL}; listen {ACCOUNT_CHANNEL}; listen {CONSOLE_CHANNEL}; \
             listen {TOPIC_CHANNEL}"
        ))
        .await?;
    Ok((client, driver))
}

fn heard(hub: &Hub, memory: &Memory, channel: &str, payload: &str) {
    if channel == TOPIC_CHANNEL {
        match TopicNotice::parse(payload) {
            // Read once here, for every stream here that follows the topic; none, nothing read.
            Some(TopicNotice::Posted { topic, seq }) if hub.follows_topic(topic) => {
                let (hub, store) = (hub.clone(), memory.store.clone());
                tokio::spawn(async move {
                    let read = async { Ok::<_, Error>(topics::post_at(&store.client().await?, topic, seq).await?) };
                    match read.await {
                        Ok(Some(post)) => hub.posted(topic, Arc::new(post)),
                        Ok(None) => {}
                        // The streams read their topics again rather than miss it.
                        Err(e) => {
                            tracing::warn!(topic, seq, error = %e, "cannot read a post to hand on");
                            hub.topics_changed(None, Some(topic));
                        }
                    }
                });
            }
            Some(TopicNotice::Posted { .. }) => {}
            Some(TopicNotice::Follows(endpoint)) => hub.topics_changed(Some(endpoint), None),
            Some(TopicNotice::Closed(topic)) => hub.topics_changed(None, Some(topic)),
            None => tracing::warn!(payload, "malformed topic notification"),
        }
        return;
    }
    if channel == ACCOUNT_CHANNEL || channel == CONSOLE_CHANNEL {
        match payload.parse().map(AccountId) {
            Ok(account) if channel == ACCOUNT_CHANNEL => hub.wake_account(account),
            Ok(account) => hub.console_session_ended(account),
            Err(_) => tracing::warn!(channel, payload, "malformed account notification"),
        }
        return;
    }
    if channel == CONTROL_CHANNEL {
        match Control::parse(payload) {
            Some(Control::Endpoint(id)) => {
                memory.store.sessions().forget_endpoint(id);
                hub.endpoint_changed(id);
            }
            Some(Control::Machine(id)) => {
                memory.store.sessions().forget_machine(id);
                memory.kept.scope_changed();
                hub.machine_changed(id);
            }
            Some(Control::Scope) => memory.kept.scope_changed(),
            None => tracing::warn!(payload, "malformed control notification"),
        }
        return;
    }
    match DeliveryNotice::parse(payload) {
        Some(DeliveryNotice::One(recipient)) => hub.wake(recipient),
        // This replica woke its own waiters when it committed the batch.
        Some(DeliveryNotice::Batch { replica, .. })
            if replica != ReplicaId::NONE && replica == memory.store.replica() => {}
        Some(DeliveryNotice::Batch { recipients, .. }) => recipients.into_iter().for_each(|r| hub.wake(r)),
        None => tracing::warn!(payload, "malformed delivery notification"),
    }
}
