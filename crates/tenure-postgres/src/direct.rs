//! Connections of the store's own for its one-statement calls, outside the sqlx pool.
//!
//! sqlx 0.8 pings every connection it takes back into a pool (`sqlx-core`
//! `pool/connection.rs`, not configurable). For a call that is one statement, that ping
//! doubles the round trips and, on a busy pool, the next caller waits for it. So
//! acquire/renew, release and heartbeat run on connections the store takes out of the
//! pool for good (`detach`: the pool may open replacements) and keeps between calls: at
//! most as many as the pool's `max_connections`, taken only when that many calls run at
//! once.
//!
//! A connection goes back to the idle stack only after its statement completed. On an
//! error, or when the caller's future is dropped mid-statement, it is closed instead:
//! its protocol state is unknown, and the next call takes a fresh one.

use parking_lot::Mutex;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::error::pg_error;

/// The store's own connections; see the module docs.
#[derive(Debug)]
pub(crate) struct DirectConnections {
    pool: PgPool,
    idle: Mutex<Vec<PgConnection>>,
    slots: Semaphore,
}

/// One connection checked out for one statement.
struct Checkout<'a> {
    owner: &'a DirectConnections,
    conn: Option<PgConnection>,
    _slot: SemaphorePermit<'a>,
}

impl DirectConnections {
    /// Up to the pool's `max_connections`, taken from it as needed.
    pub(crate) fn for_pool(pool: &PgPool) -> DirectConnections {
        let limit = usize::try_from(pool.options().get_max_connections())
            .unwrap_or(1)
            .max(1);
        DirectConnections {
            pool: pool.clone(),
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(limit),
        }
    }

    /// Runs `query` for exactly one row on one of the store's connections; failures are
    /// store errors starting with `what`.
    pub(crate) async fn fetch_one(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> tenure::Result<PgRow> {
        let checkout = self.checkout(what).await?;
        checkout
            .fetch_one(query)
            .await
            .map_err(|e| pg_error(what, e))
    }

    /// Runs `query` for its effect on one of the store's connections.
    pub(crate) async fn execute(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> tenure::Result<()> {
        let checkout = self.checkout(what).await?;
        checkout.execute(query).await.map_err(|e| pg_error(what, e))
    }

    /// An idle connection, or a new one; waits while `max_connections` calls are running.
    async fn checkout(&self, what: &str) -> tenure::Result<Checkout<'_>> {
        let slot = self.slots.acquire().await.map_err(|_| {
            tenure::Error::store_msg(crate::error::BACKEND, format!("{what}: store is closed"))
        })?;
        let idle = self.idle.lock().pop();
        let conn = match idle {
            Some(conn) => conn,
            // Usually an already open connection; the pool may open a replacement.
            None => self
                .pool
                .acquire()
                .await
                .map_err(|e| pg_error(format!("{what}: could not get a connection"), e))?
                .detach(),
        };
        Ok(Checkout {
            owner: self,
            conn: Some(conn),
            _slot: slot,
        })
    }
}

impl Checkout<'_> {
    /// Runs `query` for exactly one row; the connection is kept only if it succeeded.
    async fn fetch_one(
        mut self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<PgRow, sqlx::Error> {
        let row = query.fetch_one(self.conn()?).await?;
        self.keep();
        Ok(row)
    }

    /// Runs `query` for its effect; the connection is kept only if it succeeded.
    async fn execute(
        mut self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<(), sqlx::Error> {
        query.execute(self.conn()?).await?;
        self.keep();
        Ok(())
    }

    fn conn(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        self.conn.as_mut().ok_or(sqlx::Error::PoolClosed)
    }

    fn keep(mut self) {
        if let Some(conn) = self.conn.take() {
            self.owner.idle.lock().push(conn);
        }
    }
}
