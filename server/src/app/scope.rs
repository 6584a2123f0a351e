//! Who may reach whom: rules and caps, why, peers, groups, and reserving a spawned worker's
//! endpoint. Selector lists arrive as text and are parsed here; the store evaluates and keeps them.

use super::App;
use crate::domain::endpoint::Endpoint;
use crate::domain::redact::RedactedText;
use crate::domain::scope::{self, GroupView, Peer, RulesView, Selector, Verdict};
use crate::domain::{Error, Result, limits};
use crate::store::identity::Caller;
use crate::store::messages::Sent;
use crate::store::scope::RuleChange;

/// A selector list as the caller gave it: absent stays absent.
fn parse(list: Option<&[String]>) -> Result<Option<Vec<Selector>>> {
    list.map(Selector::parse_list).transpose()
}

/// What `set` asks for: a preset for both directions, explicit lists, and extra selectors added to
/// whatever is not open.
pub struct RuleSet<'a> {
    pub scope: &'a str,
    pub rules_in: Option<&'a [String]>,
    pub rules_out: Option<&'a [String]>,
    pub allow: &'a [String],
}

impl RuleSet<'_> {
    /// The change in each direction: the preset, then the explicit lists, then `allow` added.
    fn changes(&self) -> Result<(RuleChange, RuleChange)> {
        let base = match self.scope.trim() {
            "" => None,
            name => Some(scope::preset(name)?),
        };
        let rules_in = parse(self.rules_in)?.map(Some).or_else(|| base.clone());
        let rules_out = parse(self.rules_out)?.map(Some).or(base);
        if rules_in.is_none() && rules_out.is_none() {
            return Err(Error::invalid(if self.allow.is_empty() {
                "set takes scope, in or out"
            } else {
                "allow goes with scope, in or out"
            }));
        }
        let allow = Selector::parse_list(self.allow)?;
        let add = |change: RuleChange| {
            change.map(|rule| {
                rule.map(|mut list| {
                    list.extend(allow.iter().filter(|a| !list.contains(a)).cloned().collect::<Vec<_>>());
                    list
                })
            })
        };
        Ok((add(rules_in), add(rules_out)))
    }
}

fn needs_name(name: &str) -> Result<&str> {
    match name.trim() {
        "" => Err(Error::invalid("this group action takes name")),
        name => Ok(name),
    }
}

impl App {
    pub async fn show_rules(&self, caller: &Caller, endpoint: &str) -> Result<RulesView> {
        self.store.show_rules(caller, endpoint).await
    }

    pub async fn set_rules(&self, caller: &Caller, endpoint: &str, set: RuleSet<'_>) -> Result<RulesView> {
        let (rules_in, rules_out) = set.changes()?;
        self.store.set_rules(caller, endpoint, rules_in, rules_out).await
    }

    pub async fn widen_rules(
        &self,
        caller: &Caller,
        endpoint: &str,
        rules_in: Option<&[String]>,
        rules_out: Option<&[String]>,
    ) -> Result<RulesView> {
        let (rules_in, rules_out) = (parse(rules_in)?, parse(rules_out)?);
        if rules_in.is_none() && rules_out.is_none() {
            return Err(Error::invalid("widen takes in or out"));
        }
        self.store.widen_rules(caller, endpoint, rules_in, rules_out).await
    }

    pub async fn lift_cap(&self, caller: &Caller, endpoint: &str, cap: &str) -> Result<RulesView> {
        self.store.lift_cap(caller, endpoint, cap).await
    }

    /// Whether `from` (default the caller) may message `to`, with the reasons.
    pub async fn why(&self, caller: &Caller, from: &str, to: &str) -> Result<(String, String, Verdict)> {
        if to.trim().is_empty() {
            return Err(Error::invalid("why takes to (and optionally from)"));
        }
        self.store.why(caller, from, to).await
    }

    pub async fn peers(&self, caller: &Caller, all: bool) -> Result<Vec<Peer>> {
        self.store.peers(caller, all).await
    }

    pub async fn group_create(
        &self,
        caller: &Caller,
        name: &str,
        rules_in: Option<&[String]>,
        rules_out: Option<&[String]>,
    ) -> Result<GroupView> {
        let name = needs_name(name)?;
        self.store.group_create(caller, name, parse(rules_in)?.map(Some), parse(rules_out)?.map(Some)).await
    }

    /// Adds an endpoint to a group, or removes it.
    pub async fn group_member(&self, caller: &Caller, name: &str, endpoint: &str, add: bool) -> Result<GroupView> {
        self.store.group_member(caller, needs_name(name)?, endpoint, add).await
    }

    pub async fn group_rules(
        &self,
        caller: &Caller,
        name: &str,
        rules_in: Option<&[String]>,
        rules_out: Option<&[String]>,
    ) -> Result<GroupView> {
        let name = needs_name(name)?;
        let (rules_in, rules_out) = (parse(rules_in)?.map(Some), parse(rules_out)?.map(Some));
        if rules_in.is_none() && rules_out.is_none() {
            return Err(Error::invalid("rules takes in or out"));
        }
        self.store.group_rules(caller, name, rules_in, rules_out).await
    }

    pub async fn group_show(&self, caller: &Caller, name: &str) -> Result<GroupView> {
        self.store.group_show(caller, needs_name(name)?).await
    }

    pub async fn group_list(&self, caller: &Caller) -> Result<Vec<GroupView>> {
        self.store.group_list(caller).await
    }

    /// Drops a group; returns its name.
    pub async fn group_drop(&self, caller: &Caller, name: &str) -> Result<String> {
        let name = needs_name(name)?;
        self.store.group_drop(caller, name).await?;
        Ok(name.to_owned())
    }

    /// Reserves a child endpoint for a worker the caller starts, capped by `scope` (a preset); returns
    /// it and the one-time grant its bridge claims it with.
    pub async fn spawn(&self, caller: &Caller, harness: &str, preset: &str) -> Result<(Endpoint, String)> {
        let harness = limits::harness(harness)?;
        let caps = match preset.trim() {
            "" => None,
            "open" => return Err(Error::invalid("a worker is open unless you give tree, parent or none")),
            name => scope::preset(name)?,
        };
        let (endpoint, grant) = self.store.spawn(caller, harness, caps).await?;
        tracing::info!(parent = %caller.address(), child = %endpoint.address, "spawn reserved");
        Ok((endpoint, grant))
    }

    /// A spawned worker ended: its output goes to its parent as a message from it, redacted.
    pub async fn spawn_result(&self, grant: &str, exit_code: i32, output: &str) -> Result<Sent> {
        self.store.spawn_result(grant, exit_code, &RedactedText::from_agent(output)).await
    }
}
