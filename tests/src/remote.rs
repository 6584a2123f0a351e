//! An MCP client of the server's `/mcp` endpoint over Streamable HTTP, as a cloud agent's client
//! would be: statelessly (2026-07-28, each request carrying its version and client) or in a session
//! of a 2025 revision (`initialize`, then `Mcp-Session-Id` on every request).

use serde_json::{Value, json};

use crate::http::{Answer, request};

pub const STATELESS: &str = "2026-07-28";

pub struct RemoteAgent {
    /// host:port of the endpoint.
    pub addr: String,
    token: String,
    handle: Option<String>,
    pub version: String,
    pub session: Option<String>,
    client: String,
    next_id: i64,
}

impl RemoteAgent {
    /// A client of the stateless revision, as `handle` when given.
    pub fn stateless(addr: &str, token: &str, handle: Option<&str>) -> Self {
        Self {
            addr: addr.to_owned(),
            token: token.to_owned(),
            handle: handle.map(str::to_owned),
            version: STATELESS.to_owned(),
            session: None,
            client: "ci-job".to_owned(),
            next_id: 1,
        }
    }

    /// A client of `version` (a 2025 revision) that has initialized its session; `client` is its
    /// name (`claude-code`, …).
    pub async fn initialize(addr: &str, token: &str, handle: Option<&str>, version: &str, client: &str) -> Self {
        let mut agent = Self::stateless(addr, token, handle);
        agent.version = version.to_owned();
        agent.client = client.to_owned();
        let params = json!({
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": { "name": client, "version": "1.0" },
        });
        let (answer, response) = agent.exchange("initialize", params).await;
        assert_eq!(response["result"]["protocolVersion"], version, "{response}");
        agent.session = Some(answer.header("mcp-session-id").expect("a session id").to_owned());
        let notified = agent.post(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }), None).await;
        assert_eq!(notified.status, 202, "{notified:?}");
        agent
    }

    /// The headers every request carries: credentials, protocol version, session; for the
    /// stateless revision the method and the name it acts on (a tool's).
    fn headers(&self, method: Option<&str>, name: Option<&str>) -> Vec<(String, String)> {
        let mut headers = vec![
            ("Content-Type".to_owned(), "application/json".to_owned()),
            ("Accept".to_owned(), "application/json, text/event-stream".to_owned()),
            ("Authorization".to_owned(), format!("Bearer {}", self.token)),
        ];
        if let Some(handle) = &self.handle {
            headers.push(("Relay-Handle".to_owned(), handle.clone()));
        }
        if let Some(session) = &self.session {
            headers.push(("Mcp-Session-Id".to_owned(), session.clone()));
            headers.push(("MCP-Protocol-Version".to_owned(), self.version.clone()));
        }
        if self.version == STATELESS {
            headers.push(("MCP-Protocol-Version".to_owned(), self.version.clone()));
            if let Some(method) = method {
                headers.push(("Mcp-Method".to_owned(), method.to_owned()));
            }
            if let Some(name) = name {
                headers.push(("Mcp-Name".to_owned(), name.to_owned()));
            }
        }
        headers
    }

    /// POSTs one JSON-RPC message.
    pub async fn post(&self, message: &Value, method: Option<&str>) -> Answer {
        let name = message["params"]["name"].as_str();
        let headers = self.headers(method, name);
        let borrowed: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        request(&self.addr, "POST", "/mcp", &borrowed, &message.to_string()).await
    }

    /// Sends request `method` and returns the HTTP answer and the JSON-RPC response in it.
    pub async fn exchange(&mut self, method: &str, mut params: Value) -> (Answer, Value) {
        let id = self.next_id;
        self.next_id += 1;
        if self.version == STATELESS {
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": STATELESS,
                "io.modelcontextprotocol/clientInfo": { "name": self.client, "version": "1.0" },
                "io.modelcontextprotocol/clientCapabilities": {},
            });
        }
        let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let answer = self.post(&message, Some(method)).await;
        assert_eq!(answer.status, 200, "{method}: {answer:?}");
        let response = response_in(&answer, id).unwrap_or_else(|| panic!("{method}: no response {id} in {answer:?}"));
        (answer, response)
    }

    /// Calls a tool; its result (an error result included).
    pub async fn tool(&mut self, name: &str, arguments: Value) -> Value {
        let (_, response) = self.exchange("tools/call", json!({ "name": name, "arguments": arguments })).await;
        response.get("result").cloned().unwrap_or_else(|| panic!("{name}: {response}"))
    }

    /// Calls a tool that must succeed.
    pub async fn tool_ok(&mut self, name: &str, arguments: Value) -> Value {
        let result = self.tool(name, arguments).await;
        assert_ne!(result["isError"], true, "{name}: {result}");
        result
    }

    /// The tools listed to this agent.
    pub async fn tools(&mut self) -> Vec<Value> {
        let (_, response) = self.exchange("tools/list", json!({})).await;
        response["result"]["tools"].as_array().cloned().unwrap_or_else(|| panic!("{response}"))
    }
}

/// The JSON-RPC response with `id` in an answer: a JSON body, or one event of an event stream.
pub fn response_in(answer: &Answer, id: i64) -> Option<Value> {
    let is_it = |v: &Value| v["id"] == id;
    if answer.header("content-type").is_some_and(|t| t.starts_with("application/json")) {
        return serde_json::from_str::<Value>(&answer.body).ok().filter(is_it);
    }
    answer
        .body
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(is_it)
}
