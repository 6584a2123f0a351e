//! Step 4, the call rates of its credential and its account (`Gatekeeper::admit_rate`). A call past
//! them waits out what its caller is told to wait (up to [`MAX_RATE_HOLD`]) before it is answered,
//! holding only its credential's place: a client that ignores the wait and calls on gets no more
//! refusals a second than that place allows, where answering at once would let it spend the
//! server's CPU on refusals.

use std::sync::Arc;

use http::{Request, Response};
use tonic::body::Body;
use tower::ServiceExt;

use super::{Gatekeeper, Job, MAX_RATE_HOLD, Next, Refusal};
use crate::domain::Error;
use crate::protocol::credential::Credential;

#[derive(Clone)]
pub struct Rates {
    pub(super) gatekeeper: Arc<dyn Gatekeeper>,
}

impl Job for Rates {
    async fn admit<S: Next>(&self, request: Request<Body>, next: S) -> Result<Response<Body>, Refusal> {
        if let Some(credential) = request.extensions().get::<Credential>()
            && let Err(refusal) = self.gatekeeper.admit_rate(credential, request.uri().path())
        {
            if let Error::Throttled { retry_after, .. } = &refusal {
                tokio::time::sleep((*retry_after).min(MAX_RATE_HOLD)).await;
            }
            return Err(refusal.into());
        }
        next.oneshot(request).await.map_err(|e| Refusal::Failed(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::super::testing::*;
    use super::super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_rate_is_refused_with_a_real_wait() {
        let service = admission(answering(), RpcLimits::default());
        let started = tokio::time::Instant::now();
        let refused = service.oneshot(call("/relay.v1.Relay/List", 1, 99)).await.unwrap();
        // Held for the wait it names, so a caller that ignores it floods no faster than its places.
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(status_of(&refused), Code::ResourceExhausted);
        assert!(message_of(&refused).ends_with("try again in 1 s"), "{}", message_of(&refused));
        assert_eq!(refused.headers()["grpc-retry-pushback-ms"], "300");
    }
}
