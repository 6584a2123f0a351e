//! The scope tools: rules and caps, why, peers and groups. The server decides everything; these
//! only carry the request and word the answer.

use std::time::Duration;

use relay_proto::v1::*;
use serde_json::{Map, Value};

use super::args::{ArgError, Flag, needed, parse};
use super::input::{self, text, word};
use super::output;
use super::{Outcome, ToolError, Tools};
use crate::frame;

type Result<T> = std::result::Result<T, ToolError>;

pub async fn call(tools: &Tools, name: &str, arguments: &Map<String, Value>) -> Result<Outcome> {
    match name {
        "relay_rules" => rules(tools, parse(arguments)?).await,
        "relay_group" => group(tools, parse(arguments)?).await,
        "relay_peers" => peers(tools, parse(arguments)?).await,
        other => Err(ToolError::Refused(format!("no tool {other}"))),
    }
}

fn wrap(list: Option<impl Into<Vec<String>>>) -> Option<Selectors> {
    list.map(|selectors| Selectors { selectors: selectors.into() })
}

fn rule_text(rule: &Option<Selectors>) -> String {
    match rule {
        None => "open".to_owned(),
        Some(s) if s.selectors.is_empty() => "nobody".to_owned(),
        Some(s) => s.selectors.join(","),
    }
}

fn rule_list(rule: &Option<Selectors>) -> Option<Vec<String>> {
    rule.as_ref().map(|s| s.selectors.clone())
}

fn rules_outcome(view: RulesView) -> Outcome {
    let mut lines = vec![format!(
        "{}{}",
        view.address,
        if view.parent.is_empty() { String::new() } else { format!(" (spawned by {})", view.parent) }
    )];
    lines.push(format!("rules in: {}", rule_text(&view.rules_in)));
    lines.push(format!("rules out: {}", rule_text(&view.rules_out)));
    for cap in &view.caps {
        lines.push(format!(
            "{} {} cap by {}: {}",
            cap.id,
            cap.dir,
            cap.by,
            if cap.selectors.is_empty() { "nobody".to_owned() } else { cap.selectors.join(",") }
        ));
    }
    if !view.groups.is_empty() {
        lines.push(format!("groups: {}", view.groups.join(", ")));
    }
    let data = output::Rules {
        rules_in: rule_list(&view.rules_in),
        rules_out: rule_list(&view.rules_out),
        caps: view
            .caps
            .iter()
            .map(|c| output::Cap {
                id: c.id.clone(),
                dir: c.dir.clone(),
                selectors: c.selectors.clone(),
                by: c.by.clone(),
            })
            .collect(),
        groups: view.groups.clone(),
        address: view.address,
        parent: view.parent,
    };
    Outcome::data(lines.join("\n"), &output::RulesResult { rules: Some(data), why: None })
}

async fn rules(tools: &Tools, args: input::Rules) -> Result<Outcome> {
    let action = args.action.as_str();
    let endpoint = text(args.endpoint).trim().to_owned();
    let relay = tools.relay();
    let view = match action {
        "show" => {
            let request = ShowRulesRequest { endpoint };
            relay.call(Duration::ZERO, request, |mut c, r| async move { c.show_rules(r).await }).await?
        }
        "set" => {
            let request = SetRulesRequest {
                endpoint,
                rules_in: wrap(args.rules_in),
                rules_out: wrap(args.rules_out),
                scope: word(args.scope),
                allow: args.allow.map(|s| s.0).unwrap_or_default(),
            };
            relay.call(Duration::ZERO, request, |mut c, r| async move { c.set_rules(r).await }).await?
        }
        "widen" => {
            if endpoint.is_empty() {
                return Err(ArgError("widen takes endpoint: the agent whose caps you loosen".into()).into());
            }
            let request =
                WidenRulesRequest { endpoint, rules_in: wrap(args.rules_in), rules_out: wrap(args.rules_out) };
            relay.call(Duration::ZERO, request, |mut c, r| async move { c.widen_rules(r).await }).await?
        }
        "lift" => {
            let request = LiftCapRequest { endpoint, cap: needed(args.cap, "cap")?.0 };
            // Lifted twice, the second finds no cap.
            relay.call_once(Duration::ZERO, request, |mut c, r| async move { c.lift_cap(r).await }).await?
        }
        _ => {
            let request = WhyRequest { from: text(args.from), to: needed(args.to, "to")?.0 };
            let why = relay.call(Duration::ZERO, request, |mut c, r| async move { c.why(r).await }).await?;
            let head = format!("{} {} message {}", why.from, if why.allowed { "may" } else { "may not" }, why.to);
            let text = std::iter::once(head)
                .chain(why.reasons.iter().map(|r| format!("  {r}")))
                .collect::<Vec<_>>()
                .join("\n");
            let why = output::Why { from: why.from, to: why.to, allowed: why.allowed, reasons: why.reasons };
            return Ok(Outcome::data(text, &output::RulesResult { rules: None, why: Some(why) }));
        }
    };
    Ok(rules_outcome(view))
}

async fn peers(tools: &Tools, args: input::Peers) -> Result<Outcome> {
    let request = PeersRequest { all: Flag::or(args.all, false) };
    let reply = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.peers(r).await }).await?;
    let lines: Vec<String> = reply
        .peers
        .iter()
        .map(|p| {
            let e = p.endpoint.clone().unwrap_or_default();
            let presence = if e.online { "online" } else { "offline" };
            let title = if e.title.is_empty() { String::new() } else { format!("  title {}", frame::quote(&e.title)) };
            format!("{}  {}  {presence}{title}  ({})", e.address, e.harness, p.reason)
        })
        .collect();
    let data = output::Peers {
        peers: reply
            .peers
            .iter()
            .map(|p| {
                let e = p.endpoint.clone().unwrap_or_default();
                output::Peer {
                    address: e.address,
                    harness: e.harness,
                    online: e.online,
                    title: frame::neutralize(&e.title),
                    reason: p.reason.clone(),
                }
            })
            .collect(),
    };
    let foreign = reply.peers.iter().any(|p| p.endpoint.as_ref().is_some_and(|e| !e.title.is_empty()));
    let text = if lines.is_empty() {
        "nobody you may message is online (all: true includes offline agents)".to_owned()
    } else {
        lines.join("\n")
    };
    let outcome = Outcome::data(text, &data);
    Ok(if foreign { outcome.untrusted() } else { outcome })
}

fn group_text(g: &GroupView) -> String {
    format!(
        "group {}  owner {}\nrules in: {}\nrules out: {}\nmembers: {}",
        g.name,
        g.owner,
        rule_text(&g.rules_in),
        rule_text(&g.rules_out),
        if g.members.is_empty() { "none".to_owned() } else { g.members.join(", ") }
    )
}

async fn group(tools: &Tools, args: input::Group) -> Result<Outcome> {
    let action = args.action.as_str();
    let both = args.rules.map(|s| s.0);
    let request = GroupRequest {
        action: match action {
            "create" => GroupAction::Create,
            "add" => GroupAction::Add,
            "remove" => GroupAction::Remove,
            "rules" => GroupAction::Rules,
            "ls" => GroupAction::Ls,
            "show" => GroupAction::Show,
            _ => GroupAction::Drop,
        } as i32,
        name: text(args.name).trim().to_owned(),
        endpoint: text(args.endpoint).trim().to_owned(),
        rules_in: wrap(args.rules_in.map(|s| s.0).or_else(|| both.clone())),
        rules_out: wrap(args.rules_out.map(|s| s.0).or(both)),
    };
    let group = |mut c: crate::relay::session::Client, r| async move { c.group(r).await };
    // Creating or dropping a group twice is refused the second time: only reads are repeated.
    let reply = if matches!(action, "ls" | "show") {
        tools.relay().call(Duration::ZERO, request, group).await?
    } else {
        tools.relay().call_once(Duration::ZERO, request, group).await?
    };
    let data = output::Groups {
        groups: reply
            .groups
            .iter()
            .map(|g| output::Group {
                name: g.name.clone(),
                owner: g.owner.clone(),
                rules_in: rule_list(&g.rules_in),
                rules_out: rule_list(&g.rules_out),
                members: g.members.clone(),
            })
            .collect(),
        note: reply.note.clone(),
    };
    let text = if !reply.note.is_empty() {
        reply.note.clone()
    } else if reply.groups.is_empty() {
        "no groups in your account".to_owned()
    } else if action == "ls" {
        reply
            .groups
            .iter()
            .map(|g| format!("{}  owner {}  {} members", g.name, g.owner, g.members.len()))
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        reply.groups.iter().map(group_text).collect::<Vec<_>>().join("\n\n")
    };
    Ok(Outcome::data(text, &data))
}
