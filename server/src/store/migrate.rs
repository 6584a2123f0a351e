//! Numbered SQL migrations embedded in the binary, applied under an advisory lock so that replicas
//! starting together apply each one exactly once.

use deadpool_postgres::Client;

use crate::domain::{Error, Result};

struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "identity_and_messaging",
        sql: include_str!("../../migrations/0001_identity_and_messaging.sql"),
    },
    Migration {
        version: 2,
        name: "scope_contacts_groups",
        sql: include_str!("../../migrations/0002_scope_contacts_groups.sql"),
    },
    Migration { version: 3, name: "board", sql: include_str!("../../migrations/0003_board.sql") },
    Migration { version: 4, name: "trust", sql: include_str!("../../migrations/0004_trust.sql") },
    Migration { version: 5, name: "approvals", sql: include_str!("../../migrations/0005_approvals.sql") },
    Migration {
        version: 6,
        name: "stream_generation",
        sql: include_str!("../../migrations/0006_stream_generation.sql"),
    },
    Migration { version: 7, name: "stream_open", sql: include_str!("../../migrations/0007_stream_open.sql") },
    Migration { version: 8, name: "message_threads", sql: include_str!("../../migrations/0008_message_threads.sql") },
];

/// Arbitrary but fixed: every replica must take the same lock.
const LOCK_KEY: i64 = 0x5245_4c41_5900_0001;

/// Applies pending migrations and returns the versions applied now.
pub async fn run(client: &mut Client) -> Result<Vec<i32>> {
    client.execute("select pg_advisory_lock($1)", &[&LOCK_KEY]).await?;
    let outcome = apply_pending(client).await;
    // Unlock even on failure; if this fails too the session's end releases the lock.
    let unlocked = client.execute("select pg_advisory_unlock($1)", &[&LOCK_KEY]).await;
    let applied = outcome?;
    unlocked?;
    Ok(applied)
}

async fn apply_pending(client: &mut Client) -> Result<Vec<i32>> {
    client
        .batch_execute(
            "create table if not exists schema_migrations (
                 version    integer primary key,
                 name       text not null,
                 applied_at timestamptz not null default now()
             )",
        )
        .await?;
    let done: Vec<i32> =
        client.query("select version from schema_migrations", &[]).await?.iter().map(|r| r.get(0)).collect();
    let newest_known = MIGRATIONS.last().map_or(0, |m| m.version);
    if let Some(unknown) = done.iter().copied().filter(|v| *v > newest_known).max() {
        return Err(Error::FailedPrecondition(format!(
            "the database schema is at version {unknown}, newer than this relay-server knows ({newest_known}): upgrade relay-server"
        )));
    }
    let mut applied = Vec::new();
    for migration in MIGRATIONS.iter().filter(|m| !done.contains(&m.version)) {
        let tx = client.transaction().await?;
        tx.batch_execute(migration.sql).await.map_err(|e| {
            Error::Internal(format!("migration {} ({}) failed: {e}", migration.version, migration.name))
        })?;
        tx.execute(
            "insert into schema_migrations (version, name) values ($1, $2)",
            &[&migration.version, &migration.name],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(version = migration.version, name = migration.name, "applied migration");
        applied.push(migration.version);
    }
    Ok(applied)
}
