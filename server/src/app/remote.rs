//! Agents served over HTTP (see `protocol::mcp`): the sessions their MCP clients of the 2025
//! revisions keep, in the database so that any replica carries one on. What a session holds is
//! the transport's business; here it is text named by the session's id, kept by its hash.

use std::time::Duration;

use super::Core;
use crate::domain::Result;
use crate::domain::ids::{self, MachineId, ReplicaId};
use crate::store::{remote, replicas};

/// How long a session is kept since it began or was last taken up by a replica.
pub const SESSION_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long what an answer stream sent after its client left is kept for the client to resume.
pub const ANSWER_TTL: Duration = Duration::from_secs(10 * 60);

/// The events an answer stream at `/mcp` sent, kept for its client to resume.
#[derive(Debug, Clone)]
pub struct KeptAnswer {
    pub stream: [u8; 16],
    /// The machine that asked: the only one that reads it back.
    pub machine: MachineId,
    /// (seq, data), in order.
    pub events: Vec<(i32, String)>,
}

#[derive(Clone)]
pub struct RemoteService {
    core: Core,
}

impl RemoteService {
    pub(super) fn new(core: Core) -> Self {
        Self { core }
    }

    /// The largest request body `/mcp` takes: a send's files inline (base64, a third larger than
    /// the files) and room for the rest of the call.
    pub fn max_request_bytes(&self) -> usize {
        const REST: usize = 1024 * 1024;
        let files = usize::try_from(self.core.quotas.files.message_bytes).unwrap_or(usize::MAX);
        files.saturating_mul(4).div_ceil(3).saturating_add(REST)
    }

    pub async fn keep_session(&self, id: &str, state: &str) -> Result<()> {
        let db = self.core.store.client().await?;
        Ok(remote::keep_session(&db, &ids::token_hash(id), state, SESSION_TTL.as_secs_f64()).await?)
    }

    /// The state of session `id`, unless it ended or expired.
    pub async fn session(&self, id: &str) -> Result<Option<String>> {
        let db = self.core.store.client().await?;
        Ok(remote::session(&db, &ids::token_hash(id), SESSION_TTL.as_secs_f64()).await?)
    }

    pub async fn end_session(&self, id: &str) -> Result<()> {
        let db = self.core.store.client().await?;
        Ok(remote::end_session(&db, &ids::token_hash(id)).await?)
    }

    /// This replica, which names the answer streams it serves.
    pub fn replica(&self) -> ReplicaId {
        self.core.store.replica()
    }

    pub async fn replica_alive(&self, replica: ReplicaId) -> Result<bool> {
        let db = self.core.store.client().await?;
        Ok(replicas::alive(&db, replica).await?)
    }

    /// Keeps `answers` for [`ANSWER_TTL`], in one statement.
    pub async fn keep_answers(&self, answers: &[std::sync::Arc<KeptAnswer>]) -> Result<()> {
        let events = answers.iter().flat_map(|a| a.events.iter().map(move |(seq, data)| (a, *seq, data.as_str())));
        let (mut streams, mut seqs, mut machines, mut data) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (answer, seq, text) in events {
            streams.push(&answer.stream[..]);
            seqs.push(seq);
            machines.push(answer.machine);
            data.push(text);
        }
        let db = self.core.store.client().await?;
        Ok(remote::keep_answers(&db, &streams, &seqs, &machines, &data, ANSWER_TTL.as_secs_f64()).await?)
    }

    /// The kept events of answer stream `stream` of `machine`; empty when none is kept.
    pub async fn answer(&self, stream: &[u8], machine: MachineId) -> Result<Vec<(i32, String)>> {
        let db = self.core.store.client().await?;
        Ok(remote::answer(&db, stream, machine).await?)
    }
}
