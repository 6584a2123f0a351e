//! Scope in the database: loading what the rules need, and changing rules, caps and groups.

use std::collections::HashMap;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::identity::ENDPOINT_COLUMNS;
use super::row::{Col, FromRow};
use crate::domain::address::{Address, Origin};
use crate::domain::caller::Caller;
use crate::domain::endpoint::Endpoint;
use crate::domain::ids::{AccountId, CapId, EndpointId, GroupId};
use crate::domain::names::{NameKind, validate};
use crate::domain::scope::{self, Cap, Dir, GroupView, Party, Reach, RulesView, Scoped, Selector, Verdict};
use crate::domain::{EntityKind, Error};
use crate::store::{Result, StoreError};

/// A change to one direction of a rule: `None` leaves it, `Some(None)` opens it.
pub type RuleChange = Option<Option<Vec<Selector>>>;

fn parse_stored(raw: Option<Vec<String>>) -> Result<Option<Vec<Selector>>> {
    raw.map(|list| {
        list.iter()
            .map(|s| {
                Selector::parse(s)
                    .map_err(|e| StoreError::from(Error::Internal(format!("stored selector {s:?} is invalid: {e}"))))
            })
            .collect()
    })
    .transpose()
}

/// Whether the accounts of two endpoints reach each other.
pub(crate) fn reach(caller_account: AccountId, contacts: &[AccountId], other_account: AccountId) -> Reach {
    if caller_account == other_account {
        Reach::SameAccount
    } else if contacts.contains(&other_account) {
        Reach::Contact
    } else {
        Reach::None
    }
}

/// Loads each endpoint with its tree, groups, own rules and every cap that binds it.
pub(crate) async fn load(c: &impl GenericClient, ids: &[EndpointId]) -> Result<HashMap<EndpointId, Scoped>> {
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
             select id, array_agg(ancestor order by depth) as ancestors from chain group by id",
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
            "select c.id, c.endpoint_id, c.dir, c.selectors, by_ep.address as set_by
             from caps c
             join endpoint_addresses by_ep on by_ep.id = c.set_by
             where c.endpoint_id = any($1) order by c.id",
        )
        .await?;
    // Issued together, the queries share round trips: what needs the ancestors waits for them.
    let by_ids: [&(dyn ToSql + Sync); 1] = [&ids];
    let (chain_rows, group_rows, base_rows) =
        tokio::try_join!(c.query(&chains, &by_ids), c.query(&groups, &by_ids), c.query(&base, &by_ids))?;
    let mut ancestors: HashMap<EndpointId, Vec<EndpointId>> =
        chain_rows.iter().map(|r| Ok((r.col("id")?, r.col("ancestors")?))).collect::<Result<_>>()?;
    let all_ancestors: Vec<EndpointId> = ancestors.values().flatten().copied().collect();
    let mut bound: Vec<EndpointId> = ids.to_vec();
    bound.extend(&all_ancestors);
    let named = c.prepare_cached("select id, address from endpoint_addresses where id = any($1)").await?;
    let (by_ancestors, by_bound): ([&(dyn ToSql + Sync); 1], [&(dyn ToSql + Sync); 1]) = ([&all_ancestors], [&bound]);
    let (address_rows, cap_rows) = tokio::try_join!(c.query(&named, &by_ancestors), c.query(&caps, &by_bound))?;
    let addresses: HashMap<EndpointId, String> =
        address_rows.iter().map(|r| Ok((r.col("id")?, r.col("address")?))).collect::<Result<_>>()?;

    let mut out = HashMap::new();
    for row in &base_rows {
        let id: EndpointId = row.col("id")?;
        let chain = ancestors.remove(&id).unwrap_or_default();
        let address: String = row.col("address")?;
        let root_address =
            chain.last().and_then(|root| addresses.get(root)).cloned().unwrap_or_else(|| address.clone());
        let mut scoped = Scoped {
            party: Party {
                id,
                account_id: row.col("account_id")?,
                account: row.col("account")?,
                machine: row.col("machine")?,
                handle: row.col("handle")?,
                address,
                parent: row.col("parent_id")?,
                ancestors: chain,
                root_address,
                groups: Vec::new(),
            },
            rules_in: parse_stored(row.col("rules_in")?)?,
            rules_out: parse_stored(row.col("rules_out")?)?,
            caps: Vec::new(),
        };
        for g in &group_rows {
            if g.col::<EndpointId>("endpoint_id")? != id {
                continue;
            }
            let name: String = g.col("name")?;
            for (dir, rule) in
                [(Dir::In, parse_stored(g.col("rules_in")?)?), (Dir::Out, parse_stored(g.col("rules_out")?)?)]
            {
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
            let on: EndpointId = cap.col("endpoint_id")?;
            if on == id || scoped.party.ancestors.contains(&on) {
                scoped.caps.push(Cap {
                    id: format!("cap-{}", cap.col::<CapId>("id")?),
                    dir: Dir::parse(cap.col("dir")?)?,
                    selectors: parse_stored(Some(cap.col("selectors")?))?.unwrap_or_default(),
                    by: cap.col("set_by")?,
                    group: None,
                });
            }
        }
        out.insert(id, scoped);
    }
    Ok(out)
}

/// Decides `from` → each of `to` with one load.
pub(crate) async fn decide_many(
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
pub(crate) async fn resolve_in_reach(
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
        Some(row) if reach(caller.account_id, contacts, row.col("account_id")?) != Reach::None => {
            Ok((row.col("id")?, address))
        }
        _ => Err(super::messages::unknown_addresses(c, caller, contacts, &[address], false).await?.into()),
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
        ))
        .into());
    }
    Ok((id, address))
}

// ---- rules and caps ------------------------------------------------------------------------------

/// Replaces one direction of the endpoint's own rule.
pub(crate) async fn set_own_rule(
    c: &impl GenericClient,
    id: EndpointId,
    dir: Dir,
    rule: &Option<Vec<Selector>>,
) -> Result<()> {
    let sql = match dir {
        Dir::In => "update endpoints set rules_in = $2 where id = $1",
        Dir::Out => "update endpoints set rules_out = $2 where id = $1",
    };
    c.execute(sql, &[&id, &scope::selector_texts(rule)]).await?;
    Ok(())
}

/// Inserts a cap on the endpoint (and so on its descendants) set by `set_by`.
pub(crate) async fn insert_cap(
    c: &impl GenericClient,
    id: EndpointId,
    dir: Dir,
    selectors: &[Selector],
    set_by: EndpointId,
) -> Result<()> {
    let stored: Vec<String> = selectors.iter().map(ToString::to_string).collect();
    c.execute(
        "insert into caps (endpoint_id, dir, selectors, set_by) values ($1, $2, $3, $4)",
        &[&id, &dir.as_str(), &stored, &set_by],
    )
    .await?;
    Ok(())
}

/// Adds selectors to the caps `set_by` set on the endpoint in one direction; how many it widened.
pub(crate) async fn widen_caps(
    c: &impl GenericClient,
    id: EndpointId,
    dir: Dir,
    set_by: EndpointId,
    extra: &[Selector],
) -> Result<u64> {
    let extra: Vec<String> = extra.iter().map(ToString::to_string).collect();
    Ok(c.execute(
        "update caps set selectors = array(select distinct unnest(selectors || $4::text[]))
         where endpoint_id = $1 and dir = $2 and set_by = $3",
        &[&id, &dir.as_str(), &set_by, &extra],
    )
    .await?)
}

/// Who set cap `cap_id` on the endpoint; `None` when it has no such cap.
pub(crate) async fn cap_setter(c: &impl GenericClient, cap_id: CapId, id: EndpointId) -> Result<Option<EndpointId>> {
    c.query_opt("select set_by from caps where id = $1 and endpoint_id = $2", &[&cap_id, &id])
        .await?
        .map(|r| r.only())
        .transpose()
}

pub(crate) async fn delete_cap(c: &impl GenericClient, cap_id: CapId) -> Result<()> {
    c.execute("delete from caps where id = $1", &[&cap_id]).await?;
    Ok(())
}

/// Endpoints of the accounts other than `except` whose session has not ended, on machines not
/// revoked, by address, with their ids; those within their lease unless `all`.
pub(crate) async fn peer_candidates(
    c: &impl GenericClient,
    accounts: &[AccountId],
    except: EndpointId,
    all: bool,
) -> Result<Vec<(EndpointId, Endpoint)>> {
    let sql = format!(
        "select e.id, {ENDPOINT_COLUMNS}
         from endpoints e
         join endpoint_addresses ea on ea.id = e.id
         join machines m on m.id = e.machine_id
         where m.account_id = any($1) and m.revoked_at is null and e.id <> $2 and e.ended_at is null
           and ($3 or e.online_until > now())
         order by ea.address"
    );
    c.query(&sql, &[&accounts, &except, &all])
        .await?
        .iter()
        .map(|r| Ok((r.col("id")?, Endpoint::from_row(r)?)))
        .collect()
}

// ---- groups --------------------------------------------------------------------------------------

/// Inserts a group of the account owned by `owner`; its id, or `None` when the name is taken.
pub(crate) async fn insert_group(
    c: &impl GenericClient,
    account_id: AccountId,
    name: &str,
    owner: EndpointId,
    rules_in: &Option<Vec<Selector>>,
    rules_out: &Option<Vec<Selector>>,
) -> Result<Option<GroupId>> {
    c.query_opt(
        "insert into groups (account_id, name, owner_id, rules_in, rules_out) values ($1, $2, $3, $4, $5)
         on conflict (account_id, name) do nothing returning id",
        &[&account_id, &name, &owner, &scope::selector_texts(rules_in), &scope::selector_texts(rules_out)],
    )
    .await?
    .map(|r| r.only())
    .transpose()
}

/// How many groups the account holds.
pub(crate) async fn group_count(c: &impl GenericClient, account_id: AccountId) -> Result<i64> {
    c.query_one("select count(*) from groups where account_id = $1", &[&account_id]).await?.only()
}

/// Inserts a member into a group that cannot hold it yet (a new group's owner).
pub(crate) async fn insert_member(c: &impl GenericClient, group: GroupId, member: EndpointId) -> Result<()> {
    c.execute("insert into group_members (group_id, endpoint_id) values ($1, $2)", &[&group, &member]).await?;
    Ok(())
}

/// Adds a member to a group unless it is one already.
pub(crate) async fn ensure_member(c: &impl GenericClient, group: GroupId, member: EndpointId) -> Result<()> {
    c.execute(
        "insert into group_members (group_id, endpoint_id) values ($1, $2) on conflict do nothing",
        &[&group, &member],
    )
    .await?;
    Ok(())
}

/// Removes a member from a group; how many rows went (0 when it was no member).
pub(crate) async fn remove_member(c: &impl GenericClient, group: GroupId, member: EndpointId) -> Result<u64> {
    Ok(c.execute("delete from group_members where group_id = $1 and endpoint_id = $2", &[&group, &member]).await?)
}

/// Whether the endpoint belongs to the account.
pub(crate) async fn in_account(c: &impl GenericClient, id: EndpointId, account_id: AccountId) -> Result<bool> {
    c.query_one("select account_id = $2 from endpoint_addresses where id = $1", &[&id, &account_id]).await?.only()
}

/// Replaces one direction of a group's rule.
pub(crate) async fn set_group_rule(
    c: &impl GenericClient,
    group: GroupId,
    dir: Dir,
    rule: &Option<Vec<Selector>>,
) -> Result<()> {
    let sql = match dir {
        Dir::In => "update groups set rules_in = $2 where id = $1",
        Dir::Out => "update groups set rules_out = $2 where id = $1",
    };
    c.execute(sql, &[&group, &scope::selector_texts(rule)]).await?;
    Ok(())
}

/// Ids of the account's groups, by name.
pub(crate) async fn group_ids(c: &impl GenericClient, account_id: AccountId) -> Result<Vec<GroupId>> {
    c.query("select id from groups where account_id = $1 order by name", &[&account_id])
        .await?
        .iter()
        .map(|r| r.only())
        .collect()
}

pub(crate) async fn delete_group(c: &impl GenericClient, group: GroupId) -> Result<()> {
    c.execute("delete from groups where id = $1", &[&group]).await?;
    Ok(())
}

/// The endpoint's rules as `rules show` reports them: its own, its caps and its groups.
pub(crate) async fn read_rules(c: &impl GenericClient, id: EndpointId) -> Result<RulesView> {
    let loaded = load(c, &[id]).await?;
    let s = loaded.get(&id).ok_or_else(|| Error::not_found(EntityKind::Endpoint, "no such endpoint"))?;
    let parent = match s.party.parent {
        Some(p) => c
            .query_opt("select address from endpoint_addresses where id = $1", &[&p])
            .await?
            .map(|r| r.only::<String>())
            .transpose()?,
        None => None,
    };
    Ok(s.view(parent))
}

/// The id and owner of the caller's account's group `name`.
pub(crate) async fn group_id(c: &impl GenericClient, caller: &Caller, name: &str) -> Result<(GroupId, EndpointId)> {
    validate(NameKind::Handle, name).map_err(|_| Error::invalid(format!("invalid group name {name:?}")))?;
    let row = c
        .query_opt("select id, owner_id from groups where account_id = $1 and name = $2", &[&caller.account_id, &name])
        .await?
        .ok_or_else(|| Error::not_found(EntityKind::Group, format!("no group {name} in your account")))?;
    Ok((row.col("id")?, row.col("owner_id")?))
}

/// A group as `group show` reports it: its owner, rules and members.
pub(crate) async fn group_view(c: &impl GenericClient, group_id: GroupId) -> Result<GroupView> {
    let row = c
        .query_one(
            "select g.name, ea.address as owner, g.rules_in, g.rules_out from groups g
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
        .map(|r| r.only())
        .collect::<Result<_>>()?;
    Ok(GroupView {
        name: row.col("name")?,
        owner: row.col("owner")?,
        rules_in: scope::selector_texts(&parse_stored(row.col("rules_in")?)?),
        rules_out: scope::selector_texts(&parse_stored(row.col("rules_out")?)?),
        members,
    })
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
    .map(|r| Ok((r.col("id")?, r.col("address")?)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::identity::caller_of;
    use crate::store::testing;

    #[tokio::test]
    async fn reach_spans_the_account_and_its_contacts_and_a_group_send_reaches_its_live_members_but_the_sender() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (globex, boxed) = db.machine("globex", "box").await;
        let (ann, bob, old) = (
            db.endpoint(laptop, "ann", 0).await,
            db.endpoint(laptop, "bob", 0).await,
            db.endpoint(laptop, "old", 0).await,
        );
        let gus = db.endpoint(boxed, "gus", 0).await;
        let c = db.store.client().await.unwrap();
        assert_eq!(reach(acme, &[], acme), Reach::SameAccount);
        assert_eq!(reach(acme, &[globex], globex), Reach::Contact);
        assert_eq!(reach(acme, &[], globex), Reach::None);
        assert!(in_account(&c, bob, acme).await.unwrap() && !in_account(&c, gus, acme).await.unwrap());

        let from_ann = caller_of(&c, ann).await.unwrap();
        assert_eq!(resolve_in_reach(&c, &from_ann, &[], "bob").await.unwrap(), (bob, "acme/laptop/bob".to_owned()));
        assert!(resolve_in_reach(&c, &from_ann, &[], "globex/box/gus").await.is_err(), "a stranger reads as absent");
        assert_eq!(resolve_in_reach(&c, &from_ann, &[globex], "globex/box/gus").await.unwrap().0, gus, "a contact's");
        let loaded = load(&c, &[ann, gus]).await.unwrap();
        assert_eq!((loaded[&ann].party.account_id, loaded[&gus].party.account_id), (acme, globex));

        // Every live endpoint of the accounts but the asker, online or not as asked.
        let candidates = async |all| -> Vec<EndpointId> {
            peer_candidates(&c, &[acme, globex], ann, all).await.unwrap().into_iter().map(|(id, _)| id).collect()
        };
        assert_eq!(candidates(true).await, [bob, old, gus]);
        assert!(candidates(false).await.is_empty(), "none is online");

        let team = insert_group(&c, acme, "team", ann, &None, &None).await.unwrap().unwrap();
        let other = insert_group(&c, acme, "alpha", ann, &None, &None).await.unwrap().unwrap();
        assert_eq!(group_ids(&c, acme).await.unwrap(), [other, team], "by name");
        for member in [ann, bob, old] {
            insert_member(&c, team, member).await.unwrap();
        }
        super::super::identity::end_session(&c, old).await.unwrap();
        let members: Vec<EndpointId> =
            group_members_for_send(&c, &from_ann, "team").await.unwrap().into_iter().map(|(id, _)| id).collect();
        assert_eq!(members, [bob], "not the sender, not an ended session");
        set_group_rule(&c, team, Dir::Out, &Some(vec![Selector::parse("handle:bob").unwrap()])).await.unwrap();
        assert_eq!(group_view(&c, team).await.unwrap().rules_out, Some(vec!["handle:bob".to_owned()]));
    }

    #[tokio::test]
    async fn rules_and_caps_decide_who_may_message_whom() {
        let db = testing::db().await;
        let (_, machine) = db.machine("acme", "laptop").await;
        let (ann, bob, rev) = (
            db.endpoint(machine, "ann", 0).await,
            db.endpoint(machine, "bob", 0).await,
            db.endpoint(machine, "rev-1", 0).await,
        );
        let c = db.store.client().await.unwrap();
        let (from_ann, from_rev) = (caller_of(&c, ann).await.unwrap(), caller_of(&c, rev).await.unwrap());
        let allowed = async |from: &Caller| decide_many(&c, from, &[], &[bob]).await.unwrap()[&bob].refusal().is_none();
        assert!(allowed(&from_ann).await && allowed(&from_rev).await, "open by default");

        set_own_rule(&c, bob, Dir::In, &Some(vec![Selector::parse("handle:rev-*").unwrap()])).await.unwrap();
        assert!(!allowed(&from_ann).await && allowed(&from_rev).await, "bob takes only reviewers");
        let refused = Error::from(messageable(&c, &from_ann, "bob").await.unwrap_err());
        assert!(matches!(refused, Error::PermissionDenied(_)), "{refused:?}");
        assert_eq!(messageable(&c, &from_rev, "bob").await.unwrap(), (bob, "acme/laptop/bob".to_owned()));

        // A cap set on rev-1 by ann binds what rev-1 sends, whatever its own rules say.
        insert_cap(&c, rev, Dir::Out, &[Selector::parse("handle:ann").unwrap()], ann).await.unwrap();
        assert!(!allowed(&from_rev).await, "capped to ann");
        let cap = CapId(db.test.sql().await.query_one("select id from caps", &[]).await.unwrap().get(0));
        assert_eq!(cap_setter(&c, cap, rev).await.unwrap(), Some(ann));
        assert_eq!(cap_setter(&c, cap, bob).await.unwrap(), None, "a cap is found only on the endpoint it binds");
        let caps = read_rules(&c, rev).await.unwrap().caps;
        assert_eq!(
            (caps.len(), caps[0].selectors.clone(), caps[0].by.as_str()),
            (1, vec!["handle:ann".to_owned()], "acme/laptop/ann")
        );
        assert_eq!(widen_caps(&c, rev, Dir::Out, ann, &[Selector::parse("handle:bob").unwrap()]).await.unwrap(), 1);
        assert!(allowed(&from_rev).await, "widened to bob");
        delete_cap(&c, cap).await.unwrap();
        assert!(read_rules(&c, rev).await.unwrap().caps.is_empty());
    }

    #[tokio::test]
    async fn a_groups_name_is_taken_once_its_members_come_and_go_and_rules_read_back_as_set() {
        let db = testing::db().await;
        let (account, machine) = db.machine("acme", "laptop").await;
        let (ann, bob) = (db.endpoint(machine, "ann", 0).await, db.endpoint(machine, "bob", 0).await);
        let c = db.store.client().await.unwrap();
        let reviewers_only = Some(vec![Selector::parse("handle:rev-*").unwrap()]);
        let group =
            insert_group(&c, account, "reviewers", ann, &reviewers_only, &None).await.unwrap().expect("a new name");
        assert!(
            insert_group(&c, account, "reviewers", bob, &None, &None).await.unwrap().is_none(),
            "a name is taken once"
        );
        assert_eq!(group_count(&c, account).await.unwrap(), 1);
        insert_member(&c, group, bob).await.unwrap();
        ensure_member(&c, group, bob).await.unwrap();
        let owner = caller_of(&c, ann).await.unwrap();
        assert_eq!(group_id(&c, &owner, "reviewers").await.unwrap(), (group, ann));
        let expected = GroupView {
            name: "reviewers".into(),
            owner: "acme/laptop/ann".into(),
            rules_in: Some(vec!["handle:rev-*".into()]),
            rules_out: None,
            members: vec!["acme/laptop/bob".into()],
        };
        assert_eq!(group_view(&c, group).await.unwrap(), expected, "a member added twice is there once");
        assert_eq!(read_rules(&c, bob).await.unwrap().groups, ["reviewers"]);
        assert_eq!(remove_member(&c, group, bob).await.unwrap(), 1);
        assert_eq!(remove_member(&c, group, bob).await.unwrap(), 0, "gone already");

        set_own_rule(&c, bob, Dir::Out, &reviewers_only).await.unwrap();
        let rules = read_rules(&c, bob).await.unwrap();
        assert_eq!(
            (rules.address.as_str(), rules.rules_in, rules.rules_out),
            ("acme/laptop/bob", None, Some(vec!["handle:rev-*".into()]))
        );
        assert!(rules.groups.is_empty());

        delete_group(&c, group).await.unwrap();
        let gone = Error::from(group_id(&c, &owner, "reviewers").await.unwrap_err());
        assert!(matches!(gone, Error::NotFound { kind: EntityKind::Group, .. }), "{gone:?}");
        let bad = Error::from(group_id(&c, &owner, "no/slashes").await.unwrap_err());
        assert!(matches!(bad, Error::Invalid(_)), "{bad:?}");
    }
}
