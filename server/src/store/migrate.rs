//! Numbered SQL migrations embedded in the binary. Each applied one is recorded with the SHA-256 of
//! its SQL, so a migration edited after release is refused at start instead of silently differing
//! between databases. They run under an advisory lock held on a connection of their own, so that
//! replicas starting together apply each one exactly once.
//!
//! The rule that keeps rolling upgrades and rollbacks safe (expand, then contract) is in
//! `server/migrations/README.md`; the lint in this module's tests enforces the part of it a program
//! can see.

use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, NoTls, Socket};

use super::{DbConfig, DbTls};
use crate::domain::Error;

/// One numbered migration, as embedded from `server/migrations/NNNN_name.sql`.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// The file it was embedded from, as an operator would look for it.
    pub fn file(&self) -> String {
        format!("{:04}_{}.sql", self.version, self.name)
    }

    /// Hex SHA-256 of the SQL. Line endings are normalised so that a checkout with CRLF endings
    /// does not look like an edit.
    pub fn checksum(&self) -> String {
        hex::encode(Sha256::digest(self.sql.replace("\r\n", "\n").as_bytes()))
    }

    /// Whether the file asks to run outside a transaction (for `create index concurrently`, which
    /// cannot run inside one): its first line is `-- no-transaction`. Such a file holds one statement.
    pub fn no_transaction(&self) -> bool {
        is_no_transaction(self.sql)
    }
}

fn is_no_transaction(sql: &str) -> bool {
    sql.lines().next().is_some_and(|l| l.trim() == "-- no-transaction")
}

pub const MIGRATIONS: &[Migration] = &[
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
    Migration {
        version: 9,
        name: "replica_presence_and_unread",
        sql: include_str!("../../migrations/0009_replica_presence_and_unread.sql"),
    },
    Migration {
        version: 10,
        name: "unread_counted_by_writers",
        sql: include_str!("../../migrations/0010_unread_counted_by_writers.sql"),
    },
    Migration {
        version: 11,
        name: "scope_changes_announced",
        sql: include_str!("../../migrations/0011_scope_changes_announced.sql"),
    },
    Migration {
        version: 12,
        name: "deliveries_by_message",
        sql: include_str!("../../migrations/0012_deliveries_by_message.sql"),
    },
    Migration { version: 13, name: "messages_by_age", sql: include_str!("../../migrations/0013_messages_by_age.sql") },
    Migration {
        version: 14,
        name: "holds_by_message",
        sql: include_str!("../../migrations/0014_holds_by_message.sql"),
    },
    Migration {
        version: 15,
        name: "approvals_by_card",
        sql: include_str!("../../migrations/0015_approvals_by_card.sql"),
    },
    Migration {
        version: 16,
        name: "finished_cards_by_age",
        sql: include_str!("../../migrations/0016_finished_cards_by_age.sql"),
    },
    Migration { version: 17, name: "peeks_by_age", sql: include_str!("../../migrations/0017_peeks_by_age.sql") },
    Migration {
        version: 18,
        name: "approval_deadlines",
        sql: include_str!("../../migrations/0018_approval_deadlines.sql"),
    },
    Migration {
        version: 19,
        name: "pull_requests_followed",
        sql: include_str!("../../migrations/0019_pull_requests_followed.sql"),
    },
    Migration {
        version: 20,
        name: "card_agent_sessions",
        sql: include_str!("../../migrations/0020_card_agent_sessions.sql"),
    },
    Migration { version: 21, name: "console", sql: include_str!("../../migrations/0021_console.sql") },
    Migration {
        version: 22,
        name: "sends_written_as_sets",
        sql: include_str!("../../migrations/0022_sends_written_as_sets.sql"),
    },
    Migration {
        version: 23,
        name: "deliveries_by_message_once",
        sql: include_str!("../../migrations/0023_deliveries_by_message_once.sql"),
    },
    Migration {
        version: 24,
        name: "advance_reads_before_it_writes",
        sql: include_str!("../../migrations/0024_advance_reads_before_it_writes.sql"),
    },
    Migration {
        version: 25,
        name: "console_sessions_announced",
        sql: include_str!("../../migrations/0025_console_sessions_announced.sql"),
    },
    Migration {
        version: 26,
        name: "a_send_alone_in_one_statement",
        sql: include_str!("../../migrations/0026_a_send_alone_in_one_statement.sql"),
    },
    Migration {
        version: 27,
        name: "unread_read_with_a_kept_plan",
        sql: include_str!("../../migrations/0027_unread_read_with_a_kept_plan.sql"),
    },
    Migration {
        version: 28,
        name: "console_session_ends_apart",
        sql: include_str!("../../migrations/0028_console_session_ends_apart.sql"),
    },
    Migration {
        version: 29,
        name: "pushed_as_a_mark_per_inbox",
        sql: include_str!("../../migrations/0029_pushed_as_a_mark_per_inbox.sql"),
    },
    Migration {
        version: 30,
        name: "writers_answer_seqs",
        sql: include_str!("../../migrations/0030_writers_answer_seqs.sql"),
    },
    Migration {
        version: 31,
        name: "inbox_senders_looked_up_once",
        sql: include_str!("../../migrations/0031_inbox_senders_looked_up_once.sql"),
    },
    Migration {
        version: 32,
        name: "plain_sends_written_apart",
        sql: include_str!("../../migrations/0032_plain_sends_written_apart.sql"),
    },
    Migration {
        version: 33,
        name: "inbox_look_in_one_statement",
        sql: include_str!("../../migrations/0033_inbox_look_in_one_statement.sql"),
    },
    Migration {
        version: 34,
        name: "inbox_look_again_when_changed",
        sql: include_str!("../../migrations/0034_inbox_look_again_when_changed.sql"),
    },
    Migration {
        version: 35,
        name: "mail_announced_once",
        sql: include_str!("../../migrations/0035_mail_announced_once.sql"),
    },
];

/// Arbitrary but fixed: every replica must take the same lock.
const LOCK_KEY: i64 = 0x5245_4c41_5900_0001;
/// How often a replica waiting for another's migrations tries the lock again.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Longest a migration statement waits for a table lock. A DDL statement queued behind a long
/// transaction blocks every query queued behind it, so it is better to fail the start and retry.
const LOCK_TIMEOUT: &str = "10s";

/// Why migrating failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot open the migration connection: {}", super::with_causes(.0))]
    Connect(tokio_postgres::Error),
    #[error(
        "migration {version} ({file}) was changed after it was applied: the database recorded checksum {recorded}, the file built into this relay-server hashes to {embedded}; restore the file as it was released and put the change in a new migration"
    )]
    Edited { version: i32, file: String, recorded: String, embedded: String },
    #[error("migration {version} ({file}) failed: {error}")]
    Failed { version: i32, file: String, error: tokio_postgres::Error },
    #[error("cannot read or write the schema history: {0}")]
    History(#[from] tokio_postgres::Error),
}

impl From<MigrateError> for Error {
    fn from(e: MigrateError) -> Self {
        match e {
            MigrateError::Connect(_) => Error::Unavailable(e.to_string()),
            MigrateError::Edited { .. } => Error::FailedPrecondition(e.to_string()),
            MigrateError::Failed { .. } | MigrateError::History(_) => Error::Internal(e.to_string()),
        }
    }
}

/// What a run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Versions applied by this run.
    pub applied: Vec<i32>,
    /// Versions applied before checksums were kept, whose checksums this run recorded.
    pub backfilled: Vec<i32>,
    /// The database's newest version when it is newer than this binary knows (a rolled-back binary).
    pub database_ahead: Option<i32>,
}

/// Applies pending migrations over a connection opened for this alone and closed afterwards: the
/// session's advisory lock then never reaches a pool, and its end releases the lock even if the
/// explicit unlock could not be sent.
pub async fn apply(config: &DbConfig) -> Result<Report, MigrateError> {
    let (mut client, driver) = match &config.tls {
        DbTls::None => connect(&config.pg, NoTls).await?,
        DbTls::Rustls(tls) => connect(&config.pg, tls.clone()).await?,
    };
    let outcome = locked(&mut client).await;
    drop(client);
    if let Ok(Err(e)) = driver.await {
        tracing::debug!(error = %e, "migration connection ended with an error");
    }
    outcome
}

type Driver = JoinHandle<Result<(), tokio_postgres::Error>>;

async fn connect<T>(pg: &tokio_postgres::Config, tls: T) -> Result<(Client, Driver), MigrateError>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = pg.connect(tls).await.map_err(MigrateError::Connect)?;
    Ok((client, tokio::spawn(connection)))
}

async fn locked(client: &mut Client) -> Result<Report, MigrateError> {
    // Waiting is polling, never a statement blocked on the lock: a blocked statement holds a
    // snapshot, and the other process's `create index concurrently` waits for every snapshot to
    // end, so each would wait for the other.
    let mut told = false;
    // Rows are read with `try_get`: a row of another shape is a history error, never a panic.
    while !client.query_one("select pg_try_advisory_lock($1)", &[&LOCK_KEY]).await?.try_get::<_, bool>(0)? {
        if !std::mem::replace(&mut told, true) {
            tracing::info!("another process is applying migrations; waiting for it");
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    // Set after the advisory lock is taken: waiting for another replica to finish is expected.
    let outcome = match client.batch_execute(&format!("set lock_timeout = '{LOCK_TIMEOUT}'")).await {
        Ok(()) => apply_pending(client, MIGRATIONS).await,
        Err(e) => Err(e.into()),
    };
    // Unlock even on failure; should this fail too, closing the connection releases the lock.
    match client.query_one("select pg_advisory_unlock($1)", &[&LOCK_KEY]).await.and_then(|row| row.try_get(0)) {
        Ok(true) => {}
        Ok(false) => tracing::warn!("the migration lock was not held at unlock"),
        Err(e) => tracing::warn!(error = %e, "cannot release the migration lock; closing the connection releases it"),
    }
    outcome
}

/// The web console's migration was first released as version 19, then renumbered 21 when 19 and 20
/// went to migrations written beside it (the file is unchanged). A database that applied it as 19
/// has its record moved to 21; 19 and 20 are then applied as pending, like any gap.
async fn renumbered_console(client: &Client) -> Result<(), MigrateError> {
    let moved = client
        .execute(
            "update schema_migrations set version = 21
             where version = 19 and name = 'console'
               and not exists (select 1 from schema_migrations where version = 21)",
            &[],
        )
        .await?;
    if moved == 1 {
        tracing::info!("the console's migration, applied as version 19, is recorded as 21, its number now");
    }
    Ok(())
}

async fn apply_pending(client: &mut Client, migrations: &[Migration]) -> Result<Report, MigrateError> {
    // The checksum column came after 1..8 were released: databases that applied those have the
    // table without it. Adding a nullable column only touches the catalog.
    client
        .batch_execute(
            "create table if not exists schema_migrations (
                 version    integer primary key,
                 name       text not null,
                 applied_at timestamptz not null default now()
             );
             alter table schema_migrations add column if not exists checksum text",
        )
        .await?;
    let mut report = Report::default();
    renumbered_console(client).await?;
    let done: Vec<(i32, Option<String>)> = client
        .query("select version, checksum from schema_migrations order by version", &[])
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;

    for (version, recorded) in &done {
        let Some(migration) = migrations.iter().find(|m| m.version == *version) else { continue };
        let embedded = migration.checksum();
        match recorded {
            // Applied before checksums were kept: the file as it is now is taken as what was applied.
            None => {
                client
                    .execute(
                        "update schema_migrations set checksum = $2 where version = $1 and checksum is null",
                        &[version, &embedded],
                    )
                    .await?;
                report.backfilled.push(*version);
            }
            Some(recorded) if *recorded != embedded => {
                return Err(MigrateError::Edited {
                    version: *version,
                    file: migration.file(),
                    recorded: recorded.clone(),
                    embedded,
                });
            }
            Some(_) => {}
        }
    }
    if !report.backfilled.is_empty() {
        tracing::info!(versions = ?report.backfilled, "recorded checksums of migrations applied before checksums were kept");
    }

    let newest_known = migrations.last().map_or(0, |m| m.version);
    if let Some(newest) = done.iter().map(|(v, _)| *v).filter(|v| *v > newest_known).max() {
        // Every migration keeps the release before it working, so an older binary may run on a newer schema.
        tracing::warn!(
            database = newest,
            binary = newest_known,
            "the database schema is newer than this relay-server knows; running anyway, as each migration keeps the previous release working"
        );
        report.database_ahead = Some(newest);
    }

    for migration in migrations.iter().filter(|m| !done.iter().any(|(v, _)| *v == m.version)) {
        let failed = |error| MigrateError::Failed { version: migration.version, file: migration.file(), error };
        let record = "insert into schema_migrations (version, name, checksum) values ($1, $2, $3)";
        let checksum = migration.checksum();
        if migration.no_transaction() {
            // Not atomic with its record: such a statement must be safe to run again (`if not exists`).
            client.batch_execute(migration.sql).await.map_err(failed)?;
            client.execute(record, &[&migration.version, &migration.name, &checksum]).await?;
        } else {
            let tx = client.transaction().await?;
            tx.batch_execute(migration.sql).await.map_err(failed)?;
            tx.execute(record, &[&migration.version, &migration.name, &checksum]).await?;
            tx.commit().await?;
        }
        tracing::info!(version = migration.version, name = migration.name, "applied migration");
        report.applied.push(migration.version);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    //! The expand/contract rule, as far as a program can read it from the SQL.

    use super::*;

    /// Versions released before the lock rule that build a plain index on a table an earlier
    /// migration created. They ran once per database; the rule binds every migration after them.
    const PLAIN_INDEX_BEFORE_THE_RULE: &[i32] = &[2, 8];

    /// The statements of a file, each with the comments that lead into it.
    fn statements(sql: &str) -> Vec<&str> {
        sql.split(';').filter(|s| !code(s).trim().is_empty()).collect()
    }

    /// A statement without its comments, lowercased, on one line.
    fn code(statement: &str) -> String {
        let lines = statement.lines().map(|l| l.split_once("--").map_or(l, |(code, _)| code));
        lines.collect::<Vec<_>>().join(" ").split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
    }

    /// A `-- contract: <reason>` comment marks a deliberate contract step.
    fn contract_reason(statement: &str) -> Option<&str> {
        statement
            .lines()
            .find_map(|l| l.trim().strip_prefix("-- contract:"))
            .map(str::trim)
            .filter(|reason| !reason.is_empty())
    }

    /// What in a statement would break the release before it, unless marked as a contract.
    fn contract_steps(code: &str) -> Vec<&'static str> {
        let rules: [(&str, &str); 6] = [
            (r"\bdrop\s+column\b", "drop column"),
            (r"\bdrop\s+table\b", "drop table"),
            (r"\brename\b", "rename"),
            (r"\balter\s+column\s+\S+\s+(set\s+data\s+)?type\b", "change of a column's type"),
            (r"\bset\s+not\s+null\b", "set not null"),
            (r"\badd\s+column\s+(if\s+not\s+exists\s+)?[^,]*\bnot\s+null\b[^,]*$", "not null column without default"),
        ];
        let mut found = Vec::new();
        for (pattern, what) in rules {
            let re = regex::Regex::new(pattern).unwrap();
            // The add-column rule reads one clause at a time: each ends at a comma.
            let hit = if what.starts_with("not null") {
                code.split(',').any(|clause| re.is_match(clause) && !clause.contains(" default "))
            } else {
                re.is_match(code)
            };
            if hit {
                found.push(what);
            }
        }
        found
    }

    /// Tables a file creates itself: a plain index on one of them takes no lock anyone waits on.
    fn created_tables(sql: &str) -> Vec<String> {
        let re = regex::Regex::new(r"create\s+table\s+(if\s+not\s+exists\s+)?([a-z_][a-z0-9_]*)").unwrap();
        statements(sql).iter().filter_map(|s| re.captures(&code(s)).map(|c| c[2].to_owned())).collect()
    }

    /// A plain `create index` on a table the file did not create blocks writes to it while it builds.
    fn plain_index_on_existing_table(code: &str, created: &[String]) -> Option<String> {
        let re = regex::Regex::new(
            r"create\s+(unique\s+)?index\s+(if\s+not\s+exists\s+)?(\S+\s+)?on\s+(only\s+)?([a-z_][a-z0-9_]*)",
        )
        .unwrap();
        let caps = re.captures(code)?;
        (!code.contains(" concurrently ") && !created.contains(&caps[5].to_owned())).then(|| caps[5].to_owned())
    }

    /// What breaks the rule in the file `file` (version `version`) holding `sql`.
    fn violations(version: i32, file: &str, sql: &str) -> Vec<String> {
        let created = created_tables(sql);
        let mut found = Vec::new();
        for statement in statements(sql) {
            let code = code(statement);
            let steps = contract_steps(&code);
            if !steps.is_empty() && contract_reason(statement).is_none() {
                found.push(format!("{file}: {} in `{code}`", steps.join(", ")));
            }
            if let Some(table) = plain_index_on_existing_table(&code, &created)
                && !PLAIN_INDEX_BEFORE_THE_RULE.contains(&version)
            {
                found.push(format!(
                    "{file}: plain create index on existing table {table} blocks its writes; use create index concurrently in a -- no-transaction file"
                ));
            }
        }
        if is_no_transaction(sql) && statements(sql).len() != 1 {
            found.push(format!("{file}: a -- no-transaction file holds exactly one statement"));
        }
        found
    }

    #[test]
    fn every_migration_keeps_the_previous_release_working() {
        let found: Vec<String> = MIGRATIONS.iter().flat_map(|m| violations(m.version, &m.file(), m.sql)).collect();
        assert!(found.is_empty(), "migrations that break the expand/contract rule:\n{}", found.join("\n"));
    }

    #[test]
    fn migrations_are_numbered_from_one_without_gaps_and_match_their_files() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1, "{}", m.file());
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".sql"))
            .collect();
        files.sort();
        let embedded: Vec<String> = MIGRATIONS.iter().map(Migration::file).collect();
        assert_eq!(files, embedded, "every file in server/migrations is embedded, under its own name");
    }

    #[test]
    fn the_lint_catches_what_breaks_the_previous_release() {
        let lint = |sql: &str| violations(99, "0099_probe.sql", sql);
        assert_eq!(lint("alter table endpoints drop column note;").len(), 1);
        assert_eq!(lint("drop table peeks;").len(), 1);
        assert_eq!(lint("alter table endpoints rename column note to status_note;").len(), 1);
        assert_eq!(lint("alter table jobs rename to cards;").len(), 1);
        assert_eq!(lint("alter table jobs alter column title type varchar(80);").len(), 1);
        assert_eq!(lint("alter table jobs alter column title set not null;").len(), 1);
        assert_eq!(lint("alter table jobs add column weight int not null;").len(), 1);
        assert_eq!(lint("create index jobs_title on jobs (title);").len(), 1);
        assert_eq!(lint("-- no-transaction\ncreate index concurrently a on jobs (x);\nselect 1;").len(), 1);

        // Expansions pass.
        assert!(lint("alter table jobs add column weight int not null default 0, add column note text;").is_empty());
        assert!(lint("create table renamed_things (id bigint primary key);").is_empty(), "a name is not a rename");
        assert!(lint("create table t (id int);\ncreate index t_id on t (id);").is_empty());
        assert!(
            lint("-- no-transaction\ncreate index concurrently if not exists jobs_title on jobs (title);").is_empty()
        );
        // A marked contract passes; an unmarked one beside it does not.
        let marked = "-- contract: nothing reads note since release 0.3\nalter table endpoints drop column note;";
        assert!(lint(marked).is_empty());
        assert_eq!(
            lint("-- contract:\nalter table endpoints drop column note;").len(),
            1,
            "a contract gives its reason"
        );
        assert_eq!(lint(&format!("{marked}\nalter table endpoints drop column other;")).len(), 1);
    }

    #[test]
    fn checksums_are_of_the_sql_and_ignore_line_endings() {
        let lf = Migration { version: 1, name: "a", sql: "create table t (id int);\n" };
        let crlf = Migration { version: 1, name: "a", sql: "create table t (id int);\r\n" };
        let edited = Migration { version: 1, name: "a", sql: "create table t (id bigint);\n" };
        assert_eq!(lf.checksum(), crlf.checksum());
        assert_ne!(lf.checksum(), edited.checksum());
        assert_eq!(lf.checksum().len(), 64);
        assert_eq!(lf.file(), "0001_a.sql");
        assert!(!lf.no_transaction());
        assert!(Migration { sql: "-- no-transaction\ncreate index concurrently x on t (id);", ..lf }.no_transaction());
    }
}
