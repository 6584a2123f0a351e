//! Step 3, the credential's share: a place among the calls in flight with one token
//! (`per_credential`), taken before the request message is read and held until the answer begins.

use std::sync::Arc;

use http::{Request, Response};
use tonic::body::Body;
use tower::ServiceExt;

use super::{Budgets, Denied, Job, Next, Refusal};
use crate::protocol::credential::Credential;

#[derive(Clone)]
pub struct CredentialShare {
    pub(super) budgets: Arc<Budgets>,
}

impl Job for CredentialShare {
    async fn admit<S: Next>(&self, request: Request<Body>, next: S) -> Result<Response<Body>, Refusal> {
        let _place = match request.extensions().get::<Credential>() {
            Some(credential) => Some(self.budgets.admit_credential(&credential.holder()).map_err(Denied::refusal)?),
            None => None,
        };
        next.oneshot(request).await.map_err(|e| Refusal::Failed(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::super::testing::*;
    use super::super::*;

    #[tokio::test]
    async fn a_credential_past_its_share_is_refused_until_its_calls_are_answered() {
        let (entered, release, handler) = gated("/relay.v1.Relay/Send");
        let admission = AdmissionLayer::new(Arc::new(Stub), RpcLimits { per_credential: 1, ..RpcLimits::default() });
        // Authentication puts the credential on the request; the share counts by it.
        let service = tower::ServiceBuilder::new()
            .layer(admission.authenticate())
            .layer(admission.credential_share())
            .service(handler);
        let held = tokio::spawn(service.clone().oneshot(call("/relay.v1.Relay/Send", 1, 1)));
        entered.notified().await;
        let again = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 1, 1)).await.unwrap();
        assert_eq!(status_of(&again), Code::ResourceExhausted);
        assert!(message_of(&again).starts_with("this credential has 1 calls in flight"), "{}", message_of(&again));
        let other = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 1, 2)).await.unwrap();
        assert_eq!(status_of(&other), Code::Ok, "another credential of the account is not refused");
        release.notify_one();
        assert_eq!(status_of(&held.await.unwrap().unwrap()), Code::Ok);
        let after = service.oneshot(call("/relay.v1.Relay/WhoAmI", 1, 1)).await.unwrap();
        assert_eq!(status_of(&after), Code::Ok, "the place is given back with the answer");
    }
}
