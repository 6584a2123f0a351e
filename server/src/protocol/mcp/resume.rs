//! Resuming a call's answer stream. A request answered as an event stream (any request of a 2025
//! session; a stateless call that reports progress) gets event ids of this endpoint's own,
//! `<replica>/<stream>/<seq>`, and a first event that says so (SEP-1699's priming event). Once the
//! stream ends, what it sent is kept in the database for [`ANSWER_TTL`](crate::app::remote::ANSWER_TTL): written in batches, off
//! the answer's path. A client whose connection broke reconnects with `GET` and `Last-Event-ID`, to
//! any replica, and gets every event after the last one it had — the answer among them, also one
//! lost on its way after the server sent it. When the server sees the client leave before the
//! answer is whole, a call still waiting stops before it takes what it waited for, and the rest of
//! the stream is read to its end. Only the machine that asked reads an answer back.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use rand::Rng;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::agents::Remote;
use crate::app::remote::{KeptAnswer, RemoteService};
use crate::domain::ids::{MachineId, ReplicaId};

/// How long the rest of a stream whose client left is read before what came is kept.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// How long a resume at another replica looks for a stream the replica that served it is still
/// reading to its end.
const LOOK_LIMIT: Duration = Duration::from_secs(20);
/// How often it looks: here a look reads memory first; elsewhere each look is two reads of the
/// database, so a client holding many resumes open costs it little.
const LOOK_EVERY_HERE: Duration = Duration::from_millis(250);
const LOOK_EVERY_ELSEWHERE: Duration = Duration::from_secs(1);
/// What the first event tells a client to wait before reconnecting.
const RETRY_MS: u64 = 3000;
/// Answers waiting to be written; past it, an answer is not kept (and a warning says so).
const QUEUE: usize = 4096;
/// Answers written in one statement at most.
const BATCH: usize = 256;

/// The id of one event of an answer stream: the replica that served it, the stream (16 random
/// bytes), and the event's place in it (0 for the first, which carries no message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventId {
    pub replica: ReplicaId,
    pub stream: [u8; 16],
    pub seq: i32,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.replica)?;
        for byte in self.stream {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "/{}", self.seq)
    }
}

impl EventId {
    /// Reads an id this endpoint gave; `None` for anything else (a session stream's ids are the
    /// inbox's seqs, plain numbers).
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('/');
        let (replica, stream, seq) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || stream.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(stream.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        let seq = seq.parse::<i32>().ok().filter(|s| *s >= 0)?;
        Some(Self { replica: ReplicaId(replica.parse().ok()?), stream: bytes, seq })
    }
}

/// Set on a POST for its handler: cancelled when the client leaves before its answer is whole.
#[derive(Clone)]
pub struct Departure(pub CancellationToken);

/// The answer streams of this replica: those being read to their end after their client left,
/// and those ended and not yet written.
pub struct Answers {
    remote: RemoteService,
    /// Streaming to their client.
    live: Mutex<HashSet<[u8; 16]>>,
    draining: Mutex<HashMap<[u8; 16], watch::Receiver<bool>>>,
    unwritten: Mutex<HashMap<[u8; 16], Arc<KeptAnswer>>>,
    queue: mpsc::Sender<[u8; 16]>,
}

impl Answers {
    /// The answers of this replica, and the task that writes them.
    pub fn start(remote: RemoteService) -> Arc<Self> {
        let (queue, queued) = mpsc::channel(QUEUE);
        let answers = Arc::new(Self {
            remote,
            live: Mutex::default(),
            draining: Mutex::default(),
            unwritten: Mutex::default(),
            queue,
        });
        tokio::spawn(write(Arc::downgrade(&answers), queued));
        answers
    }

    /// Answers `GET` with `Last-Event-ID: id` for `machine`: the events after it, then the end.
    pub async fn resume(&self, machine: MachineId, id: EventId) -> Response {
        let kept = match self.kept(machine, id).await {
            Ok(kept) => kept,
            Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        };
        let after: Vec<_> = kept.into_iter().filter(|(seq, data)| *seq > id.seq && !data.is_empty()).collect();
        if after.is_empty() {
            let said = "no answer to resume after this event: none is kept for this machine (it expired, or \
                        this is not its machine), or nothing followed the event; call the tool again";
            let body = json!({ "error": said }).to_string();
            return (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        }
        let mut text = String::new();
        for (seq, data) in after {
            event(&mut text, EventId { seq, ..id }, &data);
        }
        event_stream(Body::from(text))
    }

    /// What is kept of `id`'s stream for `machine`. A stream not kept yet — still streaming to a
    /// connection not yet seen closed, or read to its end after its client left — is looked for
    /// again, for [`LOOK_LIMIT`], while it may still come: here while it streams, elsewhere while
    /// the replica that serves it lives.
    async fn kept(&self, machine: MachineId, id: EventId) -> crate::domain::Result<Vec<(i32, String)>> {
        let until = tokio::time::Instant::now() + LOOK_LIMIT;
        let here = id.replica == self.remote.replica();
        let every = if here { LOOK_EVERY_HERE } else { LOOK_EVERY_ELSEWHERE };
        loop {
            let draining = self.draining.lock().expect("answers lock poisoned").get(&id.stream).cloned();
            if let Some(mut done) = draining {
                let _ = tokio::time::timeout_at(until, done.wait_for(|done| *done)).await;
            }
            // Asked before looking: a stream is kept (here, then in the database) before it stops
            // streaming or draining, so one that may still come when asked is found by the next look.
            let may_come = if here {
                self.live.lock().expect("answers lock poisoned").contains(&id.stream)
                    || self.draining.lock().expect("answers lock poisoned").contains_key(&id.stream)
            } else {
                self.remote.replica_alive(id.replica).await?
            };
            let unwritten = self.unwritten.lock().expect("answers lock poisoned").get(&id.stream).cloned();
            if let Some(answer) = unwritten {
                return Ok(if answer.machine == machine { answer.events.clone() } else { Vec::new() });
            }
            let kept = self.remote.answer(&id.stream, machine).await?;
            if !kept.is_empty() || !may_come || tokio::time::Instant::now() >= until {
                return Ok(kept);
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Queues what a stream sent to be written; a stream that sent no message has nothing to keep.
    fn keep(&self, events: Events, machine: MachineId) {
        if events.sent.len() < 2 {
            return;
        }
        let stream = events.id.stream;
        self.unwritten
            .lock()
            .expect("answers lock poisoned")
            .insert(stream, Arc::new(KeptAnswer { stream, machine, events: events.sent }));
        if self.queue.try_send(stream).is_err() {
            self.unwritten.lock().expect("answers lock poisoned").remove(&stream);
            tracing::warn!("too many answers wait to be written: one is not kept for its client to resume");
        }
    }

    /// Reads the rest of a stream whose client left, then keeps all it sent.
    async fn drain(
        self: Arc<Self>,
        mut inner: Body,
        mut events: Events,
        machine: MachineId,
        done: watch::Sender<bool>,
    ) {
        let read = async {
            while let Some(Ok(frame)) = inner.frame().await {
                if let Ok(data) = frame.into_data() {
                    events.relabel(&data);
                }
            }
        };
        if tokio::time::timeout(DRAIN_LIMIT, read).await.is_err() {
            tracing::warn!("an answer stream whose client left did not end in time; what it sent is kept");
        }
        let stream = events.id.stream;
        self.keep(events, machine);
        self.draining.lock().expect("answers lock poisoned").remove(&stream);
        let _ = done.send(true);
    }
}

/// Writes queued answers, up to [`BATCH`] a statement, until the endpoint is gone.
async fn write(answers: std::sync::Weak<Answers>, mut queued: mpsc::Receiver<[u8; 16]>) {
    let mut streams = Vec::with_capacity(BATCH);
    while queued.recv_many(&mut streams, BATCH).await > 0 {
        let Some(answers) = answers.upgrade() else { return };
        let batch: Vec<Arc<KeptAnswer>> = {
            let unwritten = answers.unwritten.lock().expect("answers lock poisoned");
            streams.iter().filter_map(|s| unwritten.get(s).cloned()).collect()
        };
        if let Err(e) = answers.remote.keep_answers(&batch).await {
            tracing::warn!(error = %e, answers = batch.len(), "cannot keep answers for their clients to resume");
        }
        let mut unwritten = answers.unwritten.lock().expect("answers lock poisoned");
        for stream in streams.drain(..) {
            unwritten.remove(&stream);
        }
    }
}

/// Wraps each POST: its handler learns when the client leaves, and an answer that streams gets
/// resumable events.
pub async fn resumable(State(answers): State<Arc<Answers>>, mut request: Request, next: Next) -> Response {
    let machine = request.extensions().get::<Remote>().map(|r| r.machine.machine_id);
    let (Method::POST, Some(machine)) = (request.method().clone(), machine) else {
        return next.run(request).await;
    };
    let departure = CancellationToken::new();
    request.extensions_mut().insert(Departure(departure.clone()));
    // A client gone before the answer begins (a JSON answer still being made) leaves too.
    let before = departure.clone().drop_guard();
    let response = next.run(request).await;
    before.disarm();
    let streams =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streams {
        return response;
    }
    let (parts, body) = response.into_parts();
    let id = EventId { replica: answers.remote.replica(), stream: rand::rng().random(), seq: 0 };
    answers.live.lock().expect("answers lock poisoned").insert(id.stream);
    let answer =
        Answer { inner: Some(body), events: Events::new(id), answers, machine, departure, primed: false, ended: false };
    Response::from_parts(parts, Body::new(answer))
}

/// The events of one answer stream, given this endpoint's ids as they pass, and kept.
struct Events {
    id: EventId,
    /// Bytes of an event not yet ended.
    partial: Vec<u8>,
    /// Every event sent, by seq; the first (0) carries nothing.
    sent: Vec<(i32, String)>,
}

impl Events {
    fn new(id: EventId) -> Self {
        Self { id, partial: Vec::new(), sent: vec![(0, String::new())] }
    }

    /// The first event: its id, and when to reconnect.
    fn priming(&self) -> Bytes {
        Bytes::from(format!("id: {}\nretry: {RETRY_MS}\ndata:\n\n", self.id))
    }

    /// Takes what the SDK's stream sent; gives back its whole events under this endpoint's ids,
    /// comments (keep-alives) as they are, and drops the SDK's own first event.
    fn relabel(&mut self, chunk: &[u8]) -> Bytes {
        self.partial.extend_from_slice(chunk);
        let mut out = String::new();
        while let Some(end) = self.partial.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = self.partial.drain(..end + 2).collect();
            let block = String::from_utf8_lossy(&block);
            let lines: Vec<&str> = block.lines().filter(|l| !l.is_empty()).collect();
            if lines.iter().all(|l| l.starts_with(':')) {
                out.push_str(&block);
                continue;
            }
            let data: Vec<&str> = lines
                .iter()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            let data = data.join("\n");
            if data.is_empty() {
                continue;
            }
            let seq = self.sent.len() as i32;
            event(&mut out, EventId { seq, ..self.id }, &data);
            self.sent.push((seq, data));
        }
        Bytes::from(out)
    }
}

fn event(out: &mut String, id: EventId, data: &str) {
    out.push_str(&format!("id: {id}\n"));
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
}

fn event_stream(body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A streamed answer on its way to the client.
struct Answer {
    inner: Option<Body>,
    events: Events,
    answers: Arc<Answers>,
    machine: MachineId,
    departure: CancellationToken,
    primed: bool,
    /// The SDK's stream ended and all of it went out.
    ended: bool,
}

impl HttpBody for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if !this.primed {
            this.primed = true;
            return Poll::Ready(Some(Ok(Frame::data(this.events.priming()))));
        }
        let Some(inner) = this.inner.as_mut() else { return Poll::Ready(None) };
        loop {
            match ready!(Pin::new(&mut *inner).poll_frame(cx)) {
                None => {
                    this.ended = true;
                    let id = this.events.id;
                    let events = std::mem::replace(&mut this.events, Events::new(id));
                    this.answers.keep(events, this.machine);
                    this.answers.live.lock().expect("answers lock poisoned").remove(&id.stream);
                    return Poll::Ready(None);
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.events.relabel(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for Answer {
    /// The client left before the answer was whole: a call that waits stops, and the stream is
    /// read to its end and kept.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.departure.cancel();
        let id = self.events.id;
        if let (Some(inner), Ok(runtime)) = (self.inner.take(), tokio::runtime::Handle::try_current()) {
            let events = std::mem::replace(&mut self.events, Events::new(id));
            let (done, watching) = watch::channel(false);
            self.answers.draining.lock().expect("answers lock poisoned").insert(id.stream, watching);
            runtime.spawn(self.answers.clone().drain(inner, events, self.machine, done));
        }
        self.answers.live.lock().expect("answers lock poisoned").remove(&id.stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> EventId {
        EventId { replica: ReplicaId(7), stream: [0xab; 16], seq: 3 }
    }

    #[test]
    fn an_event_id_reads_back_as_written_and_nothing_else_reads() {
        let text = id().to_string();
        assert_eq!(text, format!("7/{}/3", "ab".repeat(16)));
        assert_eq!(EventId::parse(&text), Some(id()));
        for other in
            ["42", "0/3", "", "7/abab/3", &format!("7/{}/-1", "ab".repeat(16)), &format!("7/{}/3/1", "ab".repeat(16))]
        {
            assert_eq!(EventId::parse(other), None, "{other}");
        }
        assert_eq!(EventId::parse(&format!("x/{}/3", "ab".repeat(16))), None);
        assert_eq!(EventId::parse(&format!("7/{}/3", "zz".repeat(16))), None);
    }

    #[test]
    fn events_get_this_endpoints_ids_and_keep_alives_and_split_events_pass_whole() {
        let mut events = Events::new(EventId { seq: 0, ..id() });
        // The SDK's own first event is dropped: the endpoint sent its own.
        assert!(events.relabel(b"data: \nid: 0/1\nretry: 3000\n\n").is_empty());
        assert_eq!(&events.relabel(b":\n\n")[..], b":\n\n");
        assert!(events.relabel(b"data: {\"a\":").is_empty(), "half an event waits for its end");
        let out = events.relabel(b"1}\nid: 1/1\n\ndata: {\"b\":2}\n\n");
        let stream = "ab".repeat(16);
        assert_eq!(
            String::from_utf8_lossy(&out),
            format!("id: 7/{stream}/1\ndata: {{\"a\":1}}\n\nid: 7/{stream}/2\ndata: {{\"b\":2}}\n\n")
        );
        assert_eq!(events.sent, vec![(0, String::new()), (1, "{\"a\":1}".into()), (2, "{\"b\":2}".into())]);
        assert!(events.priming().starts_with(format!("id: 7/{stream}/0\nretry: 3000\n").as_bytes()));
    }
}
