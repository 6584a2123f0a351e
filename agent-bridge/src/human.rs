//! `agent-bridge human …`: what an account's person does from a terminal.

use anyhow::Context;
use clap::Subcommand;
use relay_proto::bridge_config;
use relay_proto::v1::human_client::HumanClient;
use relay_proto::v1::*;

use crate::frame::visible;
use crate::relay::connection;
use crate::relay::session::authed;

#[derive(Subcommand)]
pub enum HumanCommand {
    /// Store a human token (from `relay-server admin human add`) in the bridge config.
    Login {
        #[arg(long)]
        token: String,
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

fn human_token(config: &relay_proto::bridge_config::BridgeConfig) -> anyhow::Result<String> {
    config
        .human_token
        .clone()
        .context("no human token: run `agent-bridge human login --token …` or set RELAY_HUMAN_TOKEN")
}

fn client_id() -> String {
    use rand::Rng;
    let bytes: [u8; 12] = rand::rng().random();
    format!("h_{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn print_sent(sent: &SendResponse) {
    let to: Vec<&str> = sent.recipients.iter().map(|r| r.address.as_str()).collect();
    println!("sent {} to {}", &sent.id[..8], to.join(", "));
    for r in &sent.redactions {
        println!("redacted {} {} span(s) before delivery", r.count, r.kind);
    }
}

pub async fn run(command: HumanCommand) -> anyhow::Result<()> {
    let config = connection::resolve()?;
    let channel = connection::channel(&config.server, config.ca.as_deref())?;
    let mut client = HumanClient::new(channel);
    let refused = |s: tonic::Status| anyhow::anyhow!("{}", s.message());
    match command {
        HumanCommand::Login { token } => {
            let token = token.trim().to_owned();
            client.contact_list(authed(ContactListRequest {}, &token)).await.map_err(refused)?;
            let path = bridge_config::default_path()?;
            let mut stored = bridge_config::read(&path).context("log the machine in first: agent-bridge login")?;
            stored.human_token = Some(token);
            bridge_config::write(&path, &stored)?;
            eprintln!("human token stored in {}", path.display());
        }
        HumanCommand::Inbox { wait } => {
            let token = human_token(&config)?;
            let reply = client
                .inbox(authed(InboxRequest { wait_s: wait, ack: true, limit: 0 }, &token))
                .await
                .map_err(refused)?;
            let reply = reply.into_inner();
            if reply.messages.is_empty() {
                println!("no unread messages");
            }
            for m in reply.messages {
                let mark = if m.require_reply { "  (reply required)" } else { "" };
                // Bodies are other agents' text: nothing in them may steer the terminal.
                println!(
                    "{}  from {}  thread {}{mark}\n{}\n",
                    &m.id[..8],
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
            let token = human_token(&config)?;
            let request = SendRequest { to: vec![to], body, private, client_id: client_id(), ..Default::default() };
            let sent = client.send(authed(request, &token)).await.map_err(refused)?.into_inner();
            print_sent(&sent);
        }
        HumanCommand::Reply { id, body } => {
            let token = human_token(&config)?;
            let request = ReplyRequest { id, body, client_id: client_id() };
            let sent = client.reply(authed(request, &token)).await.map_err(refused)?.into_inner();
            print_sent(&sent);
        }
        HumanCommand::Holds { all } => {
            let token = human_token(&config)?;
            let holds = client.holds(authed(HoldsRequest { all }, &token)).await.map_err(refused)?.into_inner().holds;
            if holds.is_empty() {
                println!("no held messages");
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
            let token = human_token(&config)?;
            let view = client
                .decide_hold(authed(DecideHoldRequest { id, release: true, reason: String::new() }, &token))
                .await;
            let view = view.map_err(refused)?.into_inner();
            println!("{}\t{}", view.id, view.state);
        }
        HumanCommand::Reject { id, reason } => {
            let token = human_token(&config)?;
            let view = client.decide_hold(authed(DecideHoldRequest { id, release: false, reason }, &token)).await;
            let view = view.map_err(refused)?.into_inner();
            println!("{}\t{}", view.id, view.state);
        }
        HumanCommand::Approvals => {
            let token = human_token(&config)?;
            let list =
                client.approvals(authed(ApprovalsRequest {}, &token)).await.map_err(refused)?.into_inner().approvals;
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
            let token = human_token(&config)?;
            let request = AnswerPermissionRequest { id, decision, reason };
            let d = client.approve(authed(request, &token)).await.map_err(refused)?.into_inner();
            println!("{}\t{}", d.id, d.state);
        }
        HumanCommand::HoldPolicy { class, state } => {
            let token = human_token(&config)?;
            let request = HoldPolicyRequest { class, on: state == "on" };
            let classes = client.hold_policy(authed(request, &token)).await.map_err(refused)?.into_inner().classes;
            println!(
                "held for the human: {}",
                if classes.is_empty() { "nothing".to_owned() } else { classes.join(", ") }
            );
        }
        HumanCommand::Contact(command) => {
            let token = human_token(&config)?;
            let view = match command {
                ContactCommand::Private { account, state } => {
                    let request = ContactPrivateRequest { account, allow: state == "on" };
                    client.contact_private(authed(request, &token)).await.map_err(refused)?
                }
                ContactCommand::Request { account } => {
                    client.contact_request(authed(ContactRequestRequest { account }, &token)).await.map_err(refused)?
                }
                ContactCommand::Accept { account } => {
                    client.contact_accept(authed(ContactAcceptRequest { account }, &token)).await.map_err(refused)?
                }
                ContactCommand::Drop { account } => {
                    client.contact_drop(authed(ContactDropRequest { account }, &token)).await.map_err(refused)?
                }
                ContactCommand::List => {
                    let list = client.contact_list(authed(ContactListRequest {}, &token)).await.map_err(refused)?;
                    for c in list.into_inner().contacts {
                        println!("{}\t{}", c.account, c.state);
                    }
                    return Ok(());
                }
            }
            .into_inner();
            match view.state.as_str() {
                "none" => println!("{}\tnone\t{} undelivered messages withdrawn", view.account, view.withdrawn),
                state => println!("{}\t{state}", view.account),
            }
        }
    }
    Ok(())
}
