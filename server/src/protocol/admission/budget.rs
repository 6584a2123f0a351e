//! Step 6, the call's time budget by its method's kind ([`Kind::budget`]): an ordinary call is
//! stopped at `timeout`, a long poll at its longest wait and that; streams and calls the server
//! times itself are not timed here.

use std::time::Duration;

use http::{Request, Response};
use tonic::body::Body;
use tower::ServiceExt;

use super::{Job, Next, Refusal};
use crate::protocol::calls::{Kind, ran_too_long};

#[derive(Clone)]
pub struct TimeBudget {
    pub(super) timeout: Duration,
}

impl Job for TimeBudget {
    async fn admit<S: Next>(&self, request: Request<Body>, next: S) -> Result<Response<Body>, Refusal> {
        let path = request.uri().path().to_owned();
        let call = next.oneshot(request);
        let outcome = match Kind::of(&path).budget(self.timeout) {
            None => call.await,
            Some(budget) => match tokio::time::timeout(budget, call).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    // Dropping the handler's future rolls back whatever it had not committed.
                    tracing::warn!(budget_s = budget.as_secs_f64(), "rpc ran past its time budget; stopped");
                    return Err(ran_too_long(&path, budget).into());
                }
            },
        };
        outcome.map_err(|e| Refusal::Failed(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tonic::Code;

    use super::super::testing::*;
    use super::super::*;
    use crate::domain::limits;

    // The clock is paused and jumps ahead whenever every task waits, so the real defaults are tested
    // without the test taking minutes.
    #[tokio::test(start_paused = true)]
    async fn a_stuck_ordinary_call_is_stopped_but_a_long_poll_and_a_stream_are_not() {
        let handler = tower::service_fn(|req: Request<Body>| async move {
            match req.uri().path() {
                "/relay.v1.Relay/Send" => std::future::pending::<()>().await,
                _ => tokio::time::sleep(Duration::from_secs(u64::from(limits::MAX_WAIT_S))).await,
            }
            Ok::<_, Infallible>(ok())
        });
        let service = admission(handler, RpcLimits::default());
        let started = tokio::time::Instant::now();
        let stuck = service.clone().oneshot(call("/relay.v1.Relay/Send", 1, 1)).await.unwrap();
        assert_eq!(status_of(&stuck), Code::DeadlineExceeded);
        assert_eq!(started.elapsed(), DEFAULT_RPC_TIMEOUT);
        assert!(message_of(&stuck).starts_with("relay.v1.Relay/Send took longer than the server allows (30 s)"));

        let started = tokio::time::Instant::now();
        let waited = service.clone().oneshot(call("/relay.v1.Relay/Inbox", 1, 1)).await.unwrap();
        assert_eq!(status_of(&waited), Code::Ok, "a long poll is not cut while it waits");
        assert_eq!(started.elapsed(), Duration::from_secs(u64::from(limits::MAX_WAIT_S)));

        let stream = service.oneshot(call("/relay.v1.Relay/Subscribe", 1, 1)).await.unwrap();
        assert_eq!(status_of(&stream), Code::Ok, "a stream's setup is not timed");
    }
}
