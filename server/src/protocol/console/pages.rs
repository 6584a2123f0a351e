//! The console's pages and the fragments its live pages fetch again, rendered from the
//! application's views by maud templates, which escape every value; text agents or people wrote
//! goes in through `shown` (see `html`).

use chrono::SecondsFormat;
use maud::{DOCTYPE, Markup, Render, html};

use super::html::{shown, web_link};
use crate::domain::activity::{self, Activity, Filter};
use crate::domain::board::{Column, Job, MAX_ATTEMPTS};
use crate::domain::caller::Human;
use crate::domain::console::{Agents, Board, ContactRow, Inbox, Received};
use crate::domain::delivery::Kind;
use crate::domain::endpoint::Endpoint;
use crate::domain::trust::ApprovalState;

/// The pages a signed-in person moves between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    Board,
    Agents,
    Activity,
    Inbox,
    Contacts,
}

impl Page {
    pub const ALL: [Self; 5] = [Self::Board, Self::Agents, Self::Activity, Self::Inbox, Self::Contacts];

    pub fn path(self) -> &'static str {
        match self {
            Self::Board => "/board",
            Self::Agents => "/agents",
            Self::Activity => "/activity",
            Self::Inbox => "/inbox",
            Self::Contacts => "/contacts",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Self::Board => "Board",
            Self::Agents => "Agents",
            Self::Activity => "Activity",
            Self::Inbox => "Inbox",
            Self::Contacts => "Contacts",
        }
    }

    /// The events of `/events` after which the page fetches its live part again: `account` (a
    /// card, hold or permission request changed), `inbox` (the human's inbox changed), `tick`
    /// (every few seconds, for presence), `ready` (the feed is open: anything missed before).
    fn live(self) -> &'static str {
        match self {
            Self::Board => "ready account",
            Self::Agents => "ready tick",
            Self::Activity => "ready account tick",
            Self::Inbox => "ready account inbox",
            Self::Contacts => "",
        }
    }

    /// Where the live part is fetched from.
    pub fn fragment(self) -> &'static str {
        match self {
            Self::Board => "/board/live",
            Self::Agents => "/agents/live",
            Self::Activity => "/activity/live",
            Self::Inbox => "/inbox/live",
            Self::Contacts => "",
        }
    }
}

/// What a finished action says on the page it returns to; fixed texts chosen by a code in the
/// address, so that no link can put words of its own on the page.
pub fn done_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "posted" => "Card posted to To do.",
        "edited" => "Card edited.",
        "accepted" => "Card accepted: it is Done.",
        "sent-back" => "Card sent back to To do with the note.",
        "sent" => "Message sent.",
        "replied" => "Reply sent.",
        "read" => "Marked read.",
        "released" => "Hold released: the message was delivered.",
        "rejected" => "Hold rejected: the sender was told why.",
        "allowed" => "Permission allowed.",
        "denied" => "Permission denied.",
        "requested" => "Contact requested.",
        "contact" => "Contact made.",
        "dropped" => "Contact dropped.",
        "private-on" => "Private data may now cross this contact.",
        "private-off" => "Private data may no longer cross this contact.",
        _ => return None,
    })
}

/// A line at the top of a page: what an action did, or why it was refused.
#[derive(Debug, Clone, Copy)]
pub enum Notice<'a> {
    Done(&'a str),
    Refused(&'a str),
}

fn notice_html(notice: Option<Notice<'_>>) -> Markup {
    html! {
        @match notice {
            Some(Notice::Done(text)) => { p class="notice done" role="status" { (shown(text)) } }
            Some(Notice::Refused(text)) => { p class="notice refused" role="alert" { (shown(text)) } }
            None => {}
        }
    }
}

fn csrf_field(csrf: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(shown(csrf)); }
}

/// A hidden form field.
fn hidden(name: &str, value: impl Render) -> Markup {
    html! { input type="hidden" name=(name) value=(value); }
}

/// A whole page around `body`. `person` is absent on the sign-in page.
fn layout(
    title: &str,
    page: Option<(Page, &str)>,
    person: Option<(&Human, &str)>,
    notice: Option<Notice<'_>>,
    body: Markup,
) -> String {
    let (live, fragment) = page.map_or(("", ""), |(p, fragment)| (p.live(), fragment));
    let page = page.map(|(p, _)| p);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (shown(title)) " · Relay" }
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
            }
            body data-live=(live) data-fragment=(fragment) {
                header {
                    @if let Some((person, csrf)) = person {
                        nav {
                            span class="brand" { "Relay" }
                            @for p in Page::ALL {
                                a href=(p.path()) aria-current=[(Some(p) == page).then_some("page")] { (p.title()) }
                            }
                            span class="who" { (shown(&person.account)) "/me (" (shown(&person.name)) ")" }
                            form method="post" action="/sign-out" class="inline" {
                                (csrf_field(csrf))
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main {
                    (notice_html(notice))
                    (body)
                }
            }
        }
    }
    .into_string()
}

/// A signed-in page.
pub fn page(page: Page, person: &Human, csrf: &str, notice: Option<Notice<'_>>, body: Markup) -> String {
    page_at(page, page.fragment(), person, csrf, notice, body)
}

/// A signed-in page whose live part is fetched from `fragment` (with the page's own filters).
pub fn page_at(
    page: Page,
    fragment: &str,
    person: &Human,
    csrf: &str,
    notice: Option<Notice<'_>>,
    body: Markup,
) -> String {
    layout(page.title(), Some((page, fragment)), Some((person, csrf)), notice, body)
}

/// The sign-in page, with the reason the last try was refused.
pub fn sign_in(refused: Option<&str>) -> String {
    let body = html! {
        section class="sign-in" {
            h1 { "Sign in to Relay" }
            p {
                "Sign in with your account's human token ("
                code { "relay-server admin human add ACCOUNT" }
                " issues one)."
            }
            form method="post" action="/sign-in" {
                label {
                    "Human token "
                    input type="password" name="token" autocomplete="current-password" required autofocus;
                }
                button type="submit" { "Sign in" }
            }
        }
    };
    layout("Sign in", None, None, refused.map(Notice::Refused), body)
}

/// A page that cannot be shown (the database is away, …), with the reason.
pub fn unavailable(reason: &str) -> String {
    let body = html! { p { a href="/board" { "Try again" } } };
    layout("Unavailable", None, None, Some(Notice::Refused(reason)), body)
}

// ---- the board ---------------------------------------------------------------------------------

/// The board page: the post form, and the columns that follow the server.
pub fn board(board: &Board, csrf: &str) -> Markup {
    html! {
        h1 { "Board" }
        @if board.repos.is_empty() {
            p class="hint" {
                "No repository is on the board yet: a machine's worker adds its repositories (agent-bridge \
                 worker), or the operator adds one with add_repo."
            }
        } @else {
            details class="post" id="post-card" {
                summary { "Post a card" }
                form method="post" action="/board/post" {
                    (csrf_field(csrf))
                    label { "Title " input name="title" maxlength="200" required; }
                    label { "Detail " textarea name="detail" rows="4" {} }
                    label {
                        "Repository "
                        select name="repo" {
                            @for repo in &board.repos {
                                option value=(shown(&repo.path)) {
                                    (shown(&repo.name)) " (" (shown(&repo.path)) " on " (shown(&repo.machine)) ")"
                                }
                            }
                        }
                    }
                    label {
                        "Agent "
                        select name="agent" {
                            option value="claude" { "claude" }
                            option value="codex" { "codex" }
                        }
                    }
                    label {
                        "Schedule "
                        input name="schedule" placeholder="empty: run once; or cron like 0 9 * * 1-5, @daily";
                    }
                    label {
                        "Paths "
                        input name="paths" placeholder="empty: none; or src/auth, docs/api (claimed for its agent while it runs)";
                    }
                    input type="hidden" name="time_zone" value="UTC";
                    label {
                        "Pull request "
                        select name="requires_pr" {
                            option value="" { "as the board decides (required unless scheduled)" }
                            option value="yes" { "required" }
                            option value="no" { "not required" }
                        }
                    }
                    button type="submit" { "Post" }
                }
            }
        }
        section id="live" aria-live="polite" { (board_live(board, csrf)) }
    }
}

/// The four columns.
pub fn board_live(board: &Board, csrf: &str) -> Markup {
    let done: Vec<&Job> = board.done.iter().collect();
    html! {
        div class="columns" {
            @for (state, title) in [("todo", "To do"), ("in-progress", "In progress"), ("review", "Review")] {
                @let cards: Vec<&Job> = board.open.iter().filter(|j| j.column.name() == state).collect();
                (column(state, title, cards.len() as u32, &cards, csrf))
            }
            (column("done", "Done", board.archived, &done, csrf))
        }
    }
}

fn column(state: &str, title: &str, count: u32, cards: &[&Job], csrf: &str) -> Markup {
    html! {
        section class="column" data-column=(state) {
            h2 { (title) " " span class="count" { (count) } }
            @if cards.is_empty() {
                p class="empty" { "No cards." }
            }
            @for job in cards {
                (card(job, csrf))
            }
            @if state == "done" && (cards.len() as u32) < count {
                p class="hint" { "The newest " (cards.len()) " of " (count) " are shown." }
            }
        }
    }
}

/// An optional text as a card shows it: empty when unset.
fn text(value: &Option<String>) -> &str {
    value.as_deref().unwrap_or_default()
}

fn card(job: &Job, csrf: &str) -> Markup {
    let id = shown(job.id.as_str());
    let attempts = (job.attempts > 0).then(|| format!("{} of {MAX_ATTEMPTS}", job.attempts));
    let schedule = job.schedule.as_ref().map(|s| format!("{s} ({})", job.time_zone.as_deref().unwrap_or("UTC")));
    let next = job.schedule.as_ref().and_then(|_| {
        job.next_run_local().or_else(|| job.next_run_at.map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true)))
    });
    let paths = job.paths.join(", ");
    let fields: [(&str, &str); 11] = [
        ("card", job.id.as_str()),
        ("repository", &format!("{} on {}", job.repo.name, job.repo.machine)),
        ("agent", job.agent.name()),
        ("posted by", &job.posted_by),
        ("branch", text(&job.branch)),
        ("attempts", attempts.as_deref().unwrap_or_default()),
        ("schedule", text(&schedule)),
        ("next run", text(&next)),
        ("held off", if job.schedule.is_some() { text(&job.last_skip_reason) } else { "" }),
        ("now", text(&job.agent_state)),
        ("paths", &paths),
    ];
    html! {
        article class="card" id={ "card-" (id) } data-card=(id) data-state=(job.column.name()) {
            h3 class="title" { (shown(&job.title)) }
            dl {
                @for (name, value) in fields {
                    @if !value.is_empty() {
                        dt { (name) }
                        dd { (shown(value)) }
                    }
                }
                @if let Some(pr_url) = job.pr_url.as_deref().filter(|u| !u.is_empty()) {
                    dt { "pull request" }
                    dd {
                        @match web_link(pr_url) {
                            Some(url) => { a href=(shown(url)) rel="noreferrer noopener" { (shown(url)) } }
                            None => { (shown(pr_url)) }
                        }
                    }
                }
            }
            @if let Some(error) = job.last_error.as_deref().filter(|e| !e.is_empty()) {
                p class="error" { (shown(error)) }
            }
            @if let Some(summary) = job.summary.as_deref().filter(|s| !s.is_empty()) {
                p class="summary" { (shown(summary)) }
            }
            @if !job.detail.trim().is_empty() {
                details id={ "detail-" (id) } {
                    summary { "Detail" }
                    pre { (shown(&job.detail)) }
                }
            }
            @match job.column {
                Column::Todo => { details id={ "edit-" (id) } {
                    summary { "Edit" }
                    form method="post" action="/board/edit" {
                        (csrf_field(csrf))
                        (hidden("id", &id))
                        label { "Title " input name="title" maxlength="200" value=(shown(&job.title)) required; }
                        label { "Detail " textarea name="detail" rows="4" { (shown(&job.detail)) } }
                        button type="submit" { "Save" }
                    }
                } }
                Column::Review => { div class="actions" {
                    form method="post" action="/board/close" class="inline" {
                        (csrf_field(csrf))
                        (hidden("id", &id))
                        (hidden("accept", "yes"))
                        button type="submit" class="accept" { "Accept" }
                    }
                    details id={ "back-" (id) } {
                        summary { "Send back" }
                        form method="post" action="/board/close" {
                            (csrf_field(csrf))
                            (hidden("id", &id))
                            (hidden("accept", "no"))
                            label { "Note for the next attempt " textarea name="note" rows="3" required {} }
                            button type="submit" { "Send back" }
                        }
                    }
                } }
                _ => {}
            }
        }
    }
}

// ---- agents ------------------------------------------------------------------------------------

pub fn agents(agents: &Agents, now_ms: i64) -> Markup {
    html! {
        h1 { "Agents" }
        section id="live" aria-live="polite" { (agents_live(agents, now_ms)) }
    }
}

pub fn agents_live(agents: &Agents, now_ms: i64) -> Markup {
    html! {
        h2 { "This account" }
        (endpoints(&agents.own, now_ms, "No agent has connected yet."))
        h2 { "Contacts' agents online" }
        (endpoints(&agents.contacts, now_ms, "None online."))
    }
}

fn endpoints(list: &[Endpoint], now_ms: i64, none: &str) -> Markup {
    html! {
        @if list.is_empty() {
            p class="empty" { (none) }
        } @else {
            table {
                thead {
                    tr {
                        @for heading in ["agent", "harness", "presence", "status", "title", "now", "last seen"] {
                            th { (heading) }
                        }
                    }
                }
                tbody {
                    @for e in list {
                        @let presence = if e.online { "online" } else { "offline" };
                        @let status = if e.note.is_empty() { e.status.clone() } else { format!("{}: {}", e.status, e.note) };
                        tr data-agent=(shown(&e.address)) class=(presence) {
                            td {
                                (shown(&e.address))
                                @if e.operator { " " span class="badge" { "operator" } }
                            }
                            td { (shown(&e.harness)) }
                            td { (presence) }
                            td { (shown(&status)) }
                            td { (shown(&e.title)) }
                            td { (shown(&e.now)) }
                            td { (ago(now_ms, e.last_seen_ms)) }
                        }
                    }
                }
            }
        }
    }
}

// ---- activity ----------------------------------------------------------------------------------

/// The activity page: its filters, and the live part that follows the server.
pub fn activity(activity: &Activity, filter: &Filter) -> Markup {
    html! {
        h1 { "Activity" }
        form method="get" action="/activity" class="filters" {
            @for (name, value, hint) in [
                ("agent", &filter.agent, "ann or laptop/ann"),
                ("machine", &filter.machine, "laptop"),
                ("repo", &filter.repo, "github.com/acme/api"),
                ("topic", &filter.topic, "#deploys"),
            ] {
                label { (name) " " input type="text" name=(name) value=(shown(value)) placeholder=(hint); }
            }
            button type="submit" { "Filter" }
            @if !filter.is_empty() { " " a href="/activity" { "Clear" } }
        }
        section id="live" aria-live="polite" { (activity_live(activity)) }
    }
}

pub fn activity_live(activity: &Activity) -> Markup {
    html! {
        h2 { "Who talked to whom in the last hour" }
        (graph(&activity::picture(&activity.agents, &activity.edges)))
        h2 { "Claims in force" }
        @if activity.claims.is_empty() {
            p class="empty" { "No agent holds a claim." }
        } @else {
            table class="claims" {
                thead { tr { @for h in ["claim", "holder", "repository", "paths", "kind", "reason", "until"] { th { (h) } } } }
                tbody {
                    @for c in &activity.claims {
                        @let paths: Vec<&str> = c.paths.iter().map(|p| p.as_str()).collect();
                        tr data-claim=(c.id.name()) {
                            td { (c.id.name()) }
                            td { (shown(&c.holder)) }
                            td { (shown(c.repo.as_str())) }
                            td { (shown(&paths.join(", "))) }
                            td { (if c.exclusive { "exclusive" } else { "shared" }) }
                            td { (shown(&c.reason)) }
                            td { (c.until.to_rfc3339_opts(SecondsFormat::Secs, true)) }
                        }
                    }
                }
            }
        }
        h2 { "Topics" }
        @if activity.topics.is_empty() {
            p class="empty" { "No topic yet." }
        }
        @for t in &activity.topics {
            details class="topic" data-topic=(shown(&t.topic)) open {
                summary {
                    (shown(&t.topic)) " · " (t.followers) (if t.followers == 1 { " follower" } else { " followers" })
                    " · " (if t.open { "open to contacts" } else { "the account's alone" })
                }
                @if t.posts.is_empty() {
                    p class="empty" { "No post yet." }
                }
                ol class="messages" {
                    @for m in &t.posts {
                        li data-message=(shown(&m.id)) {
                            span class="meta" { (shown(&m.from)) " · " (m.at.to_rfc3339_opts(SecondsFormat::Secs, true)) }
                            pre class="body" { (shown(&m.body)) }
                            (files_list(&m.id, &m.files))
                        }
                    }
                }
            }
        }
        h2 { "Conversations between agents" }
        @if activity.threads.is_empty() {
            p class="empty" { "No agent has written to another yet." }
        }
        @for (i, thread) in activity.threads.iter().enumerate() {
            @let last = thread.messages.last().map(|m| m.at.to_rfc3339_opts(SecondsFormat::Secs, true)).unwrap_or_default();
            details class="thread" id=(format!("thread-{i}")) data-thread=(shown(&thread.id)) open[i == 0] {
                summary {
                    (shown(&thread.agents().join(", "))) " · " (thread.messages.len()) " messages · last " (last)
                }
                ol class="messages" {
                    @for m in &thread.messages {
                        li data-message=(shown(&m.id)) {
                            span class="meta" {
                                (shown(&m.from)) " → " (shown(&m.to.join(", "))) " · "
                                (m.at.to_rfc3339_opts(SecondsFormat::Secs, true))
                            }
                            pre class="body" { (shown(&m.body)) }
                            (files_list(&m.id, &m.files))
                        }
                    }
                }
            }
        }
    }
}

/// The files a message carries, each a link that downloads it; nothing for none.
fn files_list(id: &str, files: &[crate::domain::artifact::Attached]) -> Markup {
    html! {
        @if !files.is_empty() {
            ul class="files" {
                @for f in files {
                    li {
                        a href=(file_link(id, &f.name)) download { (shown(&f.name)) }
                        " · " (crate::domain::artifact::bytes_text(f.size))
                        (if f.binary { " · binary" } else { " · text" })
                        @if f.redacted > 0 { " · " (f.redacted) " redacted" }
                    }
                }
            }
        }
    }
}

/// Where a person downloads file `name` of message `id`.
fn file_link(id: &str, name: &str) -> String {
    let query =
        form_urlencoded::Serializer::new(String::new()).append_pair("message", id).append_pair("name", name).finish();
    format!("/file?{query}")
}

/// The picture, drawn on the server: machines as boxes holding their agents, a line for each pair
/// that talked, thicker the more they did. Presentation attributes only: the console's policy
/// allows no inline style or script.
fn graph(p: &activity::Picture) -> Markup {
    let n = |x: f64| format!("{x:.1}");
    html! {
        @if p.machines.is_empty() {
            p class="empty" { "No agent has connected yet." }
        } @else {
            svg class="graph" xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {} {}", n(p.width), n(p.height)))
                width=(n(p.width)) height=(n(p.height)) role="img"
                aria-label="The account's machines and their agents; lines join agents that wrote to each other in the last hour" {
                @for m in &p.machines {
                    g class="machine" data-machine=(shown(&m.name)) {
                        rect x=(n(m.x)) y=(n(m.y)) width=(n(m.w)) height=(n(m.h)) rx="8" fill="#f6f8fb" stroke="#9aa5b8" {}
                        text x=(n(m.x + 10.0)) y=(n(m.y + 20.0)) font-size="13" font-weight="bold" fill="#334" { (shown(&m.name)) }
                    }
                }
                @for l in &p.lines {
                    line class="edge" data-from=(shown(&l.from)) data-to=(shown(&l.to)) data-count=(l.count)
                        x1=(n(l.x1)) y1=(n(l.y1)) x2=(n(l.x2)) y2=(n(l.y2))
                        stroke="#3867d6" stroke-opacity="0.6" stroke-width=(n(l.width)) stroke-linecap="round" {
                        title { (shown(&l.from)) " → " (shown(&l.to)) ": " (l.count) (if l.count == 1 { " message" } else { " messages" }) }
                    }
                }
                @for m in &p.machines {
                    @for d in &m.agents {
                        g class="agent" data-agent=(shown(&d.address)) {
                            circle cx=(n(d.x)) cy=(n(d.y)) r="6" fill="#3867d6" {}
                            text x=(n(d.x + 12.0)) y=(n(d.y + 4.0)) font-size="12" fill="#223" { (shown(&d.label)) }
                        }
                    }
                }
            }
        }
    }
}

/// How long ago `then_ms` was, as a person reads it.
pub fn ago(now_ms: i64, then_ms: i64) -> String {
    if then_ms <= 0 {
        return "never".to_owned();
    }
    let s = ((now_ms - then_ms) / 1000).max(0);
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86400),
    }
}

// ---- the human's inbox -------------------------------------------------------------------------

/// The inbox page: the send form, and what waits on the human, following the server. `nonce`,
/// fresh for each rendering, names its forms' sends, so that a form sent twice sends once.
pub fn inbox(inbox: &Inbox, csrf: &str, nonce: &str, now_ms: i64) -> Markup {
    html! {
        h1 { "Inbox of me" }
        details class="send" id="send-message" {
            summary { "Send a message" }
            form method="post" action="/inbox/send" {
                (csrf_field(csrf))
                (hidden("client_id", shown(nonce)))
                label {
                    "To "
                    input name="to" placeholder="machine/handle, account/machine/handle, or several separated by commas" required;
                }
                label { "Message " textarea name="body" rows="4" required {} }
                label class="check" { input type="checkbox" name="private" value="yes"; " private data" }
                button type="submit" { "Send" }
            }
        }
        section id="live" aria-live="polite" { (inbox_live(inbox, csrf, nonce, now_ms)) }
    }
}

pub fn inbox_live(inbox: &Inbox, csrf: &str, nonce: &str, now_ms: i64) -> Markup {
    let unread: Vec<i64> = inbox.messages.iter().filter(|m| !m.read).map(|m| m.message.seq.0).collect();
    html! {
        @if !inbox.approvals.is_empty() {
            h2 { "Permission requests" }
            @for a in &inbox.approvals {
                @let waiting = match a.state {
                    ApprovalState::Escalated => "waiting on you",
                    _ => "with the operator",
                };
                article class="approval" data-approval=(shown(a.id.as_str())) {
                    p {
                        strong { (shown(&a.requester)) }
                        " working on card " (shown(a.job_id.as_str())) " asks to use "
                        strong { (shown(&a.tool)) }
                        " " span class="badge" { (waiting) }
                    }
                    pre class="body" { (shown(&a.input)) }
                    form method="post" action="/inbox/approval" class="decide" {
                        (csrf_field(csrf))
                        (hidden("id", shown(a.id.as_str())))
                        label { "Reason " input name="reason" placeholder="optional"; }
                        button type="submit" name="decision" value="allow" class="accept" { "Allow" }
                        " "
                        button type="submit" name="decision" value="deny" { "Deny" }
                    }
                }
            }
        }
        @if !inbox.holds.is_empty() {
            h2 { "Held messages" }
            @for h in &inbox.holds {
                article class="hold" data-hold=(shown(h.id.as_str())) {
                    p {
                        "From " strong { (shown(&h.from)) } " to " (shown(&h.to.join(", ")))
                        " " span class="badge" { (shown(&h.class)) }
                    }
                    pre class="body" { (shown(&h.body)) }
                    (files_list(h.message_id.as_str(), &h.files))
                    form method="post" action="/inbox/hold" class="inline" {
                        (csrf_field(csrf))
                        (hidden("id", shown(h.id.as_str())))
                        (hidden("release", "yes"))
                        button type="submit" class="accept" { "Release" }
                    }
                    details id={ "reject-" (shown(h.id.as_str())) } {
                        summary { "Reject" }
                        form method="post" action="/inbox/hold" {
                            (csrf_field(csrf))
                            (hidden("id", shown(h.id.as_str())))
                            (hidden("release", "no"))
                            label { "Reason (the sender reads it) " input name="reason" required; }
                            button type="submit" { "Reject" }
                        }
                    }
                }
            }
        }
        h2 { "Messages " span class="count" { (inbox.unread) " unread" } }
        @if !unread.is_empty() {
            form method="post" action="/inbox/read" class="inline" {
                (csrf_field(csrf))
                @for seq in &unread {
                    (hidden("seq", seq))
                }
                button type="submit" { "Mark all read" }
            }
        }
        @if inbox.messages.is_empty() {
            p class="empty" { "No messages." }
        }
        @for r in &inbox.messages {
            (message(r, csrf, nonce, now_ms))
        }
    }
}

fn message(r: &Received, csrf: &str, nonce: &str, now_ms: i64) -> Markup {
    let m = &r.message;
    let id = shown(m.id.as_str());
    let state = if r.read { "read" } else { "unread" };
    let kind = match m.kind {
        Kind::Ask if m.require_reply => "asks, reply required",
        Kind::Ask => "asks",
        Kind::Reply => "reply",
        Kind::Message => "",
    };
    html! {
        article class={ "message " (state) } data-message=(id) {
            p class="meta" {
                strong class="from" { (shown(&m.from)) }
                " " span { (ago(now_ms, m.sent_at_ms)) }
                " " span class="badge" { (state) }
                @if !kind.is_empty() { " " span class="badge" { (kind) } }
                @if m.private { " " span class="badge" { "private" } }
                // A message that starts a thread names it by its own id: only a thread it joined is news.
                @if !m.thread.is_empty() && m.thread != m.id.as_str() {
                    " " span class="thread" { "thread " (shown(&m.thread)) }
                }
            }
            pre class="body" { (shown(&m.body)) }
            (files_list(m.id.as_str(), &m.attachments))
            div class="actions" {
                @if !r.read {
                    form method="post" action="/inbox/read" class="inline" {
                        (csrf_field(csrf))
                        (hidden("seq", m.seq.0))
                        button type="submit" { "Mark read" }
                    }
                }
                details id={ "reply-" (id) } {
                    summary { "Reply" }
                    form method="post" action="/inbox/reply" {
                        (csrf_field(csrf))
                        (hidden("id", &id))
                        input type="hidden" name="client_id" value={ (shown(nonce)) "-" (m.seq) };
                        label { "Reply " textarea name="body" rows="3" required {} }
                        button type="submit" { "Send reply" }
                    }
                }
            }
        }
    }
}

// ---- contacts ----------------------------------------------------------------------------------

pub fn contacts(rows: &[ContactRow], csrf: &str) -> Markup {
    html! {
        h1 { "Contacts" }
        form method="post" action="/contacts/request" class="row" {
            (csrf_field(csrf))
            label { "Account " input name="account" placeholder="account name" required; }
            button type="submit" { "Request a contact" }
        }
        p class="hint" {
            "Agents of two accounts reach each other once both accounts' people accepted the contact. \
             Dropping it cuts reach at once and withdraws what no agent has seen yet."
        }
        @if rows.is_empty() {
            p class="empty" { "No contacts or requests." }
        } @else {
            table {
                thead { tr { th { "account" } th { "state" } th { "private data" } th {} } }
                tbody {
                    @for row in rows {
                        (contact(row, csrf))
                    }
                }
            }
        }
    }
}

fn contact(row: &ContactRow, csrf: &str) -> Markup {
    let c = &row.contact;
    let account = shown(&c.account);
    let state = match c.state.as_str() {
        "contact" => "contact",
        "requested" => "you asked; waiting for them",
        "pending" => "they asked; waiting for you",
        other => other,
    };
    let (now, flip, label) =
        if row.private_data { ("allowed", "no", "Forbid") } else { ("not allowed", "yes", "Allow") };
    html! {
        tr data-contact=(account) {
            td { (account) }
            td { (shown(state)) }
            td {
                @if c.state == "contact" {
                    (now) " "
                    form method="post" action="/contacts/private" class="inline" {
                        (csrf_field(csrf))
                        (hidden("account", &account))
                        (hidden("allow", flip))
                        button type="submit" { (label) }
                    }
                }
            }
            td {
                @if c.state == "pending" {
                    form method="post" action="/contacts/accept" class="inline" {
                        (csrf_field(csrf))
                        (hidden("account", &account))
                        button type="submit" class="accept" { "Accept" }
                    }
                    " "
                }
                details id={ "drop-" (account) } {
                    summary { "Drop" }
                    form method="post" action="/contacts/drop" {
                        (csrf_field(csrf))
                        (hidden("account", &account))
                        p class="hint" {
                            "Reach ends at once; messages between the accounts that no agent has seen yet are withdrawn."
                        }
                        button type="submit" { "Drop " (account) }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::board::Repo;
    use crate::domain::ids::AccountId;
    use crate::domain::ids::Seq;
    use crate::domain::message::Message;

    fn person() -> Human {
        Human { account_id: AccountId(1), account: "acme".into(), name: "owner".into() }
    }

    fn hostile() -> &'static str {
        r#"<script>alert(1)</script><img src=x onerror=alert(2)>" onclick="x"#
    }

    fn card(column: Column) -> Job {
        Job {
            id: "k1".into(),
            column,
            title: hostile().into(),
            detail: hostile().into(),
            repo: Repo { name: "app".into(), path: "/src/app".into(), machine: "ci".into() },
            last_error: Some(hostile().into()),
            agent_state: Some(hostile().into()),
            summary: Some(hostile().into()),
            pr_url: Some("javascript:alert(3)".into()),
            ..Job::default()
        }
    }

    /// No markup an agent wrote survives: neither tags nor attribute breakouts nor script links.
    fn assert_inert(html: &str) {
        assert!(!html.contains("<script>") && !html.contains("<img"), "{html}");
        assert!(!html.contains(r#"" onclick"#) && !html.contains("href=\"javascript"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{html}");
    }

    #[test]
    fn cards_show_agents_text_as_text() {
        let board = Board {
            open: vec![card(Column::Todo), card(Column::Review)],
            done: vec![card(Column::Done)],
            archived: 5,
            repos: vec![Repo { name: "<app>".into(), path: "/src/<app>".into(), machine: "ci".into() }],
        };
        let html = board_live(&board, "tok").into_string();
        assert_inert(&html);
        assert!(html.contains(r#"action="/board/edit""#) && html.contains(r#"action="/board/close""#));
        assert!(html.contains(r#"name="csrf" value="tok""#));
        assert!(html.contains("The newest 1 of 5 are shown."), "{html}");
        let whole = page(Page::Board, &person(), "tok", None, super::board(&board, "tok"));
        assert_inert(&whole);
        assert!(whole.contains(r#"data-live="ready account" data-fragment="/board/live""#), "{whole}");
        assert!(whole.contains("&lt;app&gt;") && !whole.contains("<app>"));
    }

    #[test]
    fn a_pull_request_is_a_link_only_when_it_is_a_web_address() {
        let mut job = card(Column::Review);
        job.pr_url = Some("https://forge.example/acme/app/pull/7".into());
        let out = super::card(&job, "t").into_string();
        assert!(out.contains(r#"<a href="https://forge.example/acme/app/pull/7" rel="noreferrer noopener">"#), "{out}");
    }

    #[test]
    fn messages_holds_and_requests_show_as_text() {
        let message = Message {
            id: "abcdefgh0123456789wxyz00".into(),
            seq: Seq(4),
            from: "acme/ci/bob".into(),
            thread: hostile().into(),
            kind: Kind::Ask,
            body: hostile().into(),
            reply_to: None,
            sent_at_ms: 1_000,
            relation: String::new(),
            require_reply: true,
            private: false,
            attachments: Vec::new(),
            post: None,
        };
        let inbox = Inbox {
            messages: vec![Received { message, read: false }],
            unread: 1,
            holds: vec![crate::domain::trust::Hold {
                id: "h1".into(),
                class: "contact".into(),
                state: crate::domain::trust::HoldState::Pending,
                reason: String::new(),
                from: "acme/ci/bob".into(),
                to: vec!["globex/box/eve".into()],
                body: hostile().into(),
                message_id: "m".into(),
                files: Vec::new(),
            }],
            approvals: vec![crate::domain::trust::Approval {
                id: "a1".into(),
                state: ApprovalState::Escalated,
                job_id: "k1".into(),
                requester: "acme/ci/claude-1".into(),
                tool: hostile().into(),
                input: hostile().into(),
            }],
        };
        let html = inbox_live(&inbox, "tok", "n0nce", 61_000).into_string();
        assert_inert(&html);
        assert!(html.contains("1 min ago") && html.contains("asks, reply required"), "{html}");
        assert!(html.contains(r#"<input type="hidden" name="seq" value="4">"#));
        assert!(html.contains("waiting on you") && html.contains(r#"name="client_id" value="n0nce-4""#));
    }

    #[test]
    fn agents_and_contacts_show_as_text() {
        let agent = Endpoint {
            address: "acme/ci/<b>".into(),
            harness: "claude".into(),
            status: "busy".into(),
            title: hostile().into(),
            now: hostile().into(),
            online: true,
            last_seen_ms: 5_000,
            ..Endpoint::default()
        };
        let html = agents_live(&Agents { own: vec![agent], contacts: vec![] }, 10_000).into_string();
        assert_inert(&html);
        assert!(html.contains("5 s ago") && html.contains("None online."), "{html}");
        let row = ContactRow {
            contact: crate::domain::trust::Contact { account: "<x>".into(), state: "pending".into(), withdrawn: 0 },
            private_data: false,
        };
        let html = contacts(&[row], "tok").into_string();
        assert!(html.contains("&lt;x&gt;") && !html.contains("<x>") && html.contains("/contacts/accept"), "{html}");
    }

    #[test]
    fn the_sign_in_page_carries_no_session_and_shows_why_it_refused() {
        let html = sign_in(Some("unknown <human> token"));
        assert!(html.contains("unknown &lt;human&gt; token") && !html.contains("Sign out"), "{html}");
        assert!(html.contains(r#"type="password" name="token""#));
    }

    #[test]
    fn a_notice_is_text_wherever_it_lands() {
        let html =
            page(Page::Inbox, &person(), "t", Some(Notice::Refused("no account \"<main>\"")), html! { p { "body" } });
        assert_eq!(html.matches("<p>body</p>").count(), 1, "{html}");
        assert!(html.contains("no account &quot;&lt;main&gt;&quot;"), "{html}");
        assert!(html.contains(r#"data-fragment="/inbox/live""#) && html.starts_with("<!DOCTYPE html>"), "{html}");
        assert!(html.contains(r#"<a href="/inbox" aria-current="page">Inbox</a>"#), "{html}");
    }

    #[test]
    fn finished_actions_say_only_fixed_words() {
        assert_eq!(done_text("accepted"), Some("Card accepted: it is Done."));
        assert_eq!(done_text("<script>"), None);
    }

    #[test]
    fn times_read_as_a_person_says_them() {
        assert_eq!(ago(100_000, 0), "never");
        assert_eq!(ago(100_000, 99_000), "1 s ago");
        assert_eq!(ago(10_000_000, 10_000_000 - 120_000), "2 min ago");
        assert_eq!(ago(100_000_000, 100_000_000 - 7_200_000), "2 h ago");
        assert_eq!(ago(1_000_000_000, 1_000_000_000 - 3 * 86_400_000), "3 d ago");
        assert_eq!(ago(0, 5_000), "0 s ago", "a clock behind is not in the future");
    }
}
