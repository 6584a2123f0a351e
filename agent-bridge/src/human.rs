//! `agent-bridge human …`: what an account's person does from a terminal.

use clap::Subcommand;
use relay_proto::v1::human_client::HumanClient;
use relay_proto::v1::*;

use crate::connection;
use relay_agent::frame::{short, visible};
use relay_agent::relay::replicas::Replicas;
use relay_agent::relay::session::authed;

#[derive(Subcommand)]
pub enum HumanCommand {
    /// Check a human token (from `relay-server admin human add`) and keep it for these commands, in
    /// a file of its own (mode 0600). The token is read from RELAY_HUMAN_TOKEN, else stdin (a prompt
    /// on a terminal). No machine login is needed.
    Login {
        /// The server, or its replicas comma-separated (default: RELAY_SERVER, else the one this
        /// computer's bridge uses).
        #[arg(long)]
        server: Option<String>,
        /// A PEM certificate to trust for the server, beside the system's roots (default: RELAY_CA).
        #[arg(long)]
        ca: Option<std::path::PathBuf>,
        /// The token itself; visible to other users in the process list, so prefer stdin.
        #[arg(long)]
        token: Option<String>,
    },
    /// Contacts with other accounts.
    #[command(subcommand)]
    Contact(ContactCommand),
    /// Messages to the account's human inbox (`me`); marks them read.
    Inbox {
        /// Seconds to wait for one when there are none.
        #[arg(long, default_value_t = 0)]
        wait: u32,
    },
    /// Send as the account's human.
    Send {
        to: String,
        body: String,
        /// The body is private data.
        #[arg(long)]
        private: bool,
    },
    /// Reply to a message in the human inbox (id, short id, unique suffix, or last).
    Reply { id: String, body: String },
    /// Messages held for the human; with --all, decided ones too.
    Holds {
        #[arg(long)]
        all: bool,
    },
    /// Deliver a held message.
    Release { id: String },
    /// Refuse a held message; its sender reads the reason.
    Reject {
        id: String,
        #[arg(long)]
        reason: String,
    },
    /// Board agents' permission requests waiting for an answer.
    Approvals,
    /// Answer a permission request: allow or deny.
    Approve {
        id: String,
        #[arg(value_parser = ["allow", "deny"])]
        decision: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Which messages wait for the human: `hold-policy contact on`, `hold-policy private-outbound off`.
    HoldPolicy {
        class: String,
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
}

#[derive(Subcommand)]
pub enum ContactCommand {
    /// Ask another account for a contact (made at once if it already asked you).
    Request { account: String },
    /// Accept another account's request.
    Accept { account: String },
    /// Contacts, and requests made and received.
    List,
    /// End a contact: reach is cut at once and undelivered messages are withdrawn.
    Drop { account: String },
    /// Allow or forbid private data across a contact.
    Private {
        account: String,
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
}

fn client_id() -> String {
    use rand::Rng;
    let bytes: [u8; 12] = rand::rng().random();
    format!("h_{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn print_sent(sent: &SendResponse) {
    let to: Vec<&str> = sent.recipients.iter().map(|r| r.address.as_str()).collect();
    println!("sent {} to {}", short(&sent.id), to.join(", "));
    for r in &sent.redactions {
        println!("redacted {} {} span(s) before delivery", r.count, r.kind);
    }
}

/// A failed call, as a person reads it.
fn refused(ca: Option<&str>) -> impl Fn(tonic::Status) -> anyhow::Error + '_ {
    move |status| match relay_agent::relay::replicas::untrusted_certificate(&status, ca) {
        Some(why) => anyhow::anyhow!("{why}"),
        None => anyhow::anyhow!("{}", status.message()),
    }
}

async fn login(server: Option<String>, ca: Option<std::path::PathBuf>, token: Option<String>) -> anyhow::Result<()> {
    // --ca, else RELAY_CA, whether the server comes from --server or not; kept as an absolute path
    // so the stored login works from any directory.
    let given = ca
        .or_else(|| std::env::var_os("RELAY_CA").filter(|v| !v.is_empty()).map(std::path::PathBuf::from))
        .map(|p| std::path::absolute(&p).unwrap_or(p).display().to_string());
    let (server, ca) = match server {
        Some(server) => (server, given),
        None => {
            let (server, known_ca) = connection::human_server()?;
            (server, given.or(known_ca))
        }
    };
    let token = match token {
        Some(token) => {
            eprintln!("note: a token in argv is visible to every user of this machine; pipe it in instead");
            token.trim().to_owned()
        }
        None => connection::read_secret("human token", "RELAY_HUMAN_TOKEN")?,
    };
    let replicas = Replicas::new(&server, ca.as_deref())?;
    // Stored as checked: each replica's URL once, in the order given.
    let server = replicas.list_from(0);
    let mut client = HumanClient::new(replicas.reachable().await);
    client.contact_list(authed(ContactListRequest {}, &token)).await.map_err(refused(ca.as_deref()))?;
    let path = connection::human_config_path()?;
    connection::write_human(&path, &connection::HumanConfig { server: server.clone(), ca, token })?;
    println!("logged in to {server} as your account's human; token kept in {}", path.display());
    Ok(())
}

pub async fn run(command: HumanCommand) -> anyhow::Result<()> {
    if let HumanCommand::Login { server, ca, token } = command {
        return login(server, ca, token).await;
    }
    let (server, ca, token) = connection::human_credentials()?;
    let mut client = HumanClient::new(Replicas::new(&server, ca.as_deref())?.reachable().await);
    let refused = refused(ca.as_deref());
    match command {
        HumanCommand::Login { .. } => unreachable!("handled above"),
        HumanCommand::Inbox { wait } => {
            let reply = client
                .inbox(authed(InboxRequest { wait_s: wait, ack: true, limit: 0 }, &token))
                .await
                .map_err(&refused)?;
            let reply = reply.into_inner();
            if reply.messages.is_empty() {
                println!("no unread messages");
            }
            for m in reply.messages {
                let mark = if m.require_reply { "  (reply required)" } else { "" };
                // Bodies are other agents' text: nothing in them may steer the terminal.
                println!(
                    "{}  from {}  thread {}{mark}\n{}\n",
                    visible(short(&m.id)),
                    visible(&m.from),
                    visible(&m.thread),
                    visible(&m.body)
                );
            }
            if reply.remaining > 0 {
                println!("{} more unread", reply.remaining);
            }
        }
        HumanCommand::Send { to, body, private } => {
            let request = SendRequest { to: vec![to], body, private, client_id: client_id(), ..Default::default() };
            let sent = client.send(authed(request, &token)).await.map_err(&refused)?.into_inner();
            print_sent(&sent);
        }
        HumanCommand::Reply { id, body } => {
            let request = ReplyRequest { id, body, client_id: client_id() };
            let sent = client.reply(authed(request, &token)).await.map_err(&refused)?.into_inner();
            print_sent(&sent);
        }
        HumanCommand::Holds { all } => {
            let holds = client.holds(authed(HoldsRequest { all }, &token)).await.map_err(&refused)?.into_inner().holds;
            if holds.is_empty() {
                println!("{}", if all { "no held messages, decided or not" } else { "no held messages waiting" });
            }
            for h in holds {
                let reason = if h.reason.is_empty() { String::new() } else { format!(" ({})", visible(&h.reason)) };
                println!(
                    "{}  {}  {}{reason}  from {} to {}\n{}\n",
                    h.id,
                    h.state,
                    h.class,
                    h.from,
                    h.to.join(", "),
                    visible(&h.body)
                );
            }
        }
        HumanCommand::Release { id } => {
            let request = DecideHoldRequest { id, release: true, reason: String::new() };
            let view = client.decide_hold(authed(request, &token)).await.map_err(&refused)?.into_inner();
            println!("hold {} released: delivered to {}; its sender is told", view.id, view.to.join(", "));
        }
        HumanCommand::Reject { id, reason } => {
            let request = DecideHoldRequest { id, release: false, reason };
            let view = client.decide_hold(authed(request, &token)).await.map_err(&refused)?.into_inner();
            println!("hold {} rejected: nobody gets the message, and its sender reads your reason", view.id);
        }
        HumanCommand::Approvals => {
            let list =
                client.approvals(authed(ApprovalsRequest {}, &token)).await.map_err(&refused)?.into_inner().approvals;
            if list.is_empty() {
                println!("no permission requests waiting");
            }
            for a in list {
                println!(
                    "{}  {}  {} on card {} wants {}: {}",
                    a.id,
                    a.state,
                    a.requester,
                    a.job_id,
                    visible(&a.tool),
                    visible(&a.input)
                );
            }
        }
        HumanCommand::Approve { id, decision, reason } => {
            let request = AnswerPermissionRequest { id, decision, reason };
            let d = client.approve(authed(request, &token)).await.map_err(&refused)?.into_inner();
            println!("request {} answered: {}", d.id, d.state);
        }
        HumanCommand::HoldPolicy { class, state } => {
            let request = HoldPolicyRequest { class, on: state == "on" };
            let classes = client.hold_policy(authed(request, &token)).await.map_err(&refused)?.into_inner().classes;
            println!(
                "held for the human: {}",
                if classes.is_empty() { "nothing".to_owned() } else { classes.join(", ") }
            );
        }
        HumanCommand::Contact(command) => contact(&mut client, &token, command, &refused).await?,
    }
    Ok(())
}

async fn contact(
    client: &mut HumanClient<tonic::transport::Channel>,
    token: &str,
    command: ContactCommand,
    refused: &impl Fn(tonic::Status) -> anyhow::Error,
) -> anyhow::Result<()> {
    let view = match command {
        ContactCommand::List => {
            let contacts =
                client.contact_list(authed(ContactListRequest {}, token)).await.map_err(refused)?.into_inner().contacts;
            if contacts.is_empty() {
                println!("no contacts, and no requests made or received");
            }
            for c in contacts {
                println!("{}\t{}", c.account, c.state);
            }
            return Ok(());
        }
        ContactCommand::Private { account, state } => {
            let request = ContactPrivateRequest { account, allow: state == "on" };
            let view = client.contact_private(authed(request, token)).await.map_err(refused)?.into_inner();
            let allowed = if state == "on" { "may now carry" } else { "may no longer carry" };
            println!("the contact with {} {allowed} private data", view.account);
            return Ok(());
        }
        ContactCommand::Request { account } => {
            client.contact_request(authed(ContactRequestRequest { account }, token)).await.map_err(refused)?
        }
        ContactCommand::Accept { account } => {
            client.contact_accept(authed(ContactAcceptRequest { account }, token)).await.map_err(refused)?
        }
        ContactCommand::Drop { account } => {
            client.contact_drop(authed(ContactDropRequest { account }, token)).await.map_err(refused)?
        }
    }
    .into_inner();
    match view.state.as_str() {
        "none" => println!(
            "contact with {} dropped: their agents are out of reach now, and {} undelivered messages were withdrawn",
            view.account, view.withdrawn
        ),
        "contact" => println!("contact with {} made: your agents and theirs may now message each other", view.account),
        "requested" => println!("asked {} for a contact: it is made when their human accepts", view.account),
        state => println!("contact with {}: {state}", view.account),
    }
    Ok(())
}
