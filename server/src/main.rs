use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use relay_server::admin::{self, AdminCommand};
use relay_server::dev::{self, DevOptions};
use relay_server::domain::board::{LEASE_S, PR_CHECK_S};
use relay_server::domain::limits::Quotas;
use relay_server::domain::rate::Rate;
use relay_server::domain::retention::Retention;
use relay_server::domain::timings::{APPROVAL_WAIT_S, SCHEDULER_TICK_MS, Timings};
use relay_server::protocol::admission::{self, RpcLimits};
use relay_server::protocol::connections;
use relay_server::protocol::listen::Listen;
use relay_server::protocol::ops;
use relay_server::protocol::{console, mcp};
use relay_server::serve::{self, ListenOptions, Settings, SideListeners};
use relay_server::store::DbConfig;
use tracing_subscriber::EnvFilter;

/// The central Relay server: accounts, machines, messaging and push over gRPC, state in Postgres.
#[derive(Parser)]
#[command(name = "relay-server", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written to stderr: text (coloured only on a terminal) or json (one object a
    /// line, with the call's span fields, for a log collector).
    #[arg(long, global = true, env = "RELAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve gRPC (applies pending migrations first).
    Serve {
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// Apply pending migrations and exit.
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Serve on a private Postgres cluster from the local binaries, and set this machine up as a client.
    /// The side listeners are on by default here: ops 127.0.0.1:7448, console 127.0.0.1:7449, MCP
    /// 127.0.0.1:7450 (each skipped with a warning when taken, or with `off`).
    Dev {
        #[command(flatten)]
        serve: ServeArgs,
        /// Where the private cluster lives.
        #[arg(long, env = "RELAY_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// The directory of the Postgres server programs (initdb, pg_ctl, postgres) for the private
        /// cluster [default: the newest /usr/lib/postgresql/*/bin, else where pg_ctl is on PATH].
        #[arg(long, env = "RELAY_PG_BIN")]
        pg_bin: Option<PathBuf>,
    },
    /// Operator commands straight against the database: --database-url/DATABASE_URL, else the
    /// database of the running dev server under --data-dir/RELAY_DATA_DIR (default: dev's own).
    Admin {
        #[command(flatten)]
        db: DbArgs,
        /// The data dir of a running `relay-server dev` whose database to use when no database URL is
        /// given; by default the one `dev` uses.
        #[arg(long, env = "RELAY_DATA_DIR", global = true)]
        data_dir: Option<PathBuf>,
        #[command(subcommand)]
        command: AdminArgs,
    },
}

/// What `serve` and `dev` both take.
#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    listen: ListenArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    settings: SettingsArgs,
    /// Serve /healthz, /readyz and /metrics over plaintext HTTP on this address (serve: off by
    /// default).
    #[arg(long, env = "RELAY_OPS_LISTEN", value_name = "ADDR|off")]
    ops_listen: Option<Listen>,
    /// Serve the web console on this address (serve: off by default): HTTPS with --tls-cert and
    /// --tls-key, plaintext only on loopback unless --insecure-plaintext.
    #[arg(long, env = "RELAY_CONSOLE_LISTEN", value_name = "ADDR|off")]
    console_listen: Option<Listen>,
    /// Serve the relay tools to remote MCP clients (Streamable HTTP, path /mcp) on this address
    /// (serve: off by default): HTTPS with --tls-cert and --tls-key, plaintext only on loopback
    /// unless --insecure-plaintext.
    #[arg(long, env = "RELAY_MCP_LISTEN", value_name = "ADDR|off")]
    mcp_listen: Option<Listen>,
}

/// The server's tunables, as `serve` and `dev` take them.
#[derive(Args)]
struct SettingsArgs {
    #[command(flatten)]
    rpc: RpcArgs,
    #[command(flatten)]
    retention: RetentionArgs,
    #[command(flatten)]
    timings: TimingArgs,
    #[command(flatten)]
    quotas: QuotaArgs,
}

impl From<SettingsArgs> for Settings {
    fn from(a: SettingsArgs) -> Self {
        Settings {
            rpc: a.rpc.into(),
            retention: a.retention.into(),
            quotas: a.quotas.into(),
            timings: a.timings.into(),
        }
    }
}

#[derive(Args)]
struct DbArgs {
    /// Postgres URL (postgres://user:pass@host/db) or key=value settings.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// A file holding the database URL (a container secret, a systemd credential): the URL stays out
    /// of the environment and the command line.
    #[arg(long, env = "DATABASE_URL_FILE", conflicts_with = "database_url")]
    database_url_file: Option<PathBuf>,
    /// Most database connections this process opens (plus one for notifications).
    #[arg(long, env = "RELAY_DB_POOL_SIZE", default_value_t = 16)]
    db_pool_size: usize,
    /// A PEM CA to trust for the database's certificate (with sslmode=require), beside the system's roots.
    #[arg(long, env = "RELAY_DB_CA")]
    db_ca: Option<PathBuf>,
}

impl DbArgs {
    /// The database URL given, read from its file when it was given as one.
    fn url(&self) -> anyhow::Result<Option<String>> {
        match (&self.database_url, &self.database_url_file) {
            (Some(url), _) => Ok(Some(url.clone())),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the database URL file {}", path.display()))?;
                let url = text.trim().to_owned();
                anyhow::ensure!(!url.is_empty(), "the database URL file {} is empty", path.display());
                Ok(Some(url))
            }
            (None, None) => Ok(None),
        }
    }

    fn config(&self) -> anyhow::Result<DbConfig> {
        let url = self.url()?.context(
            "no database: set DATABASE_URL, DATABASE_URL_FILE or --database-url (or run `relay-server dev` for a private one)",
        )?;
        Ok(DbConfig::parse(&url, self.db_pool_size, self.db_ca.as_deref())?)
    }
}

#[derive(Args)]
struct LimitArgs {
    /// Most unread messages one inbox holds; a send beyond it is refused until the recipient reads.
    #[arg(long, env = "RELAY_MAX_UNREAD", default_value_t = relay_server::domain::limits::DEFAULT_MAX_UNREAD,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_unread: u32,
}

#[derive(Args)]
struct RpcArgs {
    /// Most calls in flight at once; beyond it a call is refused with RESOURCE_EXHAUSTED rather than
    /// queued. Health and reflection are not counted.
    #[arg(long, env = "RELAY_MAX_CONCURRENT_RPCS", default_value_t = admission::DEFAULT_MAX_CONCURRENT_RPCS,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_concurrent_rpcs: u32,
    /// Seconds an ordinary call may take before it is stopped with DEADLINE_EXCEEDED. Long polls get
    /// their longest wait on top; streams and permission requests are not timed.
    #[arg(long, env = "RELAY_RPC_TIMEOUT_S", default_value_t = admission::DEFAULT_RPC_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    rpc_timeout_s: u64,
    /// Most calls waiting and streams open at once (long polls, permission requests, push streams,
    /// hooks waiting for mail), apart from the calls in flight, so clients waiting for mail never
    /// take the places of calls doing work.
    #[arg(long, env = "RELAY_MAX_WAITING_CALLS", default_value_t = admission::DEFAULT_MAX_WAITING_CALLS,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_waiting_calls: u32,
    /// One account's share of the calls in flight: its calls beyond it are refused, nobody else's.
    #[arg(long, env = "RELAY_MAX_CALLS_PER_ACCOUNT", default_value_t = admission::DEFAULT_MAX_CALLS_PER_ACCOUNT,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_calls_per_account: u32,
    /// One credential's share (an agent's session, a machine's or a person's token).
    #[arg(long, env = "RELAY_MAX_CALLS_PER_CREDENTIAL", default_value_t = admission::DEFAULT_MAX_CALLS_PER_CREDENTIAL,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_calls_per_credential: u32,
    /// Calls of one address being authenticated at once (behind a load balancer, raise it).
    #[arg(long, env = "RELAY_MAX_CALLS_PER_ADDRESS", default_value_t = admission::DEFAULT_MAX_CALLS_PER_ADDRESS,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_calls_per_address: u32,
    /// Waiting calls and streams one account holds open.
    #[arg(long, env = "RELAY_MAX_STREAMS_PER_ACCOUNT", default_value_t = admission::DEFAULT_MAX_STREAMS_PER_ACCOUNT,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_streams_per_account: u32,
    /// Waiting calls and streams one credential holds open.
    #[arg(long, env = "RELAY_MAX_STREAMS_PER_CREDENTIAL",
          default_value_t = admission::DEFAULT_MAX_STREAMS_PER_CREDENTIAL,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_streams_per_credential: u32,
    /// Seconds a call's request message may take to arrive after its headers.
    #[arg(long, env = "RELAY_REQUEST_WAIT_S", default_value_t = admission::DEFAULT_REQUEST_WAIT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=300))]
    request_wait_s: u64,
    /// Failed authentications one address may make a second, sustained, before its calls are
    /// refused unasked for a while (0: no limit; behind a proxy that hides clients' addresses,
    /// set 0 and limit at the proxy).
    #[arg(long, env = "RELAY_AUTH_FAILURE_RATE_PER_ADDRESS", default_value_t = admission::DEFAULT_FAILED_AUTH.per_s)]
    auth_failure_rate_per_address: f64,
    /// Failed authentications one address may make at once above its rate.
    #[arg(long, env = "RELAY_AUTH_FAILURE_BURST_PER_ADDRESS", default_value_t = admission::DEFAULT_FAILED_AUTH.burst)]
    auth_failure_burst_per_address: f64,
}

impl From<RpcArgs> for RpcLimits {
    fn from(a: RpcArgs) -> Self {
        Self {
            timeout: std::time::Duration::from_secs(a.rpc_timeout_s),
            max_concurrent: a.max_concurrent_rpcs as usize,
            max_waiting: a.max_waiting_calls as usize,
            per_account: a.max_calls_per_account as usize,
            per_credential: a.max_calls_per_credential as usize,
            per_address: a.max_calls_per_address as usize,
            streams_per_account: a.max_streams_per_account as usize,
            streams_per_credential: a.max_streams_per_credential as usize,
            request_wait: std::time::Duration::from_secs(a.request_wait_s),
            failed_auth: Rate::new(a.auth_failure_rate_per_address, a.auth_failure_burst_per_address),
            // The files' own limit, set with the quotas.
            ..RpcLimits::default()
        }
    }
}

#[derive(Args)]
struct QuotaArgs {
    /// Messages one endpoint may send a second, sustained (0: no limit). Each replica counts its own.
    #[arg(long, env = "RELAY_SEND_RATE_PER_ENDPOINT", default_value_t = Quotas::default().endpoint_sends.per_s)]
    send_rate_per_endpoint: f64,
    /// Messages one endpoint may send at once above its rate.
    #[arg(long, env = "RELAY_SEND_BURST_PER_ENDPOINT", default_value_t = Quotas::default().endpoint_sends.burst)]
    send_burst_per_endpoint: f64,
    /// Messages all of one account's endpoints may send a second together, sustained (0: no limit).
    #[arg(long, env = "RELAY_SEND_RATE_PER_ACCOUNT", default_value_t = Quotas::default().account_sends.per_s)]
    send_rate_per_account: f64,
    /// Messages one account may send at once above its rate.
    #[arg(long, env = "RELAY_SEND_BURST_PER_ACCOUNT", default_value_t = Quotas::default().account_sends.burst)]
    send_burst_per_account: f64,
    /// Deliveries all of one account's sends may make a second (a message counts once per
    /// recipient), sustained (0: no limit).
    #[arg(long, env = "RELAY_DELIVERY_RATE_PER_ACCOUNT", default_value_t = Quotas::default().account_deliveries.per_s)]
    delivery_rate_per_account: f64,
    /// Deliveries one account may make at once above its rate.
    #[arg(long, env = "RELAY_DELIVERY_BURST_PER_ACCOUNT", default_value_t = Quotas::default().account_deliveries.burst)]
    delivery_burst_per_account: f64,
    /// Endpoints one account may hold (handles on all its machines and spawned workers).
    #[arg(long, env = "RELAY_MAX_ENDPOINTS", default_value_t = Quotas::default().max_endpoints,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_endpoints: u32,
    /// Of those, the endpoints one machine's agents may hold (cards' endpoints apart), so one
    /// machine cannot take its whole account's.
    #[arg(long, env = "RELAY_MAX_ENDPOINTS_PER_MACHINE", default_value_t = Quotas::default().max_endpoints_per_machine,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_endpoints_per_machine: u32,
    /// Sessions (Hello) one machine may open a second, sustained (0: no limit).
    #[arg(long, env = "RELAY_HELLO_RATE_PER_MACHINE", default_value_t = Quotas::default().machine_hellos.per_s)]
    hello_rate_per_machine: f64,
    /// Sessions one machine may open at once above its rate.
    #[arg(long, env = "RELAY_HELLO_BURST_PER_MACHINE", default_value_t = Quotas::default().machine_hellos.burst)]
    hello_burst_per_machine: f64,
    /// Calls one credential (an agent's session, a machine's or a person's token) may make a second,
    /// sustained, reads included (0: no limit).
    #[arg(long, env = "RELAY_CALL_RATE_PER_CREDENTIAL", default_value_t = Quotas::default().credential_calls.per_s)]
    call_rate_per_credential: f64,
    /// Calls one credential may make at once above its rate.
    #[arg(long, env = "RELAY_CALL_BURST_PER_CREDENTIAL", default_value_t = Quotas::default().credential_calls.burst)]
    call_burst_per_credential: f64,
    /// Calls all of an account's credentials may make a second together, sustained (0: no limit).
    #[arg(long, env = "RELAY_CALL_RATE_PER_ACCOUNT", default_value_t = Quotas::default().account_calls.per_s)]
    call_rate_per_account: f64,
    /// Calls one account may make at once above its rate.
    #[arg(long, env = "RELAY_CALL_BURST_PER_ACCOUNT", default_value_t = Quotas::default().account_calls.burst)]
    call_burst_per_account: f64,
    /// Groups one account may hold.
    #[arg(long, env = "RELAY_MAX_GROUPS", default_value_t = Quotas::default().max_groups,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_groups: u32,
    /// Bytes one attached file may have.
    #[arg(long, env = "RELAY_MAX_FILE_BYTES", default_value_t = Quotas::default().files.file_bytes,
          value_parser = clap::value_parser!(u64).range(1..=relay_server::domain::artifact::MAX_FILE_BYTES_SETTING))]
    max_file_bytes: u64,
    /// Bytes all files of one message may have together.
    #[arg(long, env = "RELAY_MAX_MESSAGE_FILE_BYTES", default_value_t = Quotas::default().files.message_bytes,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_message_file_bytes: u64,
    /// Bytes an account's files may hold together: uploads waiting for their send, and the files
    /// its messages carry until retention takes them.
    #[arg(long, env = "RELAY_MAX_ACCOUNT_FILE_BYTES", default_value_t = Quotas::default().files.account_bytes,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_account_file_bytes: u64,
    /// Posts a new follower of a topic reads first: the topic's newest, up to this many…
    #[arg(long, env = "RELAY_TOPIC_BACKLOG_POSTS", default_value_t = Quotas::default().topic_backlog.posts)]
    topic_backlog_posts: u32,
    /// …and none older than this many seconds.
    #[arg(long, env = "RELAY_TOPIC_BACKLOG_S", default_value_t = Quotas::default().topic_backlog.max_age_s)]
    topic_backlog_s: u64,
}

impl From<QuotaArgs> for Quotas {
    fn from(a: QuotaArgs) -> Self {
        Self {
            endpoint_sends: Rate::new(a.send_rate_per_endpoint, a.send_burst_per_endpoint),
            account_sends: Rate::new(a.send_rate_per_account, a.send_burst_per_account),
            account_deliveries: Rate::new(a.delivery_rate_per_account, a.delivery_burst_per_account),
            max_endpoints: a.max_endpoints,
            max_endpoints_per_machine: a.max_endpoints_per_machine,
            machine_hellos: Rate::new(a.hello_rate_per_machine, a.hello_burst_per_machine),
            credential_calls: Rate::new(a.call_rate_per_credential, a.call_burst_per_credential),
            account_calls: Rate::new(a.call_rate_per_account, a.call_burst_per_account),
            max_groups: a.max_groups,
            files: relay_server::domain::artifact::Limits {
                file_bytes: a.max_file_bytes,
                message_bytes: a.max_message_file_bytes,
                account_bytes: a.max_account_file_bytes,
            },
            topic_backlog: relay_server::domain::topic::Backlog {
                posts: a.topic_backlog_posts,
                max_age_s: a.topic_backlog_s,
            },
            // Sign-in limits are not a setting: a person needs no more, a guesser gets no more.
            ..Quotas::default()
        }
    }
}

#[derive(Args)]
struct RetentionArgs {
    /// How long a message is kept once every recipient has read it (unread mail stays until read).
    #[arg(long, env = "RELAY_RETAIN_MESSAGES", default_value = "30d", value_parser = retention_parser)]
    retain_messages: std::time::Duration,
    /// How long a card is kept after it was closed in Done and its worktree cleaned up.
    #[arg(long, env = "RELAY_RETAIN_CARDS", default_value = "90d", value_parser = retention_parser)]
    retain_cards: std::time::Duration,
    /// How long the record of who peeked at whom is kept.
    #[arg(long, env = "RELAY_RETAIN_AUDIT", default_value = "90d", value_parser = retention_parser)]
    retain_audit: std::time::Duration,
}

/// A retention like `30d`, `12h` or `90s`: at least a second.
fn retention_parser(value: &str) -> Result<std::time::Duration, String> {
    let kept = humantime::parse_duration(value).map_err(|e| format!("{e}: write it like 30d, 12h or 90s"))?;
    if kept < std::time::Duration::from_secs(1) {
        return Err("a retention is at least 1s".into());
    }
    Ok(kept)
}

impl From<RetentionArgs> for Retention {
    fn from(a: RetentionArgs) -> Self {
        Self { messages: a.retain_messages, cards: a.retain_cards, audit: a.retain_audit }
    }
}

#[derive(Args)]
struct TimingArgs {
    /// Seconds the operator endpoint has to answer a permission request, and then the human as
    /// long again, before it is refused (1 to 3600).
    #[arg(long, env = "RELAY_APPROVAL_WAIT_S", default_value_t = APPROVAL_WAIT_S, value_parser = clap::value_parser!(u64).range(1..=3600))]
    approval_wait_s: u64,
    /// Seconds a worker's claim on a card lasts unless renewed; a worker that goes quiet loses its
    /// cards after it (at least 1).
    #[arg(long, env = "RELAY_LEASE_S", default_value_t = LEASE_S, value_parser = one_second_or_more)]
    lease_s: f64,
    /// Seconds between a worker's questions to the forge about one open pull request (at least 0.1).
    #[arg(long, env = "RELAY_PR_CHECK_S", default_value_t = PR_CHECK_S, value_parser = a_tenth_or_more)]
    pr_check_s: f64,
    /// Milliseconds between the scheduler's rounds on each replica: due schedules, permission
    /// requests, expired leases and purges (10 to 60000).
    #[arg(long, env = "RELAY_SCHEDULER_TICK_MS", default_value_t = SCHEDULER_TICK_MS, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    scheduler_tick_ms: u64,
}

fn one_second_or_more(value: &str) -> Result<f64, String> {
    at_least(value, 1.0)
}

fn a_tenth_or_more(value: &str) -> Result<f64, String> {
    at_least(value, 0.1)
}

/// A number of seconds, at least `min`.
fn at_least(value: &str, min: f64) -> Result<f64, String> {
    let seconds: f64 = value.parse().map_err(|_| format!("{value:?} is not a number of seconds"))?;
    if !seconds.is_finite() || seconds < min {
        return Err(format!("at least {min} s"));
    }
    Ok(seconds)
}

impl From<TimingArgs> for Timings {
    fn from(a: TimingArgs) -> Self {
        Self {
            approval_wait: std::time::Duration::from_secs(a.approval_wait_s),
            lease: std::time::Duration::from_secs_f64(a.lease_s),
            pr_check: std::time::Duration::from_secs_f64(a.pr_check_s),
            scheduler_tick: std::time::Duration::from_millis(a.scheduler_tick_ms),
        }
    }
}

#[derive(Args)]
struct ListenArgs {
    #[arg(long, env = "RELAY_LISTEN", default_value = "127.0.0.1:7447")]
    listen: SocketAddr,
    /// PEM certificate chain; enables TLS with --tls-key.
    #[arg(long, env = "RELAY_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "RELAY_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Allow plaintext on a non-loopback address (only behind a proxy that terminates TLS).
    #[arg(long)]
    insecure_plaintext: bool,
    /// Most connections this replica holds at once. When all are taken, a new one takes the place
    /// of the oldest that has not authenticated a call, or is closed. A connection that has not
    /// finished its setup (TLS, the HTTP/2 preface) within 5 s is closed too.
    #[arg(long, env = "RELAY_MAX_CONNECTIONS", default_value_t = connections::DEFAULT_MAX_CONNECTIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Most connections of one address that have not authenticated a call yet (behind a load
    /// balancer, every client has its address: raise it there).
    #[arg(long, env = "RELAY_MAX_CONNECTIONS_PER_ADDRESS",
          default_value_t = connections::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_address: u32,
    /// Most connections one account's calls hold (each agent holds one, a hook waiting for mail
    /// another); past it a connection's first call is refused. By default half the replica's.
    #[arg(long, env = "RELAY_MAX_CONNECTIONS_PER_ACCOUNT", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_account: Option<u32>,
    /// Most connections one credential holds (a machine's token opens its agents' sessions).
    #[arg(long, env = "RELAY_MAX_CONNECTIONS_PER_CREDENTIAL",
          default_value_t = connections::DEFAULT_MAX_CONNECTIONS_PER_CREDENTIAL as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_credential: u32,
    /// Browser Origins the MCP endpoint takes calls from, comma-separated (scheme://host[:port], `:*`
    /// for any port). A loopback endpoint also takes this machine's pages (localhost, 127.0.0.1,
    /// [::1]); calls without an Origin (agents) are never refused for it.
    #[arg(long, env = "RELAY_MCP_ALLOWED_ORIGINS", value_delimiter = ',', value_name = "ORIGIN,…")]
    mcp_allowed_origins: Vec<String>,
}

impl From<ListenArgs> for ListenOptions {
    fn from(a: ListenArgs) -> Self {
        Self {
            listen: a.listen,
            tls_cert: a.tls_cert,
            tls_key: a.tls_key,
            insecure_plaintext: a.insecure_plaintext,
            connections: connections::Limits {
                max: a.max_connections as usize,
                per_address: a.max_connections_per_address as usize,
                per_account: a.max_connections_per_account.map_or(a.max_connections as usize / 2, |n| n as usize),
                per_credential: a.max_connections_per_credential as usize,
            },
            mcp_allowed_origins: a.mcp_allowed_origins.into_iter().filter(|o| !o.trim().is_empty()).collect(),
        }
    }
}

#[derive(Subcommand)]
enum AdminArgs {
    /// Accounts: `account create NAME`.
    #[command(subcommand)]
    Account(AccountArgs),
    /// Machines: `machine add ACCOUNT/MACHINE` prints its token; `machine revoke ACCOUNT/MACHINE`.
    #[command(subcommand)]
    Machine(MachineArgs),
    /// Contacts between accounts: `contact add ACCOUNT ACCOUNT`, `contact drop ACCOUNT ACCOUNT`.
    #[command(subcommand)]
    Contact(ContactArgs),
    /// An account's people: `human add ACCOUNT` prints a human token; `human revoke ACCOUNT NAME`.
    #[command(subcommand)]
    Human(HumanArgs),
    /// Name the account's operator endpoint (MACHINE/HANDLE): it reviews cards and adds repositories.
    Operator { account: String, endpoint: String },
    /// An account's topics: `topic open ACCOUNT/#NAME` lets its contacts' agents follow it;
    /// `topic close ACCOUNT/#NAME` lets none follow it anew.
    #[command(subcommand)]
    Topic(TopicArgs),
    /// The account's loop guard: past MESSAGES between two agents within WINDOW_S seconds, or
    /// DEPTH in one thread, with no person in between, their messages are held for a person.
    LoopGuard {
        account: String,
        #[arg(long, default_value_t = 30)]
        messages: u32,
        #[arg(long, default_value_t = 60)]
        window_s: u32,
        #[arg(long, default_value_t = 40)]
        depth: u32,
    },
}

#[derive(Subcommand)]
enum TopicArgs {
    Open { topic: String },
    Close { topic: String },
}

#[derive(Subcommand)]
enum HumanArgs {
    /// Issue a human token for the account (alone on stdout, shown once).
    Add {
        account: String,
        #[arg(long, default_value = "owner")]
        name: String,
    },
    Revoke {
        account: String,
        name: String,
    },
}

#[derive(Subcommand)]
enum AccountArgs {
    Create { name: String },
}

#[derive(Subcommand)]
enum MachineArgs {
    /// Register a machine and print its token (alone on stdout, shown once).
    Add { machine: String },
    /// Revoke a machine's token; its sessions end and its next call is refused.
    Revoke { machine: String },
}

#[derive(Subcommand)]
enum ContactArgs {
    /// Make two accounts mutual contacts.
    Add { first: String, second: String },
    /// End a contact; messages between the two that no agent has seen yet are withdrawn.
    Drop { first: String, second: String },
}

impl From<AdminArgs> for AdminCommand {
    fn from(a: AdminArgs) -> Self {
        match a {
            AdminArgs::Account(AccountArgs::Create { name }) => Self::CreateAccount { name },
            AdminArgs::Machine(MachineArgs::Add { machine }) => Self::AddMachine { path: machine },
            AdminArgs::Machine(MachineArgs::Revoke { machine }) => Self::RevokeMachine { path: machine },
            AdminArgs::Contact(ContactArgs::Add { first, second }) => Self::AddContact { first, second },
            AdminArgs::Contact(ContactArgs::Drop { first, second }) => Self::DropContact { first, second },
            AdminArgs::Human(HumanArgs::Add { account, name }) => Self::AddHuman { account, name },
            AdminArgs::Human(HumanArgs::Revoke { account, name }) => Self::RevokeHuman { account, name },
            AdminArgs::Operator { account, endpoint } => Self::SetOperator { account, endpoint },
            AdminArgs::Topic(TopicArgs::Open { topic }) => Self::OpenTopic { topic, open: true },
            AdminArgs::Topic(TopicArgs::Close { topic }) => Self::OpenTopic { topic, open: false },
            AdminArgs::LoopGuard { account, messages, window_s, depth } => {
                Self::LoopGuard { account, messages, window_s, depth }
            }
        }
    }
}

/// A line for the person running a command; with JSON logs, a log line like the others.
fn say(format: LogFormat, line: &str) {
    match format {
        LogFormat::Json => tracing::info!("{line}"),
        LogFormat::Text => eprintln!("{line}"),
    }
}

/// Crates whose debug output carries what agents and people sent (the database client logs every
/// statement's parameters: bodies, token hashes; the MCP SDK every message it reads and writes):
/// held at info, whatever RELAY_LOG asks.
const KEPT_QUIET: [&str; 3] = ["tokio_postgres", "postgres_protocol", "rmcp"];

fn init_logging(format: LogFormat, default: &str) {
    use tracing_subscriber::filter::{FilterExt, LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, fmt, registry};
    // The MCP SDK logs every session's start and end at info: its warnings are what an operator needs.
    let asked = EnvFilter::try_from_env("RELAY_LOG").unwrap_or_else(|_| EnvFilter::new(format!("{default},rmcp=warn")));
    // A filter of its own, so that no directive of RELAY_LOG's can lift it.
    let quiet =
        Targets::new().with_default(LevelFilter::TRACE).with_targets(KEPT_QUIET.map(|t| (t, LevelFilter::INFO)));
    let filter = asked.and(quiet);
    let lines = fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Json => {
            registry().with(lines.json().with_current_span(true).with_span_list(true).with_filter(filter)).init()
        }
        // Colour only for a person at a terminal: journald and kubectl logs get plain lines.
        LogFormat::Text => {
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            registry().with(lines.with_ansi(ansi).with_filter(filter)).init()
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { serve } => {
            init_logging(cli.log_format, "info");
            let ServeArgs { db, listen, limits, settings, ops_listen, console_listen, mcp_listen } = serve;
            let listen = ListenOptions::from(listen);
            listen.tls()?;
            let ops = match ops_listen {
                Some(Listen::At(addr)) => Some(ops::bind(addr).await?),
                Some(Listen::Off) | None => None,
            };
            let console = match console_listen {
                Some(Listen::At(addr)) => {
                    listen.check_console(addr)?;
                    Some(console::bind(addr).await?)
                }
                Some(Listen::Off) | None => None,
            };
            let mcp = match mcp_listen {
                Some(Listen::At(addr)) => {
                    listen.check_mcp(addr)?;
                    Some(mcp::bind(addr).await?)
                }
                Some(Listen::Off) | None => None,
            };
            let store = serve::open_store(db.config()?).await?.with_max_unread(limits.max_unread);
            let settings = Settings::from(settings);
            let side = SideListeners { ops, console, mcp };
            serve::serve(store, &listen, settings, side, serve::termination()).await
        }
        Command::Migrate { db } => {
            init_logging(cli.log_format, "info");
            serve::open_store(db.config()?).await?;
            say(cli.log_format, "database schema is up to date");
            Ok(())
        }
        Command::Dev { serve, data_dir, pg_bin } => {
            init_logging(cli.log_format, "info");
            let ServeArgs { db, listen, limits, settings, ops_listen, console_listen, mcp_listen } = serve;
            dev::run(DevOptions {
                listen: listen.into(),
                database_url: db.url()?,
                data_dir,
                pg_bin,
                pool_size: db.db_pool_size,
                max_unread: limits.max_unread,
                settings: settings.into(),
                ops_listen,
                console_listen,
                mcp_listen,
            })
            .await
        }
        Command::Admin { db, data_dir, command } => {
            init_logging(cli.log_format, "warn");
            let store = match db.url()? {
                Some(_) => serve::open_store(db.config()?).await?,
                None => {
                    let config = dev::running_database(data_dir, db.db_pool_size)?;
                    serve::open_store(config).await.context("cannot use the dev server's database")?
                }
            };
            admin::run(&store, command.into()).await
        }
    }
}

/// Whether the command line itself carries a database password (`--database-url`, not the
/// `DATABASE_URL` it falls back to): every user of the machine can read it with `ps`.
fn password_in_argv(matches: &clap::ArgMatches) -> bool {
    let Some((_, command)) = matches.subcommand() else { return false };
    let Ok(Some(url)) = command.try_get_one::<String>("database_url") else { return false };
    command.value_source("database_url") == Some(ValueSource::CommandLine) && DbConfig::has_password(url)
}

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    if password_in_argv(&matches) {
        eprintln!(
            "relay-server: warning: the password in --database-url is visible to every user of this machine (ps shows command lines); set DATABASE_URL in the environment instead, e.g. from a file only the server's user can read (a systemd EnvironmentFile)"
        );
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let format = cli.log_format;
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            match format {
                LogFormat::Json => tracing::error!(error = format!("{err:#}"), "relay-server stopped"),
                LogFormat::Text => eprintln!("relay-server: {err:#}"),
            }
            ExitCode::FAILURE
        }
    }
}
