//! Step 5, the call's account's share (`per_account`), then the server's (`max_concurrent`). Calls
//! that wait (long polls, permission requests) and streams count apart from calls doing work, with
//! their own shares per credential, per account and of the server; a stream holds its stream places
//! for its life (they ride its body) and its call places only until it starts streaming.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tonic::Status;
use tonic::body::Body;
use tower::ServiceExt;

use super::{Budgets, Job, Next, Place, Refusal, refused};
use crate::metrics::Shed;
use crate::protocol::calls::Kind;
use crate::protocol::credential::Credential;

#[derive(Clone)]
pub struct Shares {
    pub(super) budgets: Arc<Budgets>,
}

impl Job for Shares {
    async fn admit<S: Next>(&self, request: Request<Body>, next: S) -> Result<Response<Body>, Refusal> {
        let (budgets, limits) = (&self.budgets, self.budgets.limits);
        let kind = Kind::of(request.uri().path());
        let waits = matches!(kind, Kind::LongPoll | Kind::ServerTimed);
        let credential = request.extensions().get::<Credential>();
        let holder = credential.map(Credential::holder);
        let account = credential.map(Credential::account_id);
        let mut streaming = Vec::new();
        if waits || kind == Kind::Stream {
            if let Some(holder) = &holder {
                streaming.push(budgets.credential_streams.take(holder.clone()).ok_or_else(|| {
                    refused(
                        Shed::shares,
                        format!(
                            "this credential has {} streams and waiting calls open, its share: close one before opening another",
                            limits.streams_per_credential
                        ),
                        None,
                    )
                })?);
            }
            if let Some(account) = account {
                streaming.push(budgets.account_streams.take(account).ok_or_else(|| {
                    refused(
                        Shed::shares,
                        format!(
                            "the account has {} streams and waiting calls open, its share of the server: this one was refused; retry after a short backoff",
                            limits.streams_per_account
                        ),
                        None,
                    )
                })?);
            }
            streaming.push(budgets.server_streams.take(()).ok_or_else(|| {
                refused(
                    Shed::calls,
                    format!(
                        "the server is at its limit of {} waiting calls and refused this one: retry after a short backoff",
                        limits.max_waiting
                    ),
                    None,
                )
            })?);
        }
        let mut held = Vec::new();
        if !waits {
            if let Some(account) = account {
                held.push(budgets.accounts.take(account).ok_or_else(|| {
                    refused(
                        Shed::shares,
                        format!(
                            "the account has {} calls in flight, its share of the server: this one was refused; retry after a short backoff",
                            limits.per_account
                        ),
                        None,
                    )
                })?);
            }
            held.push(budgets.server.take(()).ok_or_else(|| {
                refused(
                    Shed::calls,
                    format!(
                        "the server is at its limit of {} calls in flight and refused this one: retry after a short backoff",
                        limits.max_concurrent
                    ),
                    None,
                )
            })?);
        }
        let response = next.oneshot(request).await.map_err(|e| Refusal::Failed(e.into()))?;
        drop(held);
        if streaming.is_empty() {
            return Ok(response);
        }
        Ok(response.map(|body| Body::new(Holding { body, _places: streaming })))
    }
}

/// A response body that holds places until it is done.
struct Holding {
    body: Body,
    _places: Vec<Place>,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::super::testing::*;
    use super::super::*;

    #[tokio::test]
    async fn beyond_the_servers_limit_calls_are_refused_at_once_but_health_still_answers() {
        let (entered, release, handler) = gated("/relay.v1.Relay/Send");
        let service = admission(handler, limits(1));
        let held = tokio::spawn(service.clone().oneshot(call("/relay.v1.Relay/Send", 1, 1)));
        entered.notified().await;
        let refused = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 2, 2)).await.unwrap();
        assert_eq!(status_of(&refused), Code::ResourceExhausted);
        assert_eq!(
            message_of(&refused),
            "the server is at its limit of 1 calls in flight and refused this one: retry after a short backoff"
        );
        assert_eq!(refused.headers()["grpc-retry-pushback-ms"], "250");
        let health = service.clone().oneshot(call("/grpc.health.v1.Health/Check", 2, 2)).await.unwrap();
        assert_eq!(status_of(&health), Code::Ok, "health bypasses admission");
        release.notify_one();
        assert_eq!(status_of(&held.await.unwrap().unwrap()), Code::Ok);
        assert_eq!(status_of(&service.oneshot(call("/relay.v1.Relay/WhoAmI", 2, 2)).await.unwrap()), Code::Ok);
    }

    #[tokio::test]
    async fn an_account_filling_its_share_refuses_its_own_calls_not_anothers() {
        let (entered, release, handler) = gated("/relay.v1.Relay/Send");
        let shares = RpcLimits { per_account: 2, per_credential: 1, ..limits(16) };
        let service = admission(handler, shares);
        let mut held = Vec::new();
        for endpoint in [1, 2] {
            held.push(tokio::spawn(service.clone().oneshot(call("/relay.v1.Relay/Send", 1, endpoint))));
            entered.notified().await;
        }
        let same_credential = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 1, 1)).await.unwrap();
        assert_eq!(status_of(&same_credential), Code::ResourceExhausted);
        assert!(message_of(&same_credential).starts_with("this credential has 1 calls in flight"));
        let same_account = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 1, 3)).await.unwrap();
        assert_eq!(status_of(&same_account), Code::ResourceExhausted);
        assert!(message_of(&same_account).starts_with("the account has 2 calls in flight, its share"));
        let other_account = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 2, 4)).await.unwrap();
        assert_eq!(status_of(&other_account), Code::Ok, "another account is not refused");
        release.notify_waiters();
        for call in held {
            assert_eq!(status_of(&call.await.unwrap().unwrap()), Code::Ok);
        }
    }

    #[tokio::test]
    async fn waiting_calls_and_streams_have_their_own_places() {
        let (entered, release, handler) = gated("/relay.v1.Relay/Inbox");
        let service = admission(handler, RpcLimits { streams_per_credential: 1, max_waiting: 8, ..limits(1) });
        let waiting = tokio::spawn(service.clone().oneshot(call("/relay.v1.Relay/Inbox", 1, 1)));
        entered.notified().await;
        let ordinary = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 1, 1)).await.unwrap();
        assert_eq!(status_of(&ordinary), Code::Ok, "a waiting call holds no ordinary place");
        let second = service.clone().oneshot(call("/relay.v1.Relay/AskWait", 1, 1)).await.unwrap();
        assert_eq!(status_of(&second), Code::ResourceExhausted);
        assert!(message_of(&second).starts_with("this credential has 1 streams and waiting calls open"));
        let elsewhere = service.clone().oneshot(call("/relay.v1.Relay/Subscribe", 2, 2)).await.unwrap();
        assert_eq!(status_of(&elsewhere), Code::Ok);
        // A stream keeps its place while its body lives, and gives it back with it.
        let again = service.clone().oneshot(call("/relay.v1.Relay/Announce", 2, 2)).await.unwrap();
        assert_eq!(status_of(&again), Code::ResourceExhausted, "{}", message_of(&again));
        drop(elsewhere);
        let after = service.clone().oneshot(call("/relay.v1.Relay/Announce", 2, 2)).await.unwrap();
        assert_eq!(status_of(&after), Code::Ok);
        release.notify_one();
        assert_eq!(status_of(&waiting.await.unwrap().unwrap()), Code::Ok);
    }
}
