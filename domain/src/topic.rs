//! Topics: what a topic's name may be, how an agent names one (`#name` in its own account,
//! `account/#name` in a contact's), and how much of a topic's past a new subscriber is shown.

use super::names;
use super::{Error, Result};

/// What a new follower reads of a topic's past first: its newest posts, up to a count and an age.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub posts: u32,
    pub max_age_s: u64,
}

impl Default for Backlog {
    fn default() -> Self {
        Self { posts: 20, max_age_s: 7 * 24 * 3600 }
    }
}
/// Topics one account may hold.
pub const MAX_TOPICS: i64 = 1_000;
/// Topics one endpoint may follow.
pub const MAX_SUBSCRIPTIONS: i64 = 100;

/// Where a post stands: its topic (as `account/#name`, and its id) and its number there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    pub topic: String,
    pub topic_id: i64,
    pub seq: i64,
}

/// A topic as an agent names it: its account (`None`: the agent's own) and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRef {
    pub account: Option<String>,
    pub name: String,
}

impl TopicRef {
    /// Reads `#name` or `account/#name` (the `#` may be left out of a bare name given where only
    /// a topic can be meant).
    pub fn parse(raw: &str) -> Result<Self> {
        let raw = raw.trim();
        let (account, name) = match raw.split_once('/') {
            Some((account, name)) => (Some(account), name),
            None => (None, raw),
        };
        let name = name.strip_prefix('#').unwrap_or(name);
        let bad =
            |why: &str| Error::invalid(format!("invalid topic {raw:?}: {why}; a topic is #name, or account/#name"));
        if !names::is_valid_name(name) {
            return Err(bad("a name is lowercase letters, digits and -, at most 39"));
        }
        if account.is_some_and(|a| !names::is_valid_name(a)) {
            return Err(bad("not an account name"));
        }
        Ok(Self { account: account.map(str::to_owned), name: name.to_owned() })
    }

    /// Whether `raw` names a topic where an address could stand (`relay_send {to}`).
    pub fn is_topic(raw: &str) -> bool {
        let raw = raw.trim();
        raw.starts_with('#') || raw.split_once('/').is_some_and(|(_, rest)| rest.starts_with('#'))
    }

    /// As the topic's readers see it: `account/#name`.
    pub fn shown(account: &str, name: &str) -> String {
        format!("{account}/#{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_is_named_in_its_account_or_a_contacts() {
        assert_eq!(TopicRef::parse("#deploys").unwrap(), TopicRef { account: None, name: "deploys".into() });
        assert_eq!(TopicRef::parse("deploys").unwrap().name, "deploys");
        let theirs = TopicRef::parse("globex/#releases").unwrap();
        assert_eq!((theirs.account.as_deref(), theirs.name.as_str()), (Some("globex"), "releases"));
        for bad in ["#", "#Deploys", "#a b", "a/b/#c", "/#x", "#x\u{202e}"] {
            assert!(TopicRef::parse(bad).is_err(), "{bad}");
        }
        assert!(TopicRef::is_topic("#deploys") && TopicRef::is_topic("globex/#releases"));
        assert!(!TopicRef::is_topic("ci/bob") && !TopicRef::is_topic("group:ops"));
        assert_eq!(TopicRef::shown("acme", "deploys"), "acme/#deploys");
    }
}
