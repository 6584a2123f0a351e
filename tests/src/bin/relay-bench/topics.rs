//! A topic's post to a thousand followers beside a direct send, in the same run: what one post
//! costs the server and Postgres in CPU, written once and handed to each follower's push stream,
//! and how long until every follower has it; and what one direct send to one recipient costs.

use std::time::{Duration, Instant};

use relay_proto::v1::{FollowRequest, PublishRequest, Push, push};
use relay_tests::client::Agent;
use tokio::sync::mpsc;
use tonic::Streaming;

use super::{Cpu, PHASE_LIMIT, Quantiles, agents, quantiles, send_request};

/// Posts timed while no follower's stream is open: enough that the CPU clock's ticks (10 ms)
/// come to 20 µs a post.
const WRITTEN: usize = 500;
/// Posts timed with every follower's stream open (each waits for every follower before the next).
const POSTS: usize = 50;
/// Direct sends timed, each waiting for its push (50 µs a tick).
const SENDS: usize = 200;

pub struct Figures {
    pub followers: usize,
    /// Server, Postgres and benchmark µs of CPU per post while no follower's stream is open: the
    /// post written once, whoever follows.
    pub written: [f64; 3],
    /// Server, Postgres and benchmark µs of CPU per post, its pushes to every follower included.
    pub post: [f64; 3],
    /// The same for one direct send and its one push.
    pub send: [f64; 3],
    /// From the post's call to each follower's push, over every follower of every post.
    pub delivered: Quantiles,
    /// From a direct send's call to its push.
    pub direct: Quantiles,
}

/// Pushes a follower's stream received: the post's number and when.
type Received = mpsc::UnboundedSender<(u64, Instant)>;

async fn follow_stream(mut stream: Streaming<Push>, received: Received) {
    while let Ok(Some(p)) = stream.message().await {
        if let Some(push::Event::Message(m)) = p.event
            && m.topic_seq > 0
            && received.send((m.topic_seq, Instant::now())).is_err()
        {
            return;
        }
    }
}

pub async fn measure(url: &str, poster_token: &str, follower_token: &str, followers: usize, pid: u32) -> Figures {
    let mut poster = Agent::hello(url, poster_token, "topic-poster").await.expect("hello");
    let mut readers = agents(url, follower_token, "topic-f", followers).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    for chunk in readers.chunks_mut(64) {
        let follows = chunk.iter_mut().map(|a| {
            let mut rpc = a.rpc.clone();
            async move { rpc.follow(FollowRequest { topic: "#bench".into() }).await.expect("follow") }
        });
        futures_util::future::join_all(follows).await;
    }
    let publish = |poster: &mut Agent, n: usize| {
        let mut rpc = poster.rpc.clone();
        async move {
            let post =
                PublishRequest { topic: "#bench".into(), body: format!("post {n} of the bench"), ..Default::default() };
            rpc.publish(post).await.expect("publish").into_inner().seq
        }
    };
    // Written once: the followers' cursors are there, no stream is open to push to.
    let before = Cpu::now(pid);
    for n in 0..WRITTEN {
        publish(&mut poster, n).await;
    }
    let written = Cpu::now(pid).per_op(&before, WRITTEN as f64);
    // Read, so the backlog is not what is timed next.
    for chunk in readers.chunks_mut(64) {
        let reads = chunk.iter_mut().map(|a| {
            let mut rpc = a.rpc.clone();
            async move {
                loop {
                    let read = relay_proto::v1::InboxRequest { ack: true, limit: 500, ..Default::default() };
                    if rpc.inbox(read).await.expect("inbox").into_inner().remaining == 0 {
                        break;
                    }
                }
            }
        });
        futures_util::future::join_all(reads).await;
    }
    for reader in &mut readers {
        let stream = reader.subscribe(0).await;
        tokio::spawn(follow_stream(stream, tx.clone()));
    }
    drop(tx);
    // Until every follower's stream is open and has the first post.
    let deadline = Instant::now() + PHASE_LIMIT;
    let mut warm = publish(&mut poster, 0).await;
    let mut got = 0;
    while got < followers {
        let wait = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(Duration::from_secs(2).min(wait), rx.recv()).await {
            Ok(Some((seq, _))) if seq == warm => got += 1,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the followers' streams ended"),
            Err(_) if Instant::now() < deadline => {
                // A stream that opened after the post read it when it opened, or it is still
                // opening: post again and count that one.
                warm = publish(&mut poster, 0).await;
                got = 0;
            }
            Err(_) => panic!("{got} of {followers} followers had the post within {PHASE_LIMIT:?}"),
        }
    }
    while rx.try_recv().is_ok() {}

    let mut delivered = Vec::with_capacity(POSTS * followers);
    let before = Cpu::now(pid);
    for n in 1..=POSTS {
        let started = Instant::now();
        let seq = publish(&mut poster, n).await;
        let mut got = 0;
        while got < followers {
            let (at, when) = tokio::time::timeout(PHASE_LIMIT, rx.recv())
                .await
                .expect("every follower within the limit")
                .expect("streams");
            if at == seq {
                delivered.push(when - started);
                got += 1;
            }
        }
    }
    let post = Cpu::now(pid).per_op(&before, POSTS as f64);

    // A direct send to one agent whose stream is open, each waiting for its push.
    let mut one = Agent::hello(url, follower_token, "direct-recipient").await.expect("hello");
    let mut stream = one.subscribe(0).await;
    let mut direct = Vec::with_capacity(SENDS);
    let before = Cpu::now(pid);
    for n in 0..SENDS {
        let started = Instant::now();
        poster.rpc.send(send_request("ci/direct-recipient", format!("send {n} of the bench"))).await.expect("send");
        loop {
            let pushed = tokio::time::timeout(PHASE_LIMIT, super::next_message(&mut stream)).await.expect("pushed");
            if pushed.is_some() {
                break;
            }
        }
        direct.push(started.elapsed());
    }
    let send = Cpu::now(pid).per_op(&before, SENDS as f64);
    drop(readers);
    Figures { followers, written, post, send, delivered: quantiles(delivered), direct: quantiles(direct) }
}
