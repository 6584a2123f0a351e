//! The console's pages and the fragments its live pages fetch again, rendered from the
//! application's views. Every value is escaped on its way in (see `html`).

use std::fmt::Write;

use super::html::{E, web_link};
use crate::domain::board::{Job, MAX_ATTEMPTS};
use crate::domain::caller::Human;
use crate::domain::console::{Agents, Board, ContactRow, Inbox};
use crate::domain::delivery::Kind;
use crate::domain::endpoint::Endpoint;
use crate::domain::trust::ApprovalState;

const LAYOUT: &str = include_str!("layout.html");

/// The pages a signed-in person moves between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    Board,
    Agents,
    Inbox,
    Contacts,
}

impl Page {
    pub const ALL: [Self; 4] = [Self::Board, Self::Agents, Self::Inbox, Self::Contacts];

    pub fn path(self) -> &'static str {
        match self {
            Self::Board => "/board",
            Self::Agents => "/agents",
            Self::Inbox => "/inbox",
            Self::Contacts => "/contacts",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Self::Board => "Board",
            Self::Agents => "Agents",
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
            Self::Inbox => "ready account inbox",
            Self::Contacts => "",
        }
    }

    /// Where the live part is fetched from.
    pub fn fragment(self) -> &'static str {
        match self {
            Self::Board => "/board/live",
            Self::Agents => "/agents/live",
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

fn notice_html(notice: Option<Notice<'_>>) -> String {
    match notice {
        Some(Notice::Done(text)) => format!(r#"<p class="notice done" role="status">{}</p>"#, E(text)),
        Some(Notice::Refused(text)) => format!(r#"<p class="notice refused" role="alert">{}</p>"#, E(text)),
        None => String::new(),
    }
}

fn csrf_field(csrf: &str) -> String {
    format!(r#"<input type="hidden" name="csrf" value="{}">"#, E(csrf))
}

/// A whole page around `body`. `person` is absent on the sign-in page.
fn layout(
    title: &str,
    page: Option<Page>,
    person: Option<(&Human, &str)>,
    notice: Option<Notice<'_>>,
    body: &str,
) -> String {
    let mut nav = String::new();
    if let Some((person, csrf)) = person {
        nav.push_str(r#"<nav><span class="brand">Relay</span>"#);
        for p in Page::ALL {
            let current = if Some(p) == page { r#" aria-current="page""# } else { "" };
            let _ = write!(nav, r#"<a href="{}"{current}>{}</a>"#, p.path(), p.title());
        }
        let _ = write!(
            nav,
            r#"<span class="who">{}/me ({})</span><form method="post" action="/sign-out" class="inline">{}<button type="submit">Sign out</button></form></nav>"#,
            E(&person.account),
            E(&person.name),
            csrf_field(csrf)
        );
    }
    let (live, fragment) = page.map_or(("", ""), |p| (p.live(), p.fragment()));
    let title = E(title).to_string();
    let notice = notice_html(notice);
    fill(LAYOUT, |marker| match marker {
        "title" => &title,
        "live" => live,
        "fragment" => fragment,
        "nav" => &nav,
        "notice" => &notice,
        "main" => body,
        _ => "",
    })
}

/// `template` with each `{{marker}}` replaced by its value. The template is read once, so a value
/// is never read for markers, whatever it holds.
fn fill<'a>(template: &str, value: impl Fn(&str) -> &'a str) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else { break };
        out.push_str(&rest[..start]);
        out.push_str(value(&rest[start + 2..start + len]));
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// A signed-in page.
pub fn page(page: Page, person: &Human, csrf: &str, notice: Option<Notice<'_>>, body: &str) -> String {
    layout(page.title(), Some(page), Some((person, csrf)), notice, body)
}

/// The sign-in page, with the reason the last try was refused.
pub fn sign_in(refused: Option<&str>) -> String {
    let body = r#"<section class="sign-in">
<h1>Sign in to Relay</h1>
<p>Sign in with your account's human token (<code>relay-server admin human add ACCOUNT</code> issues one).</p>
<form method="post" action="/sign-in">
<label>Human token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
<button type="submit">Sign in</button>
</form>
</section>"#;
    layout("Sign in", None, None, refused.map(Notice::Refused), body)
}

/// A page that cannot be shown (the database is away, …), with the reason.
pub fn unavailable(reason: &str) -> String {
    layout("Unavailable", None, None, Some(Notice::Refused(reason)), r#"<p><a href="/board">Try again</a></p>"#)
}

// ---- the board ---------------------------------------------------------------------------------

/// The board page: the post form, and the columns that follow the server.
pub fn board(board: &Board, csrf: &str) -> String {
    let mut repos = String::new();
    for repo in &board.repos {
        let _ = write!(
            repos,
            r#"<option value="{}">{} ({} on {})</option>"#,
            E(&repo.path),
            E(&repo.name),
            E(&repo.path),
            E(&repo.machine)
        );
    }
    let post = if board.repos.is_empty() {
        r#"<p class="hint">No repository is on the board yet: a machine's worker adds its repositories (agent-bridge worker), or the operator adds one with add_repo.</p>"#.to_owned()
    } else {
        format!(
            r#"<details class="post" id="post-card"><summary>Post a card</summary>
<form method="post" action="/board/post">{csrf}
<label>Title <input name="title" maxlength="200" required></label>
<label>Detail <textarea name="detail" rows="4"></textarea></label>
<label>Repository <select name="repo">{repos}</select></label>
<label>Agent <select name="agent"><option value="claude">claude</option><option value="codex">codex</option></select></label>
<label>Schedule <input name="schedule" placeholder="empty: run once; or cron like 0 9 * * 1-5, @daily"></label>
<input type="hidden" name="time_zone" value="UTC">
<label>Pull request <select name="requires_pr"><option value="">as the board decides (required unless scheduled)</option><option value="yes">required</option><option value="no">not required</option></select></label>
<button type="submit">Post</button>
</form></details>"#,
            csrf = csrf_field(csrf)
        )
    };
    format!(r#"<h1>Board</h1>{post}<section id="live" aria-live="polite">{}</section>"#, board_live(board, csrf))
}

/// The four columns.
pub fn board_live(board: &Board, csrf: &str) -> String {
    let mut out = String::from(r#"<div class="columns">"#);
    for (state, title) in [("todo", "To do"), ("in-progress", "In progress"), ("review", "Review")] {
        let cards: Vec<&Job> = board.open.iter().filter(|j| j.state == state).collect();
        column(&mut out, state, title, cards.len() as u32, &cards, csrf);
    }
    let done: Vec<&Job> = board.done.iter().collect();
    column(&mut out, "done", "Done", board.archived, &done, csrf);
    out.push_str("</div>");
    out
}

fn column(out: &mut String, state: &str, title: &str, count: u32, cards: &[&Job], csrf: &str) {
    let _ = write!(
        out,
        r#"<section class="column" data-column="{state}"><h2>{title} <span class="count">{count}</span></h2>"#
    );
    if cards.is_empty() {
        out.push_str(r#"<p class="empty">No cards.</p>"#);
    }
    for job in cards {
        card(out, job, csrf);
    }
    if state == "done" && (cards.len() as u32) < count {
        let _ = write!(out, r#"<p class="hint">The newest {} of {count} are shown.</p>"#, cards.len());
    }
    out.push_str("</section>");
}

fn card(out: &mut String, job: &Job, csrf: &str) {
    let id = E(&job.id);
    let _ = write!(out, r#"<article class="card" id="card-{id}" data-card="{id}" data-state="{}">"#, E(&job.state));
    let _ = write!(out, r#"<h3 class="title">{}</h3><dl>"#, E(&job.title));
    let mut field = |name: &str, value: &str| {
        if !value.is_empty() {
            let _ = write!(out, "<dt>{name}</dt><dd>{}</dd>", E(value));
        }
    };
    field("card", &job.id);
    field("repository", &format!("{} on {}", job.repo.name, job.repo.machine));
    field("agent", &job.agent);
    field("posted by", &job.posted_by);
    field("branch", &job.branch);
    if job.attempts > 0 {
        field("attempts", &format!("{} of {MAX_ATTEMPTS}", job.attempts));
    }
    if !job.schedule.is_empty() {
        field("schedule", &format!("{} ({})", job.schedule, job.time_zone));
        let next = if job.next_run_local.is_empty() { &job.next_run_at } else { &job.next_run_local };
        field("next run", next);
        field("held off", &job.last_skip_reason);
    }
    field("now", &job.agent_state);
    if !job.pr_url.is_empty() {
        match web_link(&job.pr_url) {
            Some(url) => {
                let _ = write!(
                    out,
                    r#"<dt>pull request</dt><dd><a href="{}" rel="noreferrer noopener">{}</a></dd>"#,
                    E(url),
                    E(url)
                );
            }
            None => {
                let _ = write!(out, "<dt>pull request</dt><dd>{}</dd>", E(&job.pr_url));
            }
        }
    }
    out.push_str("</dl>");
    if !job.last_error.is_empty() {
        let _ = write!(out, r#"<p class="error">{}</p>"#, E(&job.last_error));
    }
    if !job.summary.is_empty() {
        let _ = write!(out, r#"<p class="summary">{}</p>"#, E(&job.summary));
    }
    if !job.detail.trim().is_empty() {
        let _ = write!(
            out,
            r#"<details id="detail-{id}"><summary>Detail</summary><pre>{}</pre></details>"#,
            E(&job.detail)
        );
    }
    let csrf = csrf_field(csrf);
    match job.state.as_str() {
        "todo" => {
            let _ = write!(
                out,
                r#"<details id="edit-{id}"><summary>Edit</summary><form method="post" action="/board/edit">{csrf}<input type="hidden" name="id" value="{id}">
<label>Title <input name="title" maxlength="200" value="{}" required></label>
<label>Detail <textarea name="detail" rows="4">{}</textarea></label>
<button type="submit">Save</button></form></details>"#,
                E(&job.title),
                E(&job.detail)
            );
        }
        "review" => {
            let _ = write!(
                out,
                r#"<div class="actions"><form method="post" action="/board/close" class="inline">{csrf}<input type="hidden" name="id" value="{id}"><input type="hidden" name="accept" value="yes"><button type="submit" class="accept">Accept</button></form>
<details id="back-{id}"><summary>Send back</summary><form method="post" action="/board/close">{csrf}<input type="hidden" name="id" value="{id}"><input type="hidden" name="accept" value="no">
<label>Note for the next attempt <textarea name="note" rows="3" required></textarea></label>
<button type="submit">Send back</button></form></details></div>"#
            );
        }
        _ => {}
    }
    out.push_str("</article>");
}

// ---- agents ------------------------------------------------------------------------------------

pub fn agents(agents: &Agents, now_ms: i64) -> String {
    format!(r#"<h1>Agents</h1><section id="live" aria-live="polite">{}</section>"#, agents_live(agents, now_ms))
}

pub fn agents_live(agents: &Agents, now_ms: i64) -> String {
    let mut out = String::from("<h2>This account</h2>");
    endpoints(&mut out, &agents.own, now_ms, "No agent has connected yet.");
    out.push_str("<h2>Contacts' agents online</h2>");
    endpoints(&mut out, &agents.contacts, now_ms, "None online.");
    out
}

fn endpoints(out: &mut String, list: &[Endpoint], now_ms: i64, none: &str) {
    if list.is_empty() {
        let _ = write!(out, r#"<p class="empty">{none}</p>"#);
        return;
    }
    out.push_str(
        "<table><thead><tr><th>agent</th><th>harness</th><th>presence</th><th>status</th><th>title</th><th>now</th><th>last seen</th></tr></thead><tbody>",
    );
    for e in list {
        let presence = if e.online { "online" } else { "offline" };
        let role = if e.operator { r#" <span class="badge">operator</span>"# } else { "" };
        let status = if e.note.is_empty() { e.status.clone() } else { format!("{}: {}", e.status, e.note) };
        let _ = write!(
            out,
            r#"<tr data-agent="{}" class="{presence}"><td>{}{role}</td><td>{}</td><td>{presence}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            E(&e.address),
            E(&e.address),
            E(&e.harness),
            E(&status),
            E(&e.title),
            E(&e.now),
            ago(now_ms, e.last_seen_ms)
        );
    }
    out.push_str("</tbody></table>");
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
pub fn inbox(inbox: &Inbox, csrf: &str, nonce: &str, now_ms: i64) -> String {
    format!(
        r#"<h1>Inbox of me</h1>
<details class="send" id="send-message"><summary>Send a message</summary>
<form method="post" action="/inbox/send">{}<input type="hidden" name="client_id" value="{}">
<label>To <input name="to" placeholder="machine/handle, account/machine/handle, or several separated by commas" required></label>
<label>Message <textarea name="body" rows="4" required></textarea></label>
<label class="check"><input type="checkbox" name="private" value="yes"> private data</label>
<button type="submit">Send</button></form></details>
<section id="live" aria-live="polite">{}</section>"#,
        csrf_field(csrf),
        E(nonce),
        inbox_live(inbox, csrf, nonce, now_ms)
    )
}

pub fn inbox_live(inbox: &Inbox, csrf: &str, nonce: &str, now_ms: i64) -> String {
    let csrf = csrf_field(csrf);
    let mut out = String::new();
    if !inbox.approvals.is_empty() {
        out.push_str("<h2>Permission requests</h2>");
        for a in &inbox.approvals {
            let waiting = match a.state {
                ApprovalState::Escalated => "waiting on you",
                _ => "with the operator",
            };
            let _ = write!(
                out,
                r#"<article class="approval" data-approval="{id}"><p><strong>{}</strong> working on card {} asks to use <strong>{}</strong> <span class="badge">{waiting}</span></p><pre class="body">{}</pre>
<form method="post" action="/inbox/approval" class="decide">{csrf}<input type="hidden" name="id" value="{id}">
<label>Reason <input name="reason" placeholder="optional"></label>
<button type="submit" name="decision" value="allow" class="accept">Allow</button> <button type="submit" name="decision" value="deny">Deny</button></form></article>"#,
                E(&a.requester),
                E(&a.job_id),
                E(&a.tool),
                E(&a.input),
                id = E(&a.id)
            );
        }
    }
    if !inbox.holds.is_empty() {
        out.push_str("<h2>Held messages</h2>");
        for h in &inbox.holds {
            let _ = write!(
                out,
                r#"<article class="hold" data-hold="{id}"><p>From <strong>{}</strong> to {} <span class="badge">{}</span></p><pre class="body">{}</pre>
<form method="post" action="/inbox/hold" class="inline">{csrf}<input type="hidden" name="id" value="{id}"><input type="hidden" name="release" value="yes"><button type="submit" class="accept">Release</button></form>
<details id="reject-{id}"><summary>Reject</summary><form method="post" action="/inbox/hold">{csrf}<input type="hidden" name="id" value="{id}"><input type="hidden" name="release" value="no">
<label>Reason (the sender reads it) <input name="reason" required></label><button type="submit">Reject</button></form></details></article>"#,
                E(&h.from),
                E(&h.to.join(", ")),
                E(&h.class),
                E(&h.body),
                id = E(&h.id)
            );
        }
    }
    let _ = write!(out, r#"<h2>Messages <span class="count">{} unread</span></h2>"#, inbox.unread);
    let unread: Vec<String> = inbox.messages.iter().filter(|m| !m.read).map(|m| m.message.seq.to_string()).collect();
    if !unread.is_empty() {
        let _ = write!(out, r#"<form method="post" action="/inbox/read" class="inline">{csrf}"#);
        for seq in &unread {
            let _ = write!(out, r#"<input type="hidden" name="seq" value="{seq}">"#);
        }
        out.push_str(r#"<button type="submit">Mark all read</button></form>"#);
    }
    if inbox.messages.is_empty() {
        out.push_str(r#"<p class="empty">No messages.</p>"#);
    }
    for r in &inbox.messages {
        let m = &r.message;
        let id = E(&m.id);
        let state = if r.read { "read" } else { "unread" };
        let kind = match m.kind {
            Kind::Ask if m.require_reply => "asks, reply required",
            Kind::Ask => "asks",
            Kind::Reply => "reply",
            Kind::Message => "",
        };
        let _ = write!(
            out,
            r#"<article class="message {state}" data-message="{id}"><p class="meta"><strong class="from">{}</strong> <span>{}</span> <span class="badge">{state}</span>"#,
            E(&m.from),
            ago(now_ms, m.sent_at_ms)
        );
        if !kind.is_empty() {
            let _ = write!(out, r#" <span class="badge">{kind}</span>"#);
        }
        if m.private {
            out.push_str(r#" <span class="badge">private</span>"#);
        }
        // A message that starts a thread names it by its own id: only a thread it joined is news.
        if !m.thread.is_empty() && m.thread != m.id {
            let _ = write!(out, r#" <span class="thread">thread {}</span>"#, E(&m.thread));
        }
        let _ = write!(out, r#"</p><pre class="body">{}</pre><div class="actions">"#, E(&m.body));
        if !r.read {
            let _ = write!(
                out,
                r#"<form method="post" action="/inbox/read" class="inline">{csrf}<input type="hidden" name="seq" value="{}"><button type="submit">Mark read</button></form>"#,
                m.seq
            );
        }
        let _ = write!(
            out,
            r#"<details id="reply-{id}"><summary>Reply</summary><form method="post" action="/inbox/reply">{csrf}<input type="hidden" name="id" value="{id}"><input type="hidden" name="client_id" value="{}-{}">
<label>Reply <textarea name="body" rows="3" required></textarea></label><button type="submit">Send reply</button></form></details></div></article>"#,
            E(nonce),
            m.seq
        );
    }
    out
}

// ---- contacts ----------------------------------------------------------------------------------

pub fn contacts(rows: &[ContactRow], csrf: &str) -> String {
    let csrf = csrf_field(csrf);
    let mut out = format!(
        r#"<h1>Contacts</h1>
<form method="post" action="/contacts/request" class="row">{csrf}<label>Account <input name="account" placeholder="account name" required></label><button type="submit">Request a contact</button></form>
<p class="hint">Agents of two accounts reach each other once both accounts' people accepted the contact. Dropping it cuts reach at once and withdraws what no agent has seen yet.</p>"#
    );
    if rows.is_empty() {
        out.push_str(r#"<p class="empty">No contacts or requests.</p>"#);
        return out;
    }
    out.push_str("<table><thead><tr><th>account</th><th>state</th><th>private data</th><th></th></tr></thead><tbody>");
    for row in rows {
        let c = &row.contact;
        let account = E(&c.account);
        let state = match c.state.as_str() {
            "contact" => "contact",
            "requested" => "you asked; waiting for them",
            "pending" => "they asked; waiting for you",
            other => other,
        };
        let _ = write!(out, r#"<tr data-contact="{account}"><td>{account}</td><td>{}</td><td>"#, E(state));
        if c.state == "contact" {
            let (now, flip, label) =
                if row.private_data { ("allowed", "no", "Forbid") } else { ("not allowed", "yes", "Allow") };
            let _ = write!(
                out,
                r#"{now} <form method="post" action="/contacts/private" class="inline">{csrf}<input type="hidden" name="account" value="{account}"><input type="hidden" name="allow" value="{flip}"><button type="submit">{label}</button></form>"#
            );
        }
        out.push_str("</td><td>");
        if c.state == "pending" {
            let _ = write!(
                out,
                r#"<form method="post" action="/contacts/accept" class="inline">{csrf}<input type="hidden" name="account" value="{account}"><button type="submit" class="accept">Accept</button></form> "#
            );
        }
        let _ = write!(
            out,
            r#"<details id="drop-{account}"><summary>Drop</summary><form method="post" action="/contacts/drop">{csrf}<input type="hidden" name="account" value="{account}"><p class="hint">Reach ends at once; messages between the accounts that no agent has seen yet are withdrawn.</p><button type="submit">Drop {account}</button></form></details></td></tr>"#
        );
    }
    out.push_str("</tbody></table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::board::Repo;
    use crate::domain::console::Received;
    use crate::domain::ids::AccountId;
    use crate::domain::message::Message;

    fn person() -> Human {
        Human { account_id: AccountId(1), account: "acme".into(), name: "owner".into() }
    }

    fn hostile() -> &'static str {
        r#"<script>alert(1)</script><img src=x onerror=alert(2)>" onclick="x"#
    }

    fn card(state: &str) -> Job {
        Job {
            id: "k1".into(),
            state: state.into(),
            title: hostile().into(),
            detail: hostile().into(),
            repo: Repo { name: "app".into(), path: "/src/app".into(), machine: "ci".into() },
            agent: "claude".into(),
            last_error: hostile().into(),
            agent_state: hostile().into(),
            summary: hostile().into(),
            pr_url: "javascript:alert(3)".into(),
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
            open: vec![card("todo"), card("review")],
            done: vec![card("done")],
            archived: 5,
            repos: vec![Repo { name: "<app>".into(), path: "/src/<app>".into(), machine: "ci".into() }],
        };
        let html = board_live(&board, "tok");
        assert_inert(&html);
        assert!(html.contains(r#"action="/board/edit""#) && html.contains(r#"action="/board/close""#));
        assert!(html.contains(r#"name="csrf" value="tok""#));
        assert!(html.contains("The newest 1 of 5 are shown."), "{html}");
        let whole = page(Page::Board, &person(), "tok", None, &super::board(&board, "tok"));
        assert_inert(&whole);
        assert!(whole.contains(r#"data-live="ready account" data-fragment="/board/live""#), "{whole}");
        assert!(whole.contains("&lt;app&gt;") && !whole.contains("<app>"));
    }

    #[test]
    fn a_pull_request_is_a_link_only_when_it_is_a_web_address() {
        let mut job = card("review");
        job.pr_url = "https://forge.example/acme/app/pull/7".into();
        let mut out = String::new();
        super::card(&mut out, &job, "t");
        assert!(out.contains(r#"<a href="https://forge.example/acme/app/pull/7" rel="noreferrer noopener">"#), "{out}");
    }

    #[test]
    fn messages_holds_and_requests_show_as_text() {
        let message = Message {
            id: "abcdefgh0123456789wxyz00".into(),
            seq: 4,
            from: "acme/ci/bob".into(),
            thread: hostile().into(),
            kind: Kind::Ask,
            body: hostile().into(),
            reply_to: String::new(),
            sent_at_ms: 1_000,
            relation: String::new(),
            require_reply: true,
            private: false,
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
        let html = inbox_live(&inbox, "tok", "n0nce", 61_000);
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
        let html = agents_live(&Agents { own: vec![agent], contacts: vec![] }, 10_000);
        assert_inert(&html);
        assert!(html.contains("5 s ago") && html.contains("None online."), "{html}");
        let row = ContactRow {
            contact: crate::domain::trust::Contact { account: "<x>".into(), state: "pending".into(), withdrawn: 0 },
            private_data: false,
        };
        let html = contacts(&[row], "tok");
        assert!(html.contains("&lt;x&gt;") && !html.contains("<x>") && html.contains("/contacts/accept"), "{html}");
    }

    #[test]
    fn the_sign_in_page_carries_no_session_and_shows_why_it_refused() {
        let html = sign_in(Some("unknown <human> token"));
        assert!(html.contains("unknown &lt;human&gt; token") && !html.contains("Sign out"), "{html}");
        assert!(html.contains(r#"type="password" name="token""#));
    }

    #[test]
    fn markers_are_filled_once_and_values_are_never_read_for_markers() {
        let filled = fill("<t>{{a}}</t><m>{{b}}</m>", |m| if m == "a" { "{{b}}" } else { "B" });
        assert_eq!(filled, "<t>{{b}}</t><m>B</m>");
        let html = page(Page::Inbox, &person(), "t", Some(Notice::Refused("no account \"{{main}}\"")), "<p>body</p>");
        assert_eq!(html.matches("<p>body</p>").count(), 1, "{html}");
        assert!(html.contains("{{main}}") && html.contains("data-fragment=\"/inbox/live\""), "{html}");
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
