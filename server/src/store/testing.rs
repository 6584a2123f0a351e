//! The store's own tests: each runs on a database of its own on the test run's Postgres (the
//! throwaway cluster relay-tests starts, or `DATABASE_URL`), migrated as a server migrates it, and
//! calls the repositories directly — no gRPC, no application layer.

use relay_tests::pg::TestDb;

use super::{DbConfig, Store, migrate};
use crate::domain::ids::{AccountId, EndpointId, MachineId};

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
}
