//! The end-of-turn hooks of clients that cannot be woken from outside: Codex's Stop hook, Gemini
//! CLI's AfterAgent hook and Cursor's stop hook. Each asks the server, at once, for mail the model
//! has not been shown; when there is some, it answers the client in its own words with a notice,
//! which gives the model one more turn. The server marks what it names surfaced in the same
//! statement, so the next end of turn finds nothing new and lets the turn end: no mail is delivered
//! twice and no hook loops.

use serde_json::{Value, json};

use super::notice::{self, Client as NoticeClient};
use super::{Agent, wake};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    Codex,
    Gemini,
    Cursor,
}

pub async fn run(client: Client, _event: Value) -> anyhow::Result<()> {
    let Some(agent) = Agent::find() else { return Ok(()) };
    let announcement = wake::announce(&agent.replicas, agent.token(), false).await?.unwrap_or_default();
    if let Some(text) = notice::text(client.notice(), agent.address(), &announcement) {
        println!("{}", answer(client, text));
    }
    Ok(())
}

impl Client {
    fn notice(self) -> NoticeClient {
        match self {
            Self::Codex => NoticeClient::Codex,
            Self::Gemini => NoticeClient::Gemini,
            Self::Cursor => NoticeClient::Cursor,
        }
    }
}

/// What the hook prints for a notice, in the words each client reads: Codex's Stop hook blocks
/// the stop with a reason, Gemini's AfterAgent denies the end with one (both become the next
/// prompt), Cursor's stop hook sends a follow-up message.
fn answer(client: Client, notice: String) -> Value {
    match client {
        Client::Codex => json!({ "decision": "block", "reason": notice }),
        Client::Gemini => json!({ "decision": "deny", "reason": notice }),
        Client::Cursor => json!({ "followup_message": notice }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_gets_the_notice_in_its_own_words() {
        let notice = "<relay-mail>…</relay-mail>".to_owned();
        assert_eq!(answer(Client::Codex, notice.clone()), json!({ "decision": "block", "reason": notice }));
        assert_eq!(answer(Client::Gemini, notice.clone()), json!({ "decision": "deny", "reason": notice }));
        assert_eq!(answer(Client::Cursor, notice.clone()), json!({ "followup_message": notice }));
    }
}
