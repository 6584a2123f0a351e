//! Files attached to messages (migration 46): uploads waiting for their send, the links a send
//! makes from its message to them, the manifests readers see with each message, a reader's fetch,
//! and the purge. A link is reached only through a message its reader may read.

use std::collections::HashMap;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::messages::WITHDRAWN;
use super::row::{Col, FromRow};
use crate::domain::artifact::{Attached, Prepared, UPLOAD_KEPT_S};
use crate::domain::caller::Caller;
use crate::domain::ids::{AccountId, EndpointId, MessageId, MessageRef};
use crate::domain::message::pick_named;
use crate::domain::names::HUMAN;
use crate::domain::{EntityKind, Error};
use crate::store::Result;

impl FromRow for Attached {
    fn from_row(row: &Row) -> Result<Self> {
        let sha: Vec<u8> = row.col("sha256")?;
        let size: i64 = row.col("size")?;
        let redacted: i32 = row.col("redacted")?;
        Ok(Attached {
            name: row.col("name")?,
            size: size.max(0) as u64,
            binary: row.col("is_binary")?,
            sha256: sha.try_into().map_err(|_| Error::Internal("a stored SHA-256 is not 32 bytes".into()))?,
            redacted: redacted.max(0) as u32,
        })
    }
}

/// What an account's files hold now: uploads waiting and what its messages carry.
const HELD: &str = "coalesce((select sum(size) from artifact_uploads where account_id = $2), 0)
                  + coalesce((select sum(size) from message_artifacts where account_id = $2), 0)";

/// Stores `file` as upload `id` of `sender`, its content once by its SHA-256, if the account's
/// files stay within `account_bytes`: one statement. `false` when they would not.
pub(crate) async fn upload(
    c: &impl GenericClient,
    sender: &Caller,
    id: &str,
    file: &Prepared,
    account_bytes: u64,
) -> Result<bool> {
    let stmt = c
        .prepare_cached(&format!(
            "with room as (select {HELD} + $5::bigint <= $8::bigint as ok),
             blob as (
                 insert into artifact_blobs (sha256, content, size)
                 select $4, $6, $5 from room where ok
                 on conflict (sha256) do update set used_at = now()
                 returning sha256)
             insert into artifact_uploads (id, endpoint_id, account_id, name, sha256, size, is_binary, redacted)
             select $3, $1, $2, $9, sha256, $5, $7, $10 from blob"
        ))
        .await?;
    let a = &file.attached;
    let stored = c
        .execute(
            &stmt,
            &[
                &sender.endpoint_id,
                &sender.account_id,
                &id,
                &a.sha256.as_slice(),
                &(a.size as i64),
                &file.content.as_slice(),
                &a.binary,
                &(account_bytes.min(i64::MAX as u64) as i64),
                &a.name,
                &(a.redacted as i32),
            ],
        )
        .await?;
    Ok(stored == 1)
}

/// What an account's files hold, in bytes.
pub(crate) async fn held(c: &impl GenericClient, sender: &Caller) -> Result<u64> {
    let held: i64 = c
        .query_one(
            &format!("select ({HELD})::bigint where $1::bigint is not null"),
            &[&sender.endpoint_id, &sender.account_id],
        )
        .await?
        .only()?;
    Ok(held.max(0) as u64)
}

/// The caller's uploads named `ids`, in the order named; an id that is not one of its uploads
/// (never made, someone else's, or gone after an hour) is not found.
pub(crate) async fn uploads(c: &impl GenericClient, sender: EndpointId, ids: &[String]) -> Result<Vec<Attached>> {
    let stmt = c
        .prepare_cached(
            "select id, name, sha256, size, is_binary, redacted from artifact_uploads
             where id = any($2) and endpoint_id = $1",
        )
        .await?;
    let rows = c.query(&stmt, &[&sender, &ids]).await?;
    ids.iter()
        .map(|id| {
            let row = rows.iter().find(|r| r.get::<_, &str>("id") == id).ok_or_else(|| {
                Error::not_found(
                    EntityKind::Upload,
                    format!("no upload {id} of yours: uploads wait an hour for their send; attach the file again"),
                )
            })?;
            Attached::from_row(row)
        })
        .collect()
}

/// Links the caller's uploads `ids` to message `message`, which is about to be written.
pub(crate) async fn link(
    c: &impl GenericClient,
    message: &MessageId,
    sender: EndpointId,
    ids: &[String],
) -> Result<u64> {
    let stmt = c
        .prepare_cached(
            "insert into message_artifacts (message_id, name, account_id, sha256, size, is_binary, redacted)
             select $1, name, account_id, sha256, size, is_binary, redacted from artifact_uploads
             where id = any($3) and endpoint_id = $2",
        )
        .await?;
    Ok(c.execute(&stmt, &[message, &sender, &ids]).await?)
}

/// Takes the links of message `message` if it was not written after all (refused, or a retry its
/// first send answered); a message that was written, whatever its sender heard, keeps them.
pub(crate) async fn unlink(c: &impl GenericClient, message: &MessageId) -> Result<u64> {
    let sql = "delete from message_artifacts a
               where a.message_id = $1 and not exists (select 1 from messages m where m.id = $1)";
    Ok(c.execute(sql, &[message]).await?)
}

/// The sender's uploads `ids`, attached to a message now written: spent, so they count once.
pub(crate) async fn spend(c: &impl GenericClient, sender: EndpointId, ids: &[String]) -> Result<u64> {
    Ok(c.execute("delete from artifact_uploads where id = any($2) and endpoint_id = $1", &[&sender, &ids]).await?)
}

/// The files of messages `ids`, by message, each message's by name: one statement, none for no ids.
pub(crate) async fn files_of(c: &impl GenericClient, ids: &[&str]) -> Result<HashMap<String, Vec<Attached>>> {
    let mut files: HashMap<String, Vec<Attached>> = HashMap::new();
    if ids.is_empty() {
        return Ok(files);
    }
    let stmt = c
        .prepare_cached(
            "select message_id, name, sha256, size, is_binary, redacted from message_artifacts
             where message_id = any($1) order by message_id, name",
        )
        .await?;
    for row in c.query(&stmt, &[&ids]).await? {
        files.entry(row.col("message_id")?).or_default().push(Attached::from_row(&row)?);
    }
    Ok(files)
}

/// File `name` of message `message`, for a person of `account`: a message its agents sent or
/// received (not withdrawn), not private (as the activity page shows them) unless it is held for
/// the account's review or was sent to its people.
pub(crate) async fn fetch_for_account(
    c: &impl GenericClient,
    account: AccountId,
    message: &str,
    name: &str,
) -> Result<(Attached, Vec<u8>)> {
    let stmt = c
        .prepare_cached(&format!(
            "select a.name, a.sha256, a.size, a.is_binary, a.redacted, b.content
             from messages m
             join message_artifacts a on a.message_id = m.id and a.name = $3
             join artifact_blobs b on b.sha256 = a.sha256
             join endpoint_addresses s on s.id = m.sender_id
             where m.id = $1
               -- Private messages stay off the activity page; one held for the account's review, or
               -- sent to its people, is theirs to see.
               and (not m.private
                    or exists (select 1 from holds h where h.message_id = m.id and h.account_id = $2)
                    or exists (select 1 from deliveries d join endpoint_addresses r on r.id = d.recipient_id
                               where d.message_id = m.id and r.account_id = $2 and r.machine = '{HUMAN}'))
               and (s.account_id = $2
                    or exists (select 1 from deliveries d join endpoint_addresses r on r.id = d.recipient_id
                               where d.message_id = m.id and r.account_id = $2 and d.state <> {WITHDRAWN}))"
        ))
        .await?;
    let row = c.query_opt(&stmt, &[&message, &account, &name]).await?.ok_or_else(|| {
        Error::not_found(
            EntityKind::Attachment,
            format!("no file {name:?} on a message your account's agents exchanged"),
        )
    })?;
    Ok((Attached::from_row(&row)?, row.col("content")?))
}

/// A message the caller may read (received and not withdrawn, or sent), named as `relay_reply`
/// names one.
pub(crate) async fn readable(c: &impl GenericClient, caller: &Caller, reference: &MessageRef) -> Result<MessageId> {
    let e = match super::messages::resolve_received(c, caller, reference).await {
        Ok(id) => return Ok(id),
        Err(e) => Error::from(e),
    };
    let (Error::NotFound { .. }, MessageRef::Text(text)) = (&e, reference) else { return Err(e.into()) };
    let sent = super::messages::sent_like(c, caller.endpoint_id, text).await?;
    if sent.is_empty() {
        return Err(e.into());
    }
    Ok(pick_named(text, sent)?)
}

/// File `name` of message `message`, with its content, if the caller may read the message.
pub(crate) async fn fetch(
    c: &impl GenericClient,
    caller: &Caller,
    message: &MessageId,
    name: &str,
) -> Result<(Attached, Vec<u8>)> {
    let stmt = c
        .prepare_cached(&format!(
            "select a.name, a.sha256, a.size, a.is_binary, a.redacted, (a.name = $3) as wanted,
                    (select b.content from artifact_blobs b where b.sha256 = a.sha256 and a.name = $3) as content
             from messages m
             join message_artifacts a on a.message_id = m.id
             where m.id = $1
               and (m.sender_id = $2
                    or exists (select 1 from deliveries d
                               where d.message_id = m.id and d.recipient_id = $2 and d.state <> {WITHDRAWN}))
             order by a.name"
        ))
        .await?;
    // The content of the one asked for only; the others' names say what there is.
    let rows = c.query(&stmt, &[message, &caller.endpoint_id, &name]).await?;
    if let Some(row) = rows.iter().find(|r| r.get::<_, bool>("wanted")) {
        let content: Option<Vec<u8>> = row.col("content")?;
        let content = content.ok_or_else(|| Error::Internal("a file's content is missing".into()))?;
        return Ok((Attached::from_row(row)?, content));
    }
    let names: Vec<String> = rows.iter().map(|r| r.col("name")).collect::<Result<_>>()?;
    let short = &message.as_str()[..message.as_str().len().min(8)];
    Err(Error::not_found(
        EntityKind::Attachment,
        if names.is_empty() {
            format!("message {short} carries no files you may fetch")
        } else {
            format!("message {short} carries no file {name:?}; it carries: {}", names.join(", "))
        },
    )
    .into())
}

/// Deletes up to `batch` of each: uploads no send attached within the hour, links whose message
/// was never written or is gone, and contents nothing refers to (left for an hour after their last
/// upload, which an upload under way may still attach).
pub(crate) async fn purge(c: &impl GenericClient, batch: i64) -> Result<u64> {
    let uploads = c
        .execute(
            "with doomed as (
                 select id from artifact_uploads where created_at < now() - make_interval(secs => $1)
                 order by created_at limit $2 for update skip locked)
             delete from artifact_uploads u using doomed where u.id = doomed.id",
            &[&UPLOAD_KEPT_S, &batch],
        )
        .await?;
    let links = c
        .execute(
            "with doomed as (
                 select message_id, name from message_artifacts a
                 -- A day's links past the hour: a message is written within seconds of its
                 -- links, or never; a purged message takes its own links.
                 where a.created_at < now() - make_interval(secs => $1)
                   and a.created_at > now() - make_interval(secs => $1) - interval '1 day'
                   and not exists (select 1 from messages m where m.id = a.message_id)
                 limit $2 for update skip locked)
             delete from message_artifacts a using doomed
             where a.message_id = doomed.message_id and a.name = doomed.name",
            &[&UPLOAD_KEPT_S, &batch],
        )
        .await?;
    let blobs = c
        .execute(
            "with doomed as (
                 select sha256 from artifact_blobs b
                 where b.used_at < now() - make_interval(secs => $1)
                   and not exists (select 1 from artifact_uploads u where u.sha256 = b.sha256)
                   and not exists (select 1 from message_artifacts a where a.sha256 = b.sha256)
                 limit $2 for update skip locked)
             delete from artifact_blobs b using doomed where b.sha256 = doomed.sha256",
            &[&UPLOAD_KEPT_S, &batch],
        )
        .await?;
    Ok(uploads + links + blobs)
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::domain::artifact::{Limits, prepare};
    use crate::domain::delivery::State;
    use crate::domain::ids::Seq;
    use crate::store::identity::caller_of;
    use crate::store::messages::{Target, advance};
    use crate::store::retention::purge_messages;
    use crate::store::testing;

    fn file(name: &str, data: &[u8]) -> Prepared {
        prepare(name, data.len() as u64, &hex::encode(Sha256::digest(data)), data.to_vec(), &Limits::default()).unwrap()
    }

    async fn count(c: &impl GenericClient, table: &str) -> i64 {
        c.query_one(&format!("select count(*) from {table}"), &[]).await.unwrap().get(0)
    }

    #[tokio::test]
    async fn files_live_while_something_refers_to_them_and_go_with_their_messages() {
        let db = testing::db().await;
        let (account_id, machine) = db.machine("acme", "laptop").await;
        let (ann, bob) = (db.endpoint(machine, "ann", 0).await, db.endpoint(machine, "bob", 0).await);
        let c = db.store.client().await.unwrap();
        let sender = caller_of(&c, ann).await.unwrap();
        let same = file("a.txt", b"same words");
        assert!(upload(&c, &sender, "up_1", &same, 1 << 20).await.unwrap());
        assert!(upload(&c, &sender, "up_2", &file("b.txt", b"same words"), 1 << 20).await.unwrap());
        assert!(upload(&c, &sender, "up_3", &file("c.bin", &[0, 1, 2]), 1 << 20).await.unwrap());
        assert_eq!(count(&c, "artifact_blobs").await, 2, "one content for two uploads of the same words");
        assert_eq!(held(&c, &sender).await.unwrap(), 23, "each upload counts");
        assert!(!upload(&c, &sender, "up_4", &file("d.txt", b"1234"), 26).await.unwrap(), "past the account's room");
        assert_eq!(count(&c, "artifact_uploads").await, 3, "nothing of a refused upload");

        // A send links its uploads; readers see them with the message.
        let to_bob = [Target { id: bob, address: "acme/laptop/bob".into(), account_id }];
        let message = db.send(ann, &to_bob, "files", None, None).await;
        assert_eq!(link(&c, &message, ann, &["up_1".into(), "up_3".into()]).await.unwrap(), 2);
        assert_eq!(link(&c, &message, bob, &["up_2".into()]).await.unwrap(), 0, "only the uploader attaches");
        let (read, _) = crate::store::messages::take_unread(&c, bob, 10, State::Surfaced).await.unwrap();
        assert_eq!(read[0].attachments.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["a.txt", "c.bin"]);
        let bobs = caller_of(&c, bob).await.unwrap();
        let (got, content) = fetch(&c, &bobs, &message, "c.bin").await.unwrap();
        assert!(got.binary && content == [0, 1, 2]);

        // Within the hour nothing goes; past it, the upload no send took and the blob only it
        // held go, and a link whose message was never written.
        let ghost = MessageId::new("never-written".to_owned());
        link(&c, &ghost, ann, &["up_2".into()]).await.unwrap();
        assert_eq!(purge(&c, 100).await.unwrap(), 0);
        for table in ["artifact_uploads", "message_artifacts"] {
            c.execute(&format!("update {table} set created_at = now() - interval '2 hours'"), &[]).await.unwrap();
        }
        c.execute("update artifact_blobs set used_at = now() - interval '2 hours'", &[]).await.unwrap();
        assert_eq!(purge(&c, 100).await.unwrap(), 3 + 1, "three uploads, the ghost's link, no content in use");
        assert_eq!((count(&c, "message_artifacts").await, count(&c, "artifact_blobs").await), (2, 2));

        // The message read and past its retention: its links go with it, then their contents.
        advance(&c, bob, &[Seq(1)], State::Read).await.unwrap();
        c.execute("update messages set created_at = now() - interval '2 hours'", &[]).await.unwrap();
        assert_eq!(purge_messages(&c, 3600.0, 10).await.unwrap(), 1);
        assert_eq!(count(&c, "message_artifacts").await, 0);
        assert_eq!(purge(&c, 100).await.unwrap(), 2);
        assert_eq!(count(&c, "artifact_blobs").await, 0);
    }
}
