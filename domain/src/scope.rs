//! Scope: who may message whom. Pure rules over a snapshot the store loads inside the send
//! transaction.
//!
//! A message from A to B is allowed when the accounts reach each other (same account, or a contact
//! both accepted), A's own `out` rule and every `out` cap binding A admit B, and B's own `in` rule and
//! every `in` cap binding B admit A. A rule of `None` is open. Caps bind the endpoint they are set on
//! and all its descendants, so an ancestor's narrowing cannot be undone below it.

use std::fmt;

use super::address::{Address, Origin};
use super::ids::{AccountId, EndpointId};
use super::names::{NameKind, validate};
use super::{Error, Result};

/// The most selectors one rule or cap may hold.
pub const MAX_SELECTORS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeRel {
    Parent,
    Children,
    Siblings,
    Myself,
    Descendants,
}

/// One term of a rule: whom it admits, seen from the endpoint the rule belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Any,
    /// `ep:<address>`, kept as written and read relative to the rule's owner.
    Endpoint(String),
    /// `handle:<glob>` with `*` and `?`.
    Handle(String),
    /// `group:<name>`; `group:self` in a group's rules means that group's members.
    Group(String),
    Tree(TreeRel),
    /// `fleet:<root address>`: the root and everything spawned below it.
    Fleet(String),
}

impl Selector {
    pub fn parse(raw: &str) -> Result<Self> {
        let text = raw.trim();
        let bad = |why: &str| {
            Error::invalid(format!(
                "invalid selector {raw:?}: {why}; use *, ep:<address>, handle:<glob>, group:<name>, tree:parent|children|siblings|self|descendants or fleet:<root>"
            ))
        };
        if text == "*" {
            return Ok(Self::Any);
        }
        let (kind, value) = text.split_once(':').ok_or_else(|| bad("no kind"))?;
        let value = value.trim();
        if value.is_empty() {
            return Err(bad("nothing after the colon"));
        }
        let check_address = |v: &str| {
            // Any origin will do: only the syntax is checked here.
            Address::parse(v, Origin { account: "a", machine: "m" }).map(|_| ()).map_err(|e| bad(&e.to_string()))
        };
        match kind {
            "ep" => check_address(value).map(|()| Self::Endpoint(value.to_owned())),
            "fleet" => check_address(value).map(|()| Self::Fleet(value.to_owned())),
            "handle" => {
                let ok = value.len() <= 64
                    && value
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'*' | b'?'));
                if ok {
                    Ok(Self::Handle(value.to_owned()))
                } else {
                    Err(bad("a handle glob uses a-z, 0-9, '-', '*' and '?'"))
                }
            }
            "group" => {
                if value == "self" || super::names::is_valid_name(value) {
                    Ok(Self::Group(value.to_owned()))
                } else {
                    Err(bad("not a group name"))
                }
            }
            "tree" => match value {
                "parent" => Ok(Self::Tree(TreeRel::Parent)),
                "children" => Ok(Self::Tree(TreeRel::Children)),
                "siblings" => Ok(Self::Tree(TreeRel::Siblings)),
                "self" => Ok(Self::Tree(TreeRel::Myself)),
                "descendants" => Ok(Self::Tree(TreeRel::Descendants)),
                _ => Err(bad("tree takes parent, children, siblings, self or descendants")),
            },
            _ => Err(bad("unknown kind")),
        }
    }

    pub fn parse_list(raw: &[String]) -> Result<Vec<Self>> {
        if raw.len() > MAX_SELECTORS {
            return Err(Error::invalid(format!("{} selectors; a rule holds at most {MAX_SELECTORS}", raw.len())));
        }
        let mut out: Vec<Self> = Vec::with_capacity(raw.len());
        for sel in raw.iter().filter(|s| !s.trim().is_empty()) {
            let sel = Self::parse(sel)?;
            if !out.contains(&sel) {
                out.push(sel);
            }
        }
        Ok(out)
    }

    /// Whether this selector, in a rule owned by `owner`, admits `other`. `group_self` names the
    /// group whose rules these are, for `group:self`.
    pub fn admits(&self, owner: &Party, other: &Party, group_self: Option<&str>) -> bool {
        let resolve = |raw: &str| {
            Address::parse(raw, Origin { account: &owner.account, machine: &owner.machine }).map(|a| a.to_string())
        };
        match self {
            Self::Any => true,
            Self::Endpoint(raw) => resolve(raw).is_ok_and(|a| a == other.address),
            Self::Handle(glob) => glob_match(glob, &other.handle),
            Self::Group(name) if name == "self" => {
                group_self.is_some_and(|g| other.account == owner.account && other.groups.iter().any(|m| m == g))
            }
            Self::Group(name) => other.account == owner.account && other.groups.iter().any(|m| m == name),
            Self::Tree(TreeRel::Parent) => owner.parent == Some(other.id),
            Self::Tree(TreeRel::Children) => other.parent == Some(owner.id),
            Self::Tree(TreeRel::Siblings) => {
                owner.parent.is_some() && other.parent == owner.parent && other.id != owner.id
            }
            Self::Tree(TreeRel::Myself) => other.id == owner.id,
            Self::Tree(TreeRel::Descendants) => other.ancestors.contains(&owner.id),
            Self::Fleet(raw) => resolve(raw).is_ok_and(|root| root == other.root_address),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Endpoint(a) => write!(f, "ep:{a}"),
            Self::Handle(g) => write!(f, "handle:{g}"),
            Self::Group(g) => write!(f, "group:{g}"),
            Self::Fleet(r) => write!(f, "fleet:{r}"),
            Self::Tree(rel) => f.write_str(match rel {
                TreeRel::Parent => "tree:parent",
                TreeRel::Children => "tree:children",
                TreeRel::Siblings => "tree:siblings",
                TreeRel::Myself => "tree:self",
                TreeRel::Descendants => "tree:descendants",
            }),
        }
    }
}

/// `*` matches any run of characters, `?` any one.
pub fn glob_match(glob: &str, text: &str) -> bool {
    let (g, t) = (glob.as_bytes(), text.as_bytes());
    let (mut gi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if gi < g.len() && (g[gi] == b'?' || g[gi] == t[ti]) {
            gi += 1;
            ti += 1;
        } else if gi < g.len() && g[gi] == b'*' {
            star = Some((gi, ti));
            gi += 1;
        } else if let Some((sg, st)) = star {
            gi = sg + 1;
            ti = st + 1;
            star = Some((sg, st + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|c| *c == b'*')
}

/// A preset for both directions: `open` clears the rule, the others replace it.
pub fn preset(name: &str) -> Result<Option<Vec<Selector>>> {
    match name {
        "open" => Ok(None),
        "tree" => Ok(Some(vec![Selector::Tree(TreeRel::Parent), Selector::Tree(TreeRel::Descendants)])),
        "parent" => Ok(Some(vec![Selector::Tree(TreeRel::Parent)])),
        "none" => Ok(Some(Vec::new())),
        other => Err(Error::invalid(format!("invalid scope {other:?}: use open, tree, parent or none"))),
    }
}

/// An endpoint as scope sees it.
#[derive(Debug, Clone, Default)]
pub struct Party {
    pub id: EndpointId,
    pub account_id: AccountId,
    pub account: String,
    pub machine: String,
    pub handle: String,
    pub address: String,
    pub parent: Option<EndpointId>,
    /// Parent first, root last.
    pub ancestors: Vec<EndpointId>,
    /// Address of the root of its spawn tree (its own when it has no parent).
    pub root_address: String,
    /// Names of the groups it belongs to, in its own account.
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    In,
    Out,
}

impl Dir {
    pub fn parse(raw: &str) -> Result<Self> {
        match raw {
            "in" => Ok(Self::In),
            "out" => Ok(Self::Out),
            other => Err(Error::Internal(format!("unknown cap direction {other}"))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::In => "in",
            Self::Out => "out",
        }
    }
}

/// A narrowing put on an endpoint (and its descendants) by an ancestor or by a group.
#[derive(Debug, Clone)]
pub struct Cap {
    /// `cap-<n>` for caps set by endpoints, `group:<name>` for a group's rules.
    pub id: String,
    pub dir: Dir,
    pub selectors: Vec<Selector>,
    /// Who set it: an address, or `group <name>`.
    pub by: String,
    /// For a group's rules: the group, which `group:self` names.
    pub group: Option<String>,
}

/// An endpoint with its own rules and every cap that binds it.
#[derive(Debug, Clone, Default)]
pub struct Scoped {
    pub party: Party,
    pub rules_in: Option<Vec<Selector>>,
    pub rules_out: Option<Vec<Selector>>,
    pub caps: Vec<Cap>,
}

impl Scoped {
    /// The endpoint's rules as `rules show` reports them: its own, its caps and its groups.
    pub fn view(&self, parent: Option<String>) -> RulesView {
        RulesView {
            address: self.party.address.clone(),
            parent: parent.unwrap_or_default(),
            rules_in: selector_texts(&self.rules_in),
            rules_out: selector_texts(&self.rules_out),
            caps: self
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
            groups: self.party.groups.clone(),
        }
    }
}

/// A rule's selectors as written; `None` is open.
pub fn selector_texts(rule: &Option<Vec<Selector>>) -> Option<Vec<String>> {
    rule.as_ref().map(|list| list.iter().map(ToString::to_string).collect())
}

/// Whether two accounts reach each other at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    SameAccount,
    Contact,
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// Why, in order; when refused, the last reason is the refusal.
    pub reasons: Vec<String>,
}

impl Verdict {
    pub fn refusal(&self) -> Option<&str> {
        (!self.allowed).then(|| self.reasons.last().map(String::as_str).unwrap_or("not allowed"))
    }
}

fn list(selectors: &[Selector]) -> String {
    if selectors.is_empty() {
        "nobody".to_owned()
    } else {
        selectors.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
    }
}

/// One side of a decision: `owner`'s rule and caps in `dir` must all admit `other`.
fn side(owner: &Scoped, other: &Party, dir: Dir, reasons: &mut Vec<String>) -> bool {
    let me = &owner.party.address;
    let rule = match dir {
        Dir::In => &owner.rules_in,
        Dir::Out => &owner.rules_out,
    };
    match rule {
        None => reasons.push(format!("{me} {} rule: open", dir.as_str())),
        Some(selectors) => match selectors.iter().find(|s| s.admits(&owner.party, other, None)) {
            Some(sel) => reasons.push(format!("{me} {} rule admits {} by {sel}", dir.as_str(), other.address)),
            None => {
                reasons.push(format!(
                    "{me} {} rule ({}) does not admit {}",
                    dir.as_str(),
                    list(selectors),
                    other.address
                ));
                return false;
            }
        },
    }
    for cap in owner.caps.iter().filter(|c| c.dir == dir) {
        match cap.selectors.iter().find(|s| s.admits(&owner.party, other, cap.group.as_deref())) {
            Some(sel) => reasons.push(format!(
                "{} ({} cap by {}) admits {} by {sel}",
                cap.id,
                dir.as_str(),
                cap.by,
                other.address
            )),
            None => {
                reasons.push(format!(
                    "{} on {me} ({} cap by {}: {}) does not admit {}",
                    cap.id,
                    dir.as_str(),
                    cap.by,
                    list(&cap.selectors),
                    other.address
                ));
                return false;
            }
        }
    }
    true
}

/// May `from` message `to`?
pub fn decide(from: &Scoped, to: &Scoped, reach: Reach) -> Verdict {
    let (a, b) = (&from.party, &to.party);
    let mut reasons = Vec::new();
    match reach {
        Reach::SameAccount => reasons.push(format!("same account {}", a.account)),
        Reach::Contact => reasons.push(format!("accounts {} and {} are contacts", a.account, b.account)),
        Reach::None => {
            reasons.push(format!("accounts {} and {} are not contacts", a.account, b.account));
            return Verdict { allowed: false, reasons };
        }
    }
    let allowed = side(from, b, Dir::Out, &mut reasons) && side(to, a, Dir::In, &mut reasons);
    Verdict { allowed, reasons }
}

/// A cap as `show` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapView {
    pub id: String,
    pub dir: String,
    pub selectors: Vec<String>,
    pub by: String,
    pub on: String,
}

/// An endpoint's rules, caps and groups. A rule of `None` is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesView {
    pub address: String,
    pub parent: String,
    pub rules_in: Option<Vec<String>>,
    pub rules_out: Option<Vec<String>>,
    pub caps: Vec<CapView>,
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    pub name: String,
    pub owner: String,
    pub rules_in: Option<Vec<String>>,
    pub rules_out: Option<Vec<String>>,
    pub members: Vec<String>,
}

/// A new group's name: a valid handle, other than `self` (`group:self` names a group's own members).
pub fn check_group_name(name: &str) -> Result<()> {
    validate(NameKind::Handle, name)
        .map_err(|_| Error::invalid(format!("invalid group name {name:?}: use a-z, 0-9 and '-'")))?;
    if name == "self" {
        return Err(Error::invalid("self is reserved: group:self means a group's own members"));
    }
    Ok(())
}

/// Only a group's owner changes it.
pub fn owner_only(caller: EndpointId, owner: EndpointId, name: &str) -> Result<()> {
    if owner == caller {
        Ok(())
    } else {
        Err(Error::PermissionDenied(format!("only the owner of group {name} may change it")))
    }
}

/// Someone the caller may message, and what admits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub endpoint: super::endpoint::Endpoint,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn party(id: i64, address: &str, parent: Option<i64>, ancestors: &[i64], root: &str) -> Party {
        let parts: Vec<&str> = address.split('/').collect();
        Party {
            id: EndpointId(id),
            account_id: AccountId(if parts[0] == "acme" { 1 } else { 2 }),
            account: parts[0].into(),
            machine: parts[1].into(),
            handle: parts[2].into(),
            address: address.into(),
            parent: parent.map(EndpointId),
            ancestors: ancestors.iter().copied().map(EndpointId).collect(),
            root_address: root.into(),
            groups: Vec::new(),
        }
    }

    /// root(1) → lead(2) → {w1(3), w2(4)}; other(5) unrelated; all in acme on box.
    fn family() -> Vec<Party> {
        vec![
            party(1, "acme/box/root", None, &[], "acme/box/root"),
            party(2, "acme/box/lead", Some(1), &[1], "acme/box/root"),
            party(3, "acme/box/w1", Some(2), &[2, 1], "acme/box/root"),
            party(4, "acme/box/w2", Some(2), &[2, 1], "acme/box/root"),
            party(5, "acme/ci/other", None, &[], "acme/ci/other"),
        ]
    }

    fn sel(s: &str) -> Selector {
        Selector::parse(s).unwrap()
    }

    #[test]
    fn selectors_parse_and_print_back() {
        for s in [
            "*",
            "ep:acme/box/w1",
            "handle:w*",
            "group:ops",
            "group:self",
            "tree:parent",
            "tree:descendants",
            "fleet:root",
        ] {
            assert_eq!(sel(s).to_string(), s);
        }
        for bad in ["", "x", "tree:cousins", "ep:Bad", "handle:A*", "group:", "what:ever", "ep:a/b/c/d"] {
            let err = Selector::parse(bad).unwrap_err().to_string();
            assert!(err.contains("invalid selector"), "{bad}: {err}");
        }
    }

    #[test]
    fn tree_selectors_follow_the_spawn_tree() {
        let f = family();
        let (root, lead, w1, w2, other) = (&f[0], &f[1], &f[2], &f[3], &f[4]);
        let admits = |s: &str, owner: &Party, other: &Party| sel(s).admits(owner, other, None);
        assert!(admits("tree:parent", w1, lead) && !admits("tree:parent", w1, root));
        assert!(admits("tree:children", lead, w1) && !admits("tree:children", root, w1));
        assert!(
            admits("tree:siblings", w1, w2)
                && !admits("tree:siblings", w1, w1)
                && !admits("tree:siblings", root, other)
        );
        assert!(admits("tree:self", w1, w1) && !admits("tree:self", w1, w2));
        assert!(admits("tree:descendants", root, w2) && !admits("tree:descendants", w2, root));
        assert!(
            admits("fleet:box/root", other, w2) && admits("fleet:root", w1, root) && !admits("fleet:root", w1, other)
        );
        assert!(admits("ep:w2", w1, w2) && admits("ep:acme/box/w2", other, w2) && !admits("ep:w2", other, w2));
        assert!(admits("handle:w?", root, w1) && admits("handle:*", root, other) && !admits("handle:w", root, w1));
    }

    #[test]
    fn groups_admit_members_of_the_owners_account() {
        let mut f = family();
        f[2].groups = vec!["ops".into()];
        assert!(sel("group:ops").admits(&f[0], &f[2], None));
        assert!(!sel("group:ops").admits(&f[0], &f[3], None));
        assert!(sel("group:self").admits(&f[0], &f[2], Some("ops")));
        assert!(!sel("group:self").admits(&f[0], &f[2], None));
    }

    #[test]
    fn globs() {
        assert!(glob_match("w*", "worker-1") && glob_match("*-1", "worker-1") && glob_match("w?rker*", "worker"));
        assert!(!glob_match("w*", "lead") && !glob_match("w?", "w") && glob_match("*", ""));
    }

    fn scoped(p: &Party) -> Scoped {
        Scoped { party: p.clone(), ..Default::default() }
    }

    #[test]
    fn decisions_need_reach_rules_and_caps() {
        let f = family();
        let (lead, w1, w2, other) = (&f[1], &f[2], &f[3], &f[4]);
        let open = decide(&scoped(w1), &scoped(w2), Reach::SameAccount);
        assert!(open.allowed);
        assert_eq!(open.reasons[0], "same account acme");

        let stranger = decide(&scoped(w1), &scoped(other), Reach::None);
        assert!(!stranger.allowed && stranger.refusal().unwrap().contains("not contacts"));

        // The recipient's in rule.
        let mut parent_only = scoped(w2);
        parent_only.rules_in = preset("parent").unwrap();
        let v = decide(&scoped(w1), &parent_only, Reach::SameAccount);
        assert!(!v.allowed);
        assert_eq!(v.refusal().unwrap(), "acme/box/w2 in rule (tree:parent) does not admit acme/box/w1");
        assert!(decide(&scoped(lead), &parent_only, Reach::SameAccount).allowed);

        // A cap set by an ancestor binds even when the endpoint's own rules are open.
        let mut capped = scoped(w1);
        capped.caps.push(Cap {
            id: "cap-7".into(),
            dir: Dir::Out,
            selectors: vec![sel("tree:parent")],
            by: "acme/box/lead".into(),
            group: None,
        });
        let v = decide(&capped, &scoped(other), Reach::SameAccount);
        assert!(!v.allowed);
        assert!(
            v.refusal().unwrap().starts_with("cap-7 on acme/box/w1 (out cap by acme/box/lead: tree:parent)"),
            "{v:?}"
        );
        let v = decide(&capped, &scoped(lead), Reach::SameAccount);
        assert!(v.allowed, "{v:?}");
        assert!(v.reasons.iter().any(|r| r.contains("cap-7 (out cap by acme/box/lead) admits")));

        // None admits nobody; a group cap's group:self admits its members.
        let mut closed = scoped(w2);
        closed.rules_out = preset("none").unwrap();
        assert!(decide(&closed, &scoped(lead), Reach::SameAccount).refusal().unwrap().contains("(nobody)"));
        let mut grouped = scoped(w1);
        grouped.party.groups = vec!["ops".into()];
        grouped.caps.push(Cap {
            id: "group:ops".into(),
            dir: Dir::Out,
            selectors: vec![sel("group:self")],
            by: "group ops".into(),
            group: Some("ops".into()),
        });
        let mut member = scoped(w2);
        member.party.groups = vec!["ops".into()];
        assert!(decide(&grouped, &member, Reach::SameAccount).allowed);
        assert!(!decide(&grouped, &scoped(lead), Reach::SameAccount).allowed);
    }

    #[test]
    fn presets() {
        assert_eq!(preset("open").unwrap(), None);
        assert_eq!(preset("none").unwrap(), Some(vec![]));
        assert_eq!(preset("tree").unwrap().unwrap().len(), 2);
        assert!(preset("wide").is_err());
    }
}
