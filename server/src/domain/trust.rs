//! What the trust features report: holds, peeks, permission requests and contacts.

use std::fmt;

use super::{Error, Result};

/// Where a held message stands, as `holds.state` stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldState {
    Pending,
    Released,
    Rejected,
}

impl HoldState {
    pub const ALL: [Self; 3] = [Self::Pending, Self::Released, Self::Rejected];

    /// Const, so SQL text can spell a state where a partial index needs the literal.
    pub const fn as_db(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Released => "released",
            Self::Rejected => "rejected",
        }
    }

    pub fn from_db(value: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_db() == value)
            .ok_or_else(|| Error::Internal(format!("unknown hold state {value} in the database")))
    }
}

impl fmt::Display for HoldState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_db())
    }
}

/// Where a permission request stands, as `approvals.state` stores it: open while pending (with the
/// operator) or escalated (with the human), then decided for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalState {
    Pending,
    Escalated,
    Allow,
    Deny,
}

impl ApprovalState {
    pub const ALL: [Self; 4] = [Self::Pending, Self::Escalated, Self::Allow, Self::Deny];

    /// Const, so SQL text can spell a state where a partial index needs the literal.
    pub const fn as_db(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Escalated => "escalated",
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }

    pub fn from_db(value: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_db() == value)
            .ok_or_else(|| Error::Internal(format!("unknown permission request state {value} in the database")))
    }
}

impl fmt::Display for ApprovalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_db())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub id: String,
    pub class: String,
    pub state: HoldState,
    pub reason: String,
    pub from: String,
    pub to: Vec<String>,
    pub body: String,
    pub message_id: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeekTurn {
    pub role: String,
    pub text: String,
    pub tools: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    pub endpoint: String,
    pub turns: Vec<PeekTurn>,
    pub updated_at: String,
}

/// Who peeked, when, at how many turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peeker {
    pub by: String,
    pub at: String,
    pub turns: u32,
}

/// A board agent's permission request, as the human lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    pub id: String,
    pub state: ApprovalState,
    pub job_id: String,
    pub requester: String,
    pub tool: String,
    pub input: String,
}

/// Where a permission request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub id: String,
    pub state: ApprovalState,
    pub reason: String,
    pub decided_by: String,
}

/// A contact with another account, from this account's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contact {
    pub account: String,
    pub state: String,
    /// Messages withdrawn when it was dropped.
    pub withdrawn: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_states_round_trip() {
        for state in HoldState::ALL {
            assert_eq!(HoldState::from_db(state.as_db()).unwrap(), state);
            assert_eq!(state.to_string(), state.as_db());
        }
        assert_eq!(HoldState::Pending.as_db(), "pending");
        assert!(HoldState::from_db("Pending").is_err() && HoldState::from_db("").is_err());
    }

    #[test]
    fn approval_states_round_trip() {
        for state in ApprovalState::ALL {
            assert_eq!(ApprovalState::from_db(state.as_db()).unwrap(), state);
            assert_eq!(state.to_string(), state.as_db());
        }
        assert_eq!(ApprovalState::Escalated.as_db(), "escalated");
        assert!(ApprovalState::from_db("owner").is_err() && ApprovalState::from_db("released").is_err());
    }
}
