//! Step 1, the call's address: unless its credential is one this replica has accepted before, a
//! place among its address's calls being authenticated, refused while the address's credentials
//! keep failing. The arrival goes on to [`super::Authenticate`], which says how it went.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use tonic::body::Body;
use tower::ServiceExt;

use super::{Arrival, Budgets, Denied, Job, Next, Refusal};
use crate::protocol::connections;

#[derive(Clone)]
pub struct Address {
    pub(super) budgets: Arc<Budgets>,
}

/// The call's [`Arrival`], for the step that authenticates it.
#[derive(Clone)]
pub(super) struct Arriving(pub(super) Arc<Mutex<Option<Arrival>>>);

impl Arriving {
    pub(super) fn take(&self) -> Option<Arrival> {
        self.0.lock().expect("arrival lock poisoned").take()
    }
}

impl Job for Address {
    async fn admit<S: Next>(&self, mut request: Request<Body>, next: S) -> Result<Response<Body>, Refusal> {
        let ip = request.extensions().get::<connections::Info>().and_then(|c| c.peer.map(|p| p.ip()));
        let arrival =
            self.budgets.arrive(ip, request.headers().get(http::header::AUTHORIZATION)).map_err(Denied::refusal)?;
        request.extensions_mut().insert(Arriving(Arc::new(Mutex::new(Some(arrival)))));
        next.oneshot(request).await.map_err(|e| Refusal::Failed(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::super::testing::*;
    use super::super::*;

    #[tokio::test]
    async fn an_address_whose_credentials_keep_failing_is_refused_before_asking_who_it_is() {
        let service = admission(answering(), RpcLimits::default());
        let bad = || call_from("/relay.v1.Relay/WhoAmI", "Bearer bad", "10.0.0.7:1", Body::empty());
        let mut refused_early = None;
        for _ in 0..DEFAULT_FAILED_AUTH.burst as usize + 5 {
            let answer = service.clone().oneshot(bad()).await.unwrap();
            if status_of(&answer) == Code::ResourceExhausted {
                refused_early = Some(message_of(&answer));
                break;
            }
            assert_eq!(status_of(&answer), Code::Unauthenticated);
        }
        let said = refused_early.expect("the address is refused once past its failures");
        assert!(
            said.contains("presented a credential the server does not accept") && said.contains("retry in"),
            "{said}"
        );
        let elsewhere = call_from("/relay.v1.Relay/WhoAmI", "Bearer 1:1", "10.0.0.8:1", Body::empty());
        assert_eq!(status_of(&service.oneshot(elsewhere).await.unwrap()), Code::Ok, "other addresses are not");
    }

    #[tokio::test]
    async fn a_known_credential_is_not_refused_for_its_neighbours_failures() {
        let service = admission(answering(), RpcLimits::default());
        let from_office = |token: &str| call_from("/relay.v1.Relay/WhoAmI", token, "10.0.0.7:1", Body::empty());
        let honest = service.clone().oneshot(from_office("Bearer 1:1")).await.unwrap();
        assert_eq!(status_of(&honest), Code::Ok);
        for _ in 0..DEFAULT_FAILED_AUTH.burst as usize * 2 {
            service.clone().oneshot(from_office("Bearer bad")).await.unwrap();
        }
        let refused = service.clone().oneshot(from_office("Bearer bad")).await.unwrap();
        assert_eq!(status_of(&refused), Code::ResourceExhausted, "the failing credentials are held back");
        let honest = service.clone().oneshot(from_office("Bearer 1:1")).await.unwrap();
        assert_eq!(status_of(&honest), Code::Ok, "the credential accepted before is not: {}", message_of(&honest));
        // A credential the replica has not accepted yet meets the address's gate.
        let newcomer = service.oneshot(from_office("Bearer 1:2")).await.unwrap();
        assert_eq!(status_of(&newcomer), Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn behind_a_proxy_failed_authentications_can_be_left_to_it() {
        let limits = RpcLimits { failed_auth: Rate::UNLIMITED, ..RpcLimits::default() };
        let service = admission(answering(), limits);
        for _ in 0..DEFAULT_FAILED_AUTH.burst as usize * 2 {
            let bad = call_from("/relay.v1.Relay/WhoAmI", "Bearer bad", "10.0.0.7:1", Body::empty());
            assert_eq!(status_of(&service.clone().oneshot(bad).await.unwrap()), Code::Unauthenticated);
        }
        let good = call_from("/relay.v1.Relay/WhoAmI", "Bearer 1:1", "10.0.0.7:1", Body::empty());
        assert_eq!(status_of(&service.oneshot(good).await.unwrap()), Code::Ok, "the proxy's address is not refused");
    }
}
