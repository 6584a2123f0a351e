//! Step 2, who the call is from: the credential its method takes (`Gatekeeper::authenticate`),
//! which then rides the request's extensions, and the connection's share of its account's and
//! credential's connections. The address's arrival learns how it went; a credential the call
//! issues (Hello's session token) is known from then on.

use std::sync::Arc;

use http::{Request, Response};
use tonic::body::Body;
use tower::ServiceExt;

use super::address::Arriving;
use super::{Budgets, Gatekeeper, Job, Next, Refusal, refused};
use crate::domain::Error;
use crate::metrics::Shed;
use crate::protocol::connections;
use crate::protocol::credential::Issued;

#[derive(Clone)]
pub struct Authenticate {
    pub(super) gatekeeper: Arc<dyn Gatekeeper>,
    pub(super) budgets: Arc<Budgets>,
}

impl Job for Authenticate {
    async fn admit<S: Next>(&self, mut request: Request<Body>, next: S) -> Result<Response<Body>, Refusal> {
        let arrival = request.extensions().get::<Arriving>().and_then(Arriving::take);
        let path = request.uri().path().to_owned();
        let credential = match self.gatekeeper.authenticate(&path, request.headers()).await {
            Ok(credential) => credential,
            Err(err) => {
                if let (Error::Unauthenticated(_), Some(arrival)) = (&err, arrival) {
                    arrival.refused();
                }
                return Err(err.into());
            }
        };
        // A method that takes no credential (it checks its own) keeps its address's place to its end.
        let _unauthenticated = match (&credential, arrival) {
            (Some(_), Some(arrival)) => {
                arrival.accepted();
                None
            }
            (_, arrival) => arrival,
        };
        let connection = request.extensions().get::<connections::Info>().cloned();
        if let (Some(connection), Some(credential)) = (&connection, &credential) {
            connection.authenticated(credential.account_id(), &credential.holder()).map_err(|over| {
                let (whose, share) = match over {
                    connections::OverShare::Account(share) => ("the account", share),
                    connections::OverShare::Credential(share) => ("this credential", share),
                };
                refused(
                    Shed::shares,
                    format!(
                        "{whose} holds {share} connections to this server, its share: this call was refused; make calls on a connection already open, or close some"
                    ),
                    None,
                )
            })?;
        }
        if let Some(credential) = credential {
            request.extensions_mut().insert(credential);
        }
        let mut response = next.oneshot(request).await.map_err(|e| Refusal::Failed(e.into()))?;
        // A credential the call issued is one the replica has accepted.
        if let Some(key) = response
            .extensions_mut()
            .remove::<Issued>()
            .and_then(|Issued(header)| self.budgets.known.key(Some(&header)))
        {
            self.budgets.known.learn(key);
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Mutex;

    use tonic::Code;

    use super::super::testing::*;
    use super::super::*;
    use crate::domain::ids::AccountId;

    #[tokio::test]
    async fn the_handler_learns_who_called_and_a_refused_credential_goes_no_further() {
        let seen: Arc<Mutex<Option<Option<AccountId>>>> = Arc::default();
        let handler = {
            let seen = seen.clone();
            tower::service_fn(move |req: Request<Body>| {
                let seen = seen.clone();
                async move {
                    *seen.lock().unwrap() = Some(req.extensions().get::<Credential>().map(Credential::account_id));
                    Ok::<_, Infallible>(ok())
                }
            })
        };
        let admission = AdmissionLayer::new(Arc::new(Stub), RpcLimits::default());
        let service = tower::ServiceBuilder::new().layer(admission.authenticate()).service(handler);
        let answer = service.clone().oneshot(call("/relay.v1.Relay/WhoAmI", 3, 4)).await.unwrap();
        assert_eq!(status_of(&answer), Code::Ok);
        assert_eq!(seen.lock().unwrap().take(), Some(Some(AccountId(3))), "the credential rides the request");
        let bad = call_from("/relay.v1.Relay/WhoAmI", "Bearer bad", "10.0.0.1:1", Body::empty());
        let refused = service.oneshot(bad).await.unwrap();
        assert_eq!(status_of(&refused), Code::Unauthenticated);
        assert_eq!(*seen.lock().unwrap(), None, "the handler never saw the call");
    }
}
