//! The messaging tools: each reads its arguments, makes one or two server calls, and words the result.

use std::time::Duration;

use rand::Rng;
use relay_proto::timing::Backoff;
use relay_proto::v1::*;
use serde_json::{Map, Value};

use super::args::{ArgError, Flag, parse};
use super::input::{self, text};
use super::output::{self, state_name};
use super::{NOTE_CHARS, Outcome, TITLE_CHARS, ToolError, Tools};
use crate::frame;
use crate::relay::RelayError;

type Result<T> = std::result::Result<T, ToolError>;

pub async fn call(tools: &Tools, name: &str, arguments: &Map<String, Value>) -> Result<Outcome> {
    match name {
        "relay_whoami" => whoami(tools, parse(arguments)?).await,
        "relay_list" => list(tools, parse(arguments)?).await,
        "relay_send" => send(tools, parse(arguments)?).await,
        "relay_reply" => reply(tools, parse(arguments)?).await,
        "relay_inbox" => inbox(tools, parse(arguments)?).await,
        "relay_ask" => ask(tools, parse(arguments)?).await,
        "relay_ask_wait" => ask_wait(tools, parse(arguments)?).await,
        "relay_set_status" => set_status(tools, parse(arguments)?).await,
        "relay_set_now" => set_now(tools, parse(arguments)?).await,
        "relay_set_title" => set_title(tools, parse(arguments)?).await,
        "relay_search" => search(tools, parse(arguments)?).await,
        "relay_fetch" => super::files::fetch(tools, parse(arguments)?).await,
        "relay_subscribe" => subscribe(tools, parse(arguments)?).await,
        "relay_unsubscribe" => unsubscribe(tools, parse(arguments)?).await,
        "relay_publish" => {
            let args: input::Publish = parse(arguments)?;
            publish(tools, args.topic.0, args.body.0, String::new()).await
        }
        "relay_rules" | "relay_group" | "relay_peers" => super::scope::call(tools, name, arguments).await,
        "relay_claim" | "relay_release" | "relay_claims" => super::claims::call(tools, name, arguments).await,
        "relay_peek" | "relay_set_peek" => super::peek::call(tools, name, arguments).await,
        "post_job" | "list_jobs" | "read_job" | "edit_job" | "finish_job" | "close_job" | "add_repo"
        | "answer_permission" | "relay_permission" => super::board::call(tools, name, arguments).await,
        other => Err(ToolError::Refused(format!("no tool {other}"))),
    }
}

/// A fresh idempotency key: a retried call after a lost answer returns the first result.
pub(super) fn client_id() -> String {
    let bytes: [u8; 12] = rand::rng().random();
    format!("b_{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// How long a send whose answer was lost is tried again, with its id, before the model is told.
const PATIENCE: Duration = Duration::from_secs(60);
/// How soon such a send is tried again.
const RETRYING: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(8));

/// Makes a send (or a reply) with the client id `what` was given before, when an earlier call of
/// the same send never learned its outcome. Once its outcome is in doubt (a request that left and
/// got no answer, now or in that earlier call) it is tried again with that id until the server
/// answers or [`PATIENCE`] runs out: so a lost answer makes no second copy, whether the bridge
/// retries or the model sends again. A send that never left (the server cannot be reached) is in
/// no doubt, and says so at once.
async fn send_once<Req, F, Fut>(
    tools: &Tools,
    what: &str,
    mut request: Req,
    set_id: impl Fn(&mut Req, String),
    call: F,
) -> Result<SendResponse>
where
    Req: Clone,
    F: Fn(crate::relay::session::Client, tonic::Request<Req>) -> Fut + Clone,
    Fut: Future<Output = std::result::Result<tonic::Response<SendResponse>, tonic::Status>>,
{
    let key = Tools::send_key(what);
    let (id, mut in_doubt) = tools.client_id_for(key).await;
    set_id(&mut request, id);
    let started = tokio::time::Instant::now();
    let mut backoff = RETRYING;
    loop {
        let retry = backoff.next_wait();
        // Once: a lost answer comes back as such (not as "unreachable"), and this loop retries.
        match tools.relay().call_once(Duration::ZERO, request.clone(), call.clone()).await {
            Ok(sent) => {
                tools.settled(key).await;
                return Ok(sent);
            }
            Err(err @ (RelayError::Unreachable(_) | RelayError::Unanswered(_))) => {
                in_doubt |= matches!(err, RelayError::Unanswered(_));
                if !in_doubt {
                    tools.settled(key).await;
                    return Err(err.into());
                }
                if started.elapsed() + retry > PATIENCE {
                    return Err(ToolError::Undetermined(err.to_string()));
                }
                tracing::info!(error = %err, retry_ms = retry.as_millis() as u64, "send not answered; trying it again with its id");
            }
            Err(err) => {
                tools.settled(key).await;
                return Err(err.into());
            }
        }
        tokio::time::sleep(retry).await;
    }
}

fn recipients_text(recipients: &[RecipientState]) -> String {
    recipients
        .iter()
        .map(|r| {
            if !r.reason.is_empty() {
                format!("{} ({}: {})", r.address, state_name(r.state()), r.reason)
            } else if r.online && r.state() == DeliveryState::Queued {
                // Queued for an online recipient means on its way, not waiting for it to connect.
                format!("{} (queued, online: being pushed)", r.address)
            } else {
                format!("{} ({})", r.address, state_name(r.state()))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Tells the sender what the server took out of its body.
fn redaction_note(redactions: &[Redaction]) -> Option<String> {
    if redactions.is_empty() {
        return None;
    }
    let total: u32 = redactions.iter().map(|r| r.count).sum();
    let kinds: Vec<String> = redactions.iter().map(|r| format!("{} {}", r.count, r.kind)).collect();
    Some(format!(
        "Redacted {total} credential span{} before delivery ({}): never put credentials in a message, send a reference instead.",
        if total == 1 { "" } else { "s" },
        kinds.join(", ")
    ))
}

/// What the sender should know beyond the ids: redactions, skipped group members, offline recipients.
fn sender_advice(outcome: Outcome, sent: &SendResponse) -> Outcome {
    let mut outcome = outcome;
    if let Some(note) = redaction_note(&sent.redactions) {
        outcome = outcome.then(note);
    }
    if !sent.skipped.is_empty() {
        let skipped: Vec<String> = sent.skipped.iter().map(|s| format!("{}: {}", s.address, s.reason)).collect();
        outcome = outcome.then(format!("Not sent to these group members (not allowed): {}.", skipped.join("; ")));
    }
    match offline_note(&sent.recipients) {
        Some(note) => outcome.then(note),
        None => outcome,
    }
}

fn endpoint_line(e: &Endpoint, me: &str) -> String {
    let presence = if e.ended {
        "ended"
    } else if e.online {
        "online"
    } else {
        "offline"
    };
    let mut parts = vec![if e.address == me { format!("{} (you)", e.address) } else { e.address.clone() }];
    parts.push(e.harness.clone());
    parts.push(presence.to_owned());
    parts.push(if e.note.is_empty() { e.status.clone() } else { format!("{} {}", e.status, frame::quote(&e.note)) });
    if !e.title.is_empty() {
        parts.push(format!("title {}", frame::quote(&e.title)));
    }
    if !e.now.is_empty() {
        parts.push(format!("now {}", frame::quote(&e.now)));
    }
    parts.join("  ")
}

fn check_chars(what: &str, value: &str, max: usize) -> std::result::Result<(), ArgError> {
    if value.chars().count() > max {
        return Err(ArgError(format!("{what} is longer than {max} characters")));
    }
    Ok(())
}

async fn whoami(tools: &Tools, _: input::Whoami) -> Result<Outcome> {
    let reply =
        tools.relay().call(Duration::ZERO, WhoAmIRequest {}, |mut c, r| async move { c.who_am_i(r).await }).await?;
    let e = reply.endpoint.unwrap_or_default();
    tools.observe(&e);
    let mut text = format!(
        "address: {}\nharness: {}\nstatus: {}{}\ntitle: {}\nunread: {}",
        e.address,
        e.harness,
        e.status,
        if e.note.is_empty() { String::new() } else { format!(" {}", frame::quote(&e.note)) },
        if e.title.is_empty() { "none".to_owned() } else { frame::quote(&e.title) },
        reply.unread
    );
    if !e.now.is_empty() {
        text.push_str(&format!("\nnow: {}", frame::quote(&e.now)));
    }
    let data = output::Whoami::new(&e, reply.unread);
    if !data.role.is_empty() {
        text.push_str(&format!("\nrole: {}", data.role));
    }
    let outcome = Outcome::data(text, &data);
    // A title or note may be left from an earlier holder of the handle: shown as data.
    Ok(if e.note.is_empty() && e.title.is_empty() && e.now.is_empty() { outcome } else { outcome.untrusted() })
}

async fn list(tools: &Tools, args: input::List) -> Result<Outcome> {
    let request = ListRequest { all: Flag::or(args.all, false), contacts: Flag::or(args.contacts, false) };
    let me = tools.relay().session().await?.endpoint.address;
    let reply = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.list(r).await }).await?;
    if reply.endpoints.is_empty() {
        let text = if request.contacts {
            "no agents of contact accounts (an account's human or operator adds contacts)"
        } else if request.all {
            "no agents in your account"
        } else {
            "no other agents online (all: true includes offline ones)"
        };
        return Ok(Outcome::text(text));
    }
    let lines: Vec<String> = reply.endpoints.iter().map(|e| endpoint_line(e, &me)).collect();
    let n = lines.len();
    let text = format!(
        "{n} agent{} (quoted titles and notes are written by the agents themselves):\n{}",
        if n == 1 { "" } else { "s" },
        lines.join("\n")
    );
    let outcome = Outcome::text(text);
    let foreign = reply.endpoints.iter().any(|e| !e.title.is_empty() || !e.note.is_empty() || !e.now.is_empty());
    Ok(if foreign { outcome.untrusted() } else { outcome })
}

fn sent_data(sent: &SendResponse) -> output::Sent {
    output::Sent {
        id: sent.id.clone(),
        thread: sent.thread.clone(),
        recipients: output::recipients(&sent.recipients),
        reply_to: sent.reply_to.clone(),
        hold: sent.hold.clone(),
        redacted: output::redacted(&sent.redactions),
        skipped: output::recipients(&sent.skipped),
        files: Vec::new(),
    }
}

/// Advice for a sender whose recipients are not online to take it now.
fn offline_note(recipients: &[RecipientState]) -> Option<String> {
    let offline: Vec<&str> = recipients
        .iter()
        .filter(|r| r.state() == DeliveryState::Queued && !r.reason.is_empty())
        .map(|r| r.address.as_str())
        .collect();
    (!offline.is_empty()).then(|| {
        format!(
            "{} will get it when {} next connects.",
            offline.join(", "),
            if offline.len() == 1 { "it" } else { "they" }
        )
    })
}

async fn send(tools: &Tools, args: input::Send) -> Result<Outcome> {
    let to = args.to.0;
    let body = args.body.0;
    let thread = text(args.thread).trim().to_owned();
    let private = Flag::or(args.private, false);
    // A topic is posted to, alone: its followers are not addresses.
    if let Some(topic) = to.iter().find(|a| is_topic(a)) {
        if to.len() > 1 || private || args.attach.is_some() {
            return Err(ArgError(format!(
                "{topic} is a topic: send to it alone, without private or attach (or use relay_publish)"
            ))
            .into());
        }
        return publish(tools, topic.clone(), body, thread).await;
    }
    // Files are read before anything leaves: one that cannot be read refuses the send whole.
    let files = args.attach.map(|a| super::files::read_all(tools, a)).transpose()?.unwrap_or_default();
    let shas: Vec<&str> = files.iter().map(|f| f.sha256.as_str()).collect();
    let what = format!("send\0{to:?}\0{thread}\0{private}\0{body}\0{shas:?}");
    let (attach, stored) = super::files::upload_all(tools, files).await?;
    let request = SendRequest {
        attach,
        to,
        body,
        thread,
        kind: MessageKind::Message as i32,
        client_id: String::new(),
        private,
        require_reply: false,
    };
    let sent =
        send_once(tools, &what, request, |r, id| r.client_id = id, |mut c, r| async move { c.send(r).await }).await?;
    let carried = files_text(&stored);
    let data = output::Sent { files: stored, ..sent_data(&sent) };
    if !sent.hold.is_empty() {
        let text = format!(
            "held {} (id {}){carried} for your account's human to review (hold {})",
            frame::short(&sent.id),
            sent.id,
            sent.hold
        );
        let outcome = Outcome::data(text, &data).then(
            "Nobody has it yet; you will get a message from your account's human when it is released or rejected.",
        );
        return Ok(sender_advice(outcome, &sent));
    }
    let text = format!(
        "sent {} (id {}, thread {}){carried} to {}",
        frame::short(&sent.id),
        sent.id,
        sent.thread,
        recipients_text(&sent.recipients)
    );
    Ok(sender_advice(Outcome::data(text, &data), &sent))
}

/// Whether an address names a topic: `#name` or `account/#name`.
fn is_topic(address: &str) -> bool {
    let address = address.trim();
    address.starts_with('#') || address.split_once('/').is_some_and(|(_, rest)| rest.starts_with('#'))
}

async fn subscribe(tools: &Tools, args: input::Subscribe) -> Result<Outcome> {
    let request = FollowRequest { topic: args.topic.0.trim().to_owned() };
    let followed = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.follow(r).await }).await?;
    let text = if followed.already {
        format!("you follow {} already", followed.topic)
    } else {
        format!("following {}", followed.topic)
    };
    // Advice goes in `next`, which the structured part carries too (a client may read only it).
    let advice = match followed.backlog {
        0 => "Its new posts come with your mail (relay_inbox).".to_owned(),
        n => format!(
            "Its {n} recent post{} and new ones come with your mail (relay_inbox).",
            if n == 1 { "" } else { "s" }
        ),
    };
    let data = output::Followed { topic: followed.topic, backlog: followed.backlog, already: followed.already };
    Ok(Outcome::data(text, &data).then(advice))
}

async fn unsubscribe(tools: &Tools, args: input::Unsubscribe) -> Result<Outcome> {
    let request = UnfollowRequest { topic: args.topic.0.trim().to_owned() };
    let done = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.unfollow(r).await }).await?;
    tools.forget_topic(&done.topic).await;
    let text = if done.followed {
        format!("no longer following {}", done.topic)
    } else {
        format!("you did not follow {}", done.topic)
    };
    Ok(Outcome::data(text, &output::Unfollowed { topic: done.topic, followed: done.followed }))
}

/// Posts `body` to `topic`, with an id kept for a retry as sends keep theirs.
async fn publish(tools: &Tools, topic: String, body: String, thread: String) -> Result<Outcome> {
    let topic = topic.trim().to_owned();
    let what = format!("publish\0{topic}\0{thread}\0{body}");
    let request = PublishRequest { topic, body, thread, client_id: String::new() };
    let key = Tools::send_key(&what);
    let (id, _) = tools.client_id_for(key).await;
    let request = PublishRequest { client_id: id, ..request };
    let posted = tools.relay().call_once(Duration::ZERO, request, |mut c, r| async move { c.publish(r).await }).await;
    let posted = match posted {
        Ok(p) => {
            tools.settled(key).await;
            p
        }
        Err(err) => {
            if !matches!(err, RelayError::Unanswered(_)) {
                tools.settled(key).await;
            }
            return Err(err.into());
        }
    };
    let data = output::Posted {
        id: posted.id.clone(),
        topic: posted.topic.clone(),
        seq: posted.seq,
        thread: posted.thread.clone(),
        followers: posted.followers,
        redacted: output::redacted(&posted.redactions),
    };
    let followers = match posted.followers {
        0 => "nobody follows it yet".to_owned(),
        1 => "1 agent follows it".to_owned(),
        n => format!("{n} agents follow it"),
    };
    let text = if posted.duplicate {
        format!("posted {} (id {}) to {} before; not again", frame::short(&posted.id), posted.id, posted.topic)
    } else {
        format!(
            "posted {} (id {}, thread {}) to {} as post {}: {followers}",
            frame::short(&posted.id),
            posted.id,
            posted.thread,
            posted.topic,
            posted.seq
        )
    };
    let outcome = Outcome::data(text, &data);
    Ok(match redaction_note(&posted.redactions) {
        Some(note) => outcome.then(note),
        None => outcome,
    })
}

/// The files a send carried, as the server stored them; empty for none.
fn files_text(files: &[output::FileOut]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let each: Vec<String> = files
        .iter()
        .map(|f| {
            let redacted = match f.redacted {
                0 => String::new(),
                n => format!(", {n} credential span{} redacted", if n == 1 { "" } else { "s" }),
            };
            let kind = if f.binary { "binary" } else { "text" };
            format!("{} ({}, {kind}{redacted})", frame::quote(&f.name), frame::bytes_text(f.size))
        })
        .collect();
    format!(" with {}", each.join(", "))
}

async fn reply(tools: &Tools, args: input::Reply) -> Result<Outcome> {
    let request = ReplyRequest { id: args.id.0.trim().to_owned(), body: args.body.0, client_id: String::new() };
    let what = format!("reply\0{}\0{}", request.id, request.body);
    let sent =
        send_once(tools, &what, request, |r, id| r.client_id = id, |mut c, r| async move { c.reply(r).await }).await?;
    tools.mark_seen_id(&sent.reply_to).await;
    let text = format!(
        "replied {} (id {}) to {}, answering {} in thread {}",
        frame::short(&sent.id),
        sent.id,
        recipients_text(&sent.recipients),
        frame::short(&sent.reply_to),
        sent.thread,
    );
    Ok(sender_advice(Outcome::data(text, &sent_data(&sent)), &sent))
}

async fn search(tools: &Tools, args: input::Search) -> Result<Outcome> {
    let given = |v: Option<super::args::NonBlank>| v.map(|v| v.0).unwrap_or_default();
    let query = args.query.0;
    let request = SearchRequest {
        query: query.clone(),
        from: given(args.from),
        to: given(args.to),
        thread: given(args.thread),
        since: given(args.since),
        limit: args.limit.map_or(0, |l| l.0),
    };
    let reply = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.search(r).await }).await?;
    let data = output::Found { found: reply.found.iter().map(output::FoundOut::from).collect() };
    if reply.found.is_empty() {
        let text = format!("nothing you may read holds {}", frame::quote(&query));
        return Ok(Outcome::data(text, &data).then("A message is found shortly after it is delivered."));
    }
    let text = reply.found.iter().map(frame::found).collect::<Vec<_>>().join("\n\n");
    Ok(Outcome::data(text, &data).untrusted())
}

async fn inbox(tools: &Tools, args: input::Inbox) -> Result<Outcome> {
    let wait_s = args.wait_s.0;
    let ack = Flag::or(args.ack, true);
    let request = InboxRequest { wait_s, ack, limit: 0 };
    let reply = tools
        .relay()
        .call_once(Duration::from_secs(wait_s.into()), request, |mut c, r| async move { c.inbox(r).await })
        .await?;
    if ack {
        tools.mark_seen(reply.messages.iter().filter(|m| m.topic.is_empty()).map(|m| m.seq)).await;
        tools
            .mark_posts_seen(
                reply.messages.iter().filter(|m| !m.topic.is_empty()).map(|m| (m.topic.clone(), m.topic_seq)),
            )
            .await;
    }
    let data = output::Inbox {
        messages: reply.messages.iter().map(output::MessageOut::from).collect(),
        remaining: reply.remaining,
    };
    if reply.messages.is_empty() {
        let text =
            if wait_s > 0 { format!("no unread messages (waited {wait_s} s)") } else { "no unread messages".into() };
        return Ok(Outcome::data(text, &data));
    }
    let mut outcome = Outcome::data(frame::messages(&reply.messages), &data).untrusted();
    for line in reply.messages.iter().filter_map(frame::reply_required) {
        outcome = outcome.then(line);
    }
    if reply.messages.iter().any(|m| m.topic.is_empty()) {
        outcome = outcome.then("Answer one with relay_reply and its short id.");
    }
    if reply.messages.iter().any(|m| !m.topic.is_empty()) {
        outcome = outcome.then("Answer a post in its topic (relay_publish) or to its author (relay_send).");
    }
    if reply.messages.iter().any(|m| !m.attachments.is_empty()) {
        outcome = outcome.then("Save a message's file with relay_fetch {message, name}.");
    }
    if reply.remaining > 0 {
        outcome = outcome.then(format!("{} more unread: call relay_inbox again.", reply.remaining));
    }
    if !ack {
        outcome = outcome.then("These stay unread until acknowledged.");
    }
    Ok(outcome)
}

async fn ask(tools: &Tools, args: input::Ask) -> Result<Outcome> {
    let to = args.to.0.trim().to_owned();
    let body = args.body.0;
    let wait_s = args.wait_s.0;
    let require_reply = Flag::or(args.require_reply, false);
    let what = format!("ask\0{to}\0{require_reply}\0{body}");
    let request = SendRequest {
        attach: Vec::new(),
        require_reply,
        private: false,
        to: vec![to],
        body,
        thread: String::new(),
        kind: MessageKind::Ask as i32,
        client_id: String::new(),
    };
    let sent =
        send_once(tools, &what, request, |r, id| r.client_id = id, |mut c, r| async move { c.send(r).await }).await?;
    match wait_for_replies(tools, sent.id.clone(), &sent.thread, wait_s).await {
        Ok(outcome) => Ok(outcome),
        // The request went out: the model needs its id to keep waiting, not a failure that invites a second ask.
        Err(err) => {
            let data = output::Replies {
                id: sent.id.clone(),
                thread: sent.thread.clone(),
                recipients: output::recipients(&sent.recipients),
                replies: Vec::new(),
            };
            let text =
                format!("asked {} (id {}), but waiting for the reply failed: {err}", frame::short(&sent.id), sent.id);
            Ok(Outcome::data(text, &data).then(format!("Keep waiting with relay_ask_wait and id {}.", sent.id)))
        }
    }
}

async fn ask_wait(tools: &Tools, args: input::AskWait) -> Result<Outcome> {
    wait_for_replies(tools, args.id.0.trim().to_owned(), "", args.wait_s.0).await
}

async fn wait_for_replies(tools: &Tools, id: String, thread: &str, wait_s: u32) -> Result<Outcome> {
    let request = AskWaitRequest { id, wait_s };
    let reply = tools
        .relay()
        .call_once(Duration::from_secs(wait_s.into()), request, |mut c, r| async move { c.ask_wait(r).await })
        .await?;
    tools.mark_seen(reply.replies.iter().map(|m| m.seq)).await;
    let data = output::Replies {
        id: reply.id.clone(),
        thread: thread.to_owned(),
        recipients: output::recipients(&reply.recipients),
        replies: reply.replies.iter().map(output::MessageOut::from).collect(),
    };
    if reply.replies.is_empty() {
        let text =
            format!("no reply yet to {} (delivery: {})", frame::short(&reply.id), recipients_text(&reply.recipients));
        let mut outcome =
            Outcome::data(text, &data).then(format!("Keep waiting with relay_ask_wait and id {}.", reply.id));
        if let Some(note) = offline_note(&reply.recipients) {
            outcome = outcome.then(note);
        }
        return Ok(outcome);
    }
    let mut outcome = Outcome::data(frame::messages(&reply.replies), &data).untrusted();
    for line in reply.replies.iter().filter_map(frame::reply_required) {
        outcome = outcome.then(line);
    }
    Ok(outcome)
}

async fn update(tools: &Tools, request: UpdateProfileRequest) -> Result<Endpoint> {
    Ok(tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.update_profile(r).await }).await?)
}

async fn set_status(tools: &Tools, args: input::SetStatus) -> Result<Outcome> {
    let state = args.state.as_str();
    let note = text(args.note);
    check_chars("note", &note, NOTE_CHARS)?;
    let e = update(tools, UpdateProfileRequest { status: Some(state.into()), note: Some(note), ..Default::default() })
        .await?;
    let note = if e.note.is_empty() { String::new() } else { format!(" {}", frame::quote(&e.note)) };
    Ok(Outcome::text(format!("{}: {}{note}", e.address, e.status)))
}

async fn set_now(tools: &Tools, args: input::SetNow) -> Result<Outcome> {
    let now = args.now.0;
    check_chars("now", &now, NOTE_CHARS)?;
    let e = update(tools, UpdateProfileRequest { now: Some(now), ..Default::default() }).await?;
    Ok(Outcome::text(if e.now.is_empty() {
        format!("{}: now cleared", e.address)
    } else {
        format!("{}: now {}", e.address, frame::quote(&e.now))
    }))
}

async fn set_title(tools: &Tools, args: input::SetTitle) -> Result<Outcome> {
    let title = args.title.0;
    check_chars("title", &title, TITLE_CHARS)?;
    let e = update(tools, UpdateProfileRequest { title: Some(title), ..Default::default() }).await?;
    Ok(Outcome::text(if e.title.is_empty() {
        format!("{}: title cleared", e.address)
    } else {
        format!("{}: title {}", e.address, frame::quote(&e.title))
    }))
}
