//! Who a call was authenticated as: what the authentication layer leaves in the request for the
//! admission layer and the handlers.

use crate::domain::caller::{Caller, CardAgent, Holder, Human, MachineIdentity};
use crate::domain::ids::AccountId;

/// The authenticated caller of a call, as the layer left it for the handler.
#[derive(Debug, Clone)]
pub enum Credential {
    Session(Caller),
    Machine(MachineIdentity),
    /// A card's agent, by its job token: only `Hello` takes it.
    Card(CardAgent),
    Person(Human),
}

impl Credential {
    pub fn account_id(&self) -> AccountId {
        match self {
            Self::Session(caller) => caller.account_id,
            Self::Machine(machine) => machine.account_id,
            Self::Card(agent) => agent.machine.account_id,
            Self::Person(person) => person.account_id,
        }
    }

    pub fn holder(&self) -> Holder {
        match self {
            Self::Session(caller) => Holder::Endpoint(caller.endpoint_id),
            Self::Machine(machine) => Holder::Machine(machine.machine_id),
            Self::Card(agent) => Holder::Machine(agent.machine.machine_id),
            Self::Person(person) => Holder::Person(person.account_id, person.name.clone()),
        }
    }
}

/// A credential a call issued (the session token of `Hello`), left in its response for admission:
/// the replica knows it from its first use, as one it has accepted.
#[derive(Debug, Clone)]
pub struct Issued(pub http::HeaderValue);

impl Issued {
    /// The bearer token `token`, as a client presents it; `None` if it could not be a header.
    pub fn bearer(token: &str) -> Option<Self> {
        http::HeaderValue::try_from(format!("Bearer {token}")).ok().map(Self)
    }
}
