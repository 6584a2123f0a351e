//! Scope in the database: loading what the rules need, and changing rules, caps and groups.

use std::collections::HashMap;

use crate::domain::ids::{AccountId, EndpointId};
use crate::domain::scope::{CapView, GroupView, Peer, RulesView};
use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::Store;
use super::error::Col;
use super::identity::{Caller, ENDPOINT_COLUMNS, endpoint_from_row};
use crate::domain::address::{Address, Origin};
use crate::domain::names::{NameKind, validate};
use crate::domain::scope::{self, Cap, Dir, Party, Reach, Scoped, Selector, Verdict};
use crate::domain::{EntityKind, Error, Result};

/// A change to one direction of a rule: `None` leaves it, `Some(None)` opens it.
pub type RuleChange = Option<Option<Vec<Selector>>>;

fn parse_stored(raw: Option<Vec<String>>) -> Result<Option<Vec<Selector>>> {
    raw.map(|list| {
        list.iter()
            .map(|s| Selector::parse(s).map_err(|e| Error::Internal(format!("stored selector {s:?} is invalid: {e}"))))
            .collect()
    })
    .transpose()
}

fn to_stored(rule: &Option<Vec<Selector>>) -> Option<Vec<String>> {
    rule.as_ref().map(|list| list.iter().map(ToString::to_string).collect())
}

fn view_selectors(rule: &Option<Vec<Selector>>) -> Option<Vec<String>> {
    to_stored(rule)
}

/// Whether the accounts of two endpoints reach each other.
pub(super) fn reach(caller_account: AccountId, contacts: &[AccountId], other_account: AccountId) -> Reach {
    if caller_account == other_account {
        Reach::SameAccount
    } else if contacts.contains(&other_account) {
        Reach::Contact
    } else {
        Reach::None
    }
}

/// Loads each endpoint with its tree, groups, own rules and every cap that binds it.
pub(super) async fn load(c: &impl GenericClient, ids: &[EndpointId]) -> Result<HashMap<EndpointId, Scoped>> {
    let base = c
        .prepare_cached(
            "select ea.id, ea.account_id, ea.account, ea.machine, ea.handle, ea.address, e.parent_id, e.rules_in, e.rules_out
             from endpoint_addresses ea join endpoints e on e.id = ea.id
             where ea.id = any($1)",
        )
        .await?;
    let chains = c
        .prepare_cached(
            "with recursive chain (id, ancestor, depth) as (
                 select id, parent_id, 1 from endpoints where id = any($1) and parent_id is not null
                 union all
                 select c.id, p.parent_id, c.depth + 1
                 from chain c join endpoints p on p.id = c.ancestor
                 where p.parent_id is not null and c.depth < 64
             )
             select id, array_agg(ancestor order by depth) from chain group by id",
        )
        .await?;
    let groups = c
        .prepare_cached(
            "select gm.endpoint_id, g.name, g.rules_in, g.rules_out
             from group_members gm join groups g on g.id = gm.group_id
             where gm.endpoint_id = any($1) order by g.name",
        )
        .await?;
    let caps = c
        .prepare_cached(
            "select c.id, c.endpoint_id, c.dir, c.selectors, by_ep.address, on_ep.address
             from caps c
             join endpoint_addresses by_ep on by_ep.id = c.set_by
             join endpoint_addresses on_ep on on_ep.id = c.endpoint_id
             where c.endpoint_id = any($1) order by c.id",
        )
        .await?;
    // Issued together, the queries share round trips: what needs the ancestors waits for them.
    let by_ids: [&(dyn ToSql + Sync); 1] = [&ids];
    let (chain_rows, group_rows, base_rows) =
        tokio::try_join!(c.query(&chains, &by_ids), c.query(&groups, &by_ids), c.query(&base, &by_ids))?;
    let mut ancestors: HashMap<EndpointId, Vec<EndpointId>> =
        chain_rows.iter().map(|r| Ok((r.col(0)?, r.col(1)?))).collect::<Result<_>>()?;
    let all_ancestors: Vec<EndpointId> = ancestors.values().flatten().copied().collect();
    let mut bound: Vec<EndpointId> = ids.to_vec();
    bound.extend(&all_ancestors);
    let named = c.prepare_cached("select id, address from endpoint_addresses where id = any($1)").await?;
    let (by_ancestors, by_bound): ([&(dyn ToSql + Sync); 1], [&(dyn ToSql + Sync); 1]) = ([&all_ancestors], [&bound]);
    let (address_rows, cap_rows) = tokio::try_join!(c.query(&named, &by_ancestors), c.query(&caps, &by_bound))?;
    let addresses: HashMap<EndpointId, String> =
        address_rows.iter().map(|r| Ok((r.col(0)?, r.col(1)?))).collect::<Result<_>>()?;

    let mut out = HashMap::new();
    for row in &base_rows {
        let id: EndpointId = row.col(0)?;
        let chain = ancestors.remove(&id).unwrap_or_default();
        let address: String = row.col(5)?;
        let root_address =
            chain.last().and_then(|root| addresses.get(root)).cloned().unwrap_or_else(|| address.clone());
        let mut scoped = Scoped {
            party: Party {
                id,
                account_id: row.col(1)?,
                account: row.col(2)?,
                machine: row.col(3)?,
                handle: row.col(4)?,
                address,
                parent: row.col(6)?,
                ancestors: chain,
                root_address,
                groups: Vec::new(),
            },
            rules_in: parse_stored(row.col(7)?)?,
            rules_out: parse_stored(row.col(8)?)?,
            caps: Vec::new(),
        };
        for g in &group_rows {
            if g.col::<EndpointId>(0)? != id {
                continue;
            }
            let name: String = g.col(1)?;
            for (dir, rule) in [(Dir::In, parse_stored(g.col(2)?)?), (Dir::Out, parse_stored(g.col(3)?)?)] {
                if let Some(selectors) = rule {
                    scoped.caps.push(Cap {
                        id: format!("group:{name}"),
                        dir,
                        selectors,
                        by: format!("group {name}"),
                        group: Some(name.clone()),
                    });
                }
            }
            scoped.party.groups.push(name);
        }
        for cap in cap_rows.iter() {
            let on: EndpointId = cap.col(1)?;
            if on == id || scoped.party.ancestors.contains(&on) {
                scoped.caps.push(Cap {
                    id: format!("cap-{}", cap.col::<i64>(0)?),
                    dir: Dir::parse(cap.col(2)?)?,
                    selectors: parse_stored(Some(cap.col(3)?))?.unwrap_or_default(),
                    by: cap.col(4)?,
                    group: None,
                });
            }
        }
        out.insert(id, scoped);
    }
    Ok(out)
}

/// Decides `from` → each of `to` with one load.
pub(super) async fn decide_many(
    c: &impl GenericClient,
    from: &Caller,
    contacts: &[AccountId],
    to: &[EndpointId],
) -> Result<HashMap<EndpointId, Verdict>> {
    let mut ids = to.to_vec();
    ids.push(from.endpoint_id);
    let loaded = load(c, &ids).await?;
    let sender =
        loaded.get(&from.endpoint_id).ok_or_else(|| Error::not_found(EntityKind::Endpoint, "your endpoint is gone"))?;
    Ok(to
        .iter()
        .filter_map(|id| {
            let target = loaded.get(id)?;
            let r = reach(from.account_id, contacts, target.party.account_id);
            Some((*id, scope::decide(sender, target, r)))
        })
        .collect())
}

/// Resolves an address the caller wrote to an endpoint id in the caller's reach.
async fn resolve_in_reach(
    c: &impl GenericClient,
    caller: &Caller,
    contacts: &[AccountId],
    raw: &str,
) -> Result<(EndpointId, String)> {
    let address = Address::parse(raw, Origin { account: &caller.account, machine: &caller.machine })?.to_string();
    let row = c
        .query_opt(
            "select ea.id, ea.account_id from endpoint_addresses ea join machines m on m.id = ea.machine_id
             where ea.address = $1 and m.revoked_at is null",
            &[&address],
        )
        .await?;
    match row {
        Some(row) if reach(caller.account_id, contacts, row.col(1)?) != Reach::None => Ok((row.col(0)?, address)),
        _ => Err(super::messages::unknown_addresses(c, caller, contacts, &[address], false).await?),
    }
}

/// An endpoint the caller may message right now, by the address it wrote.
pub(crate) async fn messageable(c: &impl GenericClient, caller: &Caller, raw: &str) -> Result<(EndpointId, String)> {
    let contacts = super::identity::contact_accounts(c, caller.account_id).await?;
    let (id, address) = resolve_in_reach(c, caller, &contacts, raw).await?;
    let verdicts = decide_many(c, caller, &contacts, &[id]).await?;
    if let Some(why) = verdicts.get(&id).and_then(Verdict::refusal) {
        return Err(Error::PermissionDenied(format!(
            "you may not message {address}, so you may not peek at it: {why}"
        )));
    }
    Ok((id, address))
}

fn rules_view(s: &Scoped, parent: Option<String>) -> RulesView {
    RulesView {
        address: s.party.address.clone(),
        parent: parent.unwrap_or_default(),
        rules_in: view_selectors(&s.rules_in),
        rules_out: view_selectors(&s.rules_out),
        caps: s
            .caps
            .iter()
            .map(|c| CapView {
                id: c.id.clone(),
                dir: c.dir.as_str().to_owned(),
                selectors: c.selectors.iter().map(ToString::to_string).collect(),
                by: c.by.clone(),
                on: c.group.as_ref().map_or_else(String::new, |g| format!("group {g}")),
            })
            .collect(),
        groups: s.party.groups.clone(),
    }
}

impl Store {
    pub async fn show_rules(&self, caller: &Caller, endpoint: &str) -> Result<RulesView> {
        let client = self.client().await?;
        let (id, _) = rules_target(&client, caller, endpoint).await?;
        view(&client, id).await
    }

    /// Own rules are replaced; a descendant gets a new cap by the caller, which can only narrow.
    pub async fn set_rules(
        &self,
        caller: &Caller,
        endpoint: &str,
        rules_in: RuleChange,
        rules_out: RuleChange,
    ) -> Result<RulesView> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let (id, descendant) = rules_target(&tx, caller, endpoint).await?;
        if descendant {
            for (dir, change) in [(Dir::In, rules_in), (Dir::Out, rules_out)] {
                match change {
                    None => {}
                    Some(None) => {
                        return Err(Error::invalid(
                            "open cannot narrow a descendant: use widen to loosen your caps on it, or lift to drop one",
                        ));
                    }
                    Some(Some(selectors)) => {
                        tx.execute(
                            "insert into caps (endpoint_id, dir, selectors, set_by) values ($1, $2, $3, $4)",
                            &[&id, &dir.as_str(), &to_stored(&Some(selectors)), &caller.endpoint_id],
                        )
                        .await?;
                    }
                }
            }
        } else {
            if let Some(rule) = rules_in {
                tx.execute("update endpoints set rules_in = $2 where id = $1", &[&id, &to_stored(&rule)]).await?;
            }
            if let Some(rule) = rules_out {
                tx.execute("update endpoints set rules_out = $2 where id = $1", &[&id, &to_stored(&rule)]).await?;
            }
        }
        let view = view(&tx, id).await?;
        tx.commit().await?;
        self.scope_changed();
        Ok(view)
    }

    /// Adds selectors to the caps the caller set on a descendant.
    pub async fn widen_rules(
        &self,
        caller: &Caller,
        endpoint: &str,
        rules_in: Option<Vec<Selector>>,
        rules_out: Option<Vec<Selector>>,
    ) -> Result<RulesView> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let (id, descendant) = rules_target(&tx, caller, endpoint).await?;
        if !descendant {
            return Err(Error::invalid("widen loosens caps you set on an agent you spawned: name it with endpoint"));
        }
        for (dir, extra) in [(Dir::In, rules_in), (Dir::Out, rules_out)] {
            let Some(extra) = extra else { continue };
            let extra: Vec<String> = extra.iter().map(ToString::to_string).collect();
            let widened = tx
                .execute(
                    "update caps set selectors = array(select distinct unnest(selectors || $4::text[]))
                     where endpoint_id = $1 and dir = $2 and set_by = $3",
                    &[&id, &dir.as_str(), &caller.endpoint_id, &extra],
                )
                .await?;
            if widened == 0 {
                return Err(Error::not_found(
                    EntityKind::Cap,
                    format!("you set no {} cap on that agent to widen", dir.as_str()),
                ));
            }
        }
        let view = view(&tx, id).await?;
        tx.commit().await?;
        self.scope_changed();
        Ok(view)
    }

    /// Drops a cap set by the caller or by an agent below it; never one set above it.
    pub async fn lift_cap(&self, caller: &Caller, endpoint: &str, cap: &str) -> Result<RulesView> {
        let cap_id: i64 = cap.trim().strip_prefix("cap-").and_then(|n| n.parse().ok()).ok_or_else(|| {
            Error::invalid(format!("invalid cap id {cap:?}: caps are named cap-<n>, as rules show lists them"))
        })?;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let (id, _) = rules_target(&tx, caller, endpoint).await?;
        let row = tx
            .query_opt("select set_by from caps where id = $1 and endpoint_id = $2", &[&cap_id, &id])
            .await?
            .ok_or_else(|| Error::not_found(EntityKind::Cap, format!("no cap {cap} on that agent")))?;
        let set_by: EndpointId = row.col(0)?;
        let setter = load(&tx, &[set_by]).await?;
        let mine = set_by == caller.endpoint_id
            || setter.get(&set_by).is_some_and(|s| s.party.ancestors.contains(&caller.endpoint_id));
        if !mine {
            return Err(Error::PermissionDenied(format!(
                "{cap} was set by an agent above you; only it or its ancestors may lift it"
            )));
        }
        tx.execute("delete from caps where id = $1", &[&cap_id]).await?;
        let view = view(&tx, id).await?;
        tx.commit().await?;
        self.scope_changed();
        Ok(view)
    }

    /// May `from` (default: the caller) message `to`, and why. Both must be in the caller's reach.
    pub async fn why(&self, caller: &Caller, from: &str, to: &str) -> Result<(String, String, Verdict)> {
        let client = self.client().await?;
        let mine = super::identity::contact_accounts(&client, caller.account_id).await?;
        let (from_id, from_address) = if from.trim().is_empty() {
            (caller.endpoint_id, caller.address())
        } else {
            resolve_in_reach(&client, caller, &mine, from).await?
        };
        let (to_id, to_address) = resolve_in_reach(&client, caller, &mine, to).await?;
        let loaded = load(&client, &[from_id, to_id]).await?;
        let (Some(a), Some(b)) = (loaded.get(&from_id), loaded.get(&to_id)) else {
            return Err(Error::not_found(EntityKind::Endpoint, "no such endpoint"));
        };
        // The verdict is about `from`, whose contacts may differ from the caller's.
        let contacts = if a.party.account_id == caller.account_id {
            mine
        } else {
            super::identity::contact_accounts(&client, a.party.account_id).await?
        };
        let verdict = scope::decide(a, b, reach(a.party.account_id, &contacts, b.party.account_id));
        Ok((from_address, to_address, verdict))
    }

    /// Endpoints the caller may message (online unless `all`), each with what admits it.
    pub async fn peers(&self, caller: &Caller, all: bool) -> Result<Vec<Peer>> {
        let client = self.client().await?;
        let contacts = super::identity::contact_accounts(&client, caller.account_id).await?;
        let mut accounts = contacts.clone();
        accounts.push(caller.account_id);
        let sql = format!(
            "select e.id, {ENDPOINT_COLUMNS}
             from endpoints e
             join endpoint_addresses ea on ea.id = e.id
             join machines m on m.id = e.machine_id
             where m.account_id = any($1) and m.revoked_at is null and e.id <> $2 and e.ended_at is null
               and ($3 or e.online_until > now())
             order by ea.address"
        );
        let rows = client.query(&sql, &[&accounts, &caller.endpoint_id, &all]).await?;
        let ids: Vec<EndpointId> = rows.iter().map(|r| r.col(0)).collect::<Result<_>>()?;
        let verdicts = decide_many(&client, caller, &contacts, &ids).await?;
        let mut peers = Vec::new();
        for (row, id) in rows.iter().zip(&ids) {
            if let Some(verdict) = verdicts.get(id)
                && verdict.allowed
            {
                peers.push(Peer { endpoint: endpoint_from_row(row)?, reason: verdict.reasons.join("; ") });
            }
        }
        Ok(peers)
    }

    // ---- groups ------------------------------------------------------------------------------

    pub async fn group_create(
        &self,
        caller: &Caller,
        name: &str,
        rules_in: RuleChange,
        rules_out: RuleChange,
    ) -> Result<GroupView> {
        validate(NameKind::Handle, name)
            .map_err(|_| Error::invalid(format!("invalid group name {name:?}: use a-z, 0-9 and '-'")))?;
        if name == "self" {
            return Err(Error::invalid("self is reserved: group:self means a group's own members"));
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "insert into groups (account_id, name, owner_id, rules_in, rules_out) values ($1, $2, $3, $4, $5)
                 on conflict (account_id, name) do nothing returning id",
                &[
                    &caller.account_id,
                    &name,
                    &caller.endpoint_id,
                    &to_stored(&rules_in.unwrap_or(None)),
                    &to_stored(&rules_out.unwrap_or(None)),
                ],
            )
            .await?
            .ok_or_else(|| Error::AlreadyExists(format!("group {name} already exists in your account")))?;
        let id: i64 = row.col(0)?;
        tx.execute("insert into group_members (group_id, endpoint_id) values ($1, $2)", &[&id, &caller.endpoint_id])
            .await?;
        let view = group_view(&tx, id).await?;
        tx.commit().await?;
        self.scope_changed();
        Ok(view)
    }

    /// Adds or removes a member: the owner may do either; any member may remove itself.
    pub async fn group_member(&self, caller: &Caller, name: &str, endpoint: &str, add: bool) -> Result<GroupView> {
        let client = self.client().await?;
        let (group, owner) = group_id(&client, caller, name).await?;
        let (member, address) = if endpoint.trim().is_empty() {
            (caller.endpoint_id, caller.address())
        } else {
            resolve_in_reach(
                &client,
                caller,
                &super::identity::contact_accounts(&client, caller.account_id).await?,
                endpoint,
            )
            .await?
        };
        let leaving_itself = !add && member == caller.endpoint_id;
        if !leaving_itself {
            owner_only(caller, owner, name)?;
        }
        if add {
            let same_account: bool = client
                .query_one(
                    "select account_id = $2 from endpoint_addresses where id = $1",
                    &[&member, &caller.account_id],
                )
                .await?
                .col(0)?;
            if !same_account {
                return Err(Error::invalid(format!(
                    "{address} is in another account; groups hold agents of one account"
                )));
            }
            client
                .execute(
                    "insert into group_members (group_id, endpoint_id) values ($1, $2) on conflict do nothing",
                    &[&group, &member],
                )
                .await?;
        } else {
            let removed = client
                .execute("delete from group_members where group_id = $1 and endpoint_id = $2", &[&group, &member])
                .await?;
            if removed == 0 {
                return Err(Error::not_found(EntityKind::Group, format!("{address} is not a member of group {name}")));
            }
        }
        self.scope_changed();
        group_view(&client, group).await
    }

    pub async fn group_rules(
        &self,
        caller: &Caller,
        name: &str,
        rules_in: RuleChange,
        rules_out: RuleChange,
    ) -> Result<GroupView> {
        let client = self.client().await?;
        let (group, owner) = group_id(&client, caller, name).await?;
        owner_only(caller, owner, name)?;
        if let Some(rule) = rules_in {
            client.execute("update groups set rules_in = $2 where id = $1", &[&group, &to_stored(&rule)]).await?;
        }
        if let Some(rule) = rules_out {
            client.execute("update groups set rules_out = $2 where id = $1", &[&group, &to_stored(&rule)]).await?;
        }
        self.scope_changed();
        group_view(&client, group).await
    }

    pub async fn group_show(&self, caller: &Caller, name: &str) -> Result<GroupView> {
        let client = self.client().await?;
        let (group, _) = group_id(&client, caller, name).await?;
        group_view(&client, group).await
    }

    pub async fn group_list(&self, caller: &Caller) -> Result<Vec<GroupView>> {
        let client = self.client().await?;
        let ids: Vec<i64> = client
            .query("select id from groups where account_id = $1 order by name", &[&caller.account_id])
            .await?
            .iter()
            .map(|r| r.col(0))
            .collect::<Result<_>>()?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(group_view(&client, id).await?);
        }
        Ok(out)
    }

    pub async fn group_drop(&self, caller: &Caller, name: &str) -> Result<()> {
        let client = self.client().await?;
        let (group, owner) = group_id(&client, caller, name).await?;
        owner_only(caller, owner, name)?;
        client.execute("delete from groups where id = $1", &[&group]).await?;
        self.scope_changed();
        Ok(())
    }
}

/// The target of a rules command: the caller, or (for what only ancestors may do) a descendant.
async fn rules_target(c: &impl GenericClient, caller: &Caller, endpoint: &str) -> Result<(EndpointId, bool)> {
    if endpoint.trim().is_empty() {
        return Ok((caller.endpoint_id, false));
    }
    let contacts = super::identity::contact_accounts(c, caller.account_id).await?;
    let (id, address) = resolve_in_reach(c, caller, &contacts, endpoint).await?;
    if id == caller.endpoint_id {
        return Ok((id, false));
    }
    let loaded = load(c, &[id]).await?;
    let is_descendant = loaded.get(&id).is_some_and(|s| s.party.ancestors.contains(&caller.endpoint_id));
    if !is_descendant {
        return Err(Error::PermissionDenied(format!(
            "{address} is not an agent you spawned (directly or below): you may change only your own rules and narrow your descendants'"
        )));
    }
    Ok((id, true))
}

async fn view(c: &impl GenericClient, id: EndpointId) -> Result<RulesView> {
    let loaded = load(c, &[id]).await?;
    let s = loaded.get(&id).ok_or_else(|| Error::not_found(EntityKind::Endpoint, "no such endpoint"))?;
    let parent = match s.party.parent {
        Some(p) => c
            .query_opt("select address from endpoint_addresses where id = $1", &[&p])
            .await?
            .map(|r| r.col::<String>(0))
            .transpose()?,
        None => None,
    };
    Ok(rules_view(s, parent))
}

async fn group_id(c: &impl GenericClient, caller: &Caller, name: &str) -> Result<(i64, EndpointId)> {
    validate(NameKind::Handle, name).map_err(|_| Error::invalid(format!("invalid group name {name:?}")))?;
    let row = c
        .query_opt("select id, owner_id from groups where account_id = $1 and name = $2", &[&caller.account_id, &name])
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Group, format!("no group {name} in your account")))?;
    Ok((row.col(0)?, row.col(1)?))
}

async fn group_view(c: &impl GenericClient, group_id: i64) -> Result<GroupView> {
    let row = c
        .query_one(
            "select g.name, ea.address, g.rules_in, g.rules_out from groups g
             join endpoint_addresses ea on ea.id = g.owner_id where g.id = $1",
            &[&group_id],
        )
        .await?;
    let members = c
        .query(
            "select ea.address from group_members gm join endpoint_addresses ea on ea.id = gm.endpoint_id
             where gm.group_id = $1 order by ea.address",
            &[&group_id],
        )
        .await?
        .iter()
        .map(|r| r.col(0))
        .collect::<Result<_>>()?;
    Ok(GroupView {
        name: row.col(0)?,
        owner: row.col(1)?,
        rules_in: view_selectors(&parse_stored(row.col(2)?)?),
        rules_out: view_selectors(&parse_stored(row.col(3)?)?),
        members,
    })
}

fn owner_only(caller: &Caller, owner: EndpointId, name: &str) -> Result<()> {
    if owner == caller.endpoint_id {
        Ok(())
    } else {
        Err(Error::PermissionDenied(format!("only the owner of group {name} may change it")))
    }
}

/// Live members of a group of the caller's account, other than the caller.
pub(crate) async fn group_members_for_send(
    c: &impl GenericClient,
    caller: &Caller,
    name: &str,
) -> Result<Vec<(EndpointId, String)>> {
    let (group, _) = group_id(c, caller, name).await?;
    c.query(
        "select ea.id, ea.address from group_members gm
             join endpoint_addresses ea on ea.id = gm.endpoint_id
             join endpoints e on e.id = gm.endpoint_id
             join machines m on m.id = e.machine_id
             where gm.group_id = $1 and gm.endpoint_id <> $2 and e.ended_at is null and m.revoked_at is null
             order by ea.address",
        &[&group, &caller.endpoint_id],
    )
    .await?
    .iter()
    .map(|r| Ok((r.col(0)?, r.col(1)?)))
    .collect()
}
