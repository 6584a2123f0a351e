//! Agents served over HTTP (see `protocol::mcp`): the sessions their MCP clients of the 2025
//! revisions keep, in the database so that any replica carries one on. What a session holds is
//! the transport's business; here it is text named by the session's id, kept by its hash.

use std::time::Duration;

use super::Core;
use crate::domain::Result;
use crate::domain::ids;
use crate::store::remote;

/// How long a session is kept since it began or was last taken up by a replica.
pub const SESSION_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

#[derive(Clone)]
pub struct RemoteService {
    core: Core,
}

impl RemoteService {
    pub(super) fn new(core: Core) -> Self {
        Self { core }
    }

    pub async fn keep_session(&self, id: &str, state: &str) -> Result<()> {
        let db = self.core.store.client().await?;
        remote::keep_session(&db, &ids::token_hash(id), state, SESSION_TTL.as_secs_f64()).await
    }

    /// The state of session `id`, unless it ended or expired.
    pub async fn session(&self, id: &str) -> Result<Option<String>> {
        let db = self.core.store.client().await?;
        remote::session(&db, &ids::token_hash(id), SESSION_TTL.as_secs_f64()).await
    }

    pub async fn end_session(&self, id: &str) -> Result<()> {
        let db = self.core.store.client().await?;
        remote::end_session(&db, &ids::token_hash(id)).await
    }
}
