//! Connections of the store's own for its one-statement calls, outside the sqlx pool.
//!
//! sqlx 0.8 pings every connection it takes back into a pool (`sqlx-core`
//! `pool/connection.rs`, not configurable). For a call that is one statement, that ping
//! doubles the round trips and, on a busy pool, the next caller waits for it. So
//! acquire/renew, release, the session calls and heartbeat run on connections the store
//! takes out of the pool for good (`detach`: the pool may open replacements) and keeps
//! between calls: at most as many as the pool's `max_connections`, taken only when that
//! many calls run at once.
//!
//! A session's keep-alive may also use one connection more, reserved for it: a member
//! contending for or handing over many shards at once fills every other slot, often with
//! statements waiting on row locks, and its session must not lapse behind its own calls.
//!
//! A connection goes back to the idle stack only after its statement completed. On an
//! error, or when the caller's future is dropped mid-statement, it is closed instead:
//! its protocol state is unknown, and the next call takes a fresh one. A connection-level
//! error (I/O, protocol) closes the idle ones as well, and the next connection is opened
//! afresh rather than taken from the pool: after a server restart they are all dead, and
//! each would fail one more call.
//!
//! Closing the connection does not stop its statement on the server: a backend waiting on
//! a row lock does not read its socket, so a call given up there would keep its backend
//! (and apply its statement late) until the lock is freed, one more backend with each
//! retry for as long as the lock is held. Each connection is therefore set up with
//! `client_connection_check_interval` (PostgreSQL 14 and later; a server that refuses it
//! goes without): the server checks every second that the caller is still there while a
//! statement runs, and ends a statement whose caller has gone.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use sqlx::postgres::PgRow;
use sqlx::{ConnectOptions, PgConnection, PgPool};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::error::pg_error;

/// The store's own connections; see the module docs.
#[derive(Debug)]
pub(crate) struct DirectConnections {
    pool: PgPool,
    idle: Mutex<Vec<PgConnection>>,
    slots: Semaphore,
    /// The one slot more that only keep-alives take, when every one of `slots` is busy.
    reserved: Semaphore,
    /// Set by a connection-level error: the pool's idle connections are likely dead too
    /// (it does not ping them before handing them out), so the next connection is a new
    /// one.
    connect_fresh: AtomicBool,
    /// Set when the server refused `client_connection_check_interval` (unknown before
    /// PostgreSQL 14), so new connections stop asking for it.
    no_client_check: AtomicBool,
}

/// How often the server checks that the caller of a running statement is still there
/// (see the module docs); sent once on each connection the store takes.
const CLIENT_CHECK: &str = "SET client_connection_check_interval = '1s'";

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
            reserved: Semaphore::new(1),
            connect_fresh: AtomicBool::new(false),
            no_client_check: AtomicBool::new(false),
        }
    }

    /// Runs `query` for exactly one row on one of the store's connections; failures are
    /// store errors starting with `what`.
    pub(crate) async fn fetch_one(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> tenure::Result<PgRow> {
        let checkout = self.checkout(what, false).await?;
        checkout
            .fetch_one(query)
            .await
            .map_err(|e| pg_error(what, e))
    }

    /// Runs `query` for at most one row on one of the store's connections.
    pub(crate) async fn fetch_optional(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> tenure::Result<Option<PgRow>> {
        self.optional_row(what, query, false).await
    }

    /// As [`fetch_optional`](Self::fetch_optional), for a session's keep-alive: on the
    /// reserved connection when every other one is busy.
    pub(crate) async fn fetch_optional_reserved(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> tenure::Result<Option<PgRow>> {
        self.optional_row(what, query, true).await
    }

    async fn optional_row(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
        reserved: bool,
    ) -> tenure::Result<Option<PgRow>> {
        let checkout = self.checkout(what, reserved).await?;
        checkout
            .fetch_optional(query)
            .await
            .map_err(|e| pg_error(what, e))
    }

    /// Runs `query` for every row it returns on one of the store's connections.
    pub(crate) async fn fetch_all(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> tenure::Result<Vec<PgRow>> {
        let checkout = self.checkout(what, false).await?;
        checkout
            .fetch_all(query)
            .await
            .map_err(|e| pg_error(what, e))
    }

    /// Runs `query` for its effect on one of the store's connections.
    pub(crate) async fn execute(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> tenure::Result<()> {
        let checkout = self.checkout(what, false).await?;
        checkout.execute(query).await.map_err(|e| pg_error(what, e))
    }

    /// An idle connection, or a new one; waits while `max_connections` calls are running
    /// (and, with `reserved`, the reserved slot is taken too).
    async fn checkout(&self, what: &str, reserved: bool) -> tenure::Result<Checkout<'_>> {
        let slot = if reserved {
            tokio::select! {
                biased;
                slot = self.slots.acquire() => slot,
                slot = self.reserved.acquire() => slot,
            }
        } else {
            self.slots.acquire().await
        };
        let slot = slot.map_err(|_| {
            tenure::Error::store_msg(crate::error::BACKEND, format!("{what}: store is closed"))
        })?;
        let idle = self.idle.lock().pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.set_up(what, self.take_new(what).await?).await?,
        };
        Ok(Checkout {
            owner: self,
            conn: Some(conn),
            _slot: slot,
        })
    }

    /// After a connection-level error: the idle connections are closed and the next one
    /// is opened afresh (see the module docs).
    fn forget_connections(&self) {
        self.idle.lock().clear();
        self.connect_fresh.store(true, Ordering::Release);
    }

    /// A connection the store has not used yet: a new one after a connection-level
    /// error, else one taken out of the pool.
    async fn take_new(&self, what: &str) -> tenure::Result<PgConnection> {
        if !self.connect_fresh.swap(false, Ordering::AcqRel) {
            // Usually an already open connection; the pool may open a replacement.
            return Ok(self
                .pool
                .acquire()
                .await
                .map_err(|e| pg_error(format!("{what}: could not get a connection"), e))?
                .detach());
        }
        let options = self.pool.connect_options();
        let timeout = self.pool.options().get_acquire_timeout();
        match tokio::time::timeout(timeout, options.connect()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => {
                self.connect_fresh.store(true, Ordering::Release);
                Err(pg_error(format!("{what}: could not connect"), e))
            }
            Err(_) => {
                self.connect_fresh.store(true, Ordering::Release);
                Err(tenure::Error::store_msg(
                    crate::error::BACKEND,
                    format!("{what}: could not connect within {timeout:?}"),
                ))
            }
        }
    }

    /// Asks the server to end the statements of `conn` whose caller has gone (see the
    /// module docs).
    async fn set_up(&self, what: &str, mut conn: PgConnection) -> tenure::Result<PgConnection> {
        if self.no_client_check.load(Ordering::Acquire) {
            return Ok(conn);
        }
        match sqlx::query(CLIENT_CHECK)
            .persistent(false)
            .execute(&mut conn)
            .await
        {
            Ok(_) => Ok(conn),
            // Refused by the server (before PostgreSQL 14: an unknown parameter; a server
            // or proxy that does not let it be set): the statements run without it.
            Err(sqlx::Error::Database(db)) => {
                if !self.no_client_check.swap(true, Ordering::AcqRel) {
                    tracing::info!(error = %db,
                        "client_connection_check_interval refused; statements given up are not ended early on the server");
                }
                Ok(conn)
            }
            Err(e) => {
                if connection_lost(&e) {
                    self.forget_connections();
                }
                Err(pg_error(
                    format!("{what}: could not set up a connection"),
                    e,
                ))
            }
        }
    }
}

impl Checkout<'_> {
    /// Runs `query` for exactly one row; the connection is kept only if it succeeded.
    async fn fetch_one(
        mut self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<PgRow, sqlx::Error> {
        let answer = query.fetch_one(self.conn()?).await;
        self.settle(answer)
    }

    /// Runs `query` for at most one row; the connection is kept only if it succeeded.
    async fn fetch_optional(
        mut self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Option<PgRow>, sqlx::Error> {
        let answer = query.fetch_optional(self.conn()?).await;
        self.settle(answer)
    }

    /// Runs `query` for every row; the connection is kept only if it succeeded.
    async fn fetch_all(
        mut self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Vec<PgRow>, sqlx::Error> {
        let answer = query.fetch_all(self.conn()?).await;
        self.settle(answer)
    }

    /// Runs `query` for its effect; the connection is kept only if it succeeded.
    async fn execute(
        mut self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<(), sqlx::Error> {
        let answer = query.execute(self.conn()?).await;
        self.settle(answer).map(|_| ())
    }

    fn conn(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        self.conn.as_mut().ok_or(sqlx::Error::PoolClosed)
    }

    /// Keeps the connection after a success. After a failure it is closed; if the
    /// failure was the connection's (not an answer from the server), the idle ones are
    /// closed too: a restarted or unreachable server broke them all, and each would
    /// otherwise fail one more call.
    fn settle<T>(mut self, answer: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        let Some(conn) = self.conn.take() else {
            return answer;
        };
        match &answer {
            Ok(_) => self.owner.idle.lock().push(conn),
            Err(error) if connection_lost(error) => self.owner.forget_connections(),
            Err(_) => {}
        }
        answer
    }
}

/// Whether `error` says the connection is gone rather than the statement failed: I/O and
/// protocol failures, and the server's own goodbyes (SQLSTATE class 08, connection
/// exception; 57P, e.g. 57P01 "terminating connection due to administrator command" sent
/// to every session when the server shuts down).
fn connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
        _ => true,
    }
}
