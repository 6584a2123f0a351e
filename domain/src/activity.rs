//! What the console's activity page shows a person: what the account's agents say to each other,
//! by thread; the claims in force; and who talked to whom in the last hour, as a picture of the
//! account's machines and their agents. The pure parts: filters, threads, and the picture's
//! geometry.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::claims::Claim;
use super::{Error, Result};

/// Messages the page reads at most from each agent's inbox: its newest.
pub const PER_INBOX: i64 = 100;
/// Threads the page shows at most, most recently active first.
pub const THREADS_SHOWN: usize = 50;
/// How far back the picture counts messages.
pub const GRAPH_WINDOW_S: f64 = 3600.0;

/// A message between agents, as stored (its body redacted when written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchanged {
    pub id: String,
    pub thread: String,
    pub from: String,
    pub to: Vec<String>,
    pub body: String,
    pub at: DateTime<Utc>,
    /// Files it carries.
    pub files: Vec<crate::artifact::Attached>,
}

/// One thread: its messages oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    pub id: String,
    pub messages: Vec<Exchanged>,
}

impl Thread {
    /// Everyone who wrote or was written to in it, in order of first appearance.
    pub fn agents(&self) -> Vec<&str> {
        let mut seen: Vec<&str> = Vec::new();
        for m in &self.messages {
            for a in std::iter::once(m.from.as_str()).chain(m.to.iter().map(String::as_str)) {
                if !seen.contains(&a) {
                    seen.push(a);
                }
            }
        }
        seen
    }
}

/// What a person narrowed the page to; empty fields narrow nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// An agent's address, or its `machine/handle` or handle.
    pub agent: String,
    /// A machine's name (or `account/machine`).
    pub machine: String,
    /// A repository's key or remote URL: the agents holding claims in it.
    pub repo: String,
    /// A topic (`#name`, `name` or `account/#name`): its posts, and no conversation.
    pub topic: String,
}

const MAX_FILTER_BYTES: usize = 256;

impl Filter {
    pub fn new(agent: &str, machine: &str, repo: &str, topic: &str) -> Result<Self> {
        let field = |name: &str, value: &str| -> Result<String> {
            let value = value.trim();
            if value.len() > MAX_FILTER_BYTES || value.chars().any(char::is_control) {
                return Err(Error::invalid(format!("{name} is not something an address or key can be")));
            }
            Ok(value.to_owned())
        };
        Ok(Self {
            agent: field("agent", agent)?,
            machine: field("machine", machine)?,
            repo: field("repo", repo)?,
            topic: field("topic", topic)?,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.agent.is_empty() && self.machine.is_empty() && self.repo.is_empty() && self.topic.is_empty()
    }

    /// Whether a message is shown: some agent in it is the one asked for, on the machine asked
    /// for, and (with a repository) among `repo_agents`, those holding claims in it.
    pub fn admits(&self, m: &Exchanged, repo_agents: Option<&[String]>) -> bool {
        if !self.topic.is_empty() {
            return false;
        }
        self.admits_agents(m, repo_agents)
    }

    /// Whether a topic's posts are shown: the topic asked for (by name, `#name` or in full), if any.
    pub fn admits_topic(&self, shown: &str) -> bool {
        let asked = self.topic.trim_start_matches('#');
        asked.is_empty() || shown == self.topic || shown.rsplit_once("/#").is_some_and(|(_, name)| name == asked)
    }

    fn admits_agents(&self, m: &Exchanged, repo_agents: Option<&[String]>) -> bool {
        let mut agents = std::iter::once(&m.from).chain(m.to.iter());
        agents.any(|a| {
            (self.agent.is_empty() || is_agent(a, &self.agent))
                && (self.machine.is_empty() || on_machine(a, &self.machine))
                && repo_agents.is_none_or(|held| held.contains(a))
        })
    }
}

/// Whether `address` (`account/machine/handle`) is the agent `asked` names: whole, or from its
/// machine on, or by handle.
fn is_agent(address: &str, asked: &str) -> bool {
    address == asked || address.ends_with(&format!("/{asked}"))
}

fn on_machine(address: &str, asked: &str) -> bool {
    let mut parts = address.split('/');
    let (account, machine) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    machine == asked || format!("{account}/{machine}") == asked
}

/// Messages grouped by thread: each thread's messages oldest first, threads most recently active
/// first, at most [`THREADS_SHOWN`].
pub fn threads(mut messages: Vec<Exchanged>) -> Vec<Thread> {
    messages.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.id.cmp(&b.id)));
    let mut by_thread: BTreeMap<String, Vec<Exchanged>> = BTreeMap::new();
    for m in messages {
        by_thread.entry(m.thread.clone()).or_default().push(m);
    }
    let mut threads: Vec<Thread> = by_thread.into_iter().map(|(id, messages)| Thread { id, messages }).collect();
    threads.sort_by(|a, b| b.messages.last().map(|m| m.at).cmp(&a.messages.last().map(|m| m.at)));
    threads.truncate(THREADS_SHOWN);
    threads
}

/// Who talked to whom: messages from one agent to another in the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub count: u32,
}

/// The activity page's content.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    pub threads: Vec<Thread>,
    /// The account's topics, each with its newest posts.
    pub topics: Vec<TopicPosts>,
    pub claims: Vec<Claim>,
    /// The account's agents (its live ones, and any other in an edge), by address.
    pub agents: Vec<String>,
    pub edges: Vec<Edge>,
}

/// Posts shown of each topic.
pub const POSTS_PER_TOPIC: i64 = 20;

/// One of the account's topics: whether contacts may follow it, how many follow it, and its
/// newest posts, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPosts {
    /// `account/#name`
    pub topic: String,
    pub open: bool,
    pub followers: i64,
    pub posts: Vec<Exchanged>,
}

// ---- the picture -------------------------------------------------------------------------------

/// Where things go in the picture, in its own units.
#[derive(Debug, Clone, PartialEq)]
pub struct Picture {
    pub width: f64,
    pub height: f64,
    pub machines: Vec<MachineBox>,
    pub lines: Vec<Line>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MachineBox {
    /// `account/machine`
    pub name: String,
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
    pub agents: Vec<Dot>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Dot {
    pub address: String,
    /// The handle, as labelled.
    pub label: String,
    pub x: f64,
    pub y: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub from: String,
    pub to: String,
    pub count: u32,
    pub x1: f64,
    pub y1: f64,
    pub x2: f64,
    pub y2: f64,
    /// Thicker for more messages: 1 for one, growing with the logarithm.
    pub width: f64,
}

const BOX_W: f64 = 180.0;
const ROW_H: f64 = 28.0;
const HEADER_H: f64 = 30.0;
const GAP: f64 = 60.0;
const COLUMNS: usize = 3;

/// Lays out machines in rows of [`COLUMNS`], each a box listing its agents; an edge joins two
/// agents' dots, as thick as the logarithm of its messages.
pub fn picture(agents: &[String], edges: &[Edge]) -> Picture {
    let mut by_machine: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let everyone = agents.iter().chain(edges.iter().flat_map(|e| [&e.from, &e.to]));
    for address in everyone {
        let machine = address.rsplit_once('/').map_or(address.as_str(), |(m, _)| m).to_owned();
        let list = by_machine.entry(machine).or_default();
        if !list.contains(address) {
            list.push(address.clone());
        }
    }
    let tallest = by_machine.values().map(Vec::len).max().unwrap_or(0) as f64;
    let box_h = HEADER_H + ROW_H * tallest.max(1.0);
    let mut machines = Vec::new();
    let mut at: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (i, (name, mut list)) in by_machine.into_iter().enumerate() {
        list.sort();
        let (col, row) = ((i % COLUMNS) as f64, (i / COLUMNS) as f64);
        let (x, y) = (GAP / 2.0 + col * (BOX_W + GAP), GAP / 2.0 + row * (box_h + GAP));
        let dots: Vec<Dot> = list
            .into_iter()
            .enumerate()
            .map(|(j, address)| {
                let dot = Dot {
                    label: address.rsplit('/').next().unwrap_or_default().to_owned(),
                    x: x + 16.0,
                    y: y + HEADER_H + ROW_H * (j as f64 + 0.5),
                    address,
                };
                at.insert(dot.address.clone(), (dot.x, dot.y));
                dot
            })
            .collect();
        machines.push(MachineBox { name, x, y, w: BOX_W, h: box_h, agents: dots });
    }
    let lines = edges
        .iter()
        .filter_map(|e| {
            let (&(x1, y1), &(x2, y2)) = (at.get(&e.from)?, at.get(&e.to)?);
            Some(Line {
                from: e.from.clone(),
                to: e.to.clone(),
                count: e.count,
                x1,
                y1,
                x2,
                y2,
                width: 1.0 + f64::from(e.count.max(1)).log2(),
            })
        })
        .collect();
    let columns = machines.len().clamp(1, COLUMNS) as f64;
    let rows = machines.len().div_ceil(COLUMNS).max(1) as f64;
    Picture { width: columns * (BOX_W + GAP), height: rows * (box_h + GAP), machines, lines }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, thread: &str, from: &str, to: &str, minute: u32) -> Exchanged {
        Exchanged {
            id: id.into(),
            thread: thread.into(),
            from: from.into(),
            to: vec![to.into()],
            body: format!("body {id}"),
            files: Vec::new(),
            at: DateTime::parse_from_rfc3339(&format!("2026-12-07T10:{minute:02}:00Z")).unwrap().with_timezone(&Utc),
        }
    }

    #[test]
    fn messages_are_grouped_by_thread_newest_thread_first() {
        let shown = threads(vec![
            message("b", "t1", "acme/a/x", "acme/b/y", 2),
            message("a", "t1", "acme/b/y", "acme/a/x", 1),
            message("c", "t2", "acme/a/x", "acme/c/z", 5),
        ]);
        assert_eq!(shown.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["t2", "t1"]);
        assert_eq!(shown[1].messages.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(shown[1].agents(), ["acme/b/y", "acme/a/x"]);
    }

    #[test]
    fn filters_narrow_by_agent_machine_and_repository() {
        let m = message("a", "t", "acme/laptop/ann", "acme/ci/bob", 1);
        let f = |agent: &str, machine: &str| Filter::new(agent, machine, "", "").unwrap();
        assert!(f("", "").admits(&m, None));
        assert!(f("bob", "").admits(&m, None) && f("ci/bob", "").admits(&m, None));
        assert!(f("acme/laptop/ann", "").admits(&m, None) && !f("carl", "").admits(&m, None));
        assert!(
            f("", "laptop").admits(&m, None) && f("", "acme/ci").admits(&m, None) && !f("", "box").admits(&m, None)
        );
        assert!(!f("ann", "ci").admits(&m, None), "the agent asked for, on the machine asked for");
        assert!(f("", "").admits(&m, Some(&["acme/ci/bob".into()])));
        assert!(!f("", "").admits(&m, Some(&[])), "nobody holds claims in that repository");
        assert!(!Filter::new("", "", "", "design").unwrap().admits(&m, None), "no message is in a topic yet");
        assert!(Filter::new("a\u{1b}", "", "", "").is_err());
    }

    #[test]
    fn the_picture_puts_each_agent_in_its_machine_and_thickens_busy_edges() {
        let agents = vec!["acme/laptop/ann".to_owned(), "acme/ci/bob".to_owned(), "acme/laptop/amy".to_owned()];
        let edges = vec![
            Edge { from: "acme/laptop/ann".into(), to: "acme/ci/bob".into(), count: 1 },
            Edge { from: "acme/ci/bob".into(), to: "acme/laptop/ann".into(), count: 8 },
            Edge { from: "acme/ci/bob".into(), to: "globex/box/gus".into(), count: 2 },
        ];
        let p = picture(&agents, &edges);
        let names: Vec<&str> = p.machines.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["acme/ci", "acme/laptop", "globex/box"], "a contact's agent in an edge is drawn too");
        let laptop = &p.machines[1];
        assert_eq!(laptop.agents.iter().map(|d| d.label.as_str()).collect::<Vec<_>>(), ["amy", "ann"]);
        for m in &p.machines {
            assert!(m.x >= 0.0 && m.y >= 0.0 && m.x + m.w <= p.width && m.y + m.h <= p.height, "{m:?} in the picture");
            for d in &m.agents {
                assert!(d.x > m.x && d.x < m.x + m.w && d.y > m.y && d.y < m.y + m.h, "{d:?} inside {}", m.name);
            }
        }
        assert_eq!(p.lines.len(), 3);
        assert_eq!(p.lines[0].width, 1.0);
        assert_eq!(p.lines[1].width, 4.0, "eight messages: 1 + log2 8");
    }

    #[test]
    fn an_empty_account_draws_an_empty_picture() {
        let p = picture(&[], &[]);
        assert!(p.machines.is_empty() && p.lines.is_empty() && p.width > 0.0 && p.height > 0.0);
    }
}
