//! Delivery states of one message to one recipient. They only move forward.

use super::ids::Seq;
use super::{Error, Result};

/// Stored as a small integer; the order is the lifecycle order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(i16)]
pub enum State {
    Queued = 1,
    Pushed = 2,
    Surfaced = 3,
    Read = 4,
    /// Taken back before the recipient saw it.
    Withdrawn = 5,
}

impl State {
    pub fn from_db(value: i16) -> Result<Self> {
        match value {
            1 => Ok(Self::Queued),
            2 => Ok(Self::Pushed),
            3 => Ok(Self::Surfaced),
            4 => Ok(Self::Read),
            5 => Ok(Self::Withdrawn),
            other => Err(Error::Internal(format!("unknown delivery state {other} in the database"))),
        }
    }

    /// Const, so SQL text can spell a state from it (`store::messages::READ`).
    pub const fn to_db(self) -> i16 {
        self as i16
    }

    /// The states a bridge may confirm: it cannot claim a message was only queued or pushed.
    pub fn confirmable(state: Option<Self>) -> Result<Self> {
        match state {
            Some(state @ (Self::Surfaced | Self::Read)) => Ok(state),
            _ => Err(Error::invalid("a confirmation must say surfaced or read")),
        }
    }
}

/// Seqs a caller named; beyond what the database can number, a seq names nothing.
pub fn seqs(named: &[u64]) -> Result<Vec<Seq>> {
    named.iter().map(|s| seq(*s)).collect()
}

/// A seq a caller named.
pub fn seq(named: u64) -> Result<Seq> {
    i64::try_from(named).map(Seq).map_err(|_| Error::invalid(format!("seq {named} is out of range")))
}

/// Message kinds, stored as small integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum Kind {
    Message = 1,
    Ask = 2,
    Reply = 3,
}

impl Kind {
    pub fn from_db(value: i16) -> Result<Self> {
        match value {
            1 => Ok(Self::Message),
            2 => Ok(Self::Ask),
            3 => Ok(Self::Reply),
            other => Err(Error::Internal(format!("unknown message kind {other} in the database"))),
        }
    }

    pub fn to_db(self) -> i16 {
        self as i16
    }

    /// What a sender may ask for; replies are made by the reply call, which knows what they answer.
    pub fn for_send(self) -> Result<Self> {
        match self {
            Self::Reply => Err(Error::invalid("to answer a message use reply with its id")),
            other => Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_keep_lifecycle_order() {
        for state in [State::Queued, State::Pushed, State::Surfaced, State::Read] {
            assert_eq!(State::from_db(state.to_db()).unwrap(), state);
        }
        assert!(State::Queued < State::Pushed && State::Pushed < State::Surfaced && State::Surfaced < State::Read);
        assert!(State::from_db(9).is_err());
    }

    #[test]
    fn bridges_confirm_only_surfaced_or_read() {
        assert_eq!(State::confirmable(Some(State::Surfaced)).unwrap(), State::Surfaced);
        assert_eq!(State::confirmable(Some(State::Read)).unwrap(), State::Read);
        assert!(State::confirmable(Some(State::Queued)).is_err());
        assert!(State::confirmable(None).is_err());
        assert!(Kind::Reply.for_send().is_err() && Kind::Ask.for_send() == Ok(Kind::Ask));
    }

    #[test]
    fn seqs_past_the_database_range_are_refused() {
        assert_eq!(seqs(&[1, 7]).unwrap(), vec![Seq(1), Seq(7)]);
        assert!(seqs(&[u64::MAX]).is_err());
    }
}
