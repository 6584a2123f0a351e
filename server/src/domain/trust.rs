//! What the trust features report: holds, peeks, permission requests and contacts.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub id: String,
    pub class: String,
    pub state: String,
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
    pub state: String,
    pub job_id: String,
    pub requester: String,
    pub tool: String,
    pub input: String,
}

/// Where a permission request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub id: String,
    pub state: String,
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
