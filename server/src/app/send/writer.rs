//! Group commit for sends. A send that was resolved and allowed is queued here; the replica's one
//! writer, on a thread of its own (see [`Batcher`]), takes whatever has queued meanwhile (up to
//! [`MAX_BATCH`]) and writes it with one call: one round trip and one commit for the whole batch,
//! its messages and deliveries written as sets.
//!
//! * A batch of plain sends (each to one inbox, relying on no contact, not a reply), the
//!   common case, is written by `relay_write_sends_plain`, which checks the inboxes first and then
//!   writes with no subtransaction; any other batch, and a batch of plain sends an inbox refuses,
//!   by `relay_write_sends_numbered`, send by send in subtransactions where it cannot write the
//!   batch whole, so a failing send leaves the others stored (the statements:
//!   `store::messages::batch`).
//! * Alone, a send waits for nobody and is written by the task that asked when its writer is idle,
//!   one statement. Under load, sends share commits.
//!
//! Every writer function answers each recipient's seq, so the recipients' streams in this process
//! are handed the message as it was stored (see [`Waker`]) instead of reading it back.
//!
//! Past [`QUEUE`] sends waiting, more are refused at once as overloaded rather than queued for
//! seconds.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::task::{Context, Poll, ready};

use chrono::{DateTime, Utc};
use deadpool_postgres::{Object, Pool};
use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::domain::delivery::Kind;
use crate::domain::ids::{EndpointId, ReplicaId, Seq};
use crate::domain::message::Message;
use crate::domain::{Error, Result, limits};
use crate::metrics::{Shed, Step, metrics};
use crate::store::StoreError;
use crate::store::messages::write::{self, NewMessage, Written};

/// Sends written together at most: written again one by one, each takes a subtransaction, and
/// Postgres tracks up to 64 per transaction cheaply.
const MAX_BATCH: usize = 64;
/// Sends waiting for the writer at most; beyond it sends are refused as overloaded. Two batches'
/// worth: one being written, the next gathering.
const QUEUE: usize = 2 * MAX_BATCH;
/// Called with each recipient of a committed batch, to wake its waiters in this process, and a way
/// to build what it was delivered (in seq order, as its stream would read it; empty when unknown),
/// called only for a recipient whose stream is here.
pub type Waker = Arc<dyn Fn(EndpointId, &mut dyn FnMut() -> Vec<Message>) + Send + Sync>;

struct Job {
    send: NewMessage,
    /// The sender's address, as its recipients see it.
    from: String,
    /// It carries files: its recipients' streams read it (with the files' names) rather than
    /// take it from here.
    attached: bool,
    done: oneshot::Sender<Result<Written>>,
    queued: Instant,
}

/// One writer a replica: every send queues for it, so sends arriving together share one batch, one
/// commit and, for one busy inbox, one row lock, instead of spreading over writers that each commit
/// a smaller batch.
///
/// The writer runs on a thread of its own, with a connection of its own whose socket that thread
/// also drives: each batch is one round trip, where on the server's shared runtime its answer would
/// wait behind the calls in flight before the next batch could start. One batch is in flight at a
/// time: each costs Postgres a fixed time, so overlapping them halves the batches and costs more.
/// Each choice was measured against its alternatives: docs/benchmarks.md, "What the figures decided".
pub(super) struct Batcher {
    writer: Arc<Writer>,
    /// What the writer takes batches from.
    queue: mpsc::Sender<Job>,
}

impl Batcher {
    /// Starts the writer on a thread of its own, writing batches through `connection` (a pool of
    /// one, whose connection is made on that thread); a send written alone uses `pool`. Inboxes
    /// hold at most `cap` unread messages; `wake` is called for each recipient of a committed
    /// batch. The writer ends, and its thread with it, when the last handle on the queue goes.
    pub(super) fn start(pool: Pool, connection: Pool, replica: Arc<AtomicI64>, cap: u32, wake: Waker) -> Result<Self> {
        let (queue, rx) = mpsc::channel(QUEUE);
        let writer = Arc::new(Writer {
            pool,
            connection,
            borrowing: AtomicBool::new(false),
            cap,
            replica,
            wake,
            turn: Arc::default(),
        });
        let run = writer.clone().run(rx);
        // The runtime is made on its thread, which says whether it could be.
        let (started, start) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("relay-send-writer".into())
            .spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => {
                    let _ = started.send(Ok(()));
                    runtime.block_on(run);
                }
                Err(e) => {
                    let _ = started.send(Err(e));
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start the send writer's thread: {e}")))?;
        match start.recv() {
            Ok(Ok(())) => Ok(Self { writer, queue }),
            Ok(Err(e)) => Err(Error::Internal(format!("cannot start the send writer's runtime: {e}"))),
            Err(_) => Err(Error::Internal("the send writer's thread ended as it started".into())),
        }
    }

    /// Writes one send of `from`, with whatever queued beside it, and waits until it is committed
    /// (or failed). A send that finds its writer idle and nothing queued is written by the calling
    /// task itself: handing it to the writer's task and its answer back costs two wake-ups, a
    /// fifth of a lone send's time on two cores.
    pub(super) async fn write(&self, send: NewMessage, from: String, attached: bool) -> Result<Written> {
        let (done, answer) = oneshot::channel();
        let (writer, queue) = (&self.writer, &self.queue);
        let job = Job { send, from, attached, done, queued: Instant::now() };
        let idle =
            if queue.capacity() == queue.max_capacity() { writer.turn.clone().try_lock_owned().ok() } else { None };
        match idle {
            Some(turn) => {
                let writer = writer.clone();
                Finished::new(async move {
                    let _turn = turn;
                    writer.finish(Via::Pool, vec![job]).await;
                })
                .await;
            }
            None => queue.try_send(job).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => {
                    metrics().shed(Shed::sends);
                    limits::overloaded()
                }
                mpsc::error::TrySendError::Closed(_) => Error::Unavailable("the server is stopping".into()),
            })?,
        }
        answer
            .await
            .map_err(|_| Error::Unavailable("the send was interrupted; retry it with the same client id".into()))?
    }
}

/// A write run by the calling task that is carried to its end even if the call is dropped (its
/// client went away, or its deadline passed): once the statement is sent it may commit, and then
/// its recipients' streams here must still be woken, as the writer's task would have.
struct Finished(Option<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Finished {
    fn new(work: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(Some(Box::pin(work)))
    }
}

impl Future for Finished {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(work) = self.0.as_mut() else { return Poll::Ready(()) };
        ready!(work.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(())
    }
}

impl Drop for Finished {
    fn drop(&mut self) {
        if let Some(work) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(work);
        }
    }
}

struct Writer {
    /// The replica's pool: a send written alone by its calling task takes a connection from it.
    pool: Pool,
    /// The writer's own connection, driven by the writer's thread.
    connection: Pool,
    /// Whether the writer last failed to have its own connection and took one of the pool's.
    borrowing: AtomicBool,
    /// The most unread messages one inbox holds.
    cap: u32,
    replica: Arc<AtomicI64>,
    wake: Waker,
    /// Held while a batch is written, by the writer's task or by a caller writing its send alone.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Writer {
    async fn run(self: Arc<Self>, mut rx: mpsc::Receiver<Job>) {
        loop {
            let mut jobs = Vec::with_capacity(MAX_BATCH);
            match rx.recv().await {
                Some(job) => jobs.push(job),
                None => return,
            }
            let _turn = self.turn.lock().await;
            // Whatever queued while the last batch was written goes in this one.
            while jobs.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            // A batch that panics ends alone: its senders are told to retry with their client ids,
            // and the writer goes on with the next, rather than every later send being refused.
            if AssertUnwindSafe(self.finish(Via::Own, jobs)).catch_unwind().await.is_err() {
                tracing::error!("writing a batch of sends panicked; senders not yet answered were told to retry");
            }
        }
    }

    /// Writes a batch on the connection `via` says, answers each of its sends and wakes their
    /// recipients here.
    async fn finish(&self, via: Via, jobs: Vec<Job>) {
        let m = metrics();
        match self.write(via, &jobs).await {
            Ok(answers) => {
                m.send_batch_size.observe(jobs.len() as f64);
                let mut delivered = Delivered::default();
                for (job, answer) in jobs.into_iter().zip(answers) {
                    let Job { send, from, attached, done, queued } = job;
                    if let Ok(Written::Stored { seqs, relations, sent_at, .. }) = &answer {
                        m.sends.inc();
                        m.deliveries(Step::delivered, send.recipients.len() as u64);
                        m.send_write_seconds.observe(queued.elapsed().as_secs_f64());
                        delivered.add(send, from, attached, seqs, relations, *sent_at);
                    }
                    let _ = done.send(answer);
                }
                delivered.wake(&self.wake);
            }
            Err(err) => {
                tracing::warn!(error = %err, sends = jobs.len(), "a batch of sends failed");
                for job in jobs {
                    let _ = job.done.send(Err(err.clone()));
                }
            }
        }
    }

    /// The writer's own connection; while the database refuses it one more connection, one of the
    /// pool's (the batch then waits on the shared runtime, as every call does).
    async fn own_connection(&self) -> Result<Object> {
        match self.connection.get().await {
            Ok(client) => {
                if self.borrowing.swap(false, Ordering::Relaxed) {
                    tracing::info!("the send writer has its own connection again");
                }
                Ok(client)
            }
            Err(e) => {
                if !self.borrowing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "the send writer cannot open a connection of its own; batches of sends take the pool's meanwhile \
                         (allow each replica RELAY_DB_POOL_SIZE + 3 connections)"
                    );
                }
                Ok(self.pool.get().await.map_err(StoreError::from)?)
            }
        }
    }

    async fn write(&self, via: Via, jobs: &[Job]) -> Result<Vec<Result<Written>>> {
        let client = match via {
            Via::Pool => self.pool.get().await.map_err(StoreError::from)?,
            Via::Own => self.own_connection().await?,
        };
        let cap = i32::try_from(self.cap).unwrap_or(i32::MAX);
        let replica = ReplicaId(self.replica.load(Ordering::Relaxed));
        if let [job] = jobs {
            return Ok(vec![Ok(write::write_one(&client, &job.send, cap, replica).await?)]);
        }
        let sends: Vec<&NewMessage> = jobs.iter().map(|j| &j.send).collect();
        Ok(write::write_set(&client, &sends, cap, replica).await?.into_iter().map(Ok).collect())
    }
}

/// Which connection a write takes.
#[derive(Debug, Clone, Copy)]
enum Via {
    /// One of the replica's pool: a send written alone by its calling task.
    Pool,
    /// The writer's own, on the writer's thread.
    Own,
}

/// What a committed batch delivered, per recipient, for its waiters in this process.
#[derive(Default)]
struct Delivered {
    /// The stored sends whose answer numbered every recipient, with sender, kind and time.
    sends: Vec<(NewMessage, String, Kind, DateTime<Utc>)>,
    /// Per recipient, its deliveries in batch order, which is seq order; `None` once a send to it
    /// did not say (its stream then reads instead).
    inboxes: HashMap<EndpointId, Option<Vec<Delivery>>>,
}

/// One delivery of a batch: its send (an index in [`Delivered::sends`]), the recipient's seq, and
/// how the recipient stands to the sender.
struct Delivery {
    send: usize,
    seq: Seq,
    relation: String,
}

impl Delivered {
    /// A stored send and what the writer answered of its recipients (in their order).
    fn add(
        &mut self,
        send: NewMessage,
        from: String,
        attached: bool,
        seqs: &[Seq],
        relations: &[String],
        sent_at: DateTime<Utc>,
    ) {
        let n = send.recipients.len();
        // A send's recipients are resolved as a set; the seqs are counted on that.
        let kind = Kind::from_db(send.kind)
            .ok()
            .filter(|_| !attached && seqs.len() == n && relations.len() == n && distinct(&send.recipients));
        for (i, recipient) in send.recipients.iter().enumerate() {
            let entry = self.inboxes.entry(*recipient).or_insert_with(|| Some(Vec::new()));
            match (entry.as_mut(), kind) {
                (Some(list), Some(_)) => {
                    list.push(Delivery { send: self.sends.len(), seq: seqs[i], relation: relations[i].clone() })
                }
                _ => *entry = None,
            }
        }
        if let Some(kind) = kind {
            self.sends.push((send, from, kind, sent_at));
        }
    }

    /// Wakes each recipient, with a way to build the messages its stream pushes.
    fn wake(self, wake: &Waker) {
        for (id, list) in &self.inboxes {
            let mut build = || {
                let pushed = list.iter().flatten().map(|d| {
                    let (send, from, kind, sent_at) = &self.sends[d.send];
                    as_pushed(send, from, d.seq, &d.relation, *kind, sent_at)
                });
                pushed.collect()
            };
            wake(*id, &mut build);
        }
    }
}

/// Whether no endpoint is named twice.
fn distinct(recipients: &[EndpointId]) -> bool {
    let mut sorted = recipients.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).all(|w| w[0] != w[1])
}

/// The message recipient `seq` was delivered, as its stream pushes it.
fn as_pushed(send: &NewMessage, from: &str, seq: Seq, relation: &str, kind: Kind, sent_at: &DateTime<Utc>) -> Message {
    Message {
        id: send.id.clone(),
        seq,
        from: from.to_owned(),
        thread: send.thread.clone(),
        kind,
        body: send.body.clone(),
        reply_to: send.reply_to.clone(),
        sent_at_ms: sent_at.timestamp_millis(),
        relation: relation.to_owned(),
        require_reply: send.require_reply,
        private: send.private,
        attachments: Vec::new(),
        post: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_dropped_midway_is_carried_to_its_end() {
        let (commit, committed) = oneshot::channel::<()>();
        let (woken, wake) = oneshot::channel();
        let mut write = Box::pin(Finished::new(async move {
            let _ = committed.await;
            let _ = woken.send("recipients woken");
        }));
        // Under way: the statement is out, its answer not yet in.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(write.as_mut().poll(&mut cx).is_pending());
        drop(write);
        commit.send(()).unwrap();
        assert_eq!(wake.await, Ok("recipients woken"), "the rest ran in a task of its own");
    }
}
