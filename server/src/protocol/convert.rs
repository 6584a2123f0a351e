//! The one place where the server's own shapes become wire types and back. Nothing below the
//! protocol layer knows `relay.v1`.

use relay_proto::v1 as wire;

use crate::app::claims::{Claimed, RepoRef};
use crate::app::messaging::Delivered;
use crate::domain::board::{Cleanup, Job, Repo};
use crate::domain::claims::Claim;
use crate::domain::delivery::{Kind, State};
use crate::domain::endpoint::Endpoint;
use crate::domain::ids::Seq;
use crate::domain::message::Sent;
use crate::domain::message::{Announcement, Message, Recipient};
use crate::domain::redact::Counts;
use crate::domain::scope::{CapView, GroupView, Peer, RulesView};
use crate::domain::search::{Found, Search};
use crate::domain::trust::{Approval, Contact, Decision, Hold, Peek, PeekTurn, Peeker};
use crate::domain::{Error, Result};
use crate::push::{announce, stream::Event};

pub fn delivery_state(state: Option<State>) -> wire::DeliveryState {
    match state {
        None => wire::DeliveryState::Unspecified,
        Some(State::Queued) => wire::DeliveryState::Queued,
        Some(State::Pushed) => wire::DeliveryState::Pushed,
        Some(State::Surfaced) => wire::DeliveryState::Surfaced,
        Some(State::Read) => wire::DeliveryState::Read,
        Some(State::Withdrawn) => wire::DeliveryState::Withdrawn,
    }
}

/// A state a bridge names; `None` for one the server has no such state for.
pub fn state_from_wire(state: wire::DeliveryState) -> Option<State> {
    match state {
        wire::DeliveryState::Unspecified => None,
        wire::DeliveryState::Queued => Some(State::Queued),
        wire::DeliveryState::Pushed => Some(State::Pushed),
        wire::DeliveryState::Surfaced => Some(State::Surfaced),
        wire::DeliveryState::Read => Some(State::Read),
        wire::DeliveryState::Withdrawn => Some(State::Withdrawn),
    }
}

/// A value of the server's as `relay.v1` carries it. `From` would do, but the orphan rule forbids
/// it here (both sides belong to other crates), so each conversion below is one of these.
pub trait WireFrom<T> {
    fn wire_from(value: T) -> Self;
}

/// [`WireFrom`] seen from the other side, as `Into` is to `From`.
pub trait IntoWire<W> {
    fn into_wire(self) -> W;
}

impl<T, W: WireFrom<T>> IntoWire<W> for T {
    fn into_wire(self) -> W {
        W::wire_from(self)
    }
}

/// A delivery's seq as the wire carries it: inboxes number from 1.
fn seq(seq: Seq) -> u64 {
    u64::try_from(seq.0).unwrap_or_default()
}

pub fn kind(kind: Kind) -> wire::MessageKind {
    match kind {
        Kind::Message => wire::MessageKind::Message,
        Kind::Ask => wire::MessageKind::Ask,
        Kind::Reply => wire::MessageKind::Reply,
    }
}

/// The kind a sender asks for; unspecified is a plain message, and a number `relay.v1` does not
/// know is refused.
pub fn kind_from_wire(kind: i32) -> Result<Kind> {
    Ok(match known::<wire::MessageKind>("kind", kind)? {
        wire::MessageKind::Unspecified | wire::MessageKind::Message => Kind::Message,
        wire::MessageKind::Ask => Kind::Ask,
        wire::MessageKind::Reply => Kind::Reply,
    })
}

/// An enum field's value, refused when `relay.v1` has no such value (a client built against
/// another contract, or a forged message): nothing unknown is taken for a default.
pub fn known<E: TryFrom<i32>>(field: &str, value: i32) -> Result<E> {
    E::try_from(value)
        .map_err(|_| Error::invalid(format!("{field} {value} is not a value relay.v1 knows: nothing was done")))
}

/// One event of a push stream, as the bridge receives it.
pub fn push(event: Event) -> wire::Push {
    let event = match event {
        Event::Message(m) => wire::push::Event::Message((*m).into_wire()),
        Event::Heartbeat { head_seq, operator } => {
            wire::push::Event::Heartbeat(wire::Heartbeat { head_seq: seq(head_seq), operator: Some(operator) })
        }
    };
    wire::Push { event: Some(event) }
}

/// One event of an `Announce` stream.
pub fn announce_event(event: announce::Event) -> wire::AnnounceEvent {
    let event = match event {
        announce::Event::Waiting => wire::announce_event::Event::Waiting(wire::Waiting {}),
        announce::Event::Announced(a) => wire::announce_event::Event::Announcement((*a).into_wire()),
    };
    wire::AnnounceEvent { event: Some(event) }
}

impl WireFrom<Announcement> for wire::Announcement {
    fn wire_from(a: Announcement) -> Self {
        let messages = a
            .messages
            .into_iter()
            .map(|m| wire::Announced {
                id: m.id.into(),
                seq: seq(m.seq),
                from: m.from,
                kind: kind(m.kind) as i32,
                require_reply: m.require_reply,
                topic: m.topic.unwrap_or_default(),
            })
            .collect();
        Self { messages, unread: a.unread }
    }
}

/// What redaction took out, by kind.
pub fn redactions(redacted: &Counts) -> Vec<wire::Redaction> {
    redacted.iter().map(|(kind, count)| wire::Redaction { kind: (*kind).to_owned(), count: *count }).collect()
}

/// A send's answer, telling the sender what was redacted from its body.
pub fn sent(sent: Sent, redacted: &Counts) -> wire::SendResponse {
    let redactions = redactions(redacted);
    wire::SendResponse {
        redactions,
        hold: sent.hold.map(String::from).unwrap_or_default(),
        id: sent.id.into(),
        thread: sent.thread,
        recipients: all(sent.recipients),
        duplicate: sent.duplicate,
        reply_to: sent.reply_to.map(String::from).unwrap_or_default(),
        skipped: all(sent.skipped),
    }
}

impl WireFrom<Delivered> for wire::SendResponse {
    fn wire_from(d: Delivered) -> Self {
        sent(d.sent, &d.redacted)
    }
}

/// A selector list from the wire, as text: absent stays absent.
pub fn selector_list(list: &Option<wire::Selectors>) -> Option<&[String]> {
    list.as_ref().map(|l| l.selectors.as_slice())
}

fn selectors(rule: Option<Vec<String>>) -> Option<wire::Selectors> {
    rule.map(|selectors| wire::Selectors { selectors })
}

/// Converts every item of a list.
pub fn all<T, U: WireFrom<T>>(list: Vec<T>) -> Vec<U> {
    list.into_iter().map(U::wire_from).collect()
}

impl WireFrom<Endpoint> for wire::Endpoint {
    fn wire_from(e: Endpoint) -> Self {
        Self {
            address: e.address,
            account: e.account,
            machine: e.machine,
            handle: e.handle,
            harness: e.harness,
            status: e.status,
            note: e.note,
            now: e.now,
            title: e.title,
            online: e.online,
            ended: e.ended,
            last_seen_ms: e.last_seen_ms,
            peek: e.peek,
            operator: e.operator,
        }
    }
}

impl WireFrom<Found> for wire::FoundMessage {
    fn wire_from(f: Found) -> Self {
        Self {
            id: f.id,
            thread: f.thread,
            from: f.from,
            sent_at: f.created_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            snippet: f.snippet,
            rank: f.rank,
        }
    }
}

/// A search as the caller asked it, checked.
pub fn search(r: &wire::SearchRequest) -> Result<Search> {
    let limit = (r.limit > 0).then_some(r.limit);
    let since = crate::domain::search::since(&r.since, chrono::Utc::now())?;
    Search::new(&r.query, Some(&r.from), Some(&r.to), Some(&r.thread), since, limit)
}

impl WireFrom<Message> for wire::Message {
    fn wire_from(m: Message) -> Self {
        Self {
            id: m.id.into(),
            seq: seq(m.seq),
            from: m.from,
            thread: m.thread,
            kind: kind(m.kind) as i32,
            body: m.body,
            reply_to: m.reply_to.map(String::from).unwrap_or_default(),
            sent_at_ms: m.sent_at_ms,
            relation: m.relation,
            require_reply: m.require_reply,
            private: m.private,
            topic: m.post.as_ref().map(|p| p.topic.clone()).unwrap_or_default(),
            topic_seq: m.post.as_ref().map_or(0, |p| p.seq.max(0) as u64),
            attachments: all(m.attachments),
        }
    }
}

impl WireFrom<crate::domain::artifact::Attached> for wire::Attachment {
    fn wire_from(a: crate::domain::artifact::Attached) -> Self {
        Self { sha256: a.sha256_hex(), name: a.name, size: a.size, binary: a.binary, redacted: a.redacted }
    }
}

impl WireFrom<Recipient> for wire::RecipientState {
    fn wire_from(r: Recipient) -> Self {
        Self { address: r.address, state: delivery_state(r.state) as i32, reason: r.reason, online: r.online }
    }
}

impl WireFrom<Repo> for wire::RepoView {
    fn wire_from(r: Repo) -> Self {
        Self { name: r.name, path: r.path, machine: r.machine }
    }
}

impl WireFrom<Job> for wire::JobView {
    fn wire_from(j: Job) -> Self {
        let next_run_local = j.next_run_local().unwrap_or_default();
        let text = Option::unwrap_or_default;
        Self {
            id: j.id.into(),
            state: j.column.name().to_owned(),
            title: j.title,
            detail: j.detail,
            repo: Some(j.repo.into_wire()),
            agent: j.agent.name().to_owned(),
            requires_pr: j.requires_pr,
            schedule: text(j.schedule),
            time_zone: text(j.time_zone),
            next_run_at: instant(j.next_run_at),
            run_count: j.run_count,
            last_run_at: instant(j.last_run_at),
            last_skip_reason: text(j.last_skip_reason),
            schedule_id: text(j.schedule_id.map(String::from)),
            posted_by: j.posted_by,
            posted_at: instant(Some(j.posted_at)),
            edited_by: text(j.edited_by),
            edited_at: instant(j.edited_at),
            attempts: j.attempts,
            last_error: text(j.last_error),
            branch: text(j.branch),
            worktree: text(j.worktree),
            agent_state: text(j.agent_state),
            pr_url: text(j.pr_url),
            summary: text(j.summary),
            started_at: instant(j.started_at),
            finished_at: instant(j.finished_at),
            closed_at: instant(j.closed_at),
            dispatcher_running: j.dispatcher_running,
            changed: j.changed,
            paths: j.paths,
            next_run_local,
        }
    }
}

/// An instant as the wire carries it: RFC 3339 in UTC to the second, empty when unset.
fn instant(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)).unwrap_or_default()
}

impl WireFrom<Cleanup> for wire::Cleanup {
    fn wire_from(c: Cleanup) -> Self {
        Self { id: c.id.into(), worktree: c.worktree, repo_path: c.repo_path }
    }
}

impl WireFrom<CapView> for wire::Cap {
    fn wire_from(c: CapView) -> Self {
        Self { id: c.id, dir: c.dir, selectors: c.selectors, by: c.by, on: c.on }
    }
}

impl WireFrom<RulesView> for wire::RulesView {
    fn wire_from(r: RulesView) -> Self {
        Self {
            address: r.address,
            parent: r.parent,
            rules_in: selectors(r.rules_in),
            rules_out: selectors(r.rules_out),
            caps: all(r.caps),
            groups: r.groups,
        }
    }
}

impl WireFrom<GroupView> for wire::GroupView {
    fn wire_from(g: GroupView) -> Self {
        Self {
            name: g.name,
            owner: g.owner,
            rules_in: selectors(g.rules_in),
            rules_out: selectors(g.rules_out),
            members: g.members,
        }
    }
}

impl WireFrom<Peer> for wire::Peer {
    fn wire_from(p: Peer) -> Self {
        Self { endpoint: Some(p.endpoint.into_wire()), reason: p.reason }
    }
}

impl WireFrom<Hold> for wire::HoldView {
    fn wire_from(h: Hold) -> Self {
        Self {
            id: h.id.into(),
            class: h.class,
            state: h.state.as_db().to_owned(),
            reason: h.reason,
            from: h.from,
            to: h.to,
            body: h.body,
            message_id: h.message_id.into(),
            attachments: all(h.files),
        }
    }
}

impl WireFrom<PeekTurn> for wire::PeekTurn {
    fn wire_from(t: PeekTurn) -> Self {
        Self { role: t.role, text: t.text, tools: t.tools }
    }
}

/// A peek turn as a bridge reports it.
pub fn peek_turn(t: wire::PeekTurn) -> PeekTurn {
    PeekTurn { role: t.role, text: t.text, tools: t.tools }
}

impl WireFrom<Peek> for wire::PeekView {
    fn wire_from(p: Peek) -> Self {
        Self { endpoint: p.endpoint, turns: all(p.turns), updated_at: instant(p.updated_at) }
    }
}

impl WireFrom<Peeker> for wire::PeekerView {
    fn wire_from(p: Peeker) -> Self {
        Self { by: p.by, at: instant(Some(p.at)), turns: p.turns }
    }
}

impl WireFrom<Approval> for wire::ApprovalView {
    fn wire_from(a: Approval) -> Self {
        Self {
            id: a.id.into(),
            state: a.state.as_db().to_owned(),
            job_id: a.job_id.into(),
            requester: a.requester,
            tool: a.tool,
            input: a.input,
        }
    }
}

impl WireFrom<Decision> for wire::PermissionDecision {
    fn wire_from(d: Decision) -> Self {
        Self { id: d.id.into(), state: d.state.as_db().to_owned(), reason: d.reason, decided_by: d.decided_by }
    }
}

impl WireFrom<Contact> for wire::ContactView {
    fn wire_from(c: Contact) -> Self {
        Self { account: c.account, state: c.state, withdrawn: c.withdrawn }
    }
}

impl WireFrom<Claim> for wire::PathClaim {
    fn wire_from(c: Claim) -> Self {
        Self {
            id: c.id.name(),
            holder: c.holder,
            repo: c.repo.to_string(),
            paths: c.paths.iter().map(|p| p.to_string()).collect(),
            exclusive: c.exclusive,
            reason: c.reason,
            since: instant(Some(c.since)),
            until: instant(Some(c.until)),
            kept: c.kept,
        }
    }
}

/// A repository a request must name.
pub fn required_repo(repo: Option<wire::RepoRef>) -> Result<RepoRef, tonic::Status> {
    repo_ref(repo).ok_or_else(|| tonic::Status::invalid_argument("repo is required"))
}

/// A repository as a request names it; `None` when it names none.
pub fn repo_ref(repo: Option<wire::RepoRef>) -> Option<RepoRef> {
    match repo?.kind? {
        wire::repo_ref::Kind::Remote(remote) => Some(RepoRef::Remote(remote)),
        wire::repo_ref::Kind::LocalPath(path) => Some(RepoRef::Local(path)),
    }
}

/// What a claim came to, as the wire carries it.
pub fn claimed(claimed: Claimed) -> wire::ClaimPathsResponse {
    match claimed {
        Claimed::Granted { claim, renewed } => {
            wire::ClaimPathsResponse { granted: true, claim: Some(claim.into_wire()), renewed, conflicts: Vec::new() }
        }
        Claimed::Conflicts(conflicts) => {
            wire::ClaimPathsResponse { granted: false, claim: None, renewed: false, conflicts: all(conflicts) }
        }
    }
}
