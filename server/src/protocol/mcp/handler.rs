//! The MCP methods the endpoint answers: the tool list and tool calls, each in the name of the agent
//! the request's credentials name, shaped for the request's protocol version.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use relay_agent::Version;
use relay_agent::tools::{INSTRUCTIONS, Tools, catalog};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, ResultType, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use super::agents::{Agents, Remote, Seat, harness_of};
use super::resume::Departure;

/// The revisions spoken, newest first: the stateless one, and the 2025 ones clients in use speak.
pub const VERSIONS: [ProtocolVersion; 4] = [
    ProtocolVersion::V_2026_07_28,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_03_26,
];

#[derive(Clone)]
pub struct Handler {
    agents: Arc<Agents>,
}

impl Handler {
    pub fn new(agents: Arc<Agents>) -> Self {
        Self { agents }
    }

    /// The agent's tools, and the version to shape their answers for.
    fn agent(&self, context: &RequestContext<RoleServer>) -> Result<(Arc<Tools>, Version), ErrorData> {
        let parts = context.extensions.get::<http::request::Parts>();
        let remote = parts
            .and_then(|p| p.extensions.get::<Remote>())
            .ok_or_else(|| ErrorData::internal_error("request without credentials", None))?;
        let mcp_session = parts.and_then(|p| p.headers.get("mcp-session-id")).and_then(|v| v.to_str().ok());
        let client = context.client_info().map(|c| c.name).unwrap_or_default();
        let seat = Seat { harness: harness_of(&client), mcp_session };
        let version = context.protocol_version().and_then(|v| Version::known(v.as_str())).unwrap_or(Version::STATELESS);
        Ok((self.agents.tools(remote, &seat), version))
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder().enable_tools().build();
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new("relay-server", env!("CARGO_PKG_VERSION"));
        info.server_info.title = Some("Relay".into());
        info.instructions = Some(INSTRUCTIONS.into());
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(&VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (tools, version) = self.agent(&context)?;
        let listed = tools.listing(version).await;
        let mut result: ListToolsResult = serde_json::from_value(serde_json::json!({ "tools": listed }))
            .map_err(|e| ErrorData::internal_error(format!("cannot list the tools: {e}"), None))?;
        // The SDK drops it for the 2025 revisions, and marks the list private and not to be kept
        // (it follows the agent's role).
        result.result_type = Some(ResultType::COMPLETE);
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if catalog::find(&request.name).is_none() {
            return Err(ErrorData::invalid_params(format!("unknown tool {:?}", request.name), None));
        }
        let (tools, version) = self.agent(&context)?;
        let arguments = request.arguments.unwrap_or_default();
        // A call that waits for mail says it still waits, when the client asked for progress: the
        // answer becomes an event stream, which proxies keep open.
        let wait_s = catalog::wait_of(&request.name, &arguments);
        let waits = wait_s.is_some();
        let waiting = wait_s
            .zip(context.meta.get_progress_token())
            .map(|(wait_s, token)| report_waiting(&context, token, wait_s));
        let progress = async {
            match waiting {
                Some(reporting) => reporting.await,
                None => std::future::pending().await,
            }
        };
        // A call that waits stops when its client leaves, before it takes what it waited for;
        // any other call ends and its answer is kept for the client to resume.
        let departed = async {
            match context.extensions.get::<http::request::Parts>().and_then(|p| p.extensions.get::<Departure>()) {
                Some(Departure(departure)) if waits => departure.cancelled().await,
                _ => std::future::pending().await,
            }
        };
        // A cancelled request ends the call (a wait among them) at once.
        let outcome = tokio::select! {
            outcome = tools.call(&request.name, &arguments) => outcome,
            () = progress => unreachable!("progress reports until the call ends"),
            () = context.ct.cancelled() => return Err(ErrorData::internal_error("cancelled", None)),
            () = departed => return Err(ErrorData::internal_error(DEPARTED, None)),
        };
        let mut result: CallToolResult = serde_json::from_value(outcome.render(version))
            .map_err(|e| ErrorData::internal_error(format!("cannot shape the result: {e}"), None))?;
        result.result_type = Some(ResultType::COMPLETE);
        Ok(CallToolResponse::Complete(result))
    }
}

/// What a client resuming a wait that stopped when it left is told.
const DEPARTED: &str = "the call stopped waiting when its client's connection closed, before it took anything: \
                        what it waited for is still unread (a relay_ask's request may have gone out: look before asking again)";

/// How often a waiting call says it still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Reports every [`PROGRESS_EVERY`] how long the call has waited of its `wait_s`; never ends.
async fn report_waiting(context: &RequestContext<RoleServer>, token: ProgressToken, wait_s: u32) {
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval_at(started + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        tick.tick().await;
        let waited = started.elapsed().as_secs();
        let mut progress = ProgressNotificationParam::new(token.clone(), waited as f64);
        progress.total = Some(f64::from(wait_s));
        progress.message = Some(format!("waiting for a message: {waited} s of {wait_s} s"));
        // A client that stopped listening ends the call through its cancellation.
        let _ = context.peer.notify_progress(progress).await;
    }
}
