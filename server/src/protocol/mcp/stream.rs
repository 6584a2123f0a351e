//! The GET stream of a 2025 session: while a client holds it open, its agent's push stream is open
//! (the agent is online, as a bridge's is) and each new message comes as a notification — the
//! channel form for Claude Code, a log message for other clients — and the tool list is announced
//! again when the agent's role changes. Each message's event id is its seq in the agent's inbox,
//! so a client reconnecting with `Last-Event-ID` resumes after what it had, on any replica. The
//! same `GET` with the id of a call's answer event resumes that answer instead (see [`super::resume`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use relay_agent::frame;
use relay_agent::relay::push;
use relay_proto::v1::Message;
use rmcp::transport::streamable_http_server::session::SessionState;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::agents::{Agents, Remote, Seat, harness_of};
use super::resume::{Answers, EventId};
use crate::app::remote::RemoteService;
use crate::metrics::metrics;

/// How often an idle stream says it is alive, so proxies keep it open and a gone client is found.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Clone)]
pub struct Streams {
    pub agents: Arc<Agents>,
    pub remote: RemoteService,
    /// Answer streams whose client left, to resume.
    pub answers: Arc<Answers>,
    /// Ends every stream when the server stops.
    pub shutdown: CancellationToken,
    /// The sessions whose stream is open on this replica, one each: a client reconnecting (its
    /// old connection perhaps dead and not yet noticed) ends the stream it had.
    pub open: Arc<Mutex<HashMap<String, (u64, CancellationToken)>>>,
}

/// Numbers the streams, so one ending lets go of its session only if no newer one took it.
static NEXT_STREAM: AtomicU64 = AtomicU64::new(0);

/// A session's stream open on this replica; let go when dropped.
struct Open {
    open: Arc<Mutex<HashMap<String, (u64, CancellationToken)>>>,
    session: String,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut open = self.open.lock().expect("streams lock poisoned");
        if open.get(&self.session).is_some_and(|(id, _)| *id == self.id) {
            open.remove(&self.session);
        }
        metrics().mcp_streams.dec();
    }
}

/// `GET /mcp`: the session's stream of notifications.
pub async fn open(State(streams): State<Streams>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let Some(remote) = parts.extensions.get::<Remote>().cloned() else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let last_event = header("last-event-id");
    // A call's answer stream, resumed after its connection broke (any revision).
    if let Some(id) = last_event.as_deref().and_then(EventId::parse) {
        return streams.answers.resume(remote.machine.machine_id, id).await;
    }
    let after_seq = match last_event.as_deref().map(|id| id.trim().parse::<u64>()) {
        None => 0,
        Some(Ok(seq)) => seq,
        Some(Err(_)) => {
            return (StatusCode::BAD_REQUEST, "Last-Event-ID names no event this endpoint sent").into_response();
        }
    };
    // The stateless revision has no stream to open: its requests stream their own answers.
    let Some(session) = header("mcp-session-id") else {
        return (StatusCode::METHOD_NOT_ALLOWED, "a stream of notifications belongs to a session: initialize first")
            .into_response();
    };
    let initialized = match streams.remote.session(&session).await {
        Ok(Some(state)) => state,
        Ok(None) => return (StatusCode::NOT_FOUND, "session not found: initialize again").into_response(),
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    let Some(params) = serde_json::from_str::<SessionState>(&initialized).ok().map(|s| s.initialize_params) else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "the session's state cannot be read").into_response();
    };
    let stop = streams.shutdown.child_token();
    let id = NEXT_STREAM.fetch_add(1, Ordering::Relaxed);
    let taken = streams.open.lock().expect("streams lock poisoned").insert(session.clone(), (id, stop.clone()));
    if let Some((_, older)) = taken {
        older.cancel();
    }
    metrics().mcp_streams.inc();
    let held = Open { open: streams.open.clone(), session: session.clone(), id };
    let client = params.client_info.name.clone();
    let tools = streams.agents.tools(&remote, &Seat { harness: harness_of(&client), mcp_session: Some(&session) });
    let capabilities = serde_json::to_value(&params.capabilities).ok();
    let channel = frame::takes_channel(Some(&client), capabilities.as_ref());

    let (events, rx) = mpsc::channel::<Event>(64);
    let (pushes, mut pushed) = mpsc::channel::<Message>(64);
    let relay = tools.relay().clone();
    let observer = tools.clone();
    let role = move |operator| observer.observe_role(operator);
    tokio::spawn(push::run(relay, pushes, tools.stream_progress(), role, after_seq, stop.clone()));
    let guard = stop.clone().drop_guard();
    let stop_here = stop.clone();
    tokio::spawn(async move {
        // Ends when the client goes (the event channel closes), taking the push stream with it.
        let _guard = guard;
        let _held = held;
        let mut role = tools.listing_changes();
        role.mark_unchanged();
        loop {
            let event = tokio::select! {
                message = pushed.recv() => match message {
                    Some(message) => {
                        tools.note_unread(&message).await;
                        notification(&message, channel)
                    }
                    None => return,
                },
                changed = role.changed() => match changed {
                    Ok(()) => Event::default().data(list_changed().to_string()),
                    Err(_) => return,
                },
                () = events.closed() => return,
                // A newer stream of the session took over, or the server stops.
                () = stop_here.cancelled() => return,
            };
            if events.send(event).await.is_err() {
                return;
            }
        }
    });
    let stream = ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)).into_response()
}

/// A message as a notification, its seq as the event id.
fn notification(message: &Message, channel: bool) -> Event {
    let body = if channel {
        json!({ "jsonrpc": "2.0", "method": frame::CHANNEL_METHOD, "params": frame::channel_params(message) })
    } else {
        json!({
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": { "level": "notice", "logger": "relay", "data": frame::channel_params(message) },
        })
    };
    Event::default().id(message.seq.to_string()).data(body.to_string())
}

fn list_changed() -> Value {
    json!({ "jsonrpc": "2.0", "method": "notifications/tools/list_changed" })
}
