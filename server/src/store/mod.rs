//! Everything the server keeps lives in Postgres; this module holds all of the SQL.

pub mod approvals;
pub mod board;
pub mod contacts;
mod error;
pub mod identity;
pub mod messages;
pub mod migrate;
pub mod scope;
pub mod spawn;
pub mod trust;

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

pub use error::is_unique_violation;

use crate::domain::{Error, Result};

/// How to reach the database.
#[derive(Clone)]
pub struct DbConfig {
    pub pg: tokio_postgres::Config,
    pub pool_size: usize,
}

impl DbConfig {
    /// Parses a libpq-style URL or key=value string. The error never repeats the URL, which may hold a password.
    pub fn parse(url: &str, pool_size: usize) -> Result<Self> {
        let mut pg =
            tokio_postgres::Config::from_str(url).map_err(|e| Error::invalid(format!("invalid database url: {e}")))?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(5));
        }
        if pg.get_application_name().is_none() {
            pg.application_name("relay-server");
        }
        pg.keepalives(true);
        Ok(Self { pg, pool_size })
    }
}

/// A handle on the database: a pool of connections with a bounded wait.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    config: DbConfig,
}

impl Store {
    /// Builds the pool and checks that the database answers.
    pub async fn connect(config: DbConfig) -> Result<Self> {
        let manager =
            Manager::from_config(config.pg.clone(), NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(Duration::from_secs(5)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Internal(format!("cannot build the database pool: {e}")))?;
        let store = Self { pool, config };
        // Startup is the one place where the driver's own words help the operator most.
        let probe = store.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => Error::Unavailable(format!("cannot reach the database: {e}")),
            other => Error::Unavailable(format!("cannot reach the database: {other}")),
        })?;
        drop(probe);
        Ok(store)
    }

    pub fn config(&self) -> &DbConfig {
        &self.config
    }

    async fn client(&self) -> Result<Object> {
        Ok(self.pool.get().await?)
    }

    pub async fn migrate(&self) -> Result<Vec<i32>> {
        let mut client = self.client().await?;
        migrate::run(&mut client).await
    }
}
