//! The figures the service is run by, exposed on the ops port's `/metrics` (see `protocol::ops`).
//!
//! One registry per process: counters and histograms are bumped where things happen; gauges of the
//! pool, sessions and pending approvals are read when scraped, so nothing polls while nobody looks.

use std::collections::HashSet;
use std::sync::LazyLock;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tonic::Code;

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// This process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub method: &'static str,
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    pub method: &'static str,
}

/// A delivery's step, counted as deliveries take it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Step {
    /// Written to an inbox by a send.
    delivered,
    /// Written to the recipient's push stream.
    pushed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub step: Step,
}

/// Why work was refused at once rather than queued.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Shed {
    /// The replica's cap on connections.
    connections,
    /// The replica's cap on calls in flight, or on waiting calls and streams.
    calls,
    /// One client's share: the calls or streams of one credential, one account or one address, or
    /// the unauthenticated connections of one address. Others are not held back.
    shares,
    /// The sends under way exceeded what the writer keeps pace with.
    sends,
    /// An address whose credentials kept failing.
    authentication,
    /// A call rate of a credential or an account.
    rates,
}

/// What happened to a path claim.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ClaimStep {
    /// A new claim stands.
    granted,
    /// A standing claim was claimed again: a new time, reason or kind.
    renewed,
    /// Another agent's claim stood in the way.
    refused,
    /// Ended by its holder.
    released,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabel {
    pub step: ClaimStep,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabel {
    pub reason: Shed,
}

/// What a purge deleted.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Purged {
    messages,
    cards,
    peeks,
    console_sessions,
    mcp_sessions,
    mcp_answers,
    files,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PurgedLabel {
    pub kind: Purged,
}

/// A request at the MCP endpoint: its HTTP method and the status it was answered with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct McpLabels {
    pub method: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApprovalLabel {
    pub state: &'static str,
}

/// Seconds from 0.5 ms to about 33 s: sends and pushes at the floor, and calls that wait.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 17))
}

pub struct Metrics {
    registry: Registry,
    /// Every method `/package.Service/Method` the server answers; any other path is counted as "other",
    /// so that a client cannot grow the label set.
    methods: HashSet<&'static str>,
    pub rpcs: Family<RpcLabels, Counter>,
    pub rpc_seconds: Family<MethodLabel, Histogram, fn() -> Histogram>,
    pub sends: Counter,
    pub deliveries: Family<StepLabel, Counter>,
    pub send_write_seconds: Histogram,
    pub send_batch_size: Histogram,
    pub send_sets_rewritten: Counter,
    pub push_lag_seconds: Histogram,
    pub pushes_handed: Counter,
    pub streams: Gauge,
    pub announcing: Gauge,
    /// Inbox reads waiting for mail on this replica.
    pub inbox_waiting: Gauge,
    pub connections: Gauge,
    pub shed: Family<ShedLabel, Counter>,
    pub listening: Gauge,
    pub listen_reconnects: Counter,
    pub pool_connections: Gauge,
    pub pool_idle: Gauge,
    pub pool_waiting: Gauge,
    pub pool_max: Gauge,
    pub pool_timeouts: Counter,
    pub sessions_cached: Gauge,
    pub scheduler_rounds: Counter,
    pub schedules_fired: Counter,
    pub leases_expired: Counter,
    pub search_indexed: Counter,
    pub search_queued: Gauge,
    pub purged: Family<PurgedLabel, Counter>,
    pub approvals_waiting: Family<ApprovalLabel, Gauge>,
    pub mcp_requests: Family<McpLabels, Counter>,
    pub claims: Family<ClaimLabel, Counter>,
    pub claims_standing: Gauge,
    pub loops_held: Counter,
    pub mcp_agents: Gauge,
    pub mcp_streams: Gauge,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("relay");
        let m = Self {
            registry: Registry::default(),
            methods: known_methods(),
            rpcs: Family::default(),
            rpc_seconds: Family::new_with_constructor(latency),
            sends: Counter::default(),
            deliveries: Family::default(),
            send_write_seconds: latency(),
            send_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            send_sets_rewritten: Counter::default(),
            push_lag_seconds: latency(),
            pushes_handed: Counter::default(),
            streams: Gauge::default(),
            announcing: Gauge::default(),
            inbox_waiting: Gauge::default(),
            connections: Gauge::default(),
            shed: Family::default(),
            listening: Gauge::default(),
            listen_reconnects: Counter::default(),
            pool_connections: Gauge::default(),
            pool_idle: Gauge::default(),
            pool_waiting: Gauge::default(),
            pool_max: Gauge::default(),
            pool_timeouts: Counter::default(),
            sessions_cached: Gauge::default(),
            scheduler_rounds: Counter::default(),
            schedules_fired: Counter::default(),
            leases_expired: Counter::default(),
            search_indexed: Counter::default(),
            search_queued: Gauge::default(),
            purged: Family::default(),
            approvals_waiting: Family::default(),
            mcp_requests: Family::default(),
            claims: Family::default(),
            claims_standing: Gauge::default(),
            loops_held: Counter::default(),
            mcp_agents: Gauge::default(),
            mcp_streams: Gauge::default(),
        };
        let r = &mut registry;
        r.register("rpcs", "Calls answered, by method and gRPC code", m.rpcs.clone());
        r.register_with_unit(
            "rpc_duration",
            "Time to a call's response (the whole call when unary), by method",
            Unit::Seconds,
            m.rpc_seconds.clone(),
        );
        r.register("sends", "Messages written", m.sends.clone());
        r.register(
            "deliveries",
            "Deliveries that took a step: delivered to an inbox, or pushed on a stream",
            m.deliveries.clone(),
        );
        r.register_with_unit(
            "send_write_duration",
            "Time from a send reaching the writer to its commit",
            Unit::Seconds,
            m.send_write_seconds.clone(),
        );
        r.register("send_batch_size", "Sends written per commit", m.send_batch_size.clone());
        r.register(
            "send_sets_rewritten",
            "Batches of plain sends whose set broke a constraint or met a deadlock, written again send by send",
            m.send_sets_rewritten.clone(),
        );
        r.register(
            "pushes_handed",
            "Deliveries pushed as the writer in this process handed them over, without reading them back",
            m.pushes_handed.clone(),
        );
        r.register_with_unit(
            "push_lag",
            "Time from a message's commit to its push on the recipient's stream",
            Unit::Seconds,
            m.push_lag_seconds.clone(),
        );
        r.register("push_streams", "Push streams open on this replica", m.streams.clone());
        r.register(
            "mail_waiters",
            "Hooks waiting on this replica for mail an agent's model has not been shown (Announce)",
            m.announcing.clone(),
        );
        r.register("inbox_waiters", "Inbox reads waiting on this replica for mail (wait_s)", m.inbox_waiting.clone());
        r.register("connections", "Client connections held by this replica", m.connections.clone());
        r.register("shed", "Work refused at once under load, by reason", m.shed.clone());
        r.register("listen_connected", "1 while the notification connection listens", m.listening.clone());
        r.register("listen_reconnects", "Times the notification connection was restored", m.listen_reconnects.clone());
        r.register("db_pool_connections", "Database connections open in the pool", m.pool_connections.clone());
        r.register("db_pool_idle", "Pooled database connections not in use", m.pool_idle.clone());
        r.register("db_pool_waiting", "Calls waiting for a pooled database connection", m.pool_waiting.clone());
        r.register("db_pool_max", "Most database connections the pool opens", m.pool_max.clone());
        r.register("db_pool_timeouts", "Waits for a pooled connection that ran out of time", m.pool_timeouts.clone());
        r.register("sessions_cached", "Sessions this replica authenticates from memory", m.sessions_cached.clone());
        r.register("scheduler_rounds", "Rounds of the board scheduler", m.scheduler_rounds.clone());
        r.register("schedules_fired", "Scheduled cards that fired a run", m.schedules_fired.clone());
        r.register("leases_expired", "Worker leases that lapsed and put their card back", m.leases_expired.clone());
        r.register("search_indexed", "Messages whose search entries were written", m.search_indexed.clone());
        r.register("search_queued", "Messages waiting for their search entries", m.search_queued.clone());
        r.register("purged", "Records deleted past their retention, by kind", m.purged.clone());
        r.register(
            "approvals_waiting",
            "Permission requests waiting for a decision, by state",
            m.approvals_waiting.clone(),
        );
        r.register(
            "path_claims",
            "Path claims by what happened: granted, renewed, refused, released",
            m.claims.clone(),
        );
        r.register("path_claims_standing", "Path claims in force", m.claims_standing.clone());
        r.register(
            "loop_guard_holds",
            "Sends held for a person because agents answered each other past the loop guard's bound",
            m.loops_held.clone(),
        );
        r.register("mcp_requests", "Requests at the MCP endpoint, by HTTP method and status", m.mcp_requests.clone());
        r.register("mcp_agents", "Agents without a bridge this replica serves over MCP", m.mcp_agents.clone());
        r.register("mcp_streams", "MCP sessions' notification streams open on this replica", m.mcp_streams.clone());
        Self { registry, ..m }
    }

    /// The label a method path is counted under.
    pub fn method(&self, path: &str) -> &'static str {
        self.methods.get(path).copied().unwrap_or("other")
    }

    /// Counts a call of `method` (a label from [`Metrics::method`]) that answered `code` after `seconds`.
    pub fn rpc_answered(&self, method: &'static str, code: Code, seconds: f64) {
        self.rpcs.get_or_create(&RpcLabels { method, code: code_name(code) }).inc();
        self.rpc_seconds.get_or_create(&MethodLabel { method }).observe(seconds);
    }

    pub fn claims(&self, step: ClaimStep, n: u64) {
        if n > 0 {
            self.claims.get_or_create(&ClaimLabel { step }).inc_by(n);
        }
    }

    pub fn shed(&self, reason: Shed) {
        self.shed.get_or_create(&ShedLabel { reason }).inc();
    }

    pub fn deliveries(&self, step: Step, n: u64) {
        if n > 0 {
            self.deliveries.get_or_create(&StepLabel { step }).inc_by(n);
        }
    }

    /// Counts a request at the MCP endpoint.
    pub fn mcp_answered(&self, method: &http::Method, status: u16) {
        let method = match *method {
            http::Method::GET => "GET",
            http::Method::POST => "POST",
            http::Method::DELETE => "DELETE",
            _ => "other",
        };
        self.mcp_requests.get_or_create(&McpLabels { method, status }).inc();
    }

    pub fn purged(&self, kind: Purged, n: u64) {
        if n > 0 {
            self.purged.get_or_create(&PurgedLabel { kind }).inc_by(n);
        }
    }

    /// The exposition in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// The methods of every service the server registers, from their descriptors.
fn known_methods() -> HashSet<&'static str> {
    use prost::Message;
    let sets = [relay_proto::v1::FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET];
    let mut methods = HashSet::new();
    for bytes in sets {
        let Ok(set) = prost_types::FileDescriptorSet::decode(bytes) else { continue };
        for file in set.file {
            for service in &file.service {
                for method in &service.method {
                    let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                    // Leaked once at start, a few dozen strings: labels borrow them for the process's life.
                    methods.insert(&*Box::leak(path.into_boxed_str()));
                }
            }
        }
    }
    methods
}

/// gRPC's canonical name of a code, as dashboards expect it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_labelled_only_when_the_server_has_them() {
        let m = metrics();
        assert_eq!(m.method("/relay.v1.Relay/Send"), "/relay.v1.Relay/Send");
        assert_eq!(m.method("/grpc.health.v1.Health/Check"), "/grpc.health.v1.Health/Check");
        assert_eq!(m.method("/relay.v1.Relay/NoSuchMethod"), "other");
        assert_eq!(m.method("/x/y"), "other");
    }

    #[test]
    fn the_exposition_names_each_family_once_with_its_type() {
        let m = metrics();
        m.rpc_answered(m.method("/relay.v1.Relay/Send"), Code::ResourceExhausted, 0.002);
        m.shed(Shed::sends);
        // A family shows once it has a series.
        m.deliveries(Step::pushed, 1);
        m.purged(Purged::peeks, 1);
        m.approvals_waiting.get_or_create(&ApprovalLabel { state: "pending" }).set(0);
        let text = m.encode();
        assert!(text.contains("# TYPE relay_rpcs counter"), "{text}");
        assert!(
            text.contains(r#"relay_rpcs_total{method="/relay.v1.Relay/Send",code="RESOURCE_EXHAUSTED"} "#),
            "{text}"
        );
        assert!(text.contains("# TYPE relay_rpc_duration_seconds histogram"), "{text}");
        assert!(text.contains(r#"relay_shed_total{reason="sends"} "#), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        for family in [
            "rpcs",
            "rpc_duration_seconds",
            "sends",
            "deliveries",
            "send_write_duration_seconds",
            "send_batch_size",
            "send_sets_rewritten",
            "push_lag_seconds",
            "push_streams",
            "mail_waiters",
            "connections",
            "shed",
            "listen_connected",
            "listen_reconnects",
            "db_pool_connections",
            "db_pool_idle",
            "db_pool_waiting",
            "db_pool_max",
            "db_pool_timeouts",
            "sessions_cached",
            "scheduler_rounds",
            "schedules_fired",
            "leases_expired",
            "search_indexed",
            "search_queued",
            "purged",
            "approvals_waiting",
        ] {
            assert!(text.contains(&format!("# HELP relay_{family} ")), "relay_{family} is not registered");
        }
    }
}
