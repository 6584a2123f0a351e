//! A stand-in `relay.v1.Relay` server of another release: it answers `CheckMachine` and `Hello`
//! as a real server of `version` would (taking a bridge within its release window, refusing one
//! outside it in the same words; nothing else), so a test can show the real bridge a server of a
//! release its own cannot work with.

use std::convert::Infallible;
use std::future::Ready;

use relay_proto::v1::{CheckMachineRequest, CheckMachineResponse, Endpoint, HelloRequest, HelloResponse};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// Serves as a server of `version` on a loopback port; its URL.
pub async fn serve(version: &str) -> String {
    serve_with_clock(version, 0).await
}

/// [`serve`], with a clock `ahead_ms` ahead of this machine's (behind when negative).
pub async fn serve_with_clock(version: &str, ahead_ms: i64) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the stand-in server");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = FakeRelay { version: version.to_owned(), ahead_ms };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    url
}

#[derive(Clone)]
struct FakeRelay {
    version: String,
    ahead_ms: i64,
}

impl NamedService for FakeRelay {
    const NAME: &'static str = "relay.v1.Relay";
}

struct CheckMachine(String, i64);

impl UnaryService<CheckMachineRequest> for CheckMachine {
    type Response = CheckMachineResponse;
    type Future = Ready<Result<Response<CheckMachineResponse>, Status>>;

    fn call(&mut self, request: Request<CheckMachineRequest>) -> Self::Future {
        if let Err(refused) = window(&request.get_ref().client_version, &self.0) {
            return std::future::ready(Err(refused));
        }
        std::future::ready(Ok(Response::new(CheckMachineResponse {
            account: "acme".into(),
            machine: "laptop".into(),
            server_version: self.0.clone(),
            server_time_ms: now_ms() + self.1,
        })))
    }
}

struct Hello(String);

impl UnaryService<HelloRequest> for Hello {
    type Response = HelloResponse;
    type Future = Ready<Result<Response<HelloResponse>, Status>>;

    fn call(&mut self, request: Request<HelloRequest>) -> Self::Future {
        let request = request.into_inner();
        if let Err(refused) = window(&request.client_version, &self.0) {
            return std::future::ready(Err(refused));
        }
        let handle = request.handle;
        let endpoint = Endpoint { address: format!("acme/laptop/{handle}"), handle, ..Default::default() };
        std::future::ready(Ok(Response::new(HelloResponse {
            endpoint: Some(endpoint),
            session_token: "rls_standin".into(),
            server_version: self.0.clone(),
            ..Default::default()
        })))
    }
}

/// What a server of `server`'s release says of a bridge of `bridge`'s.
fn window(bridge: &str, server: &str) -> Result<(), Status> {
    relay_proto::release::check(bridge, server).map_err(|mismatch| Status::failed_precondition(mismatch.to_string()))
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    since.as_millis() as i64
}

impl Service<http::Request<Body>> for FakeRelay {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (version, ahead_ms) = (self.version.clone(), self.ahead_ms);
        Box::pin(async move {
            Ok(match request.uri().path() {
                "/relay.v1.Relay/CheckMachine" => {
                    Grpc::new(ProstCodec::default()).unary(CheckMachine(version, ahead_ms), request).await
                }
                "/relay.v1.Relay/Hello" => Grpc::new(ProstCodec::default()).unary(Hello(version), request).await,
                _ => Status::unimplemented("the stand-in answers CheckMachine and Hello only").into_http(),
            })
        })
    }
}
