//! The sessions of MCP clients at the `/mcp` endpoint (see `protocol::mcp`): what each said when it
//! initialized, kept so any replica carries a session on.

use deadpool_postgres::GenericClient;

use super::row::Col;
use crate::domain::ids::{MachineId, TokenHash};
use crate::store::Result;

/// Keeps (or replaces) the state of session `id_hash` for `ttl_s` seconds.
pub(crate) async fn keep_session(c: &impl GenericClient, id_hash: &TokenHash, state: &str, ttl_s: f64) -> Result<()> {
    c.execute(
        "insert into mcp_sessions (id_hash, state, expires_at) values ($1, $2, now() + make_interval(secs => $3))
         on conflict (id_hash) do update set state = excluded.state, expires_at = excluded.expires_at",
        &[&id_hash, &state, &ttl_s],
    )
    .await?;
    Ok(())
}

/// The state of session `id_hash`, unless it expired or ended; its expiry moves `ttl_s` ahead.
pub(crate) async fn session(c: &impl GenericClient, id_hash: &TokenHash, ttl_s: f64) -> Result<Option<String>> {
    let stmt = c
        .prepare_cached(
            "update mcp_sessions set expires_at = now() + make_interval(secs => $2)
             where id_hash = $1 and expires_at > now()
             returning state",
        )
        .await?;
    c.query_opt(&stmt, &[&id_hash, &ttl_s]).await?.map(|row| row.only()).transpose()
}

pub(crate) async fn end_session(c: &impl GenericClient, id_hash: &TokenHash) -> Result<()> {
    c.execute("delete from mcp_sessions where id_hash = $1", &[&id_hash]).await?;
    Ok(())
}

/// Deletes up to `batch` expired sessions.
pub(crate) async fn purge_sessions(c: &impl GenericClient, batch: i64) -> Result<u64> {
    let sql = "with doomed as (
                   select id_hash from mcp_sessions where expires_at < now()
                   order by expires_at limit $1 for update skip locked)
               delete from mcp_sessions s using doomed where s.id_hash = doomed.id_hash";
    Ok(c.execute(sql, &[&batch]).await?)
}

/// Keeps the events of answer streams for `ttl_s` seconds, in one statement: row `i` is event
/// `seqs[i]` of stream `streams[i]`, which only machine `machines[i]` reads back.
pub(crate) async fn keep_answers(
    c: &impl GenericClient,
    streams: &[&[u8]],
    seqs: &[i32],
    machines: &[MachineId],
    data: &[&str],
    ttl_s: f64,
) -> Result<()> {
    let stmt = c
        .prepare_cached(
            "insert into mcp_answers (stream, seq, machine_id, data, kept_until)
             select e.stream, e.seq, e.machine_id, e.data, now() + make_interval(secs => $5)
             from unnest($1::bytea[], $2::integer[], $3::bigint[], $4::text[]) as e (stream, seq, machine_id, data)
             on conflict (stream, seq) do nothing",
        )
        .await?;
    c.execute(&stmt, &[&streams, &seqs, &machines, &data, &ttl_s]).await?;
    Ok(())
}

/// The kept events of answer stream `stream` of `machine`, in order; empty when none is kept.
pub(crate) async fn answer(c: &impl GenericClient, stream: &[u8], machine: MachineId) -> Result<Vec<(i32, String)>> {
    let stmt = c
        .prepare_cached(
            "select seq, data from mcp_answers
             where stream = $1 and machine_id = $2 and kept_until > now() order by seq",
        )
        .await?;
    let rows = c.query(&stmt, &[&stream, &machine]).await?;
    rows.iter().map(|row| Ok((row.col("seq")?, row.col("data")?))).collect()
}

/// Deletes up to `batch` answers kept past their time.
pub(crate) async fn purge_answers(c: &impl GenericClient, batch: i64) -> Result<u64> {
    let sql = "with doomed as (
                   select stream, seq from mcp_answers where kept_until < now()
                   order by kept_until limit $1 for update skip locked)
               delete from mcp_answers a using doomed where a.stream = doomed.stream and a.seq = doomed.seq";
    Ok(c.execute(sql, &[&batch]).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    const TTL: f64 = 600.0;

    fn hash(id: &str) -> TokenHash {
        crate::domain::ids::token_hash(id)
    }

    #[tokio::test]
    async fn a_session_reads_back_as_kept_until_it_ends_and_keeping_it_again_replaces_it() {
        let db = testing::db().await;
        let c = db.store.client().await.unwrap();
        assert_eq!(session(&c, &hash("s1"), TTL).await.unwrap(), None, "nothing is kept before");
        keep_session(&c, &hash("s1"), "first", TTL).await.unwrap();
        keep_session(&c, &hash("s2"), "other", TTL).await.unwrap();
        assert_eq!(session(&c, &hash("s1"), TTL).await.unwrap().as_deref(), Some("first"));
        keep_session(&c, &hash("s1"), "second", TTL).await.unwrap();
        assert_eq!(session(&c, &hash("s1"), TTL).await.unwrap().as_deref(), Some("second"));
        end_session(&c, &hash("s1")).await.unwrap();
        assert_eq!(session(&c, &hash("s1"), TTL).await.unwrap(), None);
        assert_eq!(session(&c, &hash("s2"), TTL).await.unwrap().as_deref(), Some("other"), "only that one ends");
        end_session(&c, &hash("s1")).await.unwrap();
    }

    #[tokio::test]
    async fn a_session_read_in_time_lives_on_and_one_past_its_time_is_gone_and_purged() {
        let db = testing::db().await;
        let c = db.store.client().await.unwrap();
        keep_session(&c, &hash("old"), "state", -1.0).await.unwrap();
        keep_session(&c, &hash("young"), "state", 1.0).await.unwrap();
        // Read within its time, a session's time starts again.
        assert!(session(&c, &hash("young"), TTL).await.unwrap().is_some());
        assert_eq!(session(&c, &hash("old"), TTL).await.unwrap(), None, "past its time, it is not read");
        assert_eq!(purge_sessions(&c, 100).await.unwrap(), 1);
        assert_eq!(purge_sessions(&c, 100).await.unwrap(), 0);
        assert!(session(&c, &hash("young"), TTL).await.unwrap().is_some(), "the purge took only the expired one");
    }

    #[tokio::test]
    async fn an_answer_reads_back_in_order_only_by_its_machine_and_is_purged_past_its_time() {
        let db = testing::db().await;
        let (_, mine) = db.machine("acme", "cloud").await;
        let (_, theirs) = db.machine("globex", "box").await;
        let c = db.store.client().await.unwrap();
        let (a, b, old) = ([1u8; 16], [2u8; 16], [3u8; 16]);
        let streams: [&[u8]; 5] = [&a, &a, &a, &b, &old];
        keep_answers(&c, &streams[..4], &[2, 0, 1, 0], &[mine, mine, mine, theirs], &["two", "", "one", "b"], TTL)
            .await
            .unwrap();
        keep_answers(&c, &streams[4..], &[0], &[mine], &["old"], -1.0).await.unwrap();
        let read = answer(&c, &a, mine).await.unwrap();
        assert_eq!(read, vec![(0, String::new()), (1, "one".into()), (2, "two".into())], "in seq order");
        assert!(answer(&c, &a, theirs).await.unwrap().is_empty(), "another machine reads nothing");
        assert!(answer(&c, &[9u8; 16], mine).await.unwrap().is_empty(), "nor does an unknown stream");
        // Written again (a retried batch), an event keeps what it first said.
        keep_answers(&c, &streams[..1], &[1], &[mine], &["changed"], TTL).await.unwrap();
        assert_eq!(answer(&c, &a, mine).await.unwrap()[1].1, "one");
        assert!(answer(&c, &old, mine).await.unwrap().is_empty(), "past its time, it is not read");
        assert_eq!(purge_answers(&c, 100).await.unwrap(), 1);
        assert_eq!(answer(&c, &a, mine).await.unwrap().len(), 3, "the purge took only the expired one");
    }
}
