//! The console's handlers, thin like the gRPC ones: find the person behind the session, check the
//! form came from the console's own page, call the application, render or redirect.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::pages::{self, Notice, Page};
use crate::app::App;
use crate::app::approvals::ApprovalsService;
use crate::app::board::BoardService;
use crate::app::board::{Edit, Post};
use crate::app::console::ConsoleService;
use crate::app::console::Watch;
use crate::app::trust::TrustService;
use crate::domain::activity::Filter;
use crate::domain::caller::Human;
use crate::domain::console::{SESSION_TTL, csrf_matches, csrf_token};
use crate::domain::ids::new_message_id;
use crate::domain::{Error, Result};
use crate::protocol::web;

/// No inline script or style, nothing from elsewhere, never in a frame.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                   form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// The largest form taken: a card's detail or a message body is at most 64 KiB.
const MAX_FORM_BYTES: usize = 256 * 1024;
/// How often a live page's feed says `tick`, for presence (it reads nothing).
const TICK: Duration = Duration::from_secs(5);

const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

#[derive(Clone)]
struct Console {
    board: BoardService,
    console: ConsoleService,
    trust: TrustService,
    approvals: ApprovalsService,
    /// Served over TLS: cookies are Secure and named `__Host-…`.
    secure: bool,
    shutdown: CancellationToken,
}

pub(super) fn router(app: &App, secure: bool, shutdown: CancellationToken) -> Router {
    Router::new()
        .route("/", get(|| async { see_other("/board") }))
        .route("/sign-in", get(sign_in_page).post(sign_in))
        .route("/sign-out", post(sign_out))
        .route("/board", get(board_page))
        .route("/board/live", get(board_live))
        .route("/board/post", post(board_post))
        .route("/board/edit", post(board_edit))
        .route("/board/close", post(board_close))
        .route("/agents", get(agents_page))
        .route("/agents/live", get(agents_live))
        .route("/activity", get(activity_page))
        .route("/activity/live", get(activity_live))
        .route("/inbox", get(inbox_page))
        .route("/inbox/live", get(inbox_live))
        .route("/inbox/send", post(inbox_send))
        .route("/inbox/reply", post(inbox_reply))
        .route("/inbox/read", post(inbox_read))
        .route("/inbox/hold", post(inbox_hold))
        .route("/inbox/approval", post(inbox_approval))
        .route("/contacts", get(contacts_page))
        .route("/contacts/request", post(contact_request))
        .route("/contacts/accept", post(contact_accept))
        .route("/contacts/drop", post(contact_drop))
        .route("/contacts/private", post(contact_private))
        .route("/events", get(events))
        .route("/file", get(file_download))
        .route("/static/console.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/static/console.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(middleware::map_response(move |response| security_headers(response, secure)))
        .with_state(Console {
            board: app.board.clone(),
            console: app.console.clone(),
            trust: app.trust.clone(),
            approvals: app.approvals.clone(),
            secure,
            shutdown,
        })
}

/// Browsers that reached the console over HTTPS keep to HTTPS for it for a year.
const HSTS: &str = "max-age=31536000";

async fn security_headers(mut response: Response, secure: bool) -> Response {
    let headers = response.headers_mut();
    if secure {
        headers.insert(header::STRICT_TRANSPORT_SECURITY, HeaderValue::from_static(HSTS));
    }
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    // Pages carry the session's form token and the account's data: never kept by a cache.
    headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

fn see_other(location: &str) -> Response {
    match HeaderValue::from_str(location) {
        Ok(location) => (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

fn page_response(status: StatusCode, html: String) -> Response {
    (status, Html(html)).into_response()
}

/// The one place where domain errors become HTTP statuses.
fn status_of(err: &Error) -> StatusCode {
    match err {
        Error::Invalid(_) => StatusCode::BAD_REQUEST,
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::AlreadyExists(_) | Error::FailedPrecondition(_) => StatusCode::CONFLICT,
        Error::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        Error::PermissionDenied(_) => StatusCode::FORBIDDEN,
        Error::ResourceExhausted(_) | Error::Throttled { .. } => StatusCode::TOO_MANY_REQUESTS,
        Error::Overloaded(_) | Error::Unavailable(_) | Error::Conflict(_) => StatusCode::SERVICE_UNAVAILABLE,
        Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// What a person reads of a refusal; an internal error's detail goes to the log only.
fn reason(err: &Error) -> String {
    match err {
        Error::Internal(detail) => {
            tracing::error!(error = %detail, "console: internal error");
            "internal error: the server's log has the details".to_owned()
        }
        other => other.to_string(),
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A form's fields as sent, in order (a field may repeat).
#[derive(Deserialize, Default)]
#[serde(transparent)]
struct Fields(Vec<(String, String)>);

impl Fields {
    /// The field's first value, or "" when absent.
    fn get(&self, name: &str) -> &str {
        self.0.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
    }

    fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.0.iter().filter(move |(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn yes(&self, name: &str) -> bool {
        matches!(self.get(name), "yes" | "on" | "true")
    }
}

/// `?done=CODE`: what the action before the redirect did.
#[derive(Deserialize, Default)]
struct Shown {
    done: Option<String>,
}

impl Shown {
    fn notice(&self) -> Option<Notice<'static>> {
        self.done.as_deref().and_then(pages::done_text).map(Notice::Done)
    }
}

impl Console {
    fn cookie_name(&self) -> &'static str {
        // `__Host-` binds the cookie to this host, over TLS, for every path.
        if self.secure { "__Host-relay_console" } else { "relay_console" }
    }

    fn session_cookie(&self, token: &str) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let cookie = format!(
            "{}={token}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{secure}",
            self.cookie_name(),
            SESSION_TTL.as_secs()
        );
        HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    fn cleared_cookie(&self) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let cookie = format!("{}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{secure}", self.cookie_name());
        HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The session token the browser sent, if any.
    fn session_of(&self, headers: &HeaderMap) -> Option<String> {
        let name = self.cookie_name();
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.trim().to_owned())
    }

    /// The session and its person.
    async fn signed_in(&self, headers: &HeaderMap) -> Result<(String, Human)> {
        let session = self.session_of(headers).ok_or_else(|| Error::Unauthenticated("not signed in".into()))?;
        let person = self.console.session(&session).await?;
        Ok((session, person))
    }

    /// Where a page request without a usable session goes: to sign in (forgetting a dead cookie).
    fn away(&self, err: Error) -> Response {
        match err {
            Error::Unauthenticated(_) => {
                let mut response = see_other("/sign-in");
                response.headers_mut().insert(header::SET_COOKIE, self.cleared_cookie());
                response
            }
            other => page_response(status_of(&other), pages::unavailable(&reason(&other))),
        }
    }

    /// Whether a POST comes from the console's own pages: the browser's `Sec-Fetch-Site` and
    /// `Origin` say where a form was sent from, and a page of another site cannot change them.
    /// Without either (an old browser), the form token decides. Under `Referrer-Policy:
    /// no-referrer` a browser may send the origin as `null`; then `Sec-Fetch-Site` speaks for it.
    fn same_origin(&self, headers: &HeaderMap) -> bool {
        if let Some(site) = headers.get("sec-fetch-site")
            && !matches!(site.as_bytes(), b"same-origin" | b"none")
        {
            return false;
        }
        let Some(origin) = headers.get(header::ORIGIN).filter(|o| o.as_bytes() != b"null") else { return true };
        let (Ok(origin), Some(Ok(host))) = (origin.to_str(), headers.get(header::HOST).map(|h| h.to_str())) else {
            return false;
        };
        // Behind a TLS-terminating proxy (--insecure-plaintext) the browser speaks https to it.
        match origin.split_once("://") {
            Some(("https", authority)) => authority == host,
            Some(("http", authority)) => !self.secure && authority == host,
            _ => false,
        }
    }

    /// The session and person behind a POST that came from the console's own page with the
    /// session's form token; otherwise the response that refuses it.
    async fn form(&self, headers: &HeaderMap, fields: &Fields) -> std::result::Result<(String, Human), Response> {
        if !self.same_origin(headers) {
            return Err(refused_cross_site());
        }
        let (session, person) = self.signed_in(headers).await.map_err(|e| self.away(e))?;
        if !csrf_matches(&session, fields.get("csrf")) {
            return Err(page_response(
                StatusCode::FORBIDDEN,
                pages::unavailable("this form's csrf token is missing or stale: reload the page and try again"),
            ));
        }
        Ok((session, person))
    }

    /// A signed-in page, with a notice, answered with `status`.
    async fn show(
        &self,
        page: Page,
        person: &Human,
        session: &str,
        notice: Option<Notice<'_>>,
        status: StatusCode,
    ) -> Response {
        let csrf = csrf_token(session);
        let body = match page {
            Page::Board => self.console.board(person).await.map(|b| pages::board(&b, &csrf)),
            Page::Agents => self.console.agents(person).await.map(|a| pages::agents(&a, now_ms())),
            Page::Inbox => {
                self.console.inbox(person).await.map(|i| pages::inbox(&i, &csrf, new_message_id().as_str(), now_ms()))
            }
            Page::Contacts => self.console.contacts(person).await.map(|c| pages::contacts(&c, &csrf)),
            Page::Activity => {
                let filter = Filter::default();
                self.console.activity(person, &filter).await.map(|a| pages::activity(&a, &filter))
            }
        };
        match body {
            Ok(body) => page_response(status, pages::page(page, person, &csrf, notice, body)),
            Err(e) => page_response(status_of(&e), pages::unavailable(&reason(&e))),
        }
    }

    /// A page's live part, as its script fetches it again.
    async fn live(&self, page: Page, headers: &HeaderMap) -> Response {
        let (session, person) = match self.signed_in(headers).await {
            Ok(signed_in) => signed_in,
            Err(e) => return (status_of(&e), reason(&e)).into_response(),
        };
        let csrf = csrf_token(&session);
        let html = match page {
            Page::Board => self.console.board(&person).await.map(|b| pages::board_live(&b, &csrf).into_string()),
            Page::Agents => self.console.agents(&person).await.map(|a| pages::agents_live(&a, now_ms()).into_string()),
            Page::Inbox => self
                .console
                .inbox(&person)
                .await
                .map(|i| pages::inbox_live(&i, &csrf, new_message_id().as_str(), now_ms()).into_string()),
            Page::Contacts => Ok(String::new()),
            Page::Activity => {
                self.console.activity(&person, &Filter::default()).await.map(|a| pages::activity_live(&a).into_string())
            }
        };
        match html {
            Ok(html) => Html(html).into_response(),
            Err(e) => (status_of(&e), reason(&e)).into_response(),
        }
    }

    /// After an action: back to its page saying what it did, or the page again with why not.
    async fn after(&self, page: Page, person: &Human, session: &str, outcome: Result<&'static str>) -> Response {
        match outcome {
            Ok(done) => see_other(&format!("{}?done={done}", page.path())),
            Err(e) => {
                let why = reason(&e);
                self.show(page, person, session, Some(Notice::Refused(&why)), status_of(&e)).await
            }
        }
    }
}

fn refused_cross_site() -> Response {
    page_response(
        StatusCode::FORBIDDEN,
        pages::unavailable("cross-site request refused: the console takes forms from its own pages only"),
    )
}

// ---- signing in and out ------------------------------------------------------------------------

async fn sign_in_page(State(c): State<Console>, headers: HeaderMap) -> Response {
    if c.signed_in(&headers).await.is_ok() {
        return see_other("/board");
    }
    page_response(StatusCode::OK, pages::sign_in(None))
}

async fn sign_in(
    State(c): State<Console>,
    ConnectInfo(web::Peer(peer)): ConnectInfo<web::Peer>,
    headers: HeaderMap,
    Form(fields): Form<Fields>,
) -> Response {
    if !c.same_origin(&headers) {
        return refused_cross_site();
    }
    match c.console.sign_in(fields.get("token"), peer.ip()).await {
        Ok((session, _)) => {
            let mut response = see_other("/board");
            response.headers_mut().insert(header::SET_COOKIE, c.session_cookie(&session));
            response
        }
        Err(e) => {
            let why = match &e {
                Error::Unauthenticated(why) => format!("sign-in refused: {why}"),
                other => reason(other),
            };
            let mut response = page_response(status_of(&e), pages::sign_in(Some(&why)));
            if let Error::Throttled { retry_after, .. } = &e {
                let seconds = crate::domain::rate::whole_seconds(*retry_after);
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            response
        }
    }
}

async fn sign_out(State(c): State<Console>, headers: HeaderMap, Form(fields): Form<Fields>) -> Response {
    let (session, _) = match c.form(&headers, &fields).await {
        Ok(signed_in) => signed_in,
        Err(refused) => return refused,
    };
    if let Err(e) = c.console.sign_out(&session).await {
        return page_response(status_of(&e), pages::unavailable(&reason(&e)));
    }
    let mut response = see_other("/sign-in");
    response.headers_mut().insert(header::SET_COOKIE, c.cleared_cookie());
    response
}

// ---- pages -------------------------------------------------------------------------------------

async fn page(c: &Console, page: Page, headers: &HeaderMap, shown: &Shown) -> Response {
    match c.signed_in(headers).await {
        Ok((session, person)) => c.show(page, &person, &session, shown.notice(), StatusCode::OK).await,
        Err(e) => c.away(e),
    }
}

async fn board_page(State(c): State<Console>, headers: HeaderMap, Query(shown): Query<Shown>) -> Response {
    page(&c, Page::Board, &headers, &shown).await
}

async fn agents_page(State(c): State<Console>, headers: HeaderMap, Query(shown): Query<Shown>) -> Response {
    page(&c, Page::Agents, &headers, &shown).await
}

async fn inbox_page(State(c): State<Console>, headers: HeaderMap, Query(shown): Query<Shown>) -> Response {
    page(&c, Page::Inbox, &headers, &shown).await
}

async fn contacts_page(State(c): State<Console>, headers: HeaderMap, Query(shown): Query<Shown>) -> Response {
    page(&c, Page::Contacts, &headers, &shown).await
}

async fn board_live(State(c): State<Console>, headers: HeaderMap) -> Response {
    c.live(Page::Board, &headers).await
}

async fn agents_live(State(c): State<Console>, headers: HeaderMap) -> Response {
    c.live(Page::Agents, &headers).await
}

async fn inbox_live(State(c): State<Console>, headers: HeaderMap) -> Response {
    c.live(Page::Inbox, &headers).await
}

/// Which file to download.
#[derive(Deserialize)]
struct FileQuery {
    message: String,
    name: String,
}

/// A file an agent sent, to save: always as bytes to download (`attachment`, no type to sniff),
/// never shown in the console's own origin.
async fn file_download(State(c): State<Console>, headers: HeaderMap, Query(q): Query<FileQuery>) -> Response {
    let person = match c.signed_in(&headers).await {
        Ok((_, person)) => person,
        Err(e) => return c.away(e),
    };
    match c.console.file(&person, &q.message, &q.name).await {
        Ok((file, content)) => {
            let encoded = percent_encoding::utf8_percent_encode(&file.name, percent_encoding::NON_ALPHANUMERIC);
            let disposition = format!("attachment; filename*=UTF-8''{encoded}");
            let mut response = content.into_response();
            let h = response.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            if let Ok(value) = HeaderValue::from_str(&disposition) {
                h.insert(header::CONTENT_DISPOSITION, value);
            }
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
            response
        }
        Err(e) => (status_of(&e), reason(&e)).into_response(),
    }
}

/// The activity page's filters, as its form and its live part's address carry them.
#[derive(Deserialize, Default)]
struct ActivityQuery {
    #[serde(default)]
    agent: String,
    #[serde(default)]
    machine: String,
    #[serde(default)]
    repo: String,
    #[serde(default)]
    topic: String,
}

impl ActivityQuery {
    fn filter(&self) -> Result<Filter> {
        Filter::new(&self.agent, &self.machine, &self.repo, &self.topic)
    }

    /// The live part's address, with the same filters.
    fn fragment(&self) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (name, value) in
            [("agent", &self.agent), ("machine", &self.machine), ("repo", &self.repo), ("topic", &self.topic)]
        {
            if !value.trim().is_empty() {
                query.append_pair(name, value.trim());
            }
        }
        let query = query.finish();
        if query.is_empty() {
            Page::Activity.fragment().to_owned()
        } else {
            format!("{}?{query}", Page::Activity.fragment())
        }
    }
}

async fn activity_page(State(c): State<Console>, headers: HeaderMap, Query(q): Query<ActivityQuery>) -> Response {
    let (session, person) = match c.signed_in(&headers).await {
        Ok(signed_in) => signed_in,
        Err(e) => return c.away(e),
    };
    let csrf = csrf_token(&session);
    let shown = match q.filter() {
        Ok(filter) => c.console.activity(&person, &filter).await.map(|a| pages::activity(&a, &filter)),
        Err(e) => Err(e),
    };
    match shown {
        Ok(body) => {
            page_response(StatusCode::OK, pages::page_at(Page::Activity, &q.fragment(), &person, &csrf, None, body))
        }
        Err(e) => {
            let why = reason(&e);
            let body = pages::activity(&Default::default(), &Filter::default());
            let notice = Some(Notice::Refused(&why));
            page_response(
                status_of(&e),
                pages::page_at(Page::Activity, Page::Activity.fragment(), &person, &csrf, notice, body),
            )
        }
    }
}

async fn activity_live(State(c): State<Console>, headers: HeaderMap, Query(q): Query<ActivityQuery>) -> Response {
    let person = match c.signed_in(&headers).await {
        Ok((_, person)) => person,
        Err(e) => return (status_of(&e), reason(&e)).into_response(),
    };
    let html = match q.filter() {
        Ok(filter) => c.console.activity(&person, &filter).await.map(|a| pages::activity_live(&a).into_string()),
        Err(e) => Err(e),
    };
    match html {
        Ok(html) => Html(html).into_response(),
        Err(e) => (status_of(&e), reason(&e)).into_response(),
    }
}

// ---- actions -----------------------------------------------------------------------------------

/// Runs an action's handler body with the checked session and person, or answers the refusal.
macro_rules! form {
    ($c:expr, $headers:expr, $fields:expr) => {
        match $c.form(&$headers, &$fields).await {
            Ok(signed_in) => signed_in,
            Err(refused) => return refused,
        }
    };
}

async fn board_post(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let requires_pr = match f.get("requires_pr") {
        "yes" => Some(true),
        "no" => Some(false),
        _ => None,
    };
    // One path per line, or several on a line between commas.
    let paths: Vec<String> =
        f.get("paths").split(['\n', ',']).map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect();
    let post = Post {
        title: f.get("title"),
        detail: f.get("detail"),
        repo: f.get("repo"),
        schedule: f.get("schedule"),
        time_zone: f.get("time_zone"),
        agent: f.get("agent"),
        requires_pr,
        cwd: "",
        paths: &paths,
    };
    let outcome = c.board.person_post_job(&person, post).await.map(|_| "posted");
    c.after(Page::Board, &person, &session, outcome).await
}

async fn board_edit(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let edit = Edit {
        title: Some(f.get("title")),
        detail: Some(f.get("detail")),
        repo: None,
        schedule: None,
        time_zone: "",
        requires_pr: None,
        cwd: "",
    };
    let outcome = c.board.person_edit_job(&person, f.get("id"), edit).await.map(|_| "edited");
    c.after(Page::Board, &person, &session, outcome).await
}

async fn board_close(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let accept = f.yes("accept");
    let outcome = c
        .board
        .person_close_job(&person, f.get("id"), accept, f.get("note"))
        .await
        .map(|_| if accept { "accepted" } else { "sent-back" });
    c.after(Page::Board, &person, &session, outcome).await
}

async fn inbox_send(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let to: Vec<String> =
        f.get("to").split([',', ' ', '\n']).map(str::trim).filter(|a| !a.is_empty()).map(str::to_owned).collect();
    let client_id = format!("console-{}", f.get("client_id"));
    let outcome =
        c.trust.human_send(&person, &to, f.get("body"), "", &client_id, f.yes("private")).await.map(|_| "sent");
    c.after(Page::Inbox, &person, &session, outcome).await
}

async fn inbox_reply(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let client_id = format!("console-{}", f.get("client_id"));
    let outcome = c.trust.human_reply(&person, f.get("id"), f.get("body"), &client_id).await.map(|_| "replied");
    c.after(Page::Inbox, &person, &session, outcome).await
}

async fn inbox_read(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let seqs: std::result::Result<Vec<u64>, _> = f.all("seq").map(str::parse).collect();
    let outcome = match seqs {
        Ok(seqs) => c.console.mark_read(&person, &seqs).await.map(|_| "read"),
        Err(_) => Err(Error::invalid("a message to mark read is named by its number")),
    };
    c.after(Page::Inbox, &person, &session, outcome).await
}

async fn inbox_hold(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let release = f.yes("release");
    let outcome = c
        .trust
        .decide_hold(&person, f.get("id"), release, f.get("reason"))
        .await
        .map(|_| if release { "released" } else { "rejected" });
    c.after(Page::Inbox, &person, &session, outcome).await
}

async fn inbox_approval(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let decision = f.get("decision");
    let outcome = c
        .approvals
        .approve(&person, f.get("id"), decision, f.get("reason"))
        .await
        .map(|_| if decision == "allow" { "allowed" } else { "denied" });
    c.after(Page::Inbox, &person, &session, outcome).await
}

async fn contact_request(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let outcome = c
        .trust
        .contact_request(&person, f.get("account"))
        .await
        .map(|contact| if contact.state == "contact" { "contact" } else { "requested" });
    c.after(Page::Contacts, &person, &session, outcome).await
}

async fn contact_accept(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let outcome = c.trust.contact_accept(&person, f.get("account")).await.map(|_| "contact");
    c.after(Page::Contacts, &person, &session, outcome).await
}

async fn contact_drop(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let outcome = c.trust.contact_drop(&person, f.get("account")).await.map(|_| "dropped");
    c.after(Page::Contacts, &person, &session, outcome).await
}

async fn contact_private(State(c): State<Console>, headers: HeaderMap, Form(f): Form<Fields>) -> Response {
    let (session, person) = form!(c, headers, f);
    let allow = f.yes("allow");
    let outcome = c
        .trust
        .contact_private(&person, f.get("account"), allow)
        .await
        .map(|_| if allow { "private-on" } else { "private-off" });
    c.after(Page::Contacts, &person, &session, outcome).await
}

// ---- live updates ------------------------------------------------------------------------------

/// Server-sent events for a signed-in page: `ready` once open, then `account` when a card, hold or
/// permission request of the account changed, `inbox` when the human's inbox did, and `tick`
/// every few seconds; `signed-out` ends it when the session did: at its expiry, or when an
/// announced end of one of the account's sessions (migration 28: signing out, its human token
/// revoked) finds this one gone. Woken by the same wake-ups as the agents' push streams.
async fn events(State(c): State<Console>, headers: HeaderMap) -> Response {
    let (session, person) = match c.signed_in(&headers).await {
        Ok(signed_in) => signed_in,
        Err(e) => return (status_of(&e), reason(&e)).into_response(),
    };
    let watch = match c.console.watch(&person).await {
        Ok(watch) => watch,
        Err(e) => return (status_of(&e), reason(&e)).into_response(),
    };
    // Read again now that the wake-ups are taken: a session that ended between the first read and
    // them is found here, not missed until it would have expired.
    let expiry = match c.console.session_left(&session).await {
        Ok((_, left)) => Box::pin(tokio::time::sleep(left)),
        Err(e) => return (status_of(&e), reason(&e)).into_response(),
    };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let feed = Feed {
        console: c.console.clone(),
        session,
        watch,
        tick,
        expiry,
        started: false,
        over: false,
        shutdown: c.shutdown,
    };
    let stream = futures_util::stream::unfold(feed, Feed::next);
    // A proxy must pass each event on as it comes.
    ([("x-accel-buffering", "no")], Sse::new(stream).keep_alive(KeepAlive::default())).into_response()
}

struct Feed {
    console: ConsoleService,
    session: String,
    watch: Watch,
    tick: tokio::time::Interval,
    expiry: std::pin::Pin<Box<tokio::time::Sleep>>,
    started: bool,
    over: bool,
    shutdown: CancellationToken,
}

enum Woke {
    Account,
    SessionEnded,
    Inbox,
    Tick,
    Expired,
    Stop,
}

impl Feed {
    async fn next(mut self) -> Option<(std::result::Result<Event, Infallible>, Self)> {
        if self.over {
            return None;
        }
        let name = if !self.started {
            self.started = true;
            "ready"
        } else {
            loop {
                let woke = tokio::select! {
                    () = self.watch.account.changed() => Woke::Account,
                    () = self.watch.sessions.changed() => Woke::SessionEnded,
                    () = self.watch.inbox.changed() => Woke::Inbox,
                    _ = self.tick.tick() => Woke::Tick,
                    () = &mut self.expiry => Woke::Expired,
                    () = self.shutdown.cancelled() => Woke::Stop,
                };
                break match woke {
                    Woke::Account => "account",
                    // One of the account's sessions ended: this page's, or another one's.
                    Woke::SessionEnded => match self.console.session(&self.session).await {
                        Err(Error::Unauthenticated(_)) => {
                            self.over = true;
                            "signed-out"
                        }
                        _ => continue,
                    },
                    Woke::Inbox => "inbox",
                    Woke::Tick => "tick",
                    Woke::Expired => {
                        self.over = true;
                        "signed-out"
                    }
                    Woke::Stop => return None,
                };
            }
        };
        // An event without data is never dispatched by a browser.
        Some((Ok(Event::default().event(name).data(name)), self))
    }
}
