//! `relay-server admin`: operator commands straight against the database.

use crate::store::Store;

pub enum AdminCommand {
    CreateAccount { name: String },
    AddMachine { path: String },
    RevokeMachine { path: String },
    AddContact { first: String, second: String },
}

/// Runs one command. Only a machine token goes to stdout; confirmations go to stderr.
pub async fn run(store: &Store, command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::CreateAccount { name } => {
            store.create_account(&name).await?;
            eprintln!("created account {name}");
        }
        AdminCommand::AddMachine { path } => {
            let token = store.add_machine(&path).await?;
            println!("{token}");
            eprintln!(
                "machine {path} added; this token is shown once: give it to `agent-bridge login` on that machine"
            );
        }
        AdminCommand::RevokeMachine { path } => {
            store.revoke_machine(&path).await?;
            eprintln!("revoked machine {path}; its sessions have ended");
        }
        AdminCommand::AddContact { first, second } => {
            store.add_contact(&first, &second).await?;
            eprintln!("{first} and {second} are now contacts");
        }
    }
    Ok(())
}
