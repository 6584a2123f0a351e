//! Who is calling, as authentication established it: a machine, a card's agent, an endpoint's
//! session, or an account's person. Everything the server does on a caller's behalf starts from
//! one of these.

use super::address::Address;
use super::ids::{self, AccountId, EndpointId, JobId, MachineId, TokenHash, TokenKind};
use super::{Error, Result};

/// A machine, as authenticated by its machine token.
#[derive(Debug, Clone)]
pub struct MachineIdentity {
    pub account_id: AccountId,
    pub account: String,
    pub machine_id: MachineId,
    pub machine: String,
}

/// One attempt at a board card, named by its job token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub card: JobId,
    pub token_hash: TokenHash,
}

/// A card's agent, as authenticated by the job token of the card's attempt in progress: it may
/// claim the card's endpoint on the machine that leased the card, and nothing else.
#[derive(Debug, Clone)]
pub struct CardAgent {
    pub machine: MachineIdentity,
    pub attempt: Attempt,
}

/// The endpoint behind an authenticated session: the sender of everything it sends.
#[derive(Debug, Clone)]
pub struct Caller {
    pub endpoint_id: EndpointId,
    pub account_id: AccountId,
    pub account: String,
    pub machine_id: MachineId,
    pub machine: String,
    pub handle: String,
    pub session_hash: TokenHash,
    /// Set when a job token opened the session: the session is the card's agent, and ends with
    /// the attempt.
    pub attempt: Option<Attempt>,
}

impl Caller {
    pub fn address(&self) -> String {
        Address { account: self.account.clone(), machine: self.machine.clone(), handle: self.handle.clone() }
            .to_string()
    }

    /// Refuses what a card's agent may not do (`what` names it): an agent reading card text acts
    /// only as its card's endpoint, never on other endpoints or for the machine.
    pub fn not_card_agent(&self, what: &str) -> Result<()> {
        match &self.attempt {
            Some(attempt) => Err(Error::PermissionDenied(format!(
                "{what} is not for a card's agent: {} acts only as the endpoint of card {}, with its job token",
                self.address(),
                attempt.card
            ))),
            None => Ok(()),
        }
    }

    /// The job token hash a call about a card acts under: a card's agent's own attempt (a token
    /// the request names must be that one), else the token the request carries. `None` when
    /// neither names an attempt.
    pub fn attempt_hash(&self, job_token: &str) -> Result<Option<TokenHash>> {
        let job_token = job_token.trim();
        let named = if job_token.is_empty() {
            None
        } else {
            ids::check_token(TokenKind::JobToken, job_token)?;
            Some(ids::token_hash(job_token))
        };
        match (&self.attempt, named) {
            (Some(own), Some(named)) if named != own.token_hash => Err(Error::PermissionDenied(format!(
                "this session is the agent of card {}: it cannot act with another card's job token",
                own.card
            ))),
            (Some(own), _) => Ok(Some(own.token_hash.clone())),
            (None, named) => Ok(named),
        }
    }
}

/// A person of an account, as authenticated by a human token.
/// Whose credential a call presents: what its budgets and call rates belong to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Holder {
    Endpoint(EndpointId),
    Machine(MachineId),
    Person(AccountId, String),
}

#[derive(Debug, Clone)]
pub struct Human {
    pub account_id: AccountId,
    pub account: String,
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(attempt: Option<Attempt>) -> Caller {
        Caller {
            endpoint_id: EndpointId(1),
            account_id: AccountId(1),
            account: "acme".into(),
            machine_id: MachineId(1),
            machine: "ci".into(),
            handle: "job-abc".into(),
            session_hash: TokenHash::from_stored(vec![1]),
            attempt,
        }
    }

    #[test]
    fn a_card_agent_acts_for_its_own_attempt_only() {
        let token = ids::new_token(TokenKind::JobToken);
        let own = Attempt { card: JobId::new("abc"), token_hash: ids::token_hash(&token) };
        let agent = caller(Some(own.clone()));
        assert_eq!(agent.attempt_hash("").unwrap(), Some(own.token_hash.clone()));
        assert_eq!(agent.attempt_hash(&token).unwrap(), Some(own.token_hash.clone()));
        let other = agent.attempt_hash(&ids::new_token(TokenKind::JobToken)).unwrap_err();
        assert!(matches!(other, Error::PermissionDenied(_)), "{other}");
        assert!(agent.not_card_agent("spawning a worker").unwrap_err().to_string().contains("card abc"));

        let machine_agent = caller(None);
        assert_eq!(machine_agent.attempt_hash("").unwrap(), None);
        assert_eq!(machine_agent.attempt_hash(&token).unwrap(), Some(own.token_hash));
        assert!(machine_agent.attempt_hash("rlj_short").is_err());
        machine_agent.not_card_agent("spawning a worker").unwrap();
    }
}
