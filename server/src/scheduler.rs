//! The timed rounds every replica runs: fire due schedules and put back cards whose worker went
//! quiet. Rows are taken with `skip locked`, so replicas share the work and never do it twice.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::app::App;

/// How often a replica looks; `RELAY_SCHEDULER_TICK_MS` changes it (tests run it fast).
fn tick() -> Duration {
    let ms = std::env::var("RELAY_SCHEDULER_TICK_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000u64);
    Duration::from_millis(ms.clamp(10, 60_000))
}

pub fn start(app: App, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(tick());
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = shutdown.cancelled() => return,
            }
            match app.fire_due_schedules().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(runs = n, "scheduled runs posted"),
                Err(e) => tracing::warn!(error = %e, "schedule round failed"),
            }
            match app.expire_leases().await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(cards = n, "worker leases expired; cards back in To do"),
                Err(e) => tracing::warn!(error = %e, "lease round failed"),
            }
        }
    })
}
