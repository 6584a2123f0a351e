//! gRPC clients speaking for one machine or one endpoint, as a bridge would.

use std::time::Duration;

use relay_proto::v1::relay_client::RelayClient;
use relay_proto::v1::*;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status, Streaming};

#[derive(Clone)]
pub struct Bearer(MetadataValue<Ascii>);

impl Bearer {
    pub fn new(token: &str) -> Self {
        Self(format!("Bearer {token}").parse().expect("ascii token"))
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request.metadata_mut().insert("authorization", self.0.clone());
        Ok(request)
    }
}

pub type Client = RelayClient<InterceptedService<Channel, Bearer>>;

/// A client of the worker service, with the machine's token.
pub fn worker_client(
    channel: Channel,
    token: &str,
) -> relay_proto::v1::worker_client::WorkerClient<InterceptedService<Channel, Bearer>> {
    relay_proto::v1::worker_client::WorkerClient::with_interceptor(channel, Bearer::new(token))
}

pub async fn channel(url: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect to relay-server")
}

pub fn client(channel: Channel, token: &str) -> Client {
    let value = format!("Bearer {token}").parse().expect("ascii token");
    RelayClient::with_interceptor(channel, Bearer(value))
}

/// An endpoint: its session client and what Hello said.
pub struct Agent {
    pub rpc: Client,
    pub session_token: String,
    pub address: String,
}

impl Agent {
    /// Claims `handle` (or a picked one when empty) on the machine whose token is given.
    pub async fn hello(url: &str, machine_token: &str, handle: &str) -> Result<Self, Status> {
        Self::hello_with(
            url,
            machine_token,
            HelloRequest { handle: handle.into(), harness: "claude".into(), ..Default::default() },
        )
        .await
    }

    pub async fn hello_with(url: &str, machine_token: &str, request: HelloRequest) -> Result<Self, Status> {
        Self::hello_on(channel(url).await, machine_token, request).await
    }

    /// Claims an endpoint over a connection it may share with others (a channel is one connection).
    pub async fn hello_on(ch: Channel, machine_token: &str, request: HelloRequest) -> Result<Self, Status> {
        let reply = client(ch.clone(), machine_token).hello(request).await?.into_inner();
        let address = reply.endpoint.expect("endpoint in hello").address;
        Ok(Self { rpc: client(ch, &reply.session_token), session_token: reply.session_token, address })
    }

    pub async fn send(&mut self, to: &[&str], body: &str) -> Result<SendResponse, Status> {
        let request =
            SendRequest { to: to.iter().map(|s| s.to_string()).collect(), body: body.into(), ..Default::default() };
        Ok(self.rpc.send(request).await?.into_inner())
    }

    pub async fn inbox(&mut self, wait_s: u32, ack: bool) -> Result<InboxResponse, Status> {
        Ok(self.rpc.inbox(InboxRequest { wait_s, ack, limit: 0 }).await?.into_inner())
    }

    pub async fn subscribe(&mut self, after_seq: u64) -> Streaming<Push> {
        self.rpc.subscribe(SubscribeRequest { after_seq }).await.expect("subscribe").into_inner()
    }
}

/// Waits until a new stream has pushed its backlog: its second heartbeat (the first comes as it
/// opens, the second once what waited is pushed). Panics after `limit`.
pub async fn caught_up(stream: &mut Streaming<Push>, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    for _ in 0..2 {
        heartbeat_by(stream, deadline, "the stream to catch up").await;
    }
}

/// The next heartbeat on a push stream, skipping messages; panics after `limit`.
pub async fn next_heartbeat(stream: &mut Streaming<Push>, limit: Duration) {
    heartbeat_by(stream, tokio::time::Instant::now() + limit, "a heartbeat").await;
}

async fn heartbeat_by(stream: &mut Streaming<Push>, deadline: tokio::time::Instant, awaited: &str) {
    while !matches!(next_push(stream, deadline, awaited).await, Some(push::Event::Heartbeat(_))) {}
}

/// The next message on a push stream, skipping heartbeats; panics after `limit`.
pub async fn next_message(stream: &mut Streaming<Push>, limit: Duration) -> Message {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(push::Event::Message(message)) = next_push(stream, deadline, "a pushed message").await {
            return message;
        }
    }
}

/// The next event on a push stream; panics at `deadline`, naming what was awaited.
async fn next_push(stream: &mut Streaming<Push>, deadline: tokio::time::Instant, awaited: &str) -> Option<push::Event> {
    tokio::time::timeout_at(deadline, stream.message())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {awaited}"))
        .expect("push stream failed")
        .expect("push stream ended")
        .event
}
