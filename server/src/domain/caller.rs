//! Who is calling, as authentication established it: a machine, an endpoint's session, or an
//! account's person. Everything the server does on a caller's behalf starts from one of these.

use super::address::Address;
use super::ids::{AccountId, EndpointId, MachineId};

/// A machine, as authenticated by its machine token.
#[derive(Debug, Clone)]
pub struct MachineIdentity {
    pub account_id: AccountId,
    pub account: String,
    pub machine_id: MachineId,
    pub machine: String,
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
    pub session_hash: Vec<u8>,
}

impl Caller {
    pub fn address(&self) -> String {
        Address { account: self.account.clone(), machine: self.machine.clone(), handle: self.handle.clone() }
            .to_string()
    }
}

/// A person of an account, as authenticated by a human token.
#[derive(Debug, Clone)]
pub struct Human {
    pub account_id: AccountId,
    pub account: String,
    pub name: String,
}
