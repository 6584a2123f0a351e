//! `relay-server admin`: operator commands straight against the database.

use crate::app::identity;
use crate::store::Store;

pub enum AdminCommand {
    CreateAccount { name: String },
    AddMachine { path: String },
    RevokeMachine { path: String },
    AddContact { first: String, second: String },
    DropContact { first: String, second: String },
    AddHuman { account: String, name: String },
    RevokeHuman { account: String, name: String },
    SetOperator { account: String, endpoint: String },
    LoopGuard { account: String, messages: u32, window_s: u32, depth: u32 },
    OpenTopic { topic: String, open: bool },
}

/// Runs one command. Only a new token goes to stdout; confirmations go to stderr.
pub async fn run(store: &Store, command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::CreateAccount { name } => {
            identity::create_account(store, &name).await?;
            eprintln!("created account {name}");
        }
        AdminCommand::AddMachine { path } => {
            let token = identity::add_machine(store, &path).await?;
            println!("{token}");
            eprintln!(
                "machine {path} added; this token is shown once: give it to `agent-bridge login` on that machine"
            );
        }
        AdminCommand::RevokeMachine { path } => {
            identity::revoke_machine(store, &path).await?;
            eprintln!("revoked machine {path}; its sessions have ended");
        }
        AdminCommand::AddContact { first, second } => {
            identity::add_contact(store, &first, &second).await?;
            eprintln!("{first} and {second} are now contacts");
        }
        AdminCommand::DropContact { first, second } => {
            let view = crate::app::trust::drop_contact(store, &first, &second).await?;
            eprintln!("{first} and {second} are no longer contacts; {} undelivered messages withdrawn", view.withdrawn);
        }
        AdminCommand::AddHuman { account, name } => {
            let token = crate::app::trust::add_human(store, &account, &name).await?;
            println!("{token}");
            eprintln!("human {name} of {account} added; this token is shown once: it manages the account's contacts");
        }
        AdminCommand::SetOperator { account, endpoint } => {
            crate::domain::board::operator_endpoint(&endpoint)?;
            crate::store::board::set_operator(&store.client().await?, &account, &endpoint).await?;
            eprintln!("{account}/{endpoint} is the operator of {account}'s board");
        }
        AdminCommand::LoopGuard { account, messages, window_s, depth } => {
            let settings = crate::domain::loops::Settings::new(messages, window_s, depth)?;
            if !crate::store::loops::set_settings(&store.client().await?, &account, settings).await? {
                anyhow::bail!("no account {account:?}");
            }
            eprintln!(
                "{account}'s loop guard: more than {messages} messages between two agents within {window_s} s, \
                 or {depth} in one thread, are held for a person"
            );
        }
        AdminCommand::OpenTopic { topic, open } => {
            let named = crate::domain::topic::TopicRef::parse(&topic)?;
            let account = named
                .account
                .ok_or_else(|| anyhow::anyhow!("name the topic with its account: ACCOUNT/#{}", named.name))?;
            if !crate::store::topics::set_open(&store.client().await?, &account, &named.name, open).await? {
                anyhow::bail!(
                    "no topic {account}/#{}: a topic is made when an agent first follows or posts to it",
                    named.name
                );
            }
            if open {
                eprintln!("{account}/#{} is open to {account}'s contacts: their agents may follow it", named.name);
            } else {
                eprintln!("{account}/#{} is {account}'s alone: no contact's agent may follow it anew", named.name);
            }
        }
        AdminCommand::RevokeHuman { account, name } => {
            crate::app::trust::revoke_human(store, &account, &name).await?;
            eprintln!("revoked human {name} of {account}");
        }
    }
    Ok(())
}
