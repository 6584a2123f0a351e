//! Everything agents and people write is stored redacted, not only message bodies: a card's review
//! note, a worker's error and agent state, a summary, a permission request and its answer, a hold's
//! reason, an agent's profile; a credential wrapped in escapes or split by invisible characters
//! too. Identifiers kept as written (a repository path, a branch or worktree, a client id, a thread
//! id) are refused when they hold one. Each is read back through the API, and no table holds the
//! secret.

use std::time::Duration;

use relay_proto::v1::human_client::HumanClient;
use relay_proto::v1::worker_client::WorkerClient;
use relay_proto::v1::*;
use relay_tests::client::{Agent, Bearer, channel};
use relay_tests::eventually;
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// A distinct GitHub token for each field, so a leak names its path. None of them is live.
fn secret(n: u32) -> String {
    format!("ghp_aB3dE5fG7hJ9kL2mN4pQ6rS8tU0vW1xY{n:04}")
}

const MARKER: &str = "[REDACTED:github-pat]";

fn redacted(text: &str, n: u32) {
    assert!(text.contains(MARKER) && !text.contains(&secret(n)), "secret {n} is not redacted in {text:?}");
}

fn worker(ch: Channel, token: &str) -> WorkerClient<InterceptedService<Channel, Bearer>> {
    WorkerClient::with_interceptor(ch, Bearer::new(token))
}

fn human(ch: Channel, token: &str) -> HumanClient<InterceptedService<Channel, Bearer>> {
    HumanClient::with_interceptor(ch, Bearer::new(token))
}

#[tokio::test]
async fn agent_written_text_is_stored_redacted() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let laptop = server.machine("acme", "laptop");
    let ci = server.machine("acme", "ci");
    server.admin_ok(&["operator", "acme", "laptop/alice"]);
    let person = server.admin_ok(&["human", "add", "acme"]);
    let ch = channel(&server.url).await;
    let mut w = worker(ch.clone(), &ci);
    w.register_repo(RegisterRepoRequest { path: "/srv/app".into() }).await.unwrap();
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &ci, "bob").await.unwrap();

    let post = PostJobRequest {
        title: "rotate the deploy key".into(),
        detail: "see the runbook".into(),
        repo: "app".into(),
        requires_pr: Some(false),
        ..Default::default()
    };
    let id = alice.rpc.post_job(post).await.unwrap().into_inner().id;
    let read = |mut agent: relay_tests::client::Client, id: String| async move {
        agent.read_job(ReadJobRequest { id }).await.unwrap().into_inner()
    };

    // A worker's agent state and its error when the agent ends.
    let claimed = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.expect("the card is claimed");
    let renew = RenewRequest {
        job_token: claimed.job_token.clone(),
        agent_state: format!("waiting: GH_TOKEN={}", secret(1)),
        ..Default::default()
    };
    assert!(w.renew(renew).await.unwrap().into_inner().in_progress);
    redacted(&read(alice.rpc.clone(), id.clone()).await.agent_state, 1);
    let release = ReleaseRequest {
        job_token: claimed.job_token,
        exit_code: 1,
        error: format!("git push: authentication failed for {}", secret(2)),
    };
    let back = w.release(release).await.unwrap().into_inner();
    assert_eq!(back.state, "todo");
    redacted(&back.last_error, 2);
    redacted(&read(alice.rpc.clone(), id.clone()).await.last_error, 2);

    // The agent's summary, and the operator's note when it sends the card back.
    let claimed = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.expect("claimed again");
    let finish = FinishJobRequest {
        job_token: claimed.job_token,
        pr_url: String::new(),
        summary: format!("used {}", secret(3)),
    };
    let review = bob.rpc.finish_job(finish).await.unwrap().into_inner();
    assert_eq!(review.state, "review");
    redacted(&review.summary, 3);
    let close = CloseJobRequest { id: id.clone(), accept: false, note: format!("never commit {}", secret(4)) };
    let sent_back = alice.rpc.close_job(close).await.unwrap().into_inner();
    assert_eq!(sent_back.state, "todo");
    redacted(&sent_back.detail, 4);

    // A permission request's input, and the operator's reason for its answer.
    let claimed = w.claim(ClaimRequest::default()).await.unwrap().into_inner().claimed.expect("claimed a third time");
    let job_token = claimed.job_token;
    let ask = PermissionRequest {
        job_token: job_token.clone(),
        tool: "Bash".into(),
        input: format!("curl -u me:{} https://api.example.com", secret(5)),
    };
    let mut asker = bob.rpc.clone();
    let asking = tokio::spawn(async move { asker.request_permission(ask).await.map(|r| r.into_inner()) });
    let sql = db.sql().await;
    let approval: String = eventually(Duration::from_secs(10), "the permission request to be recorded", || async {
        sql.query_opt("select id from approvals", &[]).await.unwrap().map(|r| r.get(0))
    })
    .await;
    // Alice's inbox also holds the board's notices, which quote the error and the summary.
    let inbox = alice.inbox(10, true).await.unwrap().messages;
    assert!(inbox.iter().all(|m| !m.body.contains("ghp_")), "{inbox:?}");
    let question = inbox.iter().find(|m| m.body.starts_with("[Approval")).expect("the operator is asked");
    redacted(&question.body, 5);
    let answer = AnswerPermissionRequest {
        id: approval,
        decision: "deny".into(),
        reason: format!("do not paste {}", secret(6)),
    };
    redacted(&alice.rpc.answer_permission(answer).await.unwrap().into_inner().reason, 6);
    let decided = tokio::time::timeout(Duration::from_secs(10), asking).await.unwrap().unwrap().unwrap();
    assert_eq!(decided.state, "deny");
    redacted(&decided.reason, 6);

    // A hold the account's human rejects, with a reason the sender reads.
    server.admin_ok(&["account", "create", "globex"]);
    let globex = server.admin_ok(&["machine", "add", "globex/box"]);
    server.admin_ok(&["contact", "add", "acme", "globex"]);
    let _carol = Agent::hello(&server.url, &globex, "carol").await.unwrap();
    let mut person = human(ch, &person);
    person.hold_policy(HoldPolicyRequest { class: "contact".into(), on: true }).await.unwrap();
    let held = alice.send(&["globex/box/carol"], "the report is ready").await.unwrap();
    assert!(!held.hold.is_empty(), "a message to a contact is held");
    let decide = DecideHoldRequest { id: held.hold, release: false, reason: format!("it quoted {}", secret(7)) };
    let view = person.decide_hold(decide).await.unwrap().into_inner();
    assert_eq!(view.state, "rejected");
    redacted(&view.reason, 7);
    let told = alice.inbox(10, true).await.unwrap().messages;
    assert!(told.iter().any(|m| m.body.contains("rejected")), "{told:?}");
    for m in &told {
        redacted(&m.body, 7);
    }

    // What an agent shows of itself: its note, what it is doing now, its title.
    let profile = UpdateProfileRequest {
        note: Some(format!("deploys with {}", secret(10))),
        now: Some(format!("testing {}", secret(10))),
        title: Some(format!("holder of {}", secret(10))),
        ..Default::default()
    };
    let me = alice.rpc.update_profile(profile).await.unwrap().into_inner();
    for text in [&me.note, &me.now, &me.title] {
        redacted(text, 10);
    }

    // A credential wrapped to slip past: URL-encoded, escaped in a JSON string, split by a
    // zero-width space. Each arrives as a marker, and the text around it as written.
    let token = secret(11);
    let wrapped = [
        token.replacen('_', "%5F", 1),
        token.replacen('_', r"\u005f", 1),
        format!("{}\u{200B}{}", &token[..10], &token[10..]),
    ];
    for text in &wrapped {
        alice.send(&["ci/bob"], &format!("try {text} now")).await.unwrap();
    }
    let got = bob.inbox(10, true).await.unwrap().messages;
    let bodies: Vec<&str> = got.iter().map(|m| m.body.as_str()).filter(|b| b.starts_with("try ")).collect();
    assert_eq!(bodies, vec!["try [REDACTED:github-pat] now"; 3], "{got:?}");

    // Identifiers kept as written are refused when they hold a token (each fits its field's
    // characters): a repository path, a branch, a client id, a thread id.
    let refused = alice.rpc.add_repo(AddRepoRequest { path: format!("/srv/{}/app", secret(8)) }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("a repository path must not contain a credential"), "{refused:?}");
    let renew = RenewRequest { job_token, branch: secret(12), ..Default::default() };
    let refused = w.renew(renew).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("a branch name must not contain a credential"), "{refused:?}");
    let request =
        SendRequest { to: vec!["ci/bob".into()], body: "hello".into(), client_id: secret(13), ..Default::default() };
    let refused = alice.rpc.send(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("a client id must not contain a credential"), "{refused:?}");
    assert!(!refused.message().contains(&secret(13)), "the refusal does not repeat it: {refused:?}");
    let request = SendRequest {
        to: vec!["ci/bob".into()],
        body: "about the key".into(),
        thread: secret(9),
        ..Default::default()
    };
    let refused = alice.rpc.send(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("a thread id must not contain a credential"), "{refused:?}");
    assert!(!refused.message().contains(&secret(9)), "the refusal does not repeat it: {refused:?}");

    // Nothing anyone wrote above reached a table unredacted. (`strpos`, not `like`: in a pattern
    // `_` stands for any character, and a random id holding "ghp" then matched.)
    for table in ["jobs", "approvals", "holds", "messages", "endpoints", "repos"] {
        let leaked: Vec<String> = sql
            .query(&format!("select t::text from {table} t where strpos(t::text, 'ghp_') > 0"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(leaked.is_empty(), "{table} holds a secret: {leaked:?}");
    }
}
