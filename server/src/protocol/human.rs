//! `relay.v1.Human`: what an account's people do with their human token.

use relay_proto::v1::human_server::Human;
use relay_proto::v1::*;
use tonic::{Request, Response, Status};

use super::auth::bearer;
use crate::domain::Result;
use crate::store::Store;
use crate::store::contacts::Human as Person;

#[derive(Clone)]
pub struct HumanService {
    store: Store,
}

impl HumanService {
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    async fn person<T>(&self, request: &Request<T>) -> Result<Person> {
        self.store.authenticate_human(bearer(request)?).await
    }
}

#[tonic::async_trait]
impl Human for HumanService {
    async fn contact_request(&self, request: Request<ContactRequestRequest>) -> Result<Response<ContactView>, Status> {
        let person = self.person(&request).await?;
        let view = self.store.contact_request(&person, request.get_ref().account.trim()).await?;
        tracing::info!(account = %person.account, other = %view.account, state = %view.state, "contact request");
        Ok(Response::new(view))
    }

    async fn contact_accept(&self, request: Request<ContactAcceptRequest>) -> Result<Response<ContactView>, Status> {
        let person = self.person(&request).await?;
        Ok(Response::new(self.store.contact_accept(&person, request.get_ref().account.trim()).await?))
    }

    async fn contact_list(
        &self,
        request: Request<ContactListRequest>,
    ) -> Result<Response<ContactListResponse>, Status> {
        let person = self.person(&request).await?;
        Ok(Response::new(ContactListResponse { contacts: self.store.contact_list(&person).await? }))
    }

    async fn contact_drop(&self, request: Request<ContactDropRequest>) -> Result<Response<ContactView>, Status> {
        let person = self.person(&request).await?;
        let view = self.store.contact_drop(&person.account, request.get_ref().account.trim()).await?;
        tracing::info!(account = %person.account, other = %view.account, withdrawn = view.withdrawn, "contact dropped");
        Ok(Response::new(view))
    }
}
