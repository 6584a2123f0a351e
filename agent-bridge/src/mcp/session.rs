//! One MCP session over stdio: reads requests, runs tools concurrently, writes answers and pushes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_proto::v1::Message;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Version;
use super::jsonrpc::{self, Incoming, Line, LineReader};
use relay_agent::frame;
use relay_agent::relay::push;
use relay_agent::tools::{Tools, catalog};

pub struct Options {
    /// `--channels`: offer `notifications/claude/channel` pushes to a client that takes them.
    pub channels: bool,
    pub version: &'static str,
}

/// Where a request of the stateless revision names its version, its client, and whether it takes
/// channel pushes.
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CLIENT_NAME: &str = "/io.modelcontextprotocol~1clientInfo/name";
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// How long requests still running at end of input may take before the session ends anyway, and
/// how long saying goodbye to the relay may take: a client closing the session (or a signal) ends
/// the bridge within two seconds, whatever the relay does.
const DRAIN_LIMIT: Duration = Duration::from_millis(1000);
const GOODBYE_LIMIT: Duration = Duration::from_millis(800);

/// Most requests running at once (tool calls, listings, batches); more are refused until some
/// finish, so a flood of requests cannot grow the bridge without bound.
pub const MAX_IN_FLIGHT: usize = 64;

#[derive(Default)]
struct State {
    /// The negotiated protocol version, once initialized.
    version: Option<Version>,
    /// The client takes channel notifications and we offered them.
    channel_client: bool,
}

struct Running {
    task: tokio::task::AbortHandle,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

struct Session {
    tools: Arc<Tools>,
    options: Options,
    out: mpsc::Sender<Value>,
    state: Mutex<State>,
    /// One permit per request in flight, [`MAX_IN_FLIGHT`] in all.
    slots: Arc<tokio::sync::Semaphore>,
    /// Running tool calls by request id, so `notifications/cancelled` can stop them. Each holds its
    /// place among the calls in flight, given back the moment the entry goes: a cancelled call's
    /// task is only dropped later, and the client may already be sending the next call.
    running: Mutex<HashMap<String, Running>>,
    /// Set once the client is initialized: pushes wait for it, so none reaches a client too early
    /// and none that arrived before is lost.
    ready: tokio::sync::watch::Sender<bool>,
    stop: CancellationToken,
}

/// Why a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The client closed stdin.
    Input,
    /// `stop` resolved (a termination signal): calls in flight were not waited for.
    Stopped,
}

/// Serves MCP until end of input or until `stop` resolves, then ends the relay session (which also
/// removes the session file).
pub async fn run(
    tools: Arc<Tools>,
    options: Options,
    input: impl AsyncBufRead + Unpin,
    output: impl AsyncWrite + Unpin + Send + 'static,
    stop: impl Future<Output = ()>,
) -> std::io::Result<Ended> {
    let (out, rx) = mpsc::channel::<Value>(256);
    let writer = tokio::spawn(write_lines(rx, output));
    let session = Arc::new(Session {
        tools,
        options,
        out,
        state: Mutex::new(State::default()),
        slots: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        running: Mutex::new(HashMap::new()),
        ready: tokio::sync::watch::channel(false).0,
        stop: CancellationToken::new(),
    });

    // Claim the endpoint and open the push stream (it is the endpoint's presence) right away;
    // failures surface on the first tool call instead.
    let (pushes, pushed) = mpsc::channel::<Message>(64);
    let progress = session.tools.stream_progress();
    let tools = session.tools.clone();
    let role = move |operator| tools.observe_role(operator);
    tokio::spawn(push::run(session.tools.relay().clone(), pushes, progress, role, 0, session.stop.clone()));
    let forwarder = tokio::spawn(forward_pushes(session.clone(), pushed));
    let relister = tokio::spawn(announce_role_changes(session.clone()));

    let mut tasks = JoinSet::new();
    let mut reader = LineReader::new(input);
    let mut stop = std::pin::pin!(stop);
    let read_result = loop {
        let next = tokio::select! {
            next = reader.next() => next,
            () = &mut stop => break Ok(Ended::Stopped),
        };
        match next {
            Ok(None) => break Ok(Ended::Input),
            Err(e) => break Err(e),
            Ok(Some(Line::TooLong)) => {
                session
                    .send(jsonrpc::error(
                        &Value::Null,
                        jsonrpc::INVALID_REQUEST,
                        "message too large: the limit is 4 MiB per line",
                    ))
                    .await;
            }
            Ok(Some(Line::Text(text))) if text.trim().is_empty() => {}
            Ok(Some(Line::Text(text))) => match serde_json::from_str::<Value>(&text) {
                Err(e) => {
                    session.send(jsonrpc::error(&Value::Null, jsonrpc::PARSE_ERROR, format!("parse error: {e}"))).await
                }
                // A batch takes one place and runs its entries in turn; with no place free its
                // requests are refused at once (its notifications, a cancellation among them, still count).
                Ok(Value::Array(batch)) => match session.slot() {
                    Some(slot) => {
                        let session = session.clone();
                        tasks.spawn(async move { session.batch(batch, Some(slot)).await });
                    }
                    None => session.clone().batch(batch, None).await,
                },
                Ok(value) => session.clone().dispatch(value, &mut tasks).await,
            },
        }
        // Reap finished calls as we go so the set stays small.
        while tasks.try_join_next().is_some() {}
    };

    // End of input: give calls in flight a moment, then stop everything and leave the relay. When
    // stopped by a signal the client is going away and nothing waits for answers.
    if matches!(read_result, Ok(Ended::Input)) {
        let _ = tokio::time::timeout(DRAIN_LIMIT, async { while tasks.join_next().await.is_some() {} }).await;
    }
    tasks.abort_all();
    session.stop.cancel();
    forwarder.abort();
    relister.abort();
    session.tools.relay().goodbye(GOODBYE_LIMIT).await;
    drop(session);
    let _ = writer.await;
    read_result
}

async fn write_lines(mut rx: mpsc::Receiver<Value>, mut output: impl AsyncWrite + Unpin) {
    while let Some(value) = rx.recv().await {
        let mut line = value.to_string();
        line.push('\n');
        if output.write_all(line.as_bytes()).await.is_err() || output.flush().await.is_err() {
            return;
        }
    }
}

fn too_many() -> String {
    format!("too many requests in flight (at most {MAX_IN_FLIGHT}): wait for answers before sending more")
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

impl Session {
    /// A place among the requests in flight (a tool call, a listing, a batch); `None` when all are taken.
    fn slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    async fn send(&self, message: Value) {
        let _ = self.out.send(message).await;
    }

    /// Handles one message; tool calls run as tasks so a long wait never blocks the session.
    async fn dispatch(self: Arc<Self>, value: Value, tasks: &mut JoinSet<()>) {
        match jsonrpc::classify(value) {
            Incoming::Request { id, method, params } if method == "tools/call" => {
                if let Err(refusal) = self.check_call(&id, &params) {
                    return self.send(refusal).await;
                }
                self.start_push_if_ready();
                let key = id_key(&id);
                let refused = {
                    // Held while the task is spawned and recorded, so its own removal comes after the record.
                    let mut running = self.running.lock().expect("running lock");
                    if running.contains_key(&key) {
                        Some((id, "a request with this id is still running".to_owned()))
                    } else if let Some(slot) = self.slot() {
                        let session = self.clone();
                        let task = tasks.spawn(async move {
                            let answer = session.tool_call(&id, &params).await;
                            session.running.lock().expect("running lock").remove(&id_key(&id));
                            session.send(answer).await;
                        });
                        running.insert(key, Running { task, _slot: slot });
                        None
                    } else {
                        Some((id, too_many()))
                    }
                };
                if let Some((id, why)) = refused {
                    self.send(jsonrpc::error(&id, jsonrpc::INVALID_REQUEST, why)).await;
                }
            }
            // Listing asks the server for the endpoint's role: off the reading loop, in a place
            // among the requests in flight, like a tool call.
            Incoming::Request { id, method, params } if method == "tools/list" => {
                let Some(slot) = self.slot() else {
                    return self.send(jsonrpc::error(&id, jsonrpc::INVALID_REQUEST, too_many())).await;
                };
                let session = self.clone();
                tasks.spawn(async move {
                    let answer = session.request(&id, &method, &params).await;
                    drop(slot);
                    session.send(answer).await;
                });
            }
            Incoming::Request { id, method, params } => {
                let answer = self.request(&id, &method, &params).await;
                self.send(answer).await;
            }
            Incoming::Notification { method, params } => self.notification(&method, &params),
            Incoming::Response => {}
            Incoming::Invalid { id, message } => {
                self.send(jsonrpc::error(&id, jsonrpc::INVALID_REQUEST, message)).await
            }
        }
    }

    /// A batch, where the negotiated version has them: every request in it answered in one array.
    /// Its entries run one after another in the batch's place; without one, each request in it
    /// is refused.
    async fn batch(self: Arc<Self>, batch: Vec<Value>, slot: Option<tokio::sync::OwnedSemaphorePermit>) {
        let version = self.state.lock().expect("state lock").version;
        if !version.is_some_and(Version::has_batches) {
            let why = match version {
                Some(v) => format!("batches are not part of protocol version {}", v.as_str()),
                None => "batches are not accepted before initialize".to_owned(),
            };
            return self.send(jsonrpc::error(&Value::Null, jsonrpc::INVALID_REQUEST, why)).await;
        }
        if batch.is_empty() {
            return self.send(jsonrpc::error(&Value::Null, jsonrpc::INVALID_REQUEST, "an empty batch")).await;
        }
        let mut answers = Vec::new();
        for value in batch {
            match jsonrpc::classify(value) {
                Incoming::Request { id, method, params } if method == "initialize" => {
                    answers.push(jsonrpc::error(&id, jsonrpc::INVALID_REQUEST, "initialize cannot be part of a batch"));
                    let _ = params;
                }
                Incoming::Request { id, .. } if slot.is_none() => {
                    answers.push(jsonrpc::error(&id, jsonrpc::INVALID_REQUEST, too_many()))
                }
                Incoming::Request { id, method, params } if method == "tools/call" => {
                    answers.push(match self.check_call(&id, &params) {
                        Err(refusal) => refusal,
                        Ok(()) => self.tool_call(&id, &params).await,
                    });
                }
                Incoming::Request { id, method, params } => answers.push(self.request(&id, &method, &params).await),
                Incoming::Notification { method, params } => self.notification(&method, &params),
                Incoming::Response => {}
                Incoming::Invalid { id, message } => {
                    answers.push(jsonrpc::error(&id, jsonrpc::INVALID_REQUEST, message))
                }
            }
        }
        // The place is free before the answer is out: a client that reads it may send the next at once.
        drop(slot);
        if !answers.is_empty() {
            self.send(Value::Array(answers)).await;
        }
    }

    async fn request(&self, id: &Value, method: &str, params: &Value) -> Value {
        match method {
            "initialize" => self.initialize(id, params),
            "ping" => jsonrpc::result(id, json!({})),
            "server/discover" => jsonrpc::result(
                id,
                json!({
                    "resultType": "complete",
                    "supportedVersions": std::iter::once(Version::STATELESS).chain(Version::ALL).map(Version::as_str).collect::<Vec<_>>(),
                    "capabilities": self.capabilities(),
                    "serverInfo": self.server_info(),
                    "instructions": relay_agent::tools::INSTRUCTIONS,
                }),
            ),
            "tools/list" => {
                let version = match self.version_of(id, params) {
                    Ok(version) => version,
                    Err(refusal) => return refusal,
                };
                let mut result = json!({ "tools": self.tools.listing(version).await });
                if version == Version::STATELESS {
                    // Private to this agent and not to be kept: the list follows its role.
                    result["resultType"] = json!("complete");
                    result["ttlMs"] = json!(0);
                    result["cacheScope"] = json!("private");
                }
                jsonrpc::result(id, result)
            }
            _ => jsonrpc::error(id, jsonrpc::METHOD_NOT_FOUND, format!("method not found: {method}")),
        }
    }

    fn initialize(&self, id: &Value, params: &Value) -> Value {
        if let Some(version) = self.state.lock().expect("state lock").version {
            let why =
                format!("already initialized (protocol version {}): a session is initialized once", version.as_str());
            return jsonrpc::error(id, jsonrpc::INVALID_REQUEST, why);
        }
        let version = Version::negotiate(params.get("protocolVersion").and_then(Value::as_str));
        let client = params.pointer("/clientInfo/name").and_then(Value::as_str);
        let channel_client = self.options.channels && frame::takes_channel(client, params.get("capabilities"));
        {
            let mut state = self.state.lock().expect("state lock");
            state.version = Some(version);
            state.channel_client = channel_client;
        }
        jsonrpc::result(
            id,
            json!({
                "protocolVersion": version.as_str(),
                "capabilities": self.capabilities(),
                "serverInfo": self.server_info(),
                "instructions": relay_agent::tools::INSTRUCTIONS,
            }),
        )
    }

    fn capabilities(&self) -> Value {
        // The tool list follows the endpoint's role: the client hears when it changes.
        let mut capabilities = json!({ "tools": { "listChanged": true } });
        if self.options.channels {
            capabilities["experimental"] = json!({ "claude/channel": {} });
        }
        capabilities
    }

    fn server_info(&self) -> Value {
        json!({ "name": "agent-bridge", "title": "Relay", "version": self.options.version })
    }

    /// The version a request is served under: the one it names itself (the stateless revision,
    /// whose requests each carry their version and client, with no handshake), else the session's.
    /// A first request of the stateless revision takes the session's place: pushes may flow.
    fn version_of(&self, id: &Value, params: &Value) -> Result<Version, Value> {
        let meta = params.get("_meta");
        let asked = meta.and_then(|m| m.get(META_VERSION)).and_then(Value::as_str);
        let Some(asked) = asked else {
            return self
                .state
                .lock()
                .expect("state lock")
                .version
                .ok_or_else(|| jsonrpc::error(id, jsonrpc::NOT_INITIALIZED, "call initialize first"));
        };
        if Version::known(asked) != Some(Version::STATELESS) {
            let why = format!(
                "unsupported protocol version {asked:?} in _meta: requests name {} there; the others initialize a session",
                Version::STATELESS.as_str()
            );
            return Err(jsonrpc::error(id, jsonrpc::INVALID_PARAMS, why));
        }
        let first = {
            let mut state = self.state.lock().expect("state lock");
            let first = state.version.is_none();
            if first {
                let client = meta.and_then(|m| m.pointer(META_CLIENT_NAME)).and_then(Value::as_str);
                let capabilities = meta.and_then(|m| m.get(META_CAPABILITIES));
                state.version = Some(Version::STATELESS);
                state.channel_client = self.options.channels && frame::takes_channel(client, capabilities);
            }
            first
        };
        if first {
            self.start_push_if_ready();
        }
        Ok(Version::STATELESS)
    }

    fn notification(&self, method: &str, params: &Value) {
        match method {
            "notifications/initialized" => self.start_push_if_ready(),
            "notifications/cancelled" => {
                if let Some(id) = params.get("requestId")
                    && let Some(call) = self.running.lock().expect("running lock").remove(&id_key(id))
                {
                    // A cancelled request gets no answer.
                    call.task.abort();
                    tracing::debug!(request = %id, "request cancelled");
                }
            }
            _ => {}
        }
    }

    /// Pushes may flow once the client has finished initializing (or, for a client that never
    /// says so, once it calls a tool).
    fn start_push_if_ready(&self) {
        if self.state.lock().expect("state lock").version.is_some() {
            self.ready.send_if_modified(|ready| !std::mem::replace(ready, true));
        }
    }

    /// Refusals that are protocol errors rather than tool results.
    fn check_call(&self, id: &Value, params: &Value) -> Result<(), Value> {
        self.version_of(id, params)?;
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return Err(jsonrpc::error(id, jsonrpc::INVALID_PARAMS, "tools/call needs a tool name"));
        };
        if catalog::find(name).is_none() {
            return Err(jsonrpc::error(id, jsonrpc::INVALID_PARAMS, format!("unknown tool {name:?}")));
        }
        match params.get("arguments") {
            None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
            Some(_) => Err(jsonrpc::error(id, jsonrpc::INVALID_PARAMS, "arguments must be an object")),
        }
    }

    async fn tool_call(&self, id: &Value, params: &Value) -> Value {
        let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
        let empty = serde_json::Map::new();
        let arguments = params.get("arguments").and_then(Value::as_object).unwrap_or(&empty);
        let outcome = self.tools.call(name, arguments).await;
        let version = self.version_of(id, params).unwrap_or(Version::LATEST);
        let mut result = outcome.render(version);
        if version == Version::STATELESS {
            result["resultType"] = json!("complete");
        }
        jsonrpc::result(id, result)
    }
}

/// Hands each pushed message on: it is unread (and hinted on every tool result) until a tool shows
/// it, and with channels it is also pushed as a channel notification. A client may drop those
/// (Claude Code does unless started with channels on) and the bridge cannot tell, so a channel push
/// never counts as the model having seen the message.
async fn forward_pushes(session: Arc<Session>, mut pushed: mpsc::Receiver<Message>) {
    let mut ready = session.ready.subscribe();
    if ready.wait_for(|r| *r).await.is_err() {
        return;
    }
    let channel = session.state.lock().expect("state lock").channel_client;
    while let Some(message) = pushed.recv().await {
        // A post pushed again (its stream reopened) is neither counted nor pushed twice.
        if !session.tools.note_unread(&message).await || !channel {
            continue;
        }
        let notification = jsonrpc::notification(frame::CHANNEL_METHOD, frame::channel_params(&message));
        session.send(notification).await;
    }
}

/// Tells the client to list tools again when what decides the listing changes (the operator's or
/// the board's tools come or go).
async fn announce_role_changes(session: Arc<Session>) {
    let mut ready = session.ready.subscribe();
    if ready.wait_for(|r| *r).await.is_err() {
        return;
    }
    let mut role = session.tools.listing_changes();
    role.mark_unchanged();
    while role.changed().await.is_ok() {
        session.send(jsonrpc::notification("notifications/tools/list_changed", json!({}))).await;
    }
}
