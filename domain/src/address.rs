//! Agent addresses: `account/machine/handle`, shortened to `machine/handle` inside one account and to
//! `handle` inside one machine.

use std::fmt;

use super::names::{NameKind, validate};
use super::{EntityKind, Error, Result};

/// A fully qualified address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    pub account: String,
    pub machine: String,
    pub handle: String,
}

use super::names::{BOARD, HUMAN};

/// The refusal of a message to the board's notice sender.
pub fn board_reads_nothing(address: &str) -> Error {
    Error::FailedPrecondition(format!(
        "{address} sends the board's notices and reads no messages: act on the card with read_job, list_jobs or close_job, or message the card's poster; nothing was sent"
    ))
}

/// The reachable address closest to `wanted`, when it is close enough to be a slip of the keys: at
/// most two edits (a swap of neighbours counts as one) and fewer than half of `wanted`'s handle.
/// Ties go to the first in `reachable`.
pub fn did_you_mean<'a>(wanted: &str, reachable: &'a [String]) -> Option<&'a str> {
    let handle = wanted.rsplit('/').next().unwrap_or(wanted);
    let most = 2.min(handle.chars().count() / 2);
    reachable
        .iter()
        .filter(|r| r.as_str() != wanted)
        .map(|r| (strsim::osa_distance(wanted, r), r.as_str()))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, r)| r)
}

/// The refusal of addresses that name no endpoint the caller can reach, each with the nearest one
/// it can, if any. `sending`: the refusal is of a send, which it says delivered nothing.
pub fn unknown(addresses: &[(String, Option<&str>)], sending: bool) -> Error {
    let listed: Vec<String> = addresses.iter().map(|(a, _)| a.clone()).collect();
    let text = match addresses {
        [(address, Some(near))] => format!("{address}: did you mean {near}? check the address with relay_list"),
        [(_, None)] => format!("{}: check the address with relay_list", listed[0]),
        _ => {
            let each: Vec<String> = addresses
                .iter()
                .map(|(a, near)| match near {
                    Some(near) => format!("{a} (did you mean {near}?)"),
                    None => a.clone(),
                })
                .collect();
            format!("{}: check the addresses with relay_list", each.join(", "))
        }
    };
    let tail = if sending { "; nothing was sent" } else { "" };
    Error::not_found(EntityKind::Endpoint, format!("no agent you can reach at {text}{tail}"))
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_human() {
            write!(f, "{}/{HUMAN}", self.account)
        } else {
            write!(f, "{}/{}/{}", self.account, self.machine, self.handle)
        }
    }
}

/// Where an address is read from: the caller's own account and machine fill in what it leaves out.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub account: &'a str,
    pub machine: &'a str,
}

impl Address {
    /// The account's human inbox.
    pub fn human(account: &str) -> Self {
        Self { account: account.to_owned(), machine: HUMAN.to_owned(), handle: HUMAN.to_owned() }
    }

    pub fn is_human(&self) -> bool {
        self.machine == HUMAN && self.handle == HUMAN
    }

    /// The board's notice sender.
    pub fn board(account: &str) -> Self {
        Self { account: account.to_owned(), machine: HUMAN.to_owned(), handle: BOARD.to_owned() }
    }

    pub fn is_board(&self) -> bool {
        self.machine == HUMAN && self.handle == BOARD
    }

    /// Parses an address as written by the agent at `origin`. `me` is the origin account's human and
    /// `account/me` another account's.
    pub fn parse(raw: &str, origin: Origin<'_>) -> Result<Self> {
        let text = raw.trim();
        let parts: Vec<&str> = text.split('/').collect();
        let (account, machine, handle) = match parts.as_slice() {
            [HUMAN] => (origin.account, HUMAN, HUMAN),
            [account, HUMAN] => (*account, HUMAN, HUMAN),
            [handle] => (origin.account, origin.machine, *handle),
            [machine, handle] => (origin.account, *machine, *handle),
            [account, machine, handle] => (*account, *machine, *handle),
            _ => {
                return Err(Error::invalid(format!(
                    "invalid address {raw:?}: write handle, machine/handle or account/machine/handle"
                )));
            }
        };
        let wrap = |e: Error| Error::invalid(format!("invalid address {raw:?}: {e}"));
        validate(NameKind::Account, account).map_err(wrap)?;
        validate(NameKind::Machine, machine).map_err(wrap)?;
        validate(NameKind::Handle, handle).map_err(wrap)?;
        Ok(Self { account: account.to_owned(), machine: machine.to_owned(), handle: handle.to_owned() })
    }
}

/// Whether `address` (as a view spells it) is on an account's reserved machine: its person (`account/me`)
/// or its board sender (`account/me/board`), no agent.
pub fn is_reserved_address(address: &str) -> bool {
    address.split('/').nth(1) == Some(HUMAN)
}

/// Whether `address` (as a view spells it) is an account's board sender.
pub fn is_board_address(address: &str) -> bool {
    let mut parts = address.split('/');
    let (Some(account), Some(machine), Some(handle), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    Address { account: account.to_owned(), machine: machine.to_owned(), handle: handle.to_owned() }.is_board()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_persons_and_a_boards_addresses_are_reserved_and_an_agents_is_not() {
        assert!(is_reserved_address("acme/me") && is_reserved_address("acme/me/board"));
        assert!(!is_reserved_address("acme/laptop/ann") && !is_reserved_address("acme/meet/ann"));
    }

    const HERE: Origin<'static> = Origin { account: "acme", machine: "laptop" };

    fn parse(raw: &str) -> Result<String> {
        Address::parse(raw, HERE).map(|a| a.to_string())
    }

    #[test]
    fn fills_in_from_the_origin() {
        assert_eq!(parse("bob").unwrap(), "acme/laptop/bob");
        assert_eq!(parse("ci/bob").unwrap(), "acme/ci/bob");
        assert_eq!(parse("other/ci/bob").unwrap(), "other/ci/bob");
        assert_eq!(parse("  bob ").unwrap(), "acme/laptop/bob");
    }

    #[test]
    fn refuses_malformed_addresses() {
        for raw in ["", "/", "a//b", "a/b/c/d", "Bob", "bob/", "x/y/Z", "a b"] {
            let err = parse(raw).unwrap_err();
            assert!(matches!(err, Error::Invalid(_)), "{raw}: {err:?}");
            assert!(err.to_string().contains("invalid address"), "{err}");
        }
    }

    #[test]
    fn me_is_the_human_inbox() {
        assert_eq!(parse("me").unwrap(), "acme/me");
        assert_eq!(parse("globex/me").unwrap(), "globex/me");
        assert!(Address::parse("me", HERE).unwrap().is_human());
        assert!(!Address::parse("laptop/bob", HERE).unwrap().is_human());
    }

    #[test]
    fn the_board_sender_is_on_the_reserved_machine() {
        let board = Address::parse("me/board", HERE).unwrap();
        assert!(board.is_board() && !board.is_human());
        assert_eq!(board, Address::board("acme"));
        assert_eq!(board.to_string(), "acme/me/board");
        assert!(!Address::parse("laptop/board", HERE).unwrap().is_board(), "a handle named board is just a handle");
        let err = board_reads_nothing("acme/me/board").to_string();
        assert!(err.starts_with("acme/me/board sends the board's notices and reads no messages"), "{err}");
    }

    fn reachable() -> Vec<String> {
        ["acme/laptop/alice", "acme/laptop/bob", "acme/ci/bob", "acme/ci/carl", "globex/box/gina", "acme/me"]
            .map(str::to_owned)
            .to_vec()
    }

    #[test]
    fn slips_of_the_keys_find_the_address_meant() {
        let r = reachable();
        assert_eq!(did_you_mean("acme/laptop/bbo", &r), Some("acme/laptop/bob"), "a swap");
        assert_eq!(did_you_mean("acme/laptop/alcie", &r), Some("acme/laptop/alice"));
        assert_eq!(did_you_mean("acme/laptop/alic", &r), Some("acme/laptop/alice"), "a missing letter");
        assert_eq!(did_you_mean("acme/ci/carlo", &r), Some("acme/ci/carl"));
        assert_eq!(did_you_mean("acme/laptp/bob", &r), Some("acme/laptop/bob"), "a machine typo");
        assert_eq!(did_you_mean("globex/box/gine", &r), Some("globex/box/gina"));
        assert_eq!(did_you_mean("acme/ci/bo", &r), Some("acme/ci/bob"));
        assert_eq!(did_you_mean("acme/ci/b", &r), None, "too short a name to guess at");
    }

    #[test]
    fn nothing_far_off_is_suggested() {
        let r = reachable();
        assert_eq!(did_you_mean("acme/laptop/zed", &r), None);
        assert_eq!(did_you_mean("initech/box/ivan", &r), None);
        assert_eq!(did_you_mean("acme/laptop/bob", &r), None, "never the address itself");
        assert_eq!(did_you_mean("acme/laptop/bob", &[]), None);
    }

    #[test]
    fn unknown_addresses_are_refused_with_the_nearest() {
        let one = unknown(&[("acme/laptop/bbo".into(), Some("acme/laptop/bob"))], true);
        assert!(matches!(one, Error::NotFound { .. }));
        assert_eq!(
            one.to_string(),
            "no agent you can reach at acme/laptop/bbo: did you mean acme/laptop/bob? check the address with relay_list; nothing was sent"
        );
        assert_eq!(
            unknown(&[("acme/ci/x".into(), None)], false).to_string(),
            "no agent you can reach at acme/ci/x: check the address with relay_list"
        );
        assert_eq!(
            unknown(&[("acme/laptop/bbo".into(), Some("acme/laptop/bob")), ("acme/ci/x".into(), None)], true)
                .to_string(),
            "no agent you can reach at acme/laptop/bbo (did you mean acme/laptop/bob?), acme/ci/x: check the addresses with relay_list; nothing was sent"
        );
    }

    #[test]
    fn error_says_which_part_is_wrong() {
        let err = parse("acme/Laptop/bob").unwrap_err().to_string();
        assert!(err.contains("machine name \"Laptop\""), "{err}");
    }
}
