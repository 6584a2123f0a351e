//! Numbered SQL migrations embedded in the binary. Each applied one is recorded with the SHA-256 of
//! its SQL, so a migration edited after release is refused at start instead of silently differing
//! between databases. They run under an advisory lock held on a connection of their own, so that
//! replicas starting together apply each one exactly once.
//!
//! SQL functions are not written in numbered migrations: each one's current body lives in
//! `server/migrations/functions/NAME.sql` ([`FUNCTIONS`]), applied after the migrations whenever
//! its revision is newer than the one the database records, so an older binary never puts its
//! bodies back over a newer one's.
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

// The numbered migrations, found in `server/migrations/` by the build script, in order.
include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// A SQL function whose current body is the file `server/migrations/functions/NAME.sql` (a
/// `create or replace function`, with its settings).
#[derive(Debug, Clone, Copy)]
pub struct Function {
    pub name: &'static str,
    /// Raised with every change to the file. A database keeps the body of the highest revision it
    /// was given: a binary holding a lower one (rolled back) leaves the newer body in place.
    pub revision: i32,
    /// The start of the file's checksum at this revision. A test compares it with the file, so a
    /// change to the file cannot land without a new revision.
    pub released: &'static str,
    pub sql: &'static str,
}

impl Function {
    /// The file it was embedded from.
    pub fn file(&self) -> String {
        format!("functions/{}.sql", self.name)
    }

    /// Hex SHA-256 of the SQL, line endings normalised as for migrations.
    pub fn checksum(&self) -> String {
        hex::encode(Sha256::digest(self.sql.replace("\r\n", "\n").as_bytes()))
    }
}

macro_rules! function {
    ($name:literal, $revision:literal, $released:literal) => {
        Function {
            name: $name,
            revision: $revision,
            released: $released,
            sql: include_str!(concat!("../../migrations/functions/", $name, ".sql")),
        }
    };
}

/// Every SQL function of the schema, in the order they are applied: a SQL-language function's body
/// is checked when it is made, so what it calls comes first. To change one, edit its file, raise its
/// revision and put the new checksum's start in `released`; the body must answer the release before
/// it as the old one did (the same rule as migrations). A function whose signature changes is
/// dropped by a numbered migration first (`create or replace` cannot change it).
pub const FUNCTIONS: &[Function] = &[
    function!("relay_state", 1, "6024f2743ec77953"),
    function!("relay_replica_alive", 1, "595007b37751baae"),
    function!("relay_endpoint_lease", 1, "903e748184c42da9"),
    function!("relay_endpoint_online", 1, "39a38ea24441b910"),
    function!("relay_delivery_state", 1, "1ea7c3db9bd99911"),
    function!("relay_count_unread", 1, "0411dc6d368e73a0"),
    function!("relay_endpoint_changed", 1, "c3d4df4cc3ef900b"),
    function!("relay_machine_changed", 1, "cd37b408e257928e"),
    function!("relay_scope_changed", 1, "bb392aaac4f1afee"),
    function!("relay_operator_changed", 1, "d2e6d57461768839"),
    function!("relay_attempt_ended", 1, "35416852799637f2"),
    function!("relay_account_changed", 1, "f3821743e1e805bc"),
    function!("relay_console_sessions_ended", 1, "449e66fcbe586b7d"),
    function!("relay_announce_delivered", 1, "cebf45f20a40b44c"),
    function!("relay_lock_inboxes", 1, "91a41eaf66e445d9"),
    function!("relay_refuse", 1, "262e285accc4338d"),
    function!("relay_write_send_set", 2, "fd85b4982f8b1831"),
    function!("relay_write_send_numbered", 3, "5b74481a07d3c6e7"),
    function!("relay_write_sends_numbered", 2, "fedbdfb020712af1"),
    function!("relay_write_send_plain", 2, "a0217a7864d83728"),
    function!("relay_write_sends_plain", 3, "c22435d97f36f79b"),
    function!("relay_write_release", 2, "a212951def9475f9"),
    function!("relay_unread", 1, "abc7943ddc4dfc81"),
    function!("relay_advance", 1, "31b3d10f9f1f0c11"),
    function!("relay_take_unread", 1, "761588528b9e860e"),
    function!("relay_look", 1, "bd5da9621244fbb4"),
    function!("relay_announce", 1, "ca35f6ae79c21f6b"),
    function!("relay_mark_pushed", 1, "de6a75c25cefeb8e"),
    function!("relay_messages_deleted", 1, "16771ba567baf3be"),
    function!("relay_endpoints_deleted", 1, "149a72e89cb7ce9d"),
    function!("relay_search_queued", 1, "a9d16ddc2b0b1309"),
    function!("relay_search_words", 1, "fdcfd3b94d28d32c"),
    function!("relay_search_query", 1, "9422d5201c186378"),
    function!("relay_search_readers_change", 1, "c7ef04a869b56319"),
    function!("relay_messages_unsearched", 1, "0db66da1f42aeec4"),
    function!("relay_deliveries_unsearched", 1, "280df24200fe4ec5"),
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
    #[error(
        "function {name} ({file}) differs from the body the database holds at the same revision {revision}: the database recorded checksum {recorded}, the file built into this relay-server hashes to {embedded}; a changed function needs a new revision"
    )]
    FunctionEdited { name: String, file: String, revision: i32, recorded: String, embedded: String },
    #[error("function {name} ({file}) failed: {error}")]
    FunctionFailed { name: String, file: String, error: tokio_postgres::Error },
    #[error("cannot read or write the schema history: {0}")]
    History(#[from] tokio_postgres::Error),
}

impl From<MigrateError> for Error {
    fn from(e: MigrateError) -> Self {
        match e {
            MigrateError::Connect(_) => Error::Unavailable(e.to_string()),
            MigrateError::Edited { .. } | MigrateError::FunctionEdited { .. } => {
                Error::FailedPrecondition(e.to_string())
            }
            MigrateError::Failed { .. } | MigrateError::FunctionFailed { .. } | MigrateError::History(_) => {
                Error::Internal(e.to_string())
            }
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
    /// Functions whose body this run applied.
    pub functions: Vec<&'static str>,
    /// Functions the database holds at a newer revision than this binary's, left as they are.
    pub functions_ahead: Vec<&'static str>,
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
    // Notices (`… already exists, skipping`) say nothing an operator needs at every start.
    let settings = format!("set lock_timeout = '{LOCK_TIMEOUT}'; set client_min_messages = warning");
    let outcome = match client.batch_execute(&settings).await {
        Ok(()) => match apply_pending(client, MIGRATIONS).await {
            Ok(report) => apply_functions(client, FUNCTIONS, report).await,
            Err(e) => Err(e),
        },
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
        .map(|r| Ok((r.try_get("version")?, r.try_get("checksum")?)))
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

/// Applies the functions whose revision is newer than the database's, all in one transaction, and
/// records each one's revision and checksum.
async fn apply_functions(
    client: &mut Client,
    functions: &[Function],
    mut report: Report,
) -> Result<Report, MigrateError> {
    client
        .batch_execute(
            "create table if not exists schema_functions (
                 name       text primary key,
                 revision   integer not null,
                 checksum   text not null,
                 applied_at timestamptz not null default now()
             )",
        )
        .await?;
    let recorded: Vec<(String, i32, String)> = client
        .query("select name, revision, checksum from schema_functions", &[])
        .await?
        .iter()
        .map(|r| Ok((r.try_get("name")?, r.try_get("revision")?, r.try_get("checksum")?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;

    let mut pending = Vec::new();
    for function in functions {
        let embedded = function.checksum();
        match recorded.iter().find(|(name, ..)| name == function.name) {
            Some((_, revision, _)) if *revision > function.revision => report.functions_ahead.push(function.name),
            Some((_, revision, checksum)) if *revision == function.revision => {
                if *checksum != embedded {
                    return Err(MigrateError::FunctionEdited {
                        name: function.name.to_owned(),
                        file: function.file(),
                        revision: *revision,
                        recorded: checksum.clone(),
                        embedded,
                    });
                }
            }
            _ => pending.push((function, embedded)),
        }
    }
    if !report.functions_ahead.is_empty() {
        tracing::warn!(
            functions = ?report.functions_ahead,
            "the database holds newer bodies of functions than this relay-server knows; keeping them, as each keeps the previous release working"
        );
    }
    if pending.is_empty() {
        return Ok(report);
    }
    let tx = client.transaction().await?;
    for (function, checksum) in pending {
        let failed =
            |error| MigrateError::FunctionFailed { name: function.name.to_owned(), file: function.file(), error };
        tx.batch_execute(function.sql).await.map_err(failed)?;
        tx.execute(
            "insert into schema_functions (name, revision, checksum) values ($1, $2, $3)
             on conflict (name) do update set revision = excluded.revision, checksum = excluded.checksum, applied_at = now()",
            &[&function.name, &function.revision, &checksum],
        )
        .await?;
        report.functions.push(function.name);
    }
    tx.commit().await?;
    tracing::info!(functions = ?report.functions, "applied functions");
    Ok(report)
}

#[cfg(test)]
mod tests {
    //! The expand/contract rule, as far as a program can read it from the SQL.

    use super::*;

    /// Versions released before the lock rule that build a plain index on a table an earlier
    /// migration created. They ran once per database; the rule binds every migration after them.
    const PLAIN_INDEX_BEFORE_THE_RULE: &[i32] = &[2, 8];

    /// Versions that dropped triggers to make them again at once, before drops were linted.
    const TRIGGERS_REMADE_BEFORE_THE_RULE: &[i32] = &[10];

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
        let rules: [(&str, &str); 8] = [
            (r"\bdrop\s+function\b", "drop function"),
            (r"\bdrop\s+trigger\b", "drop trigger"),
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
            let mut steps = contract_steps(&code);
            if TRIGGERS_REMADE_BEFORE_THE_RULE.contains(&version) {
                steps.retain(|step| *step != "drop trigger");
            }
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
        assert_eq!(lint("drop function relay_look(bigint);").len(), 1);
        assert_eq!(lint("drop trigger jobs_shown on jobs;").len(), 1);
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
    fn every_function_file_is_applied_once_at_the_revision_of_its_text() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/functions");
        let mut files: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        files.sort();
        let mut listed: Vec<String> = FUNCTIONS.iter().map(|f| format!("{}.sql", f.name)).collect();
        listed.sort();
        assert_eq!(files, listed, "every file in server/migrations/functions is listed in FUNCTIONS, once");

        let define = regex::Regex::new(r"(?i)\bcreate\s+or\s+replace\s+function\s+([a-z_][a-z0-9_]*)\s*\(").unwrap();
        for f in FUNCTIONS {
            let defined: Vec<&str> = define.captures_iter(f.sql).map(|c| c.get(1).unwrap().as_str()).collect();
            assert_eq!(defined, [f.name], "{} defines its function, and only it, with create or replace", f.file());
            assert!(
                f.checksum().starts_with(f.released),
                "{} changed at revision {}: raise the revision to {} and set its checksum to \"{}\"",
                f.file(),
                f.revision,
                f.revision + 1,
                &f.checksum()[..16]
            );
            assert!(f.revision >= 1, "{}: revisions start at 1", f.file());
        }
    }

    /// From migration 36 on a function's body is its file's. A migration may create a function
    /// only for a trigger it makes (which needs the function before the files are applied), and
    /// then with its file's body exactly, so the two never differ.
    #[test]
    fn no_function_body_is_written_in_a_migration_after_the_files_took_over() {
        let define =
            regex::Regex::new(r"(?is)\bcreate\s+(or\s+replace\s+)?function\s+(\w+)\(.*?\$function\$;").unwrap();
        for m in MIGRATIONS.iter().filter(|m| m.version >= 36) {
            for created in define.captures_iter(m.sql) {
                let name = &created[2];
                let file = FUNCTIONS.iter().find(|f| f.name == name);
                let file = file
                    .unwrap_or_else(|| panic!("{} writes {name}, which has no file in migrations/functions", m.file()));
                assert!(
                    file.sql.contains(&created[0]),
                    "{} writes {name} unlike {}: a migration creates a trigger's function with its file's body",
                    m.file(),
                    file.file()
                );
                let returns_trigger = created[0].contains("returns trigger");
                assert!(
                    returns_trigger,
                    "{} writes {name}, which is no trigger's: its body goes in its file only",
                    m.file()
                );
            }
        }
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
