//! A scripted model API standing in for the model behind a real agent CLI: Anthropic's Messages API
//! (Claude Code), OpenAI's Responses API (Codex) and Google's Gemini API (Gemini CLI), each
//! answering in the streaming form its client asks for. Every request is recorded; a test scripts
//! the answers it cares about (`on`) and waits for the request it expects (`wait_for`). Anything
//! unscripted gets a short text answer, so the client's own side requests (titles, routing) pass.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

/// Which API a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Anthropic,
    OpenAi,
    Gemini,
}

/// A request the API received.
#[derive(Debug, Clone)]
pub struct Request {
    pub api: Api,
    pub path: String,
    pub body: Value,
    pub at: tokio::time::Instant,
}

impl Request {
    /// The whole body as text: what `contains` looks in.
    pub fn text(&self) -> String {
        self.body.to_string()
    }

    pub fn contains(&self, needle: &str) -> bool {
        self.text().contains(needle)
    }

    /// The text of the conversation's newest user-side entry (a prompt, a woken turn's notice, a
    /// tool's answer): where what reached the model last arrives.
    pub fn last_turn(&self) -> String {
        let entries = match self.api {
            Api::Anthropic => &self.body["messages"],
            Api::OpenAi => &self.body["input"],
            Api::Gemini => &self.body["contents"],
        };
        let user_side = |e: &&Value| e["role"] == "user" || e["type"] == "function_call_output";
        entries.as_array().and_then(|e| e.iter().rev().find(user_side)).map(|v| v.to_string()).unwrap_or_default()
    }

    /// The tools the model called so far in this conversation, oldest first (Anthropic's API).
    pub fn tool_calls(&self) -> Vec<String> {
        let messages = self.body["messages"].as_array().into_iter().flatten();
        let content =
            messages.filter(|m| m["role"] == "assistant").flat_map(|m| m["content"].as_array().into_iter().flatten());
        content.filter(|c| c["type"] == "tool_use").filter_map(|c| c["name"].as_str().map(str::to_owned)).collect()
    }

    /// The names of the tools offered to the model (Codex's MCP namespaces listed with their
    /// tools as `namespace.tool`).
    pub fn tools(&self) -> Vec<String> {
        let mut names = Vec::new();
        match self.api {
            Api::Anthropic => {
                for tool in self.body["tools"].as_array().into_iter().flatten() {
                    names.extend(tool["name"].as_str().map(str::to_owned));
                }
            }
            Api::OpenAi => {
                for tool in self.body["tools"].as_array().into_iter().flatten() {
                    let name = tool["name"].as_str().unwrap_or_default();
                    match tool["tools"].as_array() {
                        Some(inner) => {
                            names.extend(inner.iter().filter_map(|t| t["name"].as_str()).map(|t| format!("{name}.{t}")))
                        }
                        None => names.push(name.to_owned()),
                    }
                }
            }
            Api::Gemini => {
                for group in self.body["tools"].as_array().into_iter().flatten() {
                    for f in group["functionDeclarations"].as_array().into_iter().flatten() {
                        names.extend(f["name"].as_str().map(str::to_owned));
                    }
                }
            }
        }
        names
    }
}

/// What Relay's tool definitions cost in one request, as the client wrote them for its model.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolCost {
    /// Bytes of Relay's tools: their entries in the request's tools, the names of tools the
    /// client defers (listed elsewhere in the request), and Relay's instructions where the client
    /// passes them on.
    pub bytes: usize,
    /// Of those, what the client adds to every tool of its own (Gemini CLI's `wait_for_previous`).
    pub client_added: usize,
}

impl ToolCost {
    /// Relay's own bytes.
    pub fn relay_bytes(self) -> usize {
        self.bytes - self.client_added
    }

    /// Tokens, at four bytes a token.
    pub fn tokens(bytes: usize) -> usize {
        bytes.div_ceil(4)
    }
}

impl Request {
    /// What Relay's tools cost the model in this request.
    pub fn relay_tools(&self) -> ToolCost {
        let size = |v: &Value| v.to_string().len();
        let mut cost = ToolCost::default();
        match self.api {
            Api::Anthropic | Api::OpenAi => {
                for tool in self.body["tools"].as_array().into_iter().flatten() {
                    if tool["name"].as_str().is_some_and(|n| n.starts_with("mcp__relay")) {
                        cost.bytes += size(tool);
                    }
                }
            }
            Api::Gemini => {
                for group in self.body["tools"].as_array().into_iter().flatten() {
                    for f in group["functionDeclarations"].as_array().into_iter().flatten() {
                        if f["name"].as_str().is_some_and(|n| n.starts_with("mcp_relay_")) {
                            cost.bytes += size(f);
                            for parameters in [&f["parameters"], &f["parametersJsonSchema"]] {
                                if let Some(added) = parameters["properties"].get("wait_for_previous") {
                                    // `"wait_for_previous":` and its schema, with a comma.
                                    cost.client_added += size(added) + "\"wait_for_previous\":,".len();
                                }
                            }
                        }
                    }
                }
            }
        }
        // Deferred tools are named outside the tools, and the instructions go in the prompt.
        let mut rest = self.body.clone();
        if let Some(object) = rest.as_object_mut() {
            object.remove("tools");
        }
        let rest = rest.to_string();
        let mut at = 0;
        while let Some(found) = rest[at..].find("mcp__relay__") {
            let start = at + found;
            let end = rest[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(rest.len(), |e| start + e);
            cost.bytes += end - start + 1;
            at = end;
        }
        let instructions = relay_agent::tools::INSTRUCTIONS;
        if rest.contains(&serde_json::to_string(instructions).unwrap()[1..40]) {
            cost.bytes += instructions.len();
        }
        cost
    }
}

/// What the model answers.
#[derive(Debug, Clone)]
pub enum Reply {
    Text(String),
    /// A call of a tool; `namespace` for Codex's MCP tools (`mcp__relay`).
    Tool {
        name: String,
        namespace: Option<String>,
        input: Value,
    },
}

impl Reply {
    pub fn text(text: &str) -> Self {
        Self::Text(text.to_owned())
    }

    pub fn tool(name: &str, input: Value) -> Self {
        Self::Tool { name: name.to_owned(), namespace: None, input }
    }
}

/// A scripted answer, used once, for the first request to `api` whose body holds `when`.
struct Rule {
    api: Api,
    when: String,
    reply: Reply,
    /// Holds the answer back until opened.
    gate: Option<Arc<Gate>>,
}

/// Holds a scripted answer back until the test opens it.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Notify,
}

impl Gate {
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_waiters();
    }

    async fn passed(&self) {
        loop {
            let notified = self.opened.notified();
            if *self.open.lock().unwrap() {
                return;
            }
            notified.await;
        }
    }
}

/// A model that decides each answer from the request itself, for a conversation of any length.
type Responder = Box<dyn Fn(&Request) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<Request>>,
    rules: Mutex<Vec<Rule>>,
    /// Asked, in order, for a request no rule matches.
    responders: Mutex<Vec<Responder>>,
    count: Option<watch::Sender<usize>>,
}

/// The running API; it stops with the test's runtime.
pub struct ModelApi {
    pub url: String,
    shared: Arc<Shared>,
    count: watch::Receiver<usize>,
}

const TEXT: &str = "Done, nothing more to do.";

impl ModelApi {
    pub async fn start() -> Self {
        let (tx, count) = watch::channel(0);
        let shared = Arc::new(Shared { count: Some(tx), ..Default::default() });
        let app = Router::new()
            .route("/v1/messages/count_tokens", post(|| async { json_body(json!({ "input_tokens": 10 })) }))
            .route("/v1/messages", post(anthropic))
            .route("/v1/responses", post(openai))
            .route("/v1beta/models/{call}", post(gemini))
            .fallback(get(|| async { json_body(json!({ "data": [], "models": [] })) }))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the model API");
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, shared, count }
    }

    /// Answers the first request to `api` whose body holds `when` with `reply`, once.
    pub fn on(&self, api: Api, when: &str, reply: Reply) {
        self.shared.rules.lock().unwrap().push(Rule { api, when: when.to_owned(), reply, gate: None });
    }

    /// Answers every request no rule matches and `respond` has an answer for (it returns `None`
    /// for requests that are not its own), for as long as the API runs.
    pub fn respond(&self, respond: impl Fn(&Request) -> Option<Reply> + Send + Sync + 'static) {
        self.shared.responders.lock().unwrap().push(Box::new(respond));
    }

    /// [`ModelApi::on`], holding the answer back until the returned gate is opened.
    pub fn on_held(&self, api: Api, when: &str, reply: Reply) -> Arc<Gate> {
        let gate = Arc::new(Gate::default());
        let rule = Rule { api, when: when.to_owned(), reply, gate: Some(gate.clone()) };
        self.shared.rules.lock().unwrap().push(rule);
        gate
    }

    pub fn requests(&self) -> Vec<Request> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Waits until a request matching `matches` has arrived (counting those already here from
    /// index `from` on) and returns it with its index.
    pub async fn wait_for(
        &self,
        what: &str,
        from: usize,
        limit: Duration,
        matches: impl Fn(&Request) -> bool,
    ) -> (usize, Request) {
        let mut count = self.count.clone();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(found) = self.requests().into_iter().enumerate().skip(from).find(|(_, r)| matches(r)) {
                return found;
            }
            let wait = tokio::time::timeout_at(deadline, count.changed()).await;
            assert!(
                wait.is_ok(),
                "timed out after {limit:?} waiting for {what}; the model API got: {}",
                self.summary()
            );
        }
    }

    /// One line per request received, for failure messages.
    pub fn summary(&self) -> String {
        self.requests()
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let turn = r.last_turn();
                format!("\n  #{i} {:?} {} … {}", r.api, r.path, &turn[turn.len().saturating_sub(300)..])
            })
            .collect()
    }
}

/// Records a request and finds its scripted reply (text by default).
async fn answer(shared: &Shared, api: Api, path: String, body: Value) -> Reply {
    let text = body.to_string();
    let rule = {
        let mut rules = shared.rules.lock().unwrap();
        let at = rules.iter().position(|r| r.api == api && text.contains(&r.when));
        at.map(|i| rules.remove(i))
    };
    let request = Request { api, path, body, at: tokio::time::Instant::now() };
    let responded = match rule {
        Some(_) => None,
        None => shared.responders.lock().unwrap().iter().find_map(|respond| respond(&request)),
    };
    {
        let mut requests = shared.requests.lock().unwrap();
        requests.push(request);
        if let Some(count) = &shared.count {
            count.send_replace(requests.len());
        }
    }
    if let Some(reply) = responded {
        return reply;
    }
    match rule {
        Some(Rule { gate, reply, .. }) => {
            if let Some(gate) = gate {
                gate.passed().await;
            }
            reply
        }
        None => Reply::text(TEXT),
    }
}

fn json_body(value: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

fn parse(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

fn event_stream(events: Vec<(Option<&str>, Value)>) -> Response {
    let mut body = String::new();
    for (event, data) in events {
        if let Some(event) = event {
            body.push_str(&format!("event: {event}\n"));
        }
        body.push_str(&format!("data: {data}\n\n"));
    }
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

fn id(prefix: &str) -> String {
    use rand::Rng;
    let n: u64 = rand::rng().random();
    format!("{prefix}{n:016x}")
}

async fn anthropic(State(shared): State<Arc<Shared>>, uri: Uri, body: Bytes) -> Response {
    let body = parse(&body);
    let (stream, model) = (body["stream"].as_bool() == Some(true), body["model"].clone());
    let reply = answer(&shared, Api::Anthropic, uri.to_string(), body).await;
    let (block, stop) = match &reply {
        Reply::Text(text) => (json!({ "type": "text", "text": text }), "end_turn"),
        Reply::Tool { name, input, .. } => {
            (json!({ "type": "tool_use", "id": id("toolu_"), "name": name, "input": input }), "tool_use")
        }
    };
    let usage = json!({ "input_tokens": 10, "output_tokens": 5 });
    let message_id = id("msg_");
    if !stream {
        let message = json!({ "id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": [block], "stop_reason": stop, "stop_sequence": null, "usage": usage });
        return json_body(message);
    }
    let start = json!({ "type": "message_start", "message": { "id": message_id, "type": "message", "role": "assistant",
        "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage } });
    let (opened, delta) = match &reply {
        Reply::Text(text) => (json!({ "type": "text", "text": "" }), json!({ "type": "text_delta", "text": text })),
        Reply::Tool { input, .. } => {
            let mut opened = block.clone();
            opened["input"] = json!({});
            (opened, json!({ "type": "input_json_delta", "partial_json": input.to_string() }))
        }
    };
    event_stream(vec![
        (Some("message_start"), start),
        (Some("content_block_start"), json!({ "type": "content_block_start", "index": 0, "content_block": opened })),
        (Some("content_block_delta"), json!({ "type": "content_block_delta", "index": 0, "delta": delta })),
        (Some("content_block_stop"), json!({ "type": "content_block_stop", "index": 0 })),
        (
            Some("message_delta"),
            json!({ "type": "message_delta", "delta": { "stop_reason": stop, "stop_sequence": null }, "usage": { "output_tokens": 5 } }),
        ),
        (Some("message_stop"), json!({ "type": "message_stop" })),
    ])
}

async fn openai(State(shared): State<Arc<Shared>>, uri: Uri, body: Bytes) -> Response {
    let body = parse(&body);
    let model = body["model"].clone();
    let reply = answer(&shared, Api::OpenAi, uri.to_string(), body).await;
    let item = match reply {
        Reply::Text(text) => json!({ "type": "message", "id": id("msg_"), "role": "assistant", "status": "completed",
            "content": [{ "type": "output_text", "text": text, "annotations": [] }] }),
        Reply::Tool { name, namespace, input } => {
            let mut item = json!({ "type": "function_call", "id": id("fc_"), "call_id": id("call_"), "name": name,
                "arguments": input.to_string(), "status": "completed" });
            if let Some(namespace) = namespace {
                item["namespace"] = json!(namespace);
            }
            item
        }
    };
    let response = |status: &str, output: Value| {
        json!({ "id": id("resp_"), "object": "response", "model": model, "status": status, "output": output,
            "usage": { "input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                "input_tokens_details": { "cached_tokens": 0 }, "output_tokens_details": { "reasoning_tokens": 0 } } })
    };
    event_stream(vec![
        (
            Some("response.created"),
            json!({ "type": "response.created", "response": response("in_progress", json!([])) }),
        ),
        (
            Some("response.output_item.added"),
            json!({ "type": "response.output_item.added", "output_index": 0, "item": item }),
        ),
        (
            Some("response.output_item.done"),
            json!({ "type": "response.output_item.done", "output_index": 0, "item": item }),
        ),
        (
            Some("response.completed"),
            json!({ "type": "response.completed", "response": response("completed", json!([item])) }),
        ),
    ])
}

async fn gemini(
    State(shared): State<Arc<Shared>>,
    Path(call): Path<String>,
    uri: Uri,
    _: HeaderMap,
    body: Bytes,
) -> Response {
    let body = parse(&body);
    if call.ends_with(":countTokens") {
        return json_body(json!({ "totalTokens": 10 }));
    }
    // A request for JSON (its model router asks how hard a prompt is) gets a sample of its schema,
    // unscripted and unrecorded as a turn of the conversation.
    let config = &body["generationConfig"];
    if config["responseMimeType"] == "application/json" {
        let sample = sample(&config["responseJsonSchema"]);
        let part = json!({ "text": sample.to_string() });
        return gemini_answer(&call, part);
    }
    let part = match answer(&shared, Api::Gemini, uri.to_string(), body).await {
        Reply::Text(text) => json!({ "text": text }),
        Reply::Tool { name, input, .. } => json!({ "functionCall": { "name": name, "args": input } }),
    };
    gemini_answer(&call, part)
}

fn gemini_answer(call: &str, part: Value) -> Response {
    let answer = json!({
        "candidates": [{ "content": { "role": "model", "parts": [part] }, "finishReason": "STOP", "index": 0 }],
        "usageMetadata": { "promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15 },
    });
    if call.ends_with(":streamGenerateContent") {
        event_stream(vec![(None, answer)])
    } else if call.ends_with(":generateContent") {
        json_body(answer)
    } else {
        (StatusCode::NOT_FOUND, format!("no such call {call}")).into_response()
    }
}

/// A value of the JSON schema's shape (objects with every property, the simplest leaf values).
fn sample(schema: &Value) -> Value {
    let kind = schema["type"].as_str().unwrap_or("object").to_ascii_lowercase();
    match kind.as_str() {
        "object" => {
            let props = schema["properties"].as_object().cloned().unwrap_or_default();
            Value::Object(props.iter().map(|(k, v)| (k.clone(), sample(v))).collect())
        }
        "array" => json!([]),
        "integer" | "number" => json!(10),
        "boolean" => json!(false),
        _ => json!("simple"),
    }
}
