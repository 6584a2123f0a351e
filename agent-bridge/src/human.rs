//! `agent-bridge human …`: what an account's person does from a terminal.

use anyhow::Context;
use clap::Subcommand;
use relay_proto::bridge_config;
use relay_proto::v1::human_client::HumanClient;
use relay_proto::v1::*;

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
        HumanCommand::Contact(command) => {
            let token = config
                .human_token
                .context("no human token: run `agent-bridge human login --token …` or set RELAY_HUMAN_TOKEN")?;
            let view = match command {
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
