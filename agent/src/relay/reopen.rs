//! Keeping a server stream open (the push stream, a wait for mail): a stream silent for longer than
//! the server's heartbeats allow is given up ([`SILENCE`]), and one that failed is reopened — at
//! once on the next replica while the client has replicas it has not tried since the stream last
//! brought something, else after a backoff that the stream's next event starts over.

use std::future::Future;

use relay_proto::timing::{Backoff, SILENCE};
use tonic::Status;

use super::replicas::Replicas;

/// The next event of a server stream, or an error once the server has been silent for [`SILENCE`].
pub async fn within_silence<T>(next: impl Future<Output = Result<Option<T>, Status>>) -> Result<Option<T>, Status> {
    tokio::time::timeout(SILENCE, next).await.map_err(|_| Status::deadline_exceeded("the relay server went silent"))?
}

/// When a failed stream is opened again.
#[derive(Debug)]
pub struct Reopening {
    backoff: Backoff,
    /// Replicas moved to since the stream last brought something.
    hops: usize,
}

impl Default for Reopening {
    fn default() -> Self {
        Self { backoff: Backoff::reopening(), hops: 0 }
    }
}

impl Reopening {
    /// The stream brought something: a later failure starts over.
    pub fn progressed(&mut self) {
        self.backoff.reset();
        self.hops = 0;
    }

    /// Waits before opening `what` again after it failed on replica `failed_on` for `reason`: not at
    /// all when the client has since moved to a replica it has not tried, else the backoff.
    pub async fn pause(&mut self, replicas: &Replicas, failed_on: usize, what: &str, reason: &str) {
        let (now, _) = replicas.current();
        if now != failed_on && self.hops + 1 < replicas.count() {
            self.hops += 1;
            tracing::info!(reason, replica = %replicas.url(now), "{what} interrupted; reopening on the next replica");
            return;
        }
        self.hops = 0;
        let wait = self.backoff.next_wait();
        tracing::info!(reason, retry_ms = wait.as_millis() as u64, "{what} interrupted; reopening");
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use relay_proto::timing::{HEARTBEAT_EVERY, SILENCE_MARGIN, SILENT_BEATS};
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::*;

    /// A server that beats every [`HEARTBEAT_EVERY`], once late by just under the margin, then
    /// falls silent with its connection still open: the client hears every beat and gives the
    /// stream up [`SILENCE`] after the last one — the beats it would have sent, and the margin.
    #[tokio::test(start_paused = true)]
    async fn a_client_gives_up_a_silent_stream_one_margin_after_the_beats_it_missed() {
        let (beat, mut beats) = mpsc::channel::<()>(1);
        tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(HEARTBEAT_EVERY).await;
                beat.send(()).await.unwrap();
            }
            tokio::time::sleep(SILENCE - Duration::from_millis(1)).await;
            beat.send(()).await.unwrap();
            std::future::pending::<()>().await;
        });
        let start = Instant::now();
        let mut heard = 0;
        let mut last = start;
        let gave_up = loop {
            match within_silence(async { Ok(beats.recv().await) }).await {
                Ok(_) => {
                    heard += 1;
                    last = Instant::now();
                }
                Err(status) => break status,
            }
        };
        assert_eq!(heard, 4, "a beat late by less than the margin is heard");
        assert_eq!(gave_up.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(last.elapsed(), HEARTBEAT_EVERY * SILENT_BEATS + SILENCE_MARGIN);
    }
}
