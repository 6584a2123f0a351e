//! The loop guard's rules: when agents answering each other with no person in between have gone
//! past their account's bounds, and what everyone is told. An exchange is weighed in turns: each
//! message whose sender is not the one who last wrote is a turn, so two agents (or a ring) answering
//! each other make one a message, and one agent writing however often makes one. Turns are counted
//! by thread (read before a reply or a send into a thread) and by pair in any thread (the writers
//! keep each pair's streak: server migration 44). Two bounds: turns within a window (a runaway pair
//! is fast), and turns in a thread since a person last spoke or let it go on (a slow one still goes
//! on for ever). Past either, the next message is held for a person, and so is everything between
//! the two agents until a person lets them go on.

use super::{Error, Result};

/// The most either bound may be: the guard reads this many of each inbox's newest deliveries, so
/// its cost stays the same however long the agents have talked.
pub const MAX_BOUND: u32 = 200;

/// An account's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Messages between a pair (both ways) within `window_s` past which the next is held.
    pub max_messages: u32,
    pub window_s: u32,
    /// Messages between a pair in one thread past which the next is held.
    pub max_depth: u32,
}

impl Default for Settings {
    /// A runaway pair answers at once and reaches 30 within seconds; people-paced work between two
    /// agents stays far below 30 a minute, and below 40 turns in one thread.
    fn default() -> Self {
        Self { max_messages: 30, window_s: 60, max_depth: 40 }
    }
}

impl Settings {
    /// Checks bounds a person set.
    pub fn new(max_messages: u32, window_s: u32, max_depth: u32) -> Result<Self> {
        if !(2..=MAX_BOUND).contains(&max_messages) {
            return Err(Error::invalid(format!("messages {max_messages} is out of range: 2 to {MAX_BOUND}")));
        }
        if !(10..=86_400).contains(&window_s) {
            return Err(Error::invalid(format!("window {window_s} s is out of range: 10 to 86400 seconds")));
        }
        if !(2..=MAX_BOUND).contains(&max_depth) {
            return Err(Error::invalid(format!("depth {max_depth} is out of range: 2 to {MAX_BOUND}")));
        }
        Ok(Self { max_messages, window_s, max_depth })
    }
}

/// What was seen of a thread before its next message, since a person last spoke in it or let it go
/// on: agents' turns within the window, and in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub in_window: u32,
    pub in_thread: u32,
}

/// Why the guard holds a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trip {
    Rate { messages: u32, window_s: u32 },
    Depth { messages: u32 },
}

impl Trip {
    pub fn describe(self) -> String {
        match self {
            Self::Rate { messages, window_s } => format!("{messages} turns answering each other within {window_s} s"),
            Self::Depth { messages } => format!("{messages} turns answering each other in one thread"),
        }
    }
}

/// Whether the next message between a pair is held, and why.
pub fn verdict(settings: Settings, seen: Seen) -> Option<Trip> {
    if seen.in_window >= settings.max_messages {
        return Some(Trip::Rate { messages: seen.in_window, window_s: settings.window_s });
    }
    if seen.in_thread >= settings.max_depth {
        return Some(Trip::Depth { messages: seen.in_thread });
    }
    None
}

/// What the two agents are told when the guard trips.
pub fn agents_notice(from: &str, to: &str, trip: Trip) -> String {
    format!(
        "Relay's loop guard held a message from {from} to {to}: {}, with no person in between. Further messages \
         between you wait until a person of the account releases one. Stop answering each other unless your \
         task needs it; tell your user if it does.",
        trip.describe()
    )
}

/// What the account's operator (or else its person) is told.
pub fn operator_notice(from: &str, to: &str, trip: Trip) -> String {
    format!(
        "Relay's loop guard is holding messages between {from} and {to}: {}. Release one to let them go on \
         (the count starts over), or reject them: the console's Holds, or `agent-bridge human holds`.",
        trip.describe()
    )
}

/// The hold class of what the guard holds.
pub const HOLD_CLASS: &str = "loop";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_message_is_held_past_either_bound() {
        let s = Settings::default();
        let seen = |in_window, in_thread| Seen { in_window, in_thread };
        assert_eq!(verdict(s, seen(29, 39)), None, "a busy exchange goes on");
        assert_eq!(verdict(s, seen(30, 30)), Some(Trip::Rate { messages: 30, window_s: 60 }));
        assert_eq!(verdict(s, seen(3, 40)), Some(Trip::Depth { messages: 40 }));
    }

    #[test]
    fn a_persons_bounds_are_checked() {
        assert!(
            Settings::new(1, 60, 40).is_err() && Settings::new(30, 5, 40).is_err() && Settings::new(30, 60, 1).is_err()
        );
        assert_eq!(Settings::new(5, 30, 10).unwrap(), Settings { max_messages: 5, window_s: 30, max_depth: 10 });
    }

    #[test]
    fn the_notices_say_who_why_and_what_to_do() {
        let trip = Trip::Rate { messages: 30, window_s: 60 };
        let told = agents_notice("acme/a/x", "acme/b/y", trip);
        assert!(told.contains("acme/a/x to acme/b/y") && told.contains("30 turns answering each other within 60 s"));
        assert!(operator_notice("acme/a/x", "acme/b/y", trip).contains("agent-bridge human holds"));
    }
}
