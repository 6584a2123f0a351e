//! Spawn trees: a child endpoint reserved for a worker, claimed by the worker's own bridge with a
//! one-time grant, and the worker's final report sent to its parent as the child.

use crate::domain::endpoint::Endpoint;

use super::Store;
use super::error::Col;
use super::identity::{Caller, MachineIdentity, caller_of};
use super::messages::{Outgoing, Sent};
use crate::domain::delivery::Kind;
use crate::domain::ids::{self, EndpointId, TokenKind};
use crate::domain::names::MAX_NAME_LEN;
use crate::domain::redact::{RedactedText, redact};
use crate::domain::scope::{Dir, Selector};
use crate::domain::{EntityKind, Error, Result, limits};

/// How long a reserved child endpoint waits for its worker's bridge before its handle is free again.
const RESERVATION_S: f64 = 600.0;

impl Store {
    /// Reserves `<parent handle>-<n>` on the caller's machine as a child of the caller, with caps
    /// the caller chose, and returns it with the grant its worker claims it with.
    pub async fn spawn(
        &self,
        caller: &Caller,
        harness: &str,
        caps: Option<Vec<Selector>>,
    ) -> Result<(Endpoint, String)> {
        let grant = ids::new_token(TokenKind::SpawnGrant);
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let taken: Vec<String> = tx
            .query(
                "select handle from endpoints where machine_id = $1 and handle like $2 || '-%'",
                &[&caller.machine_id, &caller.handle],
            )
            .await?
            .iter()
            .map(|r| r.col(0))
            .collect::<Result<_>>()?;
        let handle = (1..)
            .map(|n: u32| {
                let suffix = format!("-{n}");
                let base = &caller.handle[..caller.handle.len().min(MAX_NAME_LEN - suffix.len())];
                format!("{}{suffix}", base.trim_end_matches('-'))
            })
            .find(|h| !taken.contains(h))
            .expect("an unbounded range always has a free name");
        let row = tx
            .query_one(
                "insert into endpoints (machine_id, handle, harness, parent_id, spawn_grant_hash, online_until, last_seen_at)
                 values ($1, $2, $3, $4, $5, now() + $6 * interval '1 second', now())
                 returning id",
                &[&caller.machine_id, &handle, &harness, &caller.endpoint_id, &ids::token_hash(&grant), &RESERVATION_S],
            )
            .await?;
        let child: EndpointId = row.col(0)?;
        if let Some(selectors) = caps {
            let stored: Vec<String> = selectors.iter().map(ToString::to_string).collect();
            for dir in [Dir::In, Dir::Out] {
                tx.execute(
                    "insert into caps (endpoint_id, dir, selectors, set_by) values ($1, $2, $3, $4)",
                    &[&child, &dir.as_str(), &stored, &caller.endpoint_id],
                )
                .await?;
            }
        }
        let endpoint = super::identity::endpoint_on(&tx, child).await?;
        tx.commit().await?;
        Ok((endpoint, grant))
    }

    /// The worker ended: its report goes to the parent as a message from the child, and the grant
    /// is spent.
    pub async fn spawn_result(&self, grant: &str, exit_code: i32, output: &RedactedText) -> Result<Sent> {
        ids::check_token(TokenKind::SpawnGrant, grant)?;
        let client = self.client().await?;
        let row = client
            .query_opt(
                "select e.id, e.parent_id
                 from endpoints e join machines m on m.id = e.machine_id
                 where e.spawn_grant_hash = $1 and m.revoked_at is null",
                &[&ids::token_hash(grant)],
            )
            .await?
            .ok_or_else(|| Error::Unauthenticated("unknown or used spawn grant".into()))?;
        let child = caller_of(&client, row.col(0)?).await?;
        let parent: i64 = row
            .col::<Option<i64>>(1)?
            .ok_or_else(|| Error::not_found(EntityKind::Endpoint, "the worker's parent is gone"))?;
        let parent_address: String =
            client.query_one("select address from endpoint_addresses where id = $1", &[&parent]).await?.col(0)?;
        drop(client);

        let mut tail = output.as_str().to_owned();
        let room = limits::MAX_BODY_BYTES - 256;
        if tail.len() > room {
            let mut cut = tail.len() - room;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail = format!("[…]{}", &tail[cut..]);
        }
        let body = format!("worker {} finished with exit code {exit_code}. Its final output:\n{tail}", child.address());
        // Only redacted text is stored: the report, which quotes the redacted output, as a whole.
        let body = redact(&body).text;
        let to = [parent_address];
        let out = Outgoing {
            to: &to,
            body: &body,
            thread: None,
            kind: Kind::Message,
            client_id: Some("spawn-result"),
            private: false,
            require_reply: false,
        };
        let sent = self.send_unscoped(&child, out).await?;
        let client = self.client().await?;
        client.execute("update endpoints set spawn_grant_hash = null where id = $1", &[&child.endpoint_id]).await?;
        Ok(sent)
    }
}

/// The endpoint a spawn grant reserved, on the machine presenting it.
pub(crate) async fn granted_endpoint(
    client: &impl deadpool_postgres::GenericClient,
    machine: &MachineIdentity,
    grant: &str,
) -> Result<EndpointId> {
    ids::check_token(TokenKind::SpawnGrant, grant)?;
    client
        .query_opt(
            "select id from endpoints where spawn_grant_hash = $1 and machine_id = $2",
            &[&ids::token_hash(grant), &machine.machine_id],
        )
        .await?
        .ok_or_else(|| Error::Unauthenticated("unknown or used spawn grant".into()))?
        .col(0)
}
