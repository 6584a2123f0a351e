//! The web console: signing in with the human token, the session cookie, forms that only the
//! console's own pages can send, security headers, the event feed that follows the board, HTTPS
//! with the server's certificate, and a person driving it all in a real browser (headless Chromium
//! under Playwright, tests/console/browser.py).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use relay_proto::v1::human_client::HumanClient;
use relay_proto::v1::worker_client::WorkerClient;
use relay_proto::v1::*;
use relay_tests::client::{Agent, Bearer, channel};
use relay_tests::http::{Answer, form, request, request_on};
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, EXIT_LIMIT, INSTALL_LIMIT, RunWithin, exit_within};
use relay_tests::server::Server;
use relay_tests::{bin, free_port};
use sha2::Digest as _;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

/// acme with machines laptop and ci (ci has the repository `app` on the board), its human token,
/// and the console on a port of its own.
struct World {
    server: Server,
    console: String,
    human: String,
    laptop: String,
    ci: String,
    _db: TestDb,
}

async fn world(env: &[(&str, &str)]) -> World {
    let db = TestDb::new().await;
    let console = format!("127.0.0.1:{}", free_port());
    let mut all = vec![("RELAY_CONSOLE_LISTEN", console.as_str())];
    all.extend_from_slice(env);
    let server = Server::start_with_env(&db, free_port(), &all).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    let human = server.admin_ok(&["human", "add", "acme"]);
    let mut w = worker(&server.url, &ci).await;
    w.register_repo(RegisterRepoRequest { path: "/src/app".into() }).await.unwrap();
    World { server, console, human, laptop, ci, _db: db }
}

async fn worker(url: &str, token: &str) -> WorkerClient<InterceptedService<Channel, Bearer>> {
    WorkerClient::with_interceptor(channel(url).await, Bearer::new(token))
}

async fn person(url: &str, token: &str) -> HumanClient<InterceptedService<Channel, Bearer>> {
    HumanClient::with_interceptor(channel(url).await, Bearer::new(token))
}

/// Signs in; the session cookie as the browser sends it back (`name=value`).
async fn sign_in(console: &str, token: &str) -> String {
    let answer = request(console, "POST", "/sign-in", &[FORM], &form(&[("token", token)])).await;
    assert_eq!(answer.status, 303, "{answer:?}");
    assert_eq!(answer.header("location"), Some("/board"));
    let cookie = answer.header("set-cookie").expect("a session cookie");
    cookie.split(';').next().unwrap().to_owned()
}

async fn get(console: &str, path: &str, cookie: &str) -> Answer {
    request(console, "GET", path, &[("Cookie", cookie)], "").await
}

/// The form token a page carries.
fn csrf_of(html: &str) -> String {
    let at = html.find(r#"name="csrf" value=""#).expect("a form with a csrf token") + r#"name="csrf" value=""#.len();
    html[at..at + 64].to_owned()
}

async fn post_job(agent: &mut Agent, title: &str) -> String {
    let request =
        PostJobRequest { title: title.into(), repo: "app".into(), requires_pr: Some(false), ..Default::default() };
    agent.rpc.post_job(request).await.unwrap().into_inner().id
}

async fn card_state(agent: &mut Agent, id: &str) -> String {
    agent.rpc.read_job(ReadJobRequest { id: id.into() }).await.unwrap().into_inner().state
}

/// Claims the next card on ci and finishes it with a summary: it goes to Review.
async fn to_review(url: &str, ci: &str, agent: &mut Agent) -> String {
    let claimed =
        worker(url, ci).await.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.expect("a card");
    let request =
        FinishJobRequest { job_token: claimed.job_token, summary: "done: see the branch".into(), ..Default::default() };
    agent.rpc.finish_job(request).await.unwrap();
    claimed.job.unwrap().id
}

#[tokio::test]
async fn pages_need_a_session_that_only_the_human_token_opens() {
    let w = world(&[]).await;
    for path in ["/board", "/agents", "/inbox", "/contacts", "/"] {
        let answer = request(&w.console, "GET", path, &[], "").await;
        assert_eq!(answer.status, 303, "{path}: {answer:?}");
        let to = if path == "/" { "/board" } else { "/sign-in" };
        assert_eq!(answer.header("location"), Some(to), "{path}");
    }
    for path in ["/board/live", "/inbox/live", "/agents/live", "/events"] {
        assert_eq!(request(&w.console, "GET", path, &[], "").await.status, 401, "{path}");
    }
    let page = request(&w.console, "GET", "/sign-in", &[], "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(r#"type="password" name="token""#), "{}", page.body);

    // A wrong token is refused, saying why; so is a machine token.
    let unknown = format!("rlh_{}", "0".repeat(64));
    for (token, why) in [
        (unknown.as_str(), "sign-in refused: unknown human token"),
        ("not a token", "sign-in refused: malformed human token"),
        (w.laptop.as_str(), "sign-in refused: malformed human token"),
    ] {
        let refused = request(&w.console, "POST", "/sign-in", &[FORM], &form(&[("token", token)])).await;
        assert_eq!(refused.status, 401, "{refused:?}");
        assert!(refused.body.contains(why), "{why}: {}", refused.body);
        assert!(refused.header("set-cookie").is_none());
    }

    // The human token opens a session: an HttpOnly, SameSite=Strict cookie for every path, that
    // expires (not Secure: this console is plaintext on loopback).
    let answer = request(&w.console, "POST", "/sign-in", &[FORM], &form(&[("token", &w.human)])).await;
    assert_eq!(answer.status, 303);
    let cookie = answer.header("set-cookie").unwrap();
    let (pair, attributes) = cookie.split_once(';').unwrap();
    let value = pair.strip_prefix("relay_console=").expect("the console's cookie");
    assert!(value.starts_with("rlc_") && value.len() == 68 && !value.contains(&w.human[4..]), "{cookie}");
    let attributes: Vec<&str> = attributes.split(';').map(str::trim).collect();
    for wanted in ["Path=/", "Max-Age=43200", "HttpOnly", "SameSite=Strict"] {
        assert!(attributes.contains(&wanted), "{wanted} in {cookie}");
    }
    assert!(!attributes.contains(&"Secure"), "{cookie}");

    let board = get(&w.console, "/board", pair).await;
    assert_eq!(board.status, 200, "{}", board.body);
    assert!(board.body.contains("<h1>Board</h1>") && board.body.contains("acme/me (owner)"), "{}", board.body);
    assert!(board.body.contains(r#"<option value="/src/app">app (/src/app on ci)</option>"#), "{}", board.body);
    // Signed in, the sign-in page sends the person on to the board.
    assert_eq!(get(&w.console, "/sign-in", pair).await.header("location"), Some("/board"));
    // Only a session that exists counts, and nothing but the cookie names it.
    let forged = format!("relay_console=rlc_{}", "a".repeat(64));
    assert_eq!(get(&w.console, "/board", &forged).await.header("location"), Some("/sign-in"));
}

#[tokio::test]
async fn every_answer_carries_the_security_headers() {
    let w = world(&[]).await;
    let cookie = sign_in(&w.console, &w.human).await;
    for (path, cookie) in [
        ("/board", cookie.as_str()),
        ("/inbox/live", cookie.as_str()),
        ("/sign-in", ""),
        ("/static/console.js", ""),
        ("/nope", ""),
    ] {
        let answer = get(&w.console, path, cookie).await;
        let csp = answer.header("content-security-policy").unwrap_or_else(|| panic!("{path}: {answer:?}"));
        for directive in ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "form-action 'self'"] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"), "{path}");
        assert_eq!(answer.header("referrer-policy"), Some("no-referrer"), "{path}");
        assert_eq!(answer.header("x-frame-options"), Some("DENY"), "{path}");
    }
    let page = get(&w.console, "/board", &cookie).await;
    assert_eq!(page.header("cache-control"), Some("no-store"));
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(
        !page.body.contains("<script>") && page.body.contains(r#"<script src="/static/console.js" defer></script>"#)
    );
    let script = get(&w.console, "/static/console.js", "").await;
    assert_eq!(script.header("content-type"), Some("text/javascript; charset=utf-8"));
    assert!(script.body.contains("new EventSource('/events')"));
    assert_eq!(get(&w.console, "/nope", "").await.status, 404);
}

#[tokio::test]
async fn forms_need_the_sessions_token_and_the_consoles_own_origin() {
    let w = world(&[]).await;
    let cookie = sign_in(&w.console, &w.human).await;
    let csrf = csrf_of(&get(&w.console, "/board", &cookie).await.body);
    let post = |fields: Vec<(&'static str, String)>, extra: Vec<(&'static str, String)>| {
        let (console, cookie) = (w.console.clone(), cookie.clone());
        async move {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let mut headers = vec![FORM, ("Cookie", cookie.as_str())];
            headers.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
            request(&console, "POST", "/board/post", &headers, &form(&fields)).await
        }
    };
    let card = |title: &str, csrf: &str| {
        vec![
            ("title", title.to_owned()),
            ("repo", "/src/app".to_owned()),
            ("agent", "claude".to_owned()),
            ("csrf", csrf.to_owned()),
        ]
    };
    let here = format!("http://{}", w.console);

    let missing = post(card("no token", "")[..3].to_vec(), vec![]).await;
    assert_eq!(missing.status, 403, "{missing:?}");
    assert!(missing.body.contains("csrf token is missing or stale"), "{}", missing.body);
    let other_session = ::relay_server::domain::console::csrf_token(&format!("rlc_{}", "b".repeat(64)));
    assert_eq!(post(card("wrong token", &other_session), vec![]).await.status, 403);
    let cross = post(card("cross-site", &csrf), vec![("Origin", "http://evil.example".into())]).await;
    assert_eq!(cross.status, 403);
    assert!(cross.body.contains("cross-site request refused"), "{}", cross.body);
    let fetched = post(card("cross-site fetch", &csrf), vec![("Sec-Fetch-Site", "cross-site".into())]).await;
    assert_eq!(fetched.status, 403);
    let https_elsewhere = post(card("other port", &csrf), vec![("Origin", "http://127.0.0.1:1".into())]).await;
    assert_eq!(https_elsewhere.status, 403);
    // Sign-in takes no form token, but its origin is checked all the same.
    let login = request(
        &w.console,
        "POST",
        "/sign-in",
        &[FORM, ("Origin", "http://evil.example")],
        &form(&[("token", &w.human)]),
    )
    .await;
    assert_eq!(login.status, 403);
    assert!(login.header("set-cookie").is_none());

    let mut bob = Agent::hello(&w.server.url, &w.laptop, "bob").await.unwrap();
    let listed = bob.rpc.list_jobs(ListJobsRequest::default()).await.unwrap().into_inner().jobs;
    assert!(listed.is_empty(), "nothing refused was posted: {listed:?}");

    // From the console's own page, with its token: posted, and back to the board saying so.
    let origin = vec![("Origin", here.clone()), ("Sec-Fetch-Site", "same-origin".into())];
    // The paths its work changes, one per line or between commas (claimed for its agent when it runs).
    let mut with_paths = card("From the console", &csrf);
    with_paths.push(("paths", "src/auth/,\ndocs".to_owned()));
    let posted = post(with_paths, origin).await;
    assert_eq!(posted.status, 303, "{posted:?}");
    assert_eq!(posted.header("location"), Some("/board?done=posted"));
    let jobs = bob.rpc.list_jobs(ListJobsRequest::default()).await.unwrap().into_inner().jobs;
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        (jobs[0].title.as_str(), jobs[0].posted_by.as_str(), jobs[0].state.as_str()),
        ("From the console", "acme/me", "todo")
    );
    assert_eq!(jobs[0].paths, ["docs", "src/auth"]);
    let board = get(&w.console, "/board?done=posted", &cookie).await.body;
    assert!(board.contains("Card posted to To do.") && board.contains("From the console"), "{board}");
    // A refusal comes back on the page, saying why.
    let untitled = post(card("", &csrf), vec![]).await;
    assert_eq!(untitled.status, 400);
    assert!(untitled.body.contains("title is required"), "{}", untitled.body);
    let mut outside = card("Outside", &csrf);
    outside.push(("paths", "../etc".to_owned()));
    let refused = post(outside, vec![]).await;
    assert_eq!(refused.status, 400);
    assert!(refused.body.contains("leaves the repository"), "{}", refused.body);
}

#[tokio::test]
async fn the_person_closes_and_edits_cards_as_the_operator_would() {
    let w = world(&[]).await;
    let cookie = sign_in(&w.console, &w.human).await;
    let csrf = csrf_of(&get(&w.console, "/board", &cookie).await.body);
    let act = |path: &'static str, fields: Vec<(&'static str, String)>| {
        let (console, cookie, csrf) = (w.console.clone(), cookie.clone(), csrf.clone());
        async move {
            let mut fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            fields.push(("csrf", &csrf));
            request(&console, "POST", path, &[FORM, ("Cookie", &cookie)], &form(&fields)).await
        }
    };
    let mut bob = Agent::hello(&w.server.url, &w.laptop, "bob").await.unwrap();
    let first = post_job(&mut bob, "Fix the login").await;

    let edited = act(
        "/board/edit",
        vec![("id", first.clone()), ("title", "Fix the login page".into()), ("detail", "see #12".into())],
    )
    .await;
    assert_eq!(edited.header("location"), Some("/board?done=edited"), "{edited:?}");
    let read = bob.rpc.read_job(ReadJobRequest { id: first.clone() }).await.unwrap().into_inner();
    assert_eq!(
        (read.title.as_str(), read.detail.as_str(), read.edited_by.as_str()),
        ("Fix the login page", "see #12", "acme/me")
    );

    let too_early = act("/board/close", vec![("id", first.clone()), ("accept", "yes".into())]).await;
    assert_eq!(too_early.status, 409, "{too_early:?}");
    assert!(too_early.body.contains("only cards in Review can be closed"), "{}", too_early.body);

    assert_eq!(to_review(&w.server.url, &w.ci, &mut bob).await, first);
    let not_editable =
        act("/board/edit", vec![("id", first.clone()), ("title", "late".into()), ("detail", String::new())]).await;
    assert_eq!(not_editable.status, 409);
    let no_note = act("/board/close", vec![("id", first.clone()), ("accept", "no".into()), ("note", " ".into())]).await;
    assert_eq!(no_note.status, 400);
    assert!(no_note.body.contains("needs a note"), "{}", no_note.body);
    let back =
        act("/board/close", vec![("id", first.clone()), ("accept", "no".into()), ("note", "add a test".into())]).await;
    assert_eq!(back.header("location"), Some("/board?done=sent-back"), "{back:?}");
    let read = bob.rpc.read_job(ReadJobRequest { id: first.clone() }).await.unwrap().into_inner();
    assert_eq!(read.state, "todo");
    assert!(
        read.detail.ends_with("Review note from acme/me (owner) for the next attempt:\nadd a test"),
        "{}",
        read.detail
    );
    // The poster heard of it from the board, as from the operator.
    let notice = bob.inbox(5, true).await.unwrap().messages;
    assert!(
        notice.iter().any(|m| m.from == "acme/me/board" && m.body.contains("acme/me (owner) sent it back")),
        "{notice:?}"
    );

    assert_eq!(to_review(&w.server.url, &w.ci, &mut bob).await, first);
    let accepted = act("/board/close", vec![("id", first.clone()), ("accept", "yes".into())]).await;
    assert_eq!(accepted.header("location"), Some("/board?done=accepted"));
    assert_eq!(card_state(&mut bob, &first).await, "done");
    let board = get(&w.console, "/board/live", &cookie).await.body;
    let done = &board[board.find(r#"data-column="done""#).unwrap()..];
    assert!(done.contains(&format!(r#"data-card="{first}""#)), "{board}");
}

/// A GET of the event feed, as a browser's EventSource holds it (HTTP/1.0: the body runs to the
/// end of the connection, unchunked).
async fn events(console: &str, cookie: &str) -> BufReader<TcpStream> {
    let mut stream = TcpStream::connect(console).await.unwrap();
    let head =
        format!("GET /events HTTP/1.0\r\nHost: {console}\r\nCookie: {cookie}\r\nAccept: text/event-stream\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).await.unwrap();
    assert!(status.contains(" 200 "), "{status}");
    let mut line = String::new();
    let mut content_type = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        if line.to_ascii_lowercase().starts_with("content-type:") {
            content_type = line.clone();
        }
        if line.trim().is_empty() {
            break;
        }
    }
    assert!(content_type.contains("text/event-stream"), "{content_type}");
    reader
}

/// The name of the next event on the feed, within `limit`.
async fn next_event(feed: &mut BufReader<TcpStream>, limit: Duration) -> String {
    tokio::time::timeout(limit, async {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(feed.read_line(&mut line).await.unwrap() > 0, "the feed ended");
            if let Some(name) = line.strip_prefix("event:") {
                return name.trim().to_owned();
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event within {limit:?}"))
}

/// Reads the feed until `signed-out`, within `limit`. What comes before it may only be a repaint
/// (`account`: the previous release's triggers also announce a session's end as a change to the
/// account) or a `tick`.
async fn until_signed_out(feed: &mut BufReader<TcpStream>, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_event(feed, left).await.as_str() {
            "signed-out" => return,
            "account" | "tick" => continue,
            other => panic!("unexpected event {other} before signed-out"),
        }
    }
}

/// The next event on the feed that is not a `tick` (the feed's presence beat, every five seconds),
/// within `limit`.
async fn next_wake(feed: &mut BufReader<TcpStream>, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let event = next_event(feed, deadline.saturating_duration_since(Instant::now())).await;
        if event != "tick" {
            return event;
        }
    }
}

/// Well under the feed's five-second tick, and loose enough for a loaded machine.
const WAKE: Duration = Duration::from_secs(3);

#[tokio::test]
async fn the_event_feed_wakes_at_once_when_a_card_moves_or_mail_comes() {
    let mut w = world(&[]).await;
    let cookie = sign_in(&w.console, &w.human).await;
    let mut feed = events(&w.console, &cookie).await;
    assert_eq!(next_event(&mut feed, Duration::from_secs(5)).await, "ready");
    let mut bob = Agent::hello(&w.server.url, &w.laptop, "bob").await.unwrap();

    let id = post_job(&mut bob, "Watched").await;
    assert_eq!(next_wake(&mut feed, WAKE).await, "account");
    // A worker's claim moves it; a renewed lease alone shows nothing new and wakes nobody.
    let mut ci = worker(&w.server.url, &w.ci).await;
    let claimed = ci.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.unwrap();
    assert_eq!(claimed.job.as_ref().unwrap().id, id);
    assert_eq!(next_wake(&mut feed, WAKE).await, "account");
    let renewal =
        RenewRequest { job_token: claimed.job_token.clone(), agent_state: "starting".into(), ..Default::default() };
    ci.renew(renewal).await.unwrap();
    bob.send(&["me"], "mail for the person").await.unwrap();
    assert_eq!(next_wake(&mut feed, WAKE).await, "inbox", "the renewal woke nothing");

    // Another account's board is not this console's business.
    let globex = w.server.machine("globex", "box");
    w.server.admin_ok(&["contact", "add", "acme", "globex"]);
    let mut worker_globex = worker(&w.server.url, &globex).await;
    worker_globex.register_repo(RegisterRepoRequest { path: "/srv/site".into() }).await.unwrap();
    let mut eve = Agent::hello(&w.server.url, &globex, "eve").await.unwrap();
    let request = PostJobRequest { title: "elsewhere".into(), repo: "site".into(), ..Default::default() };
    eve.rpc.post_job(request).await.unwrap();
    let woke = tokio::time::timeout(Duration::from_millis(500), next_wake(&mut feed, WAKE)).await;
    assert!(woke.is_err(), "another account's card woke this console: {woke:?}");

    // An open feed does not hold up the server's stop: it ends, and the server exits cleanly.
    let stopping = Instant::now();
    let status = w.server.stop().await;
    assert!(status.success(), "{status:?}");
    assert!(stopping.elapsed() < Duration::from_secs(8), "stopped after {:?}", stopping.elapsed());
    let mut rest = String::new();
    let ended =
        tokio::time::timeout(Duration::from_secs(2), tokio::io::AsyncReadExt::read_to_string(&mut feed, &mut rest));
    assert!(ended.await.is_ok(), "the feed ended with the server");
}

#[tokio::test]
async fn signing_out_or_revoking_the_token_ends_the_session() {
    let w = world(&[]).await;
    let cookie = sign_in(&w.console, &w.human).await;
    let csrf = csrf_of(&get(&w.console, "/board", &cookie).await.body);
    let mut open_page = events(&w.console, &cookie).await;
    assert_eq!(next_event(&mut open_page, Duration::from_secs(5)).await, "ready");
    let refused = request(&w.console, "POST", "/sign-out", &[FORM, ("Cookie", &cookie)], &form(&[])).await;
    assert_eq!(refused.status, 403, "sign-out is a form like any other");
    let out = request(&w.console, "POST", "/sign-out", &[FORM, ("Cookie", &cookie)], &form(&[("csrf", &csrf)])).await;
    assert_eq!(out.status, 303);
    assert_eq!(out.header("location"), Some("/sign-in"));
    let cleared = out.header("set-cookie").unwrap();
    assert!(cleared.starts_with("relay_console=;") && cleared.contains("Max-Age=0"), "{cleared}");
    assert_eq!(
        get(&w.console, "/board", &cookie).await.header("location"),
        Some("/sign-in"),
        "the old cookie opens nothing"
    );
    // A page left open hears it at once (well before its next tick), not by asking.
    until_signed_out(&mut open_page, Duration::from_secs(2)).await;

    // A revoked human token ends its sessions at once, and an open event feed hears it at once.
    let cookie = sign_in(&w.console, &w.human).await;
    assert_eq!(get(&w.console, "/board", &cookie).await.status, 200);
    let second = sign_in(&w.console, &w.human).await;
    let mut feed = events(&w.console, &second).await;
    assert_eq!(next_event(&mut feed, Duration::from_secs(5)).await, "ready");
    w.server.admin_ok(&["human", "revoke", "acme", "owner"]);
    assert_eq!(get(&w.console, "/board", &cookie).await.header("location"), Some("/sign-in"));
    assert_eq!(get(&w.console, "/inbox/live", &second).await.status, 401);
    let refused = request(&w.console, "POST", "/sign-in", &[FORM], &form(&[("token", &w.human)])).await;
    assert!(refused.body.contains("sign-in refused: this human token was revoked"), "{}", refused.body);
    until_signed_out(&mut feed, Duration::from_secs(2)).await;
    let mut rest = String::new();
    let ended =
        tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read_to_string(&mut feed, &mut rest));
    assert!(ended.await.is_ok(), "the feed ends after signed-out");
}

#[tokio::test]
async fn signing_out_one_session_leaves_the_accounts_other_pages_open() {
    let w = world(&[]).await;
    let leaving = sign_in(&w.console, &w.human).await;
    let staying = sign_in(&w.console, &w.human).await;
    let csrf = csrf_of(&get(&w.console, "/board", &leaving).await.body);
    let mut page = events(&w.console, &staying).await;
    assert_eq!(next_event(&mut page, Duration::from_secs(5)).await, "ready");
    let out = request(&w.console, "POST", "/sign-out", &[FORM, ("Cookie", &leaving)], &form(&[("csrf", &csrf)])).await;
    assert_eq!(out.status, 303);
    // The other page checks its own session on hearing of the end, finds it standing, and goes on:
    // the next change to the account reaches it as a repaint, not a sign-out.
    let mut bob = Agent::hello(&w.server.url, &w.laptop, "bob").await.unwrap();
    post_job(&mut bob, "Still watched").await;
    for _ in 0..2 {
        let event = next_event(&mut page, Duration::from_secs(5)).await;
        assert!(event == "account" || event == "tick", "the other page goes on: {event}");
    }
    assert_eq!(get(&w.console, "/board", &staying).await.status, 200);
}

#[tokio::test]
async fn the_console_speaks_https_with_the_servers_certificate() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let issued = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, issued.cert.pem()).unwrap();
    std::fs::write(&key, issued.signing_key.serialize_pem()).unwrap();
    let port = free_port();
    let console = format!("127.0.0.1:{port}");
    let server = Server::start_tls_with_env(&db, &cert, &key, &[("RELAY_CONSOLE_LISTEN", &console)]).await;
    server.admin_ok(&["account", "create", "acme"]);
    let human = server.admin_ok(&["human", "add", "acme"]);

    let mut roots = rustls::RootCertStore::empty();
    roots.add(issued.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let host = format!("localhost:{port}");
    let tls = || async {
        let tcp = TcpStream::connect(&console).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let stream = connector.connect(name, tcp).await.expect("a TLS handshake with the server's certificate");
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        stream
    };
    let answer = request_on(tls().await, &host, "POST", "/sign-in", &[FORM], &form(&[("token", &human)])).await;
    assert_eq!(answer.status, 303, "{answer:?}");
    let cookie = answer.header("set-cookie").unwrap();
    assert!(cookie.starts_with("__Host-relay_console=rlc_"), "{cookie}");
    assert!(
        cookie.contains("; Secure") && cookie.contains("; HttpOnly") && cookie.contains("; SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    let board = request_on(tls().await, &host, "GET", "/board", &[("Cookie", pair)], "").await;
    assert_eq!(board.status, 200);
    assert_eq!(board.header("strict-transport-security"), Some("max-age=31536000"), "browsers keep to HTTPS");
    // A form from the plain-http origin of the same host is another origin.
    let csrf = csrf_of(&board.body);
    let headers = [FORM, ("Cookie", pair), ("Origin", "http://localhost")];
    let plain_origin = request_on(tls().await, &host, "POST", "/sign-out", &headers, &form(&[("csrf", &csrf)])).await;
    assert_eq!(plain_origin.status, 403);
    // Plaintext is not served there.
    let plain = relay_tests::http::get(&console, "/sign-in").await;
    assert!(plain.as_ref().is_none_or(|(status, _)| *status != 200), "{plain:?}");
}

#[tokio::test]
async fn guessing_a_human_token_is_slowed_to_a_crawl_for_that_address_alone() {
    let w = world(&[]).await;
    let guess = |n: usize| form(&[("token", &format!("rlh_{n:064}"))]);
    let mut slowed = None;
    for n in 0..40 {
        let answer = request(&w.console, "POST", "/sign-in", &[FORM], &guess(n)).await;
        if answer.status == 429 {
            slowed = Some(answer);
            break;
        }
        assert_eq!(answer.status, 401, "{answer:?}");
    }
    let slowed = slowed.expect("guesses are refused once they pass the address's budget");
    let wait: u64 = slowed.header("retry-after").and_then(|s| s.parse().ok()).expect("Retry-After in seconds");
    assert!(wait >= 1, "a real wait: {wait}");
    assert!(slowed.body.contains("too many failed sign-ins from your address: try again in"), "{}", slowed.body);
    // From that address even the right token waits; the person at another address signs in.
    let right = request(&w.console, "POST", "/sign-in", &[FORM], &form(&[("token", &w.human)])).await;
    assert_eq!(right.status, 429);
    let elsewhere = tokio::net::TcpSocket::new_v4().unwrap();
    elsewhere.bind("127.0.0.5:0".parse().unwrap()).unwrap();
    let stream = elsewhere.connect(w.console.parse().unwrap()).await.unwrap();
    let answer = request_on(stream, &w.console, "POST", "/sign-in", &[FORM], &form(&[("token", &w.human)])).await;
    assert_eq!(answer.status, 303, "{answer:?}");
}

#[test]
fn a_plaintext_console_on_a_public_address_is_refused() {
    let out = Command::new(bin("relay-server"))
        .args(["serve", "--console-listen", &format!("0.0.0.0:{}", free_port())])
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT)
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing a plaintext console on non-loopback address"), "{err}");
}

// ---- a real browser ---------------------------------------------------------------------------

/// The browser test's Python: `RELAY_CONSOLE_PYTHON`, else `target/console-venv` (made here when CI
/// has not made it, from tests/console/requirements.txt).
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("RELAY_CONSOLE_PYTHON") {
        return PathBuf::from(python);
    }
    let target = bin("relay-server").parent().and_then(Path::parent).unwrap().to_path_buf();
    let venv = target.join("console-venv");
    let python = venv.join("bin").join("python");
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join("console").join("requirements.txt");
    let ready = python.exists()
        && Command::new(&python)
            .args(["-c", "import playwright"])
            .status_within(COMMAND_LIMIT)
            .is_ok_and(|s| s.success());
    if !ready {
        let made = Command::new("python3")
            .arg("-m")
            .arg("venv")
            .arg(&venv)
            .status_within(INSTALL_LIMIT)
            .expect("python3 for the console venv");
        assert!(made.success(), "cannot create {}", venv.display());
        let installed = Command::new(&python)
            .args(["-m", "pip", "install", "-q", "-r"])
            .arg(&requirements)
            .status_within(INSTALL_LIMIT)
            .expect("pip for the console venv");
        assert!(installed.success(), "cannot install Playwright into {}", venv.display());
    }
    python
}

/// The system's Chromium (Debian's `chromium` package): `RELAY_CHROMIUM`, else the first found.
fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("RELAY_CHROMIUM") {
        return PathBuf::from(path);
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("no Chromium: install Debian's chromium package (apt-get install chromium), or set RELAY_CHROMIUM")
}

/// What the script asks of the world while it drives the browser, answered on its stdin.
struct Stage {
    url: String,
    ci: String,
    bob: Agent,
    eve: Agent,
    amy: Agent,
    human: HumanClient<InterceptedService<Channel, Bearer>>,
    card: String,
    message: String,
    asking: Option<tokio::task::JoinHandle<Result<PermissionDecision, tonic::Status>>>,
    hold: String,
}

impl Stage {
    async fn act(&mut self, want: &str) -> Result<String, String> {
        let (step, arg) = want.split_once(' ').unwrap_or((want, ""));
        match step {
            // An agent posts a card while the person watches the board.
            "post-card" => {
                self.card = post_job(&mut self.bob, "Ship the <b>login</b> page").await;
                Ok(self.card.clone())
            }
            "to-review" => {
                let id = to_review(&self.url, &self.ci, &mut self.bob).await;
                (id == self.card).then(|| id.clone()).ok_or(format!("claimed {id}, not {}", self.card))
            }
            "check-done" => {
                let state = card_state(&mut self.bob, &self.card).await;
                (state == "done").then_some(state.clone()).ok_or(format!("the card is {state}"))
            }
            // A board agent asks for a tool; with no operator, the person is asked at once.
            "approval" => {
                let id = post_job(&mut self.bob, "Clean the build").await;
                let claimed =
                    worker(&self.url, &self.ci).await.claim(ClaimRequest::default()).await.unwrap().into_inner();
                let claimed = claimed.claimed.ok_or("nothing to claim")?;
                if claimed.job.as_ref().map(|j| j.id.as_str()) != Some(id.as_str()) {
                    return Err("claimed another card".into());
                }
                let mut rpc = self.bob.rpc.clone();
                let ask = PermissionRequest {
                    job_token: claimed.job_token,
                    tool: "Bash".into(),
                    input: r#"{"command":"rm -rf build <script>alert(2)</script>"}"#.into(),
                };
                self.asking =
                    Some(tokio::spawn(async move { rpc.request_permission(ask).await.map(|r| r.into_inner()) }));
                for _ in 0..100 {
                    let open = self.human.approvals(ApprovalsRequest {}).await.unwrap().into_inner().approvals;
                    if let Some(approval) = open.into_iter().find(|a| a.job_id == id) {
                        return Ok(approval.id);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err("the permission request never reached the person".into())
            }
            "approval-decided" => {
                let asking = self.asking.take().ok_or("no request asked")?;
                let decision = tokio::time::timeout(Duration::from_secs(10), asking)
                    .await
                    .map_err(|_| "the asking agent is still waiting")?
                    .unwrap()
                    .map_err(|e| e.to_string())?;
                (decision.state == "allow").then(|| decision.decided_by.clone()).ok_or(format!("{decision:?}"))
            }
            "message" => {
                let sent = self.bob.send(&["me"], arg).await.map_err(|e| e.to_string())?;
                self.message = sent.id.clone();
                Ok(sent.id)
            }
            // The person's reply reaches bob as an answer to his message.
            "check-reply" => {
                let inbox = self.bob.inbox(10, true).await.map_err(|e| e.to_string())?;
                let found = inbox.messages.iter().find(|m| m.body == arg && m.reply_to == self.message);
                found.map(|m| m.from.clone()).ok_or(format!("no reply {arg:?} in {:?}", inbox.messages))
            }
            "bob-got" => {
                let inbox = self.bob.inbox(10, true).await.map_err(|e| e.to_string())?;
                let found = inbox.messages.iter().find(|m| m.body == arg && m.from == "acme/me");
                found.map(|m| m.id.clone()).ok_or(format!("no {arg:?} from acme/me in {:?}", inbox.messages))
            }
            "hold" => {
                let sent = self.bob.send(&["globex/box/eve"], arg).await.map_err(|e| e.to_string())?;
                self.hold = sent.hold.clone();
                (!sent.hold.is_empty()).then(|| sent.hold.clone()).ok_or("the message was not held".into())
            }
            "hold-released" => {
                let inbox = self.eve.inbox(10, true).await.map_err(|e| e.to_string())?;
                inbox
                    .messages
                    .iter()
                    .find(|m| m.body == arg)
                    .map(|m| m.from.clone())
                    .ok_or(format!("{:?}", inbox.messages))
            }
            // Two of the account's agents talk (one of them privately too), and one claims paths.
            "agents-talk" => {
                // With a file a person can download from the page.
                let data = b"step 1: <b>migrate</b>\n".to_vec();
                let upload = UploadRequest {
                    name: "plan & notes.md".into(),
                    size: data.len() as u64,
                    sha256: hex::encode(sha2::Sha256::digest(&data)),
                    data,
                };
                let up = self.bob.rpc.upload(upload).await.map_err(|e| e.to_string())?.into_inner();
                let first = SendRequest {
                    to: vec!["ci/amy".into()],
                    body: arg.into(),
                    attach: vec![up.upload],
                    ..Default::default()
                };
                let sent = self.bob.rpc.send(first).await.map_err(|e| e.to_string())?.into_inner();
                let private = SendRequest {
                    to: vec!["ci/amy".into()],
                    body: "the private plan".into(),
                    private: true,
                    ..Default::default()
                };
                self.bob.rpc.send(private).await.map_err(|e| e.to_string())?;
                let reply = ReplyRequest { id: sent.id.clone(), body: "hi bob".into(), client_id: String::new() };
                self.amy.rpc.reply(reply).await.map_err(|e| e.to_string())?;
                let again = SendRequest {
                    to: vec!["ci/amy".into()],
                    body: "thanks".into(),
                    thread: sent.thread,
                    ..Default::default()
                };
                self.bob.rpc.send(again).await.map_err(|e| e.to_string())?;
                let repo = RepoRef { kind: Some(repo_ref::Kind::Remote("git@github.com:acme/api.git".into())) };
                let claim = ClaimPathsRequest {
                    repo: Some(repo),
                    paths: vec!["src/auth/**".into()],
                    exclusive: true,
                    ttl_s: None,
                    reason: "refactoring <b>login</b>".into(),
                };
                let claimed = self.bob.rpc.claim_paths(claim).await.map_err(|e| e.to_string())?.into_inner();
                claimed.granted.then_some(sent.id).ok_or("the claim was not granted".into())
            }
            other => Err(format!("unknown step {other}")),
        }
    }
}

#[tokio::test]
async fn a_person_drives_the_console_in_a_real_browser() {
    let w = world(&[]).await;
    let globex = w.server.machine("globex", "box");
    w.server.admin_ok(&["contact", "add", "acme", "globex"]);
    w.server.admin_ok(&["account", "create", "initech"]);
    let mut human = person(&w.server.url, &w.human).await;
    human.hold_policy(HoldPolicyRequest { class: "contact".into(), on: true }).await.unwrap();
    let mut bob = Agent::hello(&w.server.url, &w.laptop, "bob").await.unwrap();
    let mut eve = Agent::hello(&w.server.url, &globex, "eve").await.unwrap();
    let amy = Agent::hello(&w.server.url, &w.ci, "amy").await.unwrap();
    let profile = UpdateProfileRequest {
        status: Some("busy".into()),
        title: Some("Building <the> login".into()),
        ..Default::default()
    };
    bob.rpc.update_profile(profile).await.unwrap();
    // Online while their push streams are open.
    let _bob_stream = bob.subscribe(0).await;
    let _eve_stream = eve.subscribe(0).await;

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("console").join("browser.py");
    let (python, chromium) = (tokio::task::spawn_blocking(python).await.unwrap(), chromium());
    // Screenshots of each page and of a failure; kept in RELAY_CONSOLE_ARTIFACTS when set.
    let artifacts = tempfile::tempdir().unwrap();
    let kept = std::env::var_os("RELAY_CONSOLE_ARTIFACTS").map(PathBuf::from);
    let shots = kept.clone().unwrap_or_else(|| artifacts.path().to_owned());
    let mut child = tokio::process::Command::new(python)
        .arg(&script)
        .args(["--url", &format!("http://{}", w.console), "--chromium"])
        .arg(&chromium)
        .arg("--artifacts")
        .arg(&shots)
        .env("RELAY_HUMAN_TOKEN", &w.human)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the browser test");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let errors = tokio::spawn(async move {
        let mut text = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
        text
    });

    let mut stage = Stage {
        url: w.server.url.clone(),
        ci: w.ci.clone(),
        bob,
        eve,
        amy,
        human,
        card: String::new(),
        message: String::new(),
        asking: None,
        hold: String::new(),
    };
    let mut said = Vec::new();
    let run = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            said.push(line.clone());
            if let Some(want) = line.strip_prefix("want ") {
                let answer = match stage.act(want).await {
                    Ok(value) => format!("ok {value}\n"),
                    Err(why) => format!("fail {why}\n"),
                };
                said.push(format!("> {}", answer.trim_end()));
                stdin.write_all(answer.as_bytes()).await.unwrap();
            }
        }
    };
    let finished = tokio::time::timeout(Duration::from_secs(240), run).await.is_ok();
    let status =
        if finished { Some(exit_within(&mut child, EXIT_LIMIT, "the browser test to exit").await) } else { None };
    let _ = child.kill().await;
    let errors = errors.await.unwrap_or_default();
    let taken: Vec<String> = std::fs::read_dir(&shots)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path().display().to_string()).collect())
        .unwrap_or_default();
    let passed = status.is_some_and(|s| s.success()) && said.last().is_some_and(|l| l.starts_with("passed"));
    if !passed {
        // Keep the screenshots for whoever reads the failure.
        let dir = kept.unwrap_or_else(|| artifacts.keep());
        panic!(
            "the browser test failed ({}):\n--- stdout\n{}\n--- stderr\n{errors}\n--- screenshots in {} ({taken:?})",
            if finished { "exited" } else { "timed out" },
            said.join("\n"),
            dir.display()
        );
    }
}

/// The activity page links each file an agent attached; the link downloads it as bytes for the
/// account's people, and for nobody else (another account's person, or no session).
#[tokio::test]
async fn a_person_downloads_the_files_of_their_agents_messages_and_no_one_else_does() {
    let w = world(&[]).await;
    let mut bob = Agent::hello(&w.server.url, &w.laptop, "bob").await.unwrap();
    Agent::hello(&w.server.url, &w.ci, "amy").await.unwrap();
    let data = b"<html><script>alert(1)</script></html>".to_vec();
    let upload = UploadRequest {
        name: "page.html".into(),
        size: data.len() as u64,
        sha256: hex::encode(sha2::Sha256::digest(&data)),
        data: data.clone(),
    };
    let up = bob.rpc.upload(upload).await.unwrap().into_inner().upload;
    let send =
        SendRequest { to: vec!["ci/amy".into()], body: "the page".into(), attach: vec![up], ..Default::default() };
    let id = bob.rpc.send(send).await.unwrap().into_inner().id;

    let cookie = sign_in(&w.console, &w.human).await;
    let page = get(&w.console, "/activity", &cookie).await;
    let link = format!("/file?message={id}&amp;name=page.html");
    assert!(page.body.contains(&format!("href=\"{link}\"")), "{}", page.body);
    let file = get(&w.console, &link.replace("&amp;", "&"), &cookie).await;
    assert_eq!(file.status, 200, "{file:?}");
    assert_eq!(file.body.as_bytes(), data, "as stored");
    assert_eq!(file.header("content-type"), Some("application/octet-stream"));
    assert_eq!(file.header("content-disposition"), Some("attachment; filename*=UTF-8''page%2Ehtml"));
    assert_eq!(file.header("x-content-type-options"), Some("nosniff"));

    let missing = get(&w.console, &format!("/file?message={id}&name=other.txt"), &cookie).await;
    assert_eq!(missing.status, 404, "{missing:?}");

    // A message held for the person shows its files beside it, to look at before releasing it.
    let globex = w.server.machine("globex", "box");
    w.server.admin_ok(&["contact", "add", "acme", "globex"]);
    person(&w.server.url, &w.human)
        .await
        .hold_policy(HoldPolicyRequest { class: "contact".into(), on: true })
        .await
        .unwrap();
    Agent::hello(&w.server.url, &globex, "eve").await.unwrap();
    let data = b"the numbers".to_vec();
    let upload = UploadRequest {
        name: "q3.csv".into(),
        size: data.len() as u64,
        sha256: hex::encode(sha2::Sha256::digest(&data)),
        data: data.clone(),
    };
    let up = bob.rpc.upload(upload).await.unwrap().into_inner().upload;
    let send = SendRequest {
        to: vec!["globex/box/eve".into()],
        body: "figures".into(),
        attach: vec![up],
        ..Default::default()
    };
    let held = bob.rpc.send(send).await.unwrap().into_inner();
    assert!(!held.hold.is_empty(), "{held:?}");
    let inbox = get(&w.console, "/inbox", &cookie).await;
    let link = format!("/file?message={}&amp;name=q3.csv", held.id);
    assert!(inbox.body.contains(&format!("href=\"{link}\"")), "{}", inbox.body);
    let file = get(&w.console, &link.replace("&amp;", "&"), &cookie).await;
    assert_eq!((file.status, file.body.as_bytes()), (200, data.as_slice()), "{file:?}");

    let stranger = sign_in(&w.console, &w.server.admin_ok(&["human", "add", "globex"])).await;
    let theirs = get(&w.console, &format!("/file?message={id}&name=page.html"), &stranger).await;
    assert_eq!(theirs.status, 404, "another account's person finds no such file: {theirs:?}");
    let before = get(&w.console, &format!("/file?message={}&name=q3.csv", held.id), &stranger).await;
    assert_eq!(before.status, 404, "a held message is not its recipients' yet: {before:?}");
    let anonymous = request(&w.console, "GET", &format!("/file?message={id}&name=page.html"), &[], "").await;
    assert_ne!(anonymous.status, 200, "{anonymous:?}");
    assert!(!anonymous.body.contains("alert"), "{anonymous:?}");
}

/// The activity page shows the account's topics, whom they reach and their newest posts, as
/// text; the topic filter narrows the page to one topic's posts.
#[tokio::test]
async fn the_activity_page_shows_topics_and_their_posts() {
    let w = world(&[]).await;
    let mut bob = Agent::hello(&w.server.url, &w.laptop, "bob").await.unwrap();
    let mut amy = Agent::hello(&w.server.url, &w.ci, "amy").await.unwrap();
    amy.rpc.follow(FollowRequest { topic: "#deploys".into() }).await.unwrap();
    let hostile = "<script>alert(1)</script> deploy 7 is out";
    bob.rpc
        .publish(PublishRequest { topic: "#deploys".into(), body: hostile.into(), ..Default::default() })
        .await
        .unwrap();
    bob.send(&["ci/amy"], "a direct word").await.unwrap();
    w.server.admin_ok(&["topic", "open", "acme/#deploys"]);

    let cookie = sign_in(&w.console, &w.human).await;
    let page = get(&w.console, "/activity", &cookie).await;
    assert!(page.body.contains("data-topic=\"acme/#deploys\""), "{}", page.body);
    assert!(page.body.contains("acme/#deploys · 1 follower · open to contacts"), "{}", page.body);
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt; deploy 7 is out"), "{}", page.body);
    assert!(!page.body.contains("<script>alert(1)"), "agents' text is never markup");
    assert!(page.body.contains("a direct word"));
    let narrowed = get(&w.console, "/activity?topic=%23deploys", &cookie).await;
    assert!(narrowed.body.contains("deploy 7 is out") && !narrowed.body.contains("a direct word"), "{}", narrowed.body);
    let other = get(&w.console, "/activity?topic=%23other", &cookie).await;
    assert!(other.body.contains("No topic yet."), "{}", other.body);
}
