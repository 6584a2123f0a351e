//! Who may reach whom: rules and caps, why, peers, groups, and reserving a spawned worker's
//! endpoint. Selector lists arrive as text and are parsed here; the store keeps them and loads what
//! the rules decide on.

use deadpool_postgres::GenericClient;

use super::Core;
use crate::domain::caller::Caller;
use crate::domain::delivery::Kind;
use crate::domain::endpoint::Endpoint;
use crate::domain::ids::{self, CapId, EndpointId, TokenKind};
use crate::domain::message::Sent;
use crate::domain::names;
use crate::domain::redact::{RedactedText, redact};
use crate::domain::scope::{self as domain_scope, Dir, GroupView, Peer, RulesView, Selector, Verdict};
use crate::domain::{EntityKind, Error, Result, limits};
use crate::store;
use crate::store::identity;
use crate::store::messages::Outgoing;
use crate::store::scope::{self, RuleChange};
use crate::store::spawn;

/// Who may reach whom: rules, caps, peers, groups, and the agents a caller spawns.
#[derive(Clone)]
pub struct ScopeService {
    core: Core,
    /// Told when who may reach whom changes, and sends a worker's report.
    messaging: super::messaging::MessagingService,
}

impl ScopeService {
    pub(super) fn new(core: Core, messaging: super::messaging::MessagingService) -> Self {
        Self { core, messaging }
    }
}

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
            name => Some(domain_scope::preset(name)?),
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

impl ScopeService {
    pub async fn show_rules(&self, caller: &Caller, endpoint: &str) -> Result<RulesView> {
        let db = self.core.store.client().await?;
        let (id, _) = rules_target(&db, caller, endpoint).await?;
        Ok(scope::read_rules(&db, id).await?)
    }

    /// Own rules are replaced; a descendant gets a new cap by the caller, which can only narrow.
    pub async fn set_rules(&self, caller: &Caller, endpoint: &str, set: RuleSet<'_>) -> Result<RulesView> {
        let (rules_in, rules_out) = set.changes()?;
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let (id, descendant) = rules_target(&tx, caller, endpoint).await?;
        for (dir, change) in [(Dir::In, rules_in), (Dir::Out, rules_out)] {
            match change {
                None => {}
                Some(None) if descendant => {
                    return Err(Error::invalid(
                        "open cannot narrow a descendant: use widen to loosen your caps on it, or lift to drop one",
                    ));
                }
                Some(Some(selectors)) if descendant => {
                    scope::insert_cap(&tx, id, dir, &selectors, caller.endpoint_id).await?;
                }
                Some(rule) => scope::set_own_rule(&tx, id, dir, &rule).await?,
            }
        }
        let view = scope::read_rules(&tx, id).await?;
        store::commit(tx).await?;
        self.messaging.scope_changed();
        Ok(view)
    }

    /// Adds selectors to the caps the caller set on a descendant.
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
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let (id, descendant) = rules_target(&tx, caller, endpoint).await?;
        if !descendant {
            return Err(Error::invalid("widen loosens caps you set on an agent you spawned: name it with endpoint"));
        }
        for (dir, extra) in [(Dir::In, rules_in), (Dir::Out, rules_out)] {
            let Some(extra) = extra else { continue };
            if scope::widen_caps(&tx, id, dir, caller.endpoint_id, &extra).await? == 0 {
                return Err(Error::not_found(
                    EntityKind::Cap,
                    format!("you set no {} cap on that agent to widen", dir.as_str()),
                ));
            }
        }
        let view = scope::read_rules(&tx, id).await?;
        store::commit(tx).await?;
        self.messaging.scope_changed();
        Ok(view)
    }

    /// Drops a cap set by the caller or by an agent below it; never one set above it.
    pub async fn lift_cap(&self, caller: &Caller, endpoint: &str, cap: &str) -> Result<RulesView> {
        let cap_id = cap.trim().strip_prefix("cap-").and_then(|n| n.parse().ok()).map(CapId).ok_or_else(|| {
            Error::invalid(format!("invalid cap id {cap:?}: caps are named cap-<n>, as rules show lists them"))
        })?;
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let (id, _) = rules_target(&tx, caller, endpoint).await?;
        let set_by = scope::cap_setter(&tx, cap_id, id)
            .await?
            .ok_or_else(|| Error::not_found(EntityKind::Cap, format!("no cap {cap} on that agent")))?;
        let setter = scope::load(&tx, &[set_by]).await?;
        let mine = set_by == caller.endpoint_id
            || setter.get(&set_by).is_some_and(|s| s.party.ancestors.contains(&caller.endpoint_id));
        if !mine {
            return Err(Error::PermissionDenied(format!(
                "{cap} was set by an agent above you; only it or its ancestors may lift it"
            )));
        }
        scope::delete_cap(&tx, cap_id).await?;
        let view = scope::read_rules(&tx, id).await?;
        store::commit(tx).await?;
        self.messaging.scope_changed();
        Ok(view)
    }

    /// Whether `from` (default the caller) may message `to`, with the reasons. Both must be in the
    /// caller's reach.
    pub async fn why(&self, caller: &Caller, from: &str, to: &str) -> Result<(String, String, Verdict)> {
        if to.trim().is_empty() {
            return Err(Error::invalid("why takes to (and optionally from)"));
        }
        let db = self.core.store.client().await?;
        let mine = identity::contact_accounts(&db, caller.account_id).await?;
        let (from_id, from_address) = if from.trim().is_empty() {
            (caller.endpoint_id, caller.address())
        } else {
            scope::resolve_in_reach(&db, caller, &mine, from).await?
        };
        let (to_id, to_address) = scope::resolve_in_reach(&db, caller, &mine, to).await?;
        let loaded = scope::load(&db, &[from_id, to_id]).await?;
        let (Some(a), Some(b)) = (loaded.get(&from_id), loaded.get(&to_id)) else {
            return Err(Error::not_found(EntityKind::Endpoint, "no such endpoint"));
        };
        // The verdict is about `from`, whose contacts may differ from the caller's.
        let contacts = if a.party.account_id == caller.account_id {
            mine
        } else {
            identity::contact_accounts(&db, a.party.account_id).await?
        };
        let verdict = domain_scope::decide(a, b, scope::reach(a.party.account_id, &contacts, b.party.account_id));
        Ok((from_address, to_address, verdict))
    }

    /// Endpoints the caller may message (online unless `all`), each with what admits it.
    pub async fn peers(&self, caller: &Caller, all: bool) -> Result<Vec<Peer>> {
        let db = self.core.store.client().await?;
        let contacts = identity::contact_accounts(&db, caller.account_id).await?;
        let mut accounts = contacts.clone();
        accounts.push(caller.account_id);
        let candidates = scope::peer_candidates(&db, &accounts, caller.endpoint_id, all).await?;
        let ids: Vec<EndpointId> = candidates.iter().map(|(id, _)| *id).collect();
        let verdicts = scope::decide_many(&db, caller, &contacts, &ids).await?;
        Ok(candidates
            .into_iter()
            .filter_map(|(id, endpoint)| {
                let verdict = verdicts.get(&id).filter(|v| v.allowed)?;
                Some(Peer { endpoint, reason: verdict.reasons.join("; ") })
            })
            .collect())
    }

    pub async fn group_create(
        &self,
        caller: &Caller,
        name: &str,
        rules_in: Option<&[String]>,
        rules_out: Option<&[String]>,
    ) -> Result<GroupView> {
        // A group's rules are caps on its members: a card's agent changes no rules but its own.
        caller.not_card_agent("making a group")?;
        let name = needs_name(name)?;
        let (rules_in, rules_out) = (parse(rules_in)?, parse(rules_out)?);
        domain_scope::check_group_name(name)?;
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        if scope::group_count(&tx, caller.account_id).await? >= i64::from(self.core.quotas.max_groups) {
            return Err(limits::no_room_for_groups(&caller.account, self.core.quotas.max_groups));
        }
        let id = scope::insert_group(&tx, caller.account_id, name, caller.endpoint_id, &rules_in, &rules_out)
            .await?
            .ok_or_else(|| Error::AlreadyExists(format!("group {name} already exists in your account")))?;
        scope::insert_member(&tx, id, caller.endpoint_id).await?;
        let view = scope::group_view(&tx, id).await?;
        store::commit(tx).await?;
        self.messaging.scope_changed();
        Ok(view)
    }

    /// Adds an endpoint to a group, or removes it: the owner may do either; any member may remove
    /// itself.
    pub async fn group_member(&self, caller: &Caller, name: &str, endpoint: &str, add: bool) -> Result<GroupView> {
        let name = needs_name(name)?;
        let db = self.core.store.client().await?;
        let (group, owner) = scope::group_id(&db, caller, name).await?;
        let (member, address) = if endpoint.trim().is_empty() {
            (caller.endpoint_id, caller.address())
        } else {
            let contacts = identity::contact_accounts(&db, caller.account_id).await?;
            scope::resolve_in_reach(&db, caller, &contacts, endpoint).await?
        };
        let leaving_itself = !add && member == caller.endpoint_id;
        if !leaving_itself {
            caller.not_card_agent("changing a group's members")?;
            domain_scope::owner_only(caller.endpoint_id, owner, name)?;
        }
        if add {
            if !scope::in_account(&db, member, caller.account_id).await? {
                return Err(Error::invalid(format!(
                    "{address} is in another account; groups hold agents of one account"
                )));
            }
            scope::ensure_member(&db, group, member).await?;
        } else if scope::remove_member(&db, group, member).await? == 0 {
            return Err(Error::not_found(EntityKind::Group, format!("{address} is not a member of group {name}")));
        }
        self.messaging.scope_changed();
        Ok(scope::group_view(&db, group).await?)
    }

    pub async fn group_rules(
        &self,
        caller: &Caller,
        name: &str,
        rules_in: Option<&[String]>,
        rules_out: Option<&[String]>,
    ) -> Result<GroupView> {
        let name = needs_name(name)?;
        let (rules_in, rules_out): (RuleChange, RuleChange) = (parse(rules_in)?.map(Some), parse(rules_out)?.map(Some));
        if rules_in.is_none() && rules_out.is_none() {
            return Err(Error::invalid("rules takes in or out"));
        }
        caller.not_card_agent("changing a group's rules")?;
        let db = self.core.store.client().await?;
        let (group, owner) = scope::group_id(&db, caller, name).await?;
        domain_scope::owner_only(caller.endpoint_id, owner, name)?;
        for (dir, change) in [(Dir::In, rules_in), (Dir::Out, rules_out)] {
            if let Some(rule) = change {
                scope::set_group_rule(&db, group, dir, &rule).await?;
            }
        }
        self.messaging.scope_changed();
        Ok(scope::group_view(&db, group).await?)
    }

    pub async fn group_show(&self, caller: &Caller, name: &str) -> Result<GroupView> {
        let name = needs_name(name)?;
        let db = self.core.store.client().await?;
        let (group, _) = scope::group_id(&db, caller, name).await?;
        Ok(scope::group_view(&db, group).await?)
    }

    pub async fn group_list(&self, caller: &Caller) -> Result<Vec<GroupView>> {
        let db = self.core.store.client().await?;
        let ids = scope::group_ids(&db, caller.account_id).await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(scope::group_view(&db, id).await?);
        }
        Ok(out)
    }

    /// Drops a group; returns its name.
    pub async fn group_drop(&self, caller: &Caller, name: &str) -> Result<String> {
        caller.not_card_agent("dropping a group")?;
        let name = needs_name(name)?;
        let db = self.core.store.client().await?;
        let (group, owner) = scope::group_id(&db, caller, name).await?;
        domain_scope::owner_only(caller.endpoint_id, owner, name)?;
        scope::delete_group(&db, group).await?;
        self.messaging.scope_changed();
        Ok(name.to_owned())
    }

    /// Reserves `<parent handle>-<n>` on the caller's machine for a worker the caller starts, as a
    /// child of the caller capped by `scope` (a preset); returns it and the one-time grant its
    /// bridge claims it with. A card's agent spawns nothing: a worker's bridge needs a machine
    /// credential, which a card's agent never holds, and its reach would outlive the card.
    pub async fn spawn(&self, caller: &Caller, harness: &str, preset: &str) -> Result<(Endpoint, String)> {
        caller.not_card_agent("spawning a worker")?;
        let harness = limits::harness(harness)?;
        let caps = match preset.trim() {
            "" => None,
            "open" => return Err(Error::invalid("a worker is open unless you give tree, parent or none")),
            name => domain_scope::preset(name)?,
        };
        let grant = ids::new_token(TokenKind::SpawnGrant);
        let mut db = self.core.store.client().await?;
        let tx = store::begin(&mut db).await?;
        let taken = spawn::child_handles(&tx, caller.machine_id, &caller.handle).await?;
        let handle = names::child_handle(&caller.handle, &taken);
        if let Some(full) = identity::no_room_for(&tx, caller.machine_id, &handle, self.core.endpoint_caps()).await? {
            return Err(self.core.no_room(&caller.account, &caller.machine, full));
        }
        let child =
            spawn::insert_child(&tx, caller.machine_id, &handle, harness, caller.endpoint_id, &ids::token_hash(&grant))
                .await?;
        if let Some(selectors) = caps {
            for dir in [Dir::In, Dir::Out] {
                scope::insert_cap(&tx, child, dir, &selectors, caller.endpoint_id).await?;
            }
        }
        let endpoint = identity::endpoint_on(&tx, child).await?;
        store::commit(tx).await?;
        tracing::info!(parent = %caller.address(), child = %endpoint.address, "spawn reserved");
        Ok((endpoint, grant))
    }

    /// A spawned worker ended: its output goes to its parent as a message from it, redacted, and
    /// the grant is spent.
    pub async fn spawn_result(&self, grant: &str, exit_code: i32, output: &str) -> Result<Sent> {
        let output = RedactedText::from_agent(output);
        ids::check_token(TokenKind::SpawnGrant, grant)?;
        // The connection goes back before the send, which takes its own.
        let (child, parent_address) = {
            let db = self.core.store.client().await?;
            let (child, parent) = spawn::grant_holder(&db, &ids::token_hash(grant))
                .await?
                .ok_or_else(|| Error::Unauthenticated("unknown or used spawn grant".into()))?;
            let child = identity::caller_of(&db, child).await?;
            let parent = parent.ok_or_else(|| Error::not_found(EntityKind::Endpoint, "the worker's parent is gone"))?;
            (child, spawn::address_of(&db, parent).await?)
        };
        let body = worker_report(&child.address(), exit_code, &output);
        let to = [parent_address];
        let out = Outgoing {
            to: &to,
            body: &body,
            thread: None,
            kind: Kind::Message,
            client_id: Some("spawn-result"),
            private: false,
            require_reply: false,
            attach: &[],
        };
        let sent = self.messaging.send_unscoped(&child, out).await?;
        spawn::spend_grant(&self.core.store.client().await?, child.endpoint_id).await?;
        Ok(sent)
    }
}

/// The target of a rules command: the caller, or (for what only ancestors may do) a descendant;
/// `true` with a descendant.
async fn rules_target(c: &impl GenericClient, caller: &Caller, endpoint: &str) -> Result<(EndpointId, bool)> {
    if endpoint.trim().is_empty() {
        return Ok((caller.endpoint_id, false));
    }
    let contacts = identity::contact_accounts(c, caller.account_id).await?;
    let (id, address) = scope::resolve_in_reach(c, caller, &contacts, endpoint).await?;
    if id == caller.endpoint_id {
        return Ok((id, false));
    }
    caller.not_card_agent("changing another agent's rules")?;
    let loaded = scope::load(c, &[id]).await?;
    let is_descendant = loaded.get(&id).is_some_and(|s| s.party.ancestors.contains(&caller.endpoint_id));
    if !is_descendant {
        return Err(Error::PermissionDenied(format!(
            "{address} is not an agent you spawned (directly or below): you may change only your own rules and narrow your descendants'"
        )));
    }
    Ok((id, true))
}

/// A worker's report to its parent: its exit code and the tail of its output that fits a message.
/// Only redacted text is stored: the report, which quotes the redacted output, as a whole.
fn worker_report(worker: &str, exit_code: i32, output: &RedactedText) -> RedactedText {
    let mut tail = output.as_str().to_owned();
    let room = limits::MAX_BODY_BYTES - 256;
    if tail.len() > room {
        let mut cut = tail.len() - room;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = format!("[…]{}", &tail[cut..]);
    }
    redact(&format!("worker {worker} finished with exit code {exit_code}. Its final output:\n{tail}")).text
}
