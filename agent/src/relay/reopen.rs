//! Keeping a server stream open (the push stream, a wait for mail): one mechanism, [`keep`], for
//! every stream a client holds. A stream silent for longer than the server's heartbeats allow is
//! given up ([`within_silence`]), and one that failed is opened again — at once on the next replica
//! while the client has replicas it has not tried since the stream last brought something, else
//! after a backoff that the stream's next event starts over.

use std::future::Future;

use relay_proto::timing::{Backoff, SILENCE};
use tonic::Status;

use super::replicas::Replicas;

/// The next event of a server stream, or an error once the server has been silent for [`SILENCE`].
pub async fn within_silence<T>(next: impl Future<Output = Result<Option<T>, Status>>) -> Result<Option<T>, Status> {
    tokio::time::timeout(SILENCE, next).await.map_err(|_| Status::deadline_exceeded("the relay server went silent"))?
}

/// What one opening of a kept stream came to.
#[derive(Debug)]
pub enum Attempt<T> {
    /// The stream is done with: [`keep`] answers this.
    Done(T),
    /// Open it again at once (its credential was renewed meanwhile).
    Again,
    /// It failed or ended on replica `on` for `reason`, after bringing something or not.
    Failed { on: usize, reason: String, progressed: bool },
}

/// A server stream a client keeps open.
pub trait Kept {
    /// What it answers once it is done with.
    type Done;

    /// Opens the stream and follows it until it is done with, fails or ends.
    fn open(&mut self) -> impl Future<Output = Attempt<Self::Done>> + Send;
}

/// Keeps `stream` (named `what` in the log) open: opens it until it is done with, pausing between
/// failures as the replicas and the backoff say.
pub async fn keep<K: Kept>(replicas: &Replicas, what: &str, stream: &mut K) -> K::Done {
    let mut reopening = Reopening::default();
    loop {
        match stream.open().await {
            Attempt::Done(done) => return done,
            Attempt::Again => {}
            Attempt::Failed { on, reason, progressed } => {
                if progressed {
                    reopening.progressed();
                }
                reopening.pause(replicas, on, what, &reason).await;
            }
        }
    }
}

/// When a failed stream is opened again.
#[derive(Debug)]
struct Reopening {
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
    fn progressed(&mut self) {
        self.backoff.reset();
        self.hops = 0;
    }

    /// Waits before opening `what` again after it failed on replica `failed_on` for `reason`: not at
    /// all when the client has since moved to a replica it has not tried, else the backoff.
    async fn pause(&mut self, replicas: &Replicas, failed_on: usize, what: &str, reason: &str) {
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

    /// Openings as scripted, each recorded with when it was made.
    struct Scripted {
        script: Vec<Attempt<u8>>,
        opened: Vec<u128>,
        start: Instant,
    }

    impl Kept for Scripted {
        type Done = u8;

        async fn open(&mut self) -> Attempt<u8> {
            self.opened.push(self.start.elapsed().as_millis());
            self.script.pop().expect("no more openings than scripted")
        }
    }

    /// Failures wait the doubling backoff, a failure after progress starts it over, a renewed
    /// credential opens again at once, and the stream's end is what `keep` answers.
    #[tokio::test(start_paused = true)]
    async fn a_kept_stream_backs_off_between_failures_and_starts_over_after_progress() {
        let replicas = Replicas::new("http://127.0.0.1:9", None).expect("one replica");
        let failed = |progressed| Attempt::Failed { on: 0, reason: "gone".into(), progressed };
        let mut script =
            vec![failed(false), failed(false), failed(true), Attempt::Again, failed(false), Attempt::Done(7)];
        script.reverse();
        let mut stream = Scripted { script, opened: Vec::new(), start: Instant::now() };
        assert_eq!(keep(&replicas, "test stream", &mut stream).await, 7);
        // 200 and 400 ms after the first two failures; 200 again after one that had progressed; none
        // after Again; then 400.
        assert_eq!(stream.opened, [0, 200, 600, 800, 800, 1200]);
    }
}
