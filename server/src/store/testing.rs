//! The store's own tests: each runs on a database of its own on the test run's Postgres (the
//! throwaway cluster relay-tests starts, or `DATABASE_URL`), migrated as a server migrates it, and
//! calls the repositories directly — no gRPC, no application layer.

use relay_tests::pg::TestDb;

use super::board::{NewJob, insert_job, insert_repo};
use super::identity::caller_of;
use super::messages::write::{NewMessage, Written, write_one};
use super::messages::{Outgoing, Target};
use super::{DbConfig, Store, migrate};
use crate::domain::caller::MachineIdentity;
use crate::domain::delivery::Kind;
use crate::domain::ids::{self, AccountId, EndpointId, JobId, MachineId, MessageId, ReplicaId, RepoId};
use crate::domain::redact::RedactedText;

/// A migrated database of this test's own, and the store on it.
pub struct Db {
    pub store: Store,
    /// Kept so the database outlives the test's use of it.
    pub test: TestDb,
}

pub async fn db() -> Db {
    let test = TestDb::new().await;
    let config = DbConfig::parse(&test.url, 4, None).expect("the test database's url");
    let store = Store::connect(config).await.expect("connect to the test database");
    migrate::apply(store.config()).await.expect("migrate the test database");
    Db { store, test }
}

impl Db {
    /// An account and one machine of it, written as `admin` writes them.
    pub async fn machine(&self, account: &str, machine: &str) -> (AccountId, MachineId) {
        let sql = self.test.sql().await;
        let account: i64 = sql
            .query_one("insert into accounts (name) values ($1) on conflict (name) do update set name = excluded.name returning id", &[&account])
            .await
            .unwrap()
            .get(0);
        let hash = format!("{account}/{machine}").into_bytes();
        let machine: i64 = sql
            .query_one(
                "insert into machines (account_id, name, token_hash) values ($1, $2, $3) returning id",
                &[&account, &machine, &hash],
            )
            .await
            .unwrap()
            .get(0);
        (AccountId(account), MachineId(machine))
    }

    /// An endpoint `handle` of `machine`, as a claim leaves it, with `unread` messages counted.
    pub async fn endpoint(&self, machine: MachineId, handle: &str, unread: i32) -> EndpointId {
        let sql = self.test.sql().await;
        let row = sql
            .query_one(
                "insert into endpoints (machine_id, handle, unread) values ($1, $2, $3) returning id",
                &[&machine, &handle, &unread],
            )
            .await
            .unwrap();
        EndpointId(row.get(0))
    }

    /// Writes `text` from `from` to `to` as a send stores it, by the writer; a reply when it
    /// answers `reply_to`. Its id.
    pub async fn send(
        &self,
        from: EndpointId,
        to: &[Target],
        text: &str,
        client_id: Option<&str>,
        reply_to: Option<&MessageId>,
    ) -> MessageId {
        let c = self.store.client().await.unwrap();
        let sender = caller_of(&c, from).await.unwrap();
        let body = RedactedText::from_agent(text);
        let kind = if reply_to.is_some() { Kind::Reply } else { Kind::Message };
        let out = Outgoing { kind, client_id, ..Outgoing::notice(&body) };
        let id = ids::new_message_id();
        let thread = match reply_to {
            Some(original) => {
                c.query_one("select thread from messages where id = $1", &[original]).await.unwrap().get(0)
            }
            None => id.to_string(),
        };
        let message = NewMessage::new(&sender, id.clone(), thread, to, &out, reply_to);
        match write_one(&c, &message, 1000, ReplicaId::NONE).await.unwrap() {
            Written::Stored { .. } => id,
            Written::Duplicate => panic!("a duplicate of an earlier send"),
            Written::Refused(why) => panic!("refused: {} {}", why.state, why.message),
        }
    }

    /// Card `id` in To do on repository `/src/app` of `machine`, posted by `pat`.
    pub async fn card(&self, account_id: AccountId, machine_id: MachineId, id: &str) -> JobId {
        let c = self.store.client().await.unwrap();
        // `insert_repo` keys on the ids; the names are read back so the identity is the machine's own.
        let names = c
            .query_one(
                "select m.name, a.name from machines m join accounts a on a.id = m.account_id where m.id = $1",
                &[&machine_id],
            )
            .await
            .unwrap();
        let machine = MachineIdentity { machine_id, machine: names.get(0), account_id, account: names.get(1) };
        insert_repo(&c, &machine, "/src/app", "app", "pat").await.unwrap();
        let repo: i64 = c
            .query_one("select id from repos where machine_id = $1 and path = '/src/app'", &[&machine_id])
            .await
            .unwrap()
            .get(0);
        let id = JobId::new(id);
        let new = NewJob {
            id: &id,
            account_id,
            repo_id: RepoId(repo),
            title: "fix the build",
            detail: "",
            agent: "claude",
            requires_pr: false,
            schedule: None,
            posted_by: "pat",
            paths: &[],
        };
        insert_job(&c, &new).await.unwrap();
        id
    }
}
