//! This replica's liveness: the one write that keeps every push stream it holds online.

use tokio::task::JoinHandle;
use tokio::time::{Instant, interval_at};
use tokio_util::sync::CancellationToken;

use crate::domain::presence;
use crate::store::Store;

/// Renews the replica's row every [`presence::REPLICA_RENEW`] until shutdown, then removes it, so
/// the endpoints whose streams it held go offline (after their reconnect grace) at once rather than
/// when the lease lapses.
pub fn start(store: Store, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut renew = interval_at(Instant::now() + presence::REPLICA_RENEW, presence::REPLICA_RENEW);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = renew.tick() => {
                    if let Err(e) = store.renew_replica().await {
                        tracing::warn!(error = %e, replica = %store.replica(), "cannot renew this replica's liveness");
                    }
                }
            }
        }
        if let Err(e) = store.retire_replica().await {
            tracing::warn!(error = %e, replica = %store.replica(), "cannot retire this replica");
        }
    })
}
