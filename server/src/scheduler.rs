//! The timed rounds every replica runs: fire due schedules, hand unanswered permission requests on
//! (to the human, then refused), put back cards whose worker went quiet, and now and then purge
//! what outlived its retention, and index new messages for search. Rows are taken with `skip locked`, so
//! replicas share the work and never do it twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::app::approvals::ApprovalsService;
use crate::app::board::BoardService;
use crate::app::messaging::MessagingService;
use crate::app::observe::OpsService;
use crate::metrics::{Purged, metrics};

/// Rounds between purges: a backlog drains in bounded batches, and an idle server seldom asks.
const PURGE_EVERY_ROUNDS: u64 = 60;

/// The longest one batch of search indexing may take (tens of milliseconds as a rule): past it,
/// against a database that stopped answering, the task gives up and a later round starts another.
const INDEX_BATCH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// The services the rounds call.
struct Rounds {
    board: BoardService,
    approvals: ApprovalsService,
    ops: OpsService,
    messaging: MessagingService,
    /// Whether this replica's indexing task runs: one at a time, started by a round that finds the
    /// search queue holds messages.
    indexing: Arc<AtomicBool>,
}

pub fn start(app: &App, shutdown: CancellationToken) -> JoinHandle<()> {
    let rounds = Rounds {
        board: app.board.clone(),
        approvals: app.approvals.clone(),
        ops: app.ops.clone(),
        messaging: app.messaging.clone(),
        indexing: Arc::default(),
    };
    tokio::spawn(async move {
        let mut every = tokio::time::interval(rounds.ops.timings().scheduler_tick);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for round in 0u64.. {
            tokio::select! {
                _ = every.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if round % PURGE_EVERY_ROUNDS == 0 {
                purge(&rounds).await;
            }
            metrics().scheduler_rounds.inc();
            // One read says which jobs have work; an idle round costs nothing more.
            let due = match rounds.ops.due_work().await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(error = %e, "scheduler round failed");
                    continue;
                }
            };
            if due.schedules {
                fire_schedules(&rounds).await;
            }
            if due.approvals {
                approval_round(&rounds).await;
            }
            if due.leases {
                expire_leases(&rounds).await;
            }
            if due.search && !rounds.indexing.swap(true, Ordering::AcqRel) {
                tokio::spawn(index_for_search(rounds.messaging.clone(), rounds.indexing.clone(), shutdown.clone()));
            }
        }
    })
}

async fn fire_schedules(rounds: &Rounds) {
    match rounds.board.fire_due_schedules().await {
        Ok(0) => {}
        Ok(n) => {
            metrics().schedules_fired.inc_by(n as u64);
            tracing::info!(runs = n, "scheduled runs posted");
        }
        Err(e) => tracing::warn!(error = %e, "schedule round failed"),
    }
}

async fn approval_round(rounds: &Rounds) {
    match rounds.approvals.approval_round().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(requests = n, "permission requests escalated or expired"),
        Err(e) => tracing::warn!(error = %e, "approval round failed"),
    }
}

async fn expire_leases(rounds: &Rounds) {
    match rounds.board.expire_leases().await {
        Ok(0) => {}
        Ok(n) => {
            metrics().leases_expired.inc_by(n);
            tracing::warn!(cards = n, "worker leases expired; cards back in To do");
        }
        Err(e) => tracing::warn!(error = %e, "lease round failed"),
    }
}

/// Indexes the search queue batch by batch until it is empty (or the rest is being taken by other
/// replicas), apart from the rounds so that a backlog never delays a round's other work.
async fn index_for_search(messaging: MessagingService, running: Arc<AtomicBool>, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        match tokio::time::timeout(INDEX_BATCH_DEADLINE, messaging.index_for_search()).await {
            Ok(Ok(taken)) => {
                metrics().search_indexed.inc_by(taken);
                if taken < crate::domain::search::INDEX_BATCH as u64 {
                    break;
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "search indexing failed; the next round tries again");
                break;
            }
            Err(_) => {
                tracing::warn!("search indexing took over a minute; the next round tries again");
                break;
            }
        }
    }
    running.store(false, Ordering::Release);
}

async fn purge(rounds: &Rounds) {
    match rounds.ops.purge().await {
        Ok(purged) => {
            let m = metrics();
            m.purged(Purged::messages, purged.messages);
            m.purged(Purged::cards, purged.cards);
            m.purged(Purged::peeks, purged.peeks);
            m.purged(Purged::console_sessions, purged.console_sessions);
            m.purged(Purged::mcp_sessions, purged.mcp_sessions);
            m.purged(Purged::files, purged.files);
            m.purged(Purged::mcp_answers, purged.mcp_answers);
            if purged.total() > 0 {
                tracing::info!(
                    messages = purged.messages,
                    cards = purged.cards,
                    peeks = purged.peeks,
                    files = purged.files,
                    console_sessions = purged.console_sessions,
                    mcp_sessions = purged.mcp_sessions,
                    mcp_answers = purged.mcp_answers,
                    "purged past retention"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "purge round failed"),
    }
}
