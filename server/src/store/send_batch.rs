//! Group commit for sends. A send that was resolved and allowed is queued here; writer tasks take
//! whatever has queued meanwhile (up to [`MAX_BATCH`]) and write it with one call of
//! `relay_send_batch` (migrations 9 and 10): one round trip and one commit for the whole batch, each send
//! in its own subtransaction so a failing one leaves the others stored. Alone, a send waits for
//! nobody; under load, sends share commits.
//!
//! Past [`QUEUE`] sends waiting for one writer, more for it are refused at once as overloaded rather
//! than queued for seconds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::error::Col;
use crate::domain::ids::EndpointId;
use crate::domain::{Error, Result, limits, presence};
use crate::metrics::{Shed, Step, metrics};

/// Sends written together at most: each takes a subtransaction, and Postgres tracks up to 64 per
/// transaction cheaply.
const MAX_BATCH: usize = 64;
/// Batches written at once: commits overlap while the next batch gathers. Each writer has its own
/// queue, and a send goes to the writer of its lowest recipient: sends to one busy inbox then share
/// batches, one row lock and one commit for many, instead of queueing on that row lock one writer
/// after another.
const WRITERS: usize = 4;
/// Sends waiting for each writer at most; beyond it sends are refused as overloaded.
const QUEUE: usize = 64;

/// Called with each recipient of a committed batch, to wake its waiters in this process.
pub type Waker = Arc<dyn Fn(EndpointId) + Send + Sync>;

/// What became of one send of a batch.
pub(super) enum Written {
    /// Stored; recipients not online, with when they were last seen.
    Stored { offline: HashMap<EndpointId, String> },
    /// A send with the same client id was stored before.
    Duplicate,
    /// Refused by the database: its SQLSTATE, message and detail.
    Refused { state: String, message: String, detail: Option<String> },
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    ok: bool,
    #[serde(default)]
    duplicate: bool,
    #[serde(default)]
    offline: Vec<Offline>,
    error: Option<String>,
    message: Option<String>,
    detail: Option<String>,
}

#[derive(Deserialize)]
struct Offline {
    id: i64,
    last_seen_ms: Option<i64>,
}

struct Job {
    send: Value,
    /// The send's recipients, woken here once it is stored.
    to: Vec<EndpointId>,
    done: oneshot::Sender<Result<Written>>,
    queued: Instant,
}

pub(super) struct Batcher {
    queues: Vec<mpsc::Sender<Job>>,
    waker: Arc<OnceLock<Waker>>,
    cap: Arc<AtomicU32>,
}

impl Batcher {
    /// Starts the writers; they end when the last handle on the queue goes.
    pub(super) fn start(pool: Pool, replica: Arc<AtomicI64>) -> Self {
        let waker: Arc<OnceLock<Waker>> = Arc::default();
        let cap = Arc::new(AtomicU32::new(limits::DEFAULT_MAX_UNREAD));
        let queues = (0..WRITERS)
            .map(|_| {
                let (queue, rx) = mpsc::channel(QUEUE);
                let writer =
                    Writer { pool: pool.clone(), cap: cap.clone(), replica: replica.clone(), waker: waker.clone() };
                tokio::spawn(writer.run(rx));
                queue
            })
            .collect();
        Self { queues, waker, cap }
    }

    /// The most unread messages one inbox holds.
    pub(super) fn set_cap(&self, cap: u32) {
        self.cap.store(cap, Ordering::Relaxed);
    }

    pub(super) fn set_waker(&self, waker: Waker) {
        let _ = self.waker.set(waker);
    }

    /// Queues one send to `to` and waits until its batch is committed (or failed).
    pub(super) async fn write(&self, send: Value, to: Vec<EndpointId>) -> Result<Written> {
        let (done, answer) = oneshot::channel();
        let lowest = to.iter().min().map_or(0, |id| id.0);
        let queue = &self.queues[lowest.rem_euclid(WRITERS as i64) as usize];
        queue.try_send(Job { send, to, done, queued: Instant::now() }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                metrics().shed(Shed::sends);
                limits::overloaded()
            }
            mpsc::error::TrySendError::Closed(_) => Error::Unavailable("the server is stopping".into()),
        })?;
        answer
            .await
            .map_err(|_| Error::Unavailable("the send was interrupted; retry it with the same client id".into()))?
    }
}

struct Writer {
    pool: Pool,
    cap: Arc<AtomicU32>,
    replica: Arc<AtomicI64>,
    waker: Arc<OnceLock<Waker>>,
}

impl Writer {
    async fn run(self, mut rx: mpsc::Receiver<Job>) {
        loop {
            let mut jobs = Vec::with_capacity(MAX_BATCH);
            match rx.recv().await {
                Some(job) => jobs.push(job),
                None => return,
            }
            // Whatever queued while the last batch was written goes in this one.
            while jobs.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            let m = metrics();
            m.send_batch_size.observe(jobs.len() as f64);
            match self.write(&jobs).await {
                Ok(answers) => {
                    let mut woken = Vec::new();
                    for (job, answer) in jobs.into_iter().zip(answers) {
                        if let Ok(Written::Stored { .. }) = &answer {
                            m.sends.inc();
                            m.deliveries(Step::delivered, job.to.len() as u64);
                            m.send_write_seconds.observe(job.queued.elapsed().as_secs_f64());
                            woken.extend(&job.to);
                        }
                        let _ = job.done.send(answer);
                    }
                    if let Some(wake) = self.waker.get() {
                        woken.sort_unstable();
                        woken.dedup();
                        woken.into_iter().for_each(|id| wake(id));
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, sends = jobs.len(), "a batch of sends failed");
                    for job in jobs {
                        let _ = job.done.send(Err(err.clone()));
                    }
                }
            }
        }
    }

    async fn write(&self, jobs: &[Job]) -> Result<Vec<Result<Written>>> {
        let client = self.pool.get().await?;
        let batch = Value::Array(jobs.iter().map(|j| j.send.clone()).collect());
        let cap = i32::try_from(self.cap.load(Ordering::Relaxed)).unwrap_or(i32::MAX);
        let replica = self.replica.load(Ordering::Relaxed);
        let stmt = client.prepare_cached("select relay_send_batch($1, $2, $3)").await?;
        let row = client.query_one(&stmt, &[&batch, &cap, &replica]).await?;
        let answers: Vec<Answer> = serde_json::from_value(row.col::<Value>(0)?)
            .map_err(|e| Error::Internal(format!("unreadable answer from relay_send_batch: {e}")))?;
        if answers.len() != jobs.len() {
            return Err(Error::Internal(format!(
                "relay_send_batch answered {} of {} sends",
                answers.len(),
                jobs.len()
            )));
        }
        Ok(answers.into_iter().map(written).collect())
    }
}

fn written(answer: Answer) -> Result<Written> {
    if answer.duplicate {
        return Ok(Written::Duplicate);
    }
    if answer.ok {
        let offline = answer
            .offline
            .into_iter()
            .map(|o| {
                (
                    EndpointId(o.id),
                    presence::offline_reason(o.last_seen_ms.and_then(DateTime::<Utc>::from_timestamp_millis)),
                )
            })
            .collect();
        return Ok(Written::Stored { offline });
    }
    Ok(Written::Refused {
        state: answer.error.unwrap_or_default(),
        message: answer.message.unwrap_or_default(),
        detail: answer.detail,
    })
}
