//! The push stream: kept open for as long as the bridge runs (it is also the endpoint's presence),
//! reopened after any failure (at once on the next replica when its replica went away, else with
//! backoff), and resumed above the last seq received so nothing is handed on twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use relay_proto::v1::{Message, SubscribeRequest, push};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::reopen::{self, Attempt, Kept, within_silence};
use super::session::{Relay, authed};

/// How far the stream has brought this bridge. While the stream is open and has handed on
/// everything the server had for it, the messages it handed on are all there is unread; otherwise
/// (not yet open, reopening after a failure, still catching up) only the server can say.
#[derive(Debug, Default)]
pub struct Progress {
    caught_up: AtomicBool,
    /// The newest seq handed on.
    received: AtomicU64,
}

impl Progress {
    /// Whether everything unread was handed on: the stream is open and caught up, and whoever
    /// takes the messages has taken up to `taken`.
    pub fn complete(&self, taken: u64) -> bool {
        self.caught_up.load(Ordering::Acquire) && self.received.load(Ordering::Acquire) <= taken
    }

    fn set_caught_up(&self, caught_up: bool) {
        self.caught_up.store(caught_up, Ordering::Release);
    }
}

/// Feeds every new message into `sink`, in seq order and each seq once, until `stop`; tells `role`
/// whether the endpoint is its account's operator whenever the server says (at every heartbeat,
/// and at once when it changes). With `after_seq`, a reader that had messages up to it resumes
/// above it.
pub async fn run(
    relay: Arc<Relay>,
    sink: mpsc::Sender<Message>,
    progress: Arc<Progress>,
    role: impl Fn(bool) + Send + Sync,
    after_seq: u64,
    stop: CancellationToken,
) {
    let mut stream =
        PushStream { relay: relay.clone(), sink, progress: progress.clone(), role, last_seq: after_seq, address: None };
    tokio::select! {
        () = reopen::keep(relay.replicas(), "push stream", &mut stream) => {}
        () = stop.cancelled() => {}
    }
    progress.set_caught_up(false);
}

/// The push stream and how far it brought the bridge.
struct PushStream<R> {
    relay: Arc<Relay>,
    sink: mpsc::Sender<Message>,
    progress: Arc<Progress>,
    role: R,
    /// The newest seq handed on, which a reopened stream resumes above.
    last_seq: u64,
    /// The endpoint the stream is of: another one has its own seqs.
    address: Option<String>,
}

impl<R: Fn(bool) + Send + Sync> Kept for PushStream<R> {
    /// Whoever took the messages is gone.
    type Done = ();

    async fn open(&mut self) -> Attempt<()> {
        self.progress.set_caught_up(false);
        let mut replica = self.relay.client().0;
        let mut progressed = false;
        let outcome = self.follow(&mut replica, &mut progressed).await;
        self.progress.set_caught_up(false);
        match outcome {
            Ok(()) => Attempt::Done(()),
            Err(reason) => Attempt::Failed { on: replica, reason, progressed },
        }
    }
}

impl<R: Fn(bool)> PushStream<R> {
    /// Opens the stream on the replica in use (named in `replica`) and hands on what it brings
    /// (`progressed` once it brought anything) until it fails, or until nobody takes the messages.
    async fn follow(&mut self, replica: &mut usize, progressed: &mut bool) -> Result<(), String> {
        let relay = &self.relay;
        // Resumed on the replica in use, should the bridge have moved.
        let session = relay.session().await.map_err(|e| e.to_string())?;
        let (at, mut client) = relay.client();
        *replica = at;
        if self.address.as_ref() != Some(&session.endpoint.address) {
            // A different endpoint (not the first one) has its own sequence.
            if self.address.replace(session.endpoint.address.clone()).is_some() {
                self.last_seq = 0;
                self.progress.received.store(0, Ordering::Release);
            }
        }
        let request = authed(SubscribeRequest { after_seq: self.last_seq }, &session.token);
        let mut stream = match client.subscribe(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                if status.code() == tonic::Code::Unauthenticated {
                    relay.renew(&session).await.map_err(|e| e.to_string())?;
                }
                relay.replicas().failed(*replica, &status);
                return Err(status.message().to_owned());
            }
        };
        // The server opens with a heartbeat naming the inbox head, then sends what is unread above
        // `after_seq` and a heartbeat once that backlog is through, then heartbeats between
        // deliveries: caught up at once when nothing lies above what this bridge has, else from the
        // next heartbeat.
        let mut opened = false;
        loop {
            let push = match within_silence(stream.message()).await {
                Err(status) => {
                    if status.code() == tonic::Code::Unauthenticated {
                        relay.renew(&session).await.map_err(|e| e.to_string())?;
                    }
                    relay.replicas().failed(*replica, &status);
                    return Err(status.message().to_owned());
                }
                Ok(None) => return Err("push stream closed by the server".to_owned()),
                Ok(Some(push)) => push,
            };
            *progressed = true;
            match push.event {
                // A topic's post: numbered in its topic, not in the inbox.
                Some(push::Event::Message(message)) if !message.topic.is_empty() => {
                    // Nobody takes the messages any more: the stream is done.
                    let Ok(()) = self.sink.send(message).await else { return Ok(()) };
                }
                Some(push::Event::Message(message)) if message.seq > self.last_seq => {
                    self.last_seq = message.seq;
                    self.progress.received.fetch_max(message.seq, Ordering::AcqRel);
                    if self.sink.send(message).await.is_err() {
                        return Ok(());
                    }
                }
                Some(push::Event::Heartbeat(beat)) => {
                    if opened || beat.head_seq <= self.last_seq {
                        self.progress.set_caught_up(true);
                    }
                    opened = true;
                    if let Some(operator) = beat.operator {
                        (self.role)(operator);
                    }
                }
                _ => {}
            }
        }
    }
}
