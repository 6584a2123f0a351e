//! Delivery states of one message to one recipient. They only move forward.

use relay_proto::v1::DeliveryState;

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

    pub fn to_db(self) -> i16 {
        self as i16
    }

    pub fn to_proto(self) -> DeliveryState {
        match self {
            Self::Queued => DeliveryState::Queued,
            Self::Pushed => DeliveryState::Pushed,
            Self::Surfaced => DeliveryState::Surfaced,
            Self::Read => DeliveryState::Read,
            Self::Withdrawn => DeliveryState::Withdrawn,
        }
    }

    /// The states a bridge may confirm: it cannot claim a message was only queued or pushed.
    pub fn confirmable(state: DeliveryState) -> Result<Self> {
        match state {
            DeliveryState::Surfaced => Ok(Self::Surfaced),
            DeliveryState::Read => Ok(Self::Read),
            _ => Err(Error::invalid("a confirmation must say surfaced or read")),
        }
    }
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

    pub fn to_proto(self) -> relay_proto::v1::MessageKind {
        use relay_proto::v1::MessageKind as P;
        match self {
            Self::Message => P::Message,
            Self::Ask => P::Ask,
            Self::Reply => P::Reply,
        }
    }

    /// What a sender may ask for; replies are made by the reply call, which knows what they answer.
    pub fn for_send(kind: relay_proto::v1::MessageKind) -> Result<Self> {
        use relay_proto::v1::MessageKind as P;
        match kind {
            P::Unspecified | P::Message => Ok(Self::Message),
            P::Ask => Ok(Self::Ask),
            P::Reply => Err(Error::invalid("to answer a message use reply with its id")),
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
        assert_eq!(State::confirmable(DeliveryState::Surfaced).unwrap(), State::Surfaced);
        assert_eq!(State::confirmable(DeliveryState::Read).unwrap(), State::Read);
        assert!(State::confirmable(DeliveryState::Queued).is_err());
        assert!(State::confirmable(DeliveryState::Unspecified).is_err());
    }
}
