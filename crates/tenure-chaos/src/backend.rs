//! The stores a chaos run drives: leases for the elector, and the fenced log.
//!
//! The log is a table of `(role, worker, token, seq)` rows. A leader appends one row per
//! write inside a fenced transaction (the fence check and the insert commit together or
//! not at all), so the table's id order is commit order: SQLite has one writer at a time
//! (`BEGIN IMMEDIATE`), and on PostgreSQL the fence row's lock is held from before the
//! insert until commit. In the negative control (no fence) SQLite still serialises
//! writers; on PostgreSQL id order is then only insert order.

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};
use tenure::{Error, FencingToken, LeaseStore};
use tenure_postgres::{PgFence, PgLeaseStore, Schema};
use tenure_sqlite::{SqliteDatabase, SqliteOptions};

use crate::ChaosError;

const SQLITE_LOG: &str = "CREATE TABLE IF NOT EXISTS tenure_chaos_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    role TEXT NOT NULL, worker TEXT NOT NULL, token INTEGER NOT NULL, seq INTEGER NOT NULL)";

const PG_LOG: &str = "CREATE TABLE IF NOT EXISTS tenure.tenure_chaos_log (
    id bigserial PRIMARY KEY,
    role text NOT NULL, worker text NOT NULL, token bigint NOT NULL, seq bigint NOT NULL)";

/// One row of the fenced log, in commit order (`id`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LogRow {
    /// Commit order.
    pub id: i64,
    /// The worker incarnation that wrote it.
    pub worker: String,
    /// The token it was written under.
    pub token: u64,
    /// The worker's sequence number.
    pub seq: u64,
}

/// How one write ended, as the worker saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Committed.
    Ok,
    /// Refused by the fence; nothing written.
    Fenced,
    /// Failed before commit was sent; nothing written.
    Error(String),
    /// Commit sent, answer unknown.
    Unknown(String),
}

/// An open store: SQLite file or PostgreSQL pool.
#[derive(Clone)]
pub enum Backend {
    /// A SQLite database file.
    Sqlite(SqliteDatabase),
    /// A PostgreSQL pool with tenure's stores on it.
    Postgres {
        /// The pool (connections carry this process's application name).
        pool: PgPool,
        /// Leases.
        leases: PgLeaseStore,
        /// Fences.
        fence: PgFence,
    },
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Sqlite(_) => "Backend::Sqlite",
            Backend::Postgres { .. } => "Backend::Postgres",
        })
    }
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl Backend {
    /// Opens `url` (`sqlite:PATH` or `postgres://...`). PostgreSQL connections are tagged
    /// with `app_name`, which is how `cut` finds the workers' connections.
    ///
    /// SQLite statements wait up to `sqlite_busy` for another process's write lock.
    /// Keep it below the elector's local window (about the TTL): the elector abandons an
    /// acquire that has not answered by then, and an abandoned `BEGIN IMMEDIATE` that
    /// later gets the lock leaves a transaction open on a pooled connection, holding the
    /// file's write lock for good (found by this tool; see the crate docs).
    pub async fn open(
        url: &str,
        app_name: &str,
        ttl: Duration,
        sqlite_busy: Duration,
    ) -> Result<Self, ChaosError> {
        if url.starts_with("sqlite:") {
            // Other processes' releases are only seen by reading; poll often enough to
            // measure takeover, not so often that five workers swamp two cores.
            let options = SqliteOptions::new()
                .poll_interval(Duration::from_millis(20))
                .busy_timeout(sqlite_busy);
            let db = tenure_sqlite::connect_with(url, options).await?;
            return Ok(Backend::Sqlite(db));
        }
        let options = PgConnectOptions::from_str(url)
            .map_err(|_| {
                ChaosError::Usage(
                    "the store is not a valid PostgreSQL URL; expected postgres://USER:PASSWORD@HOST:PORT/DB"
                        .to_owned(),
                )
            })?
            .application_name(app_name);
        let pool = PgPoolOptions::new()
            .max_connections(4)
            // A worker must notice a dead server within about a term, not hang.
            .acquire_timeout(ttl.max(Duration::from_secs(1)))
            .connect_with(options)
            .await
            .map_err(|e| Error::store("postgres", "cannot connect to the chaos store", e))?;
        let leases = PgLeaseStore::new(pool.clone(), Schema::default());
        let fence = PgFence::new(pool.clone(), Schema::default());
        Ok(Backend::Postgres {
            pool,
            leases,
            fence,
        })
    }

    /// The lease store the elector runs on.
    pub fn leases(&self) -> Arc<dyn LeaseStore> {
        match self {
            Backend::Sqlite(db) => Arc::new(db.lease_store()),
            Backend::Postgres { leases, .. } => Arc::new(leases.clone()),
        }
    }

    /// Creates tenure's schema and the log table (done once, by the orchestrator).
    pub async fn prepare(&self) -> Result<(), ChaosError> {
        match self {
            Backend::Sqlite(db) => {
                sqlx::query(SQLITE_LOG)
                    .execute(db.pool())
                    .await
                    .map_err(|e| Error::store("sqlite", "cannot create the chaos log", e))?;
            }
            Backend::Postgres { pool, leases, .. } => {
                leases.migrate().await?;
                sqlx::query(PG_LOG)
                    .execute(pool)
                    .await
                    .map_err(|e| Error::store("postgres", "cannot create the chaos log", e))?;
            }
        }
        Ok(())
    }

    /// Appends `(role, worker, token, seq)` to the log, fenced on the role's log
    /// resource unless `unfenced` (the negative control).
    pub async fn write(
        &self,
        role: &str,
        worker: &str,
        token: FencingToken,
        seq: u64,
        unfenced: bool,
    ) -> WriteOutcome {
        match self {
            Backend::Sqlite(db) => write_sqlite(db, role, worker, token, seq, unfenced).await,
            Backend::Postgres { pool, fence, .. } => {
                let write: Boxed<'_, WriteOutcome> =
                    Box::pin(write_pg(pool, fence, role, worker, token, seq, unfenced));
                write.await
            }
        }
    }

    /// The log rows of `role`, in commit order.
    pub async fn read_log(&self, role: &str) -> Result<Vec<LogRow>, ChaosError> {
        let rows = match self {
            Backend::Sqlite(db) => sqlx::query(
                "SELECT id, worker, token, seq FROM tenure_chaos_log WHERE role = ?1 ORDER BY id",
            )
            .bind(role)
            .fetch_all(db.pool())
            .await
            .map_err(|e| Error::store("sqlite", "cannot read the chaos log", e))?
            .into_iter()
            .map(|r| row(r.try_get(0), r.try_get(1), r.try_get(2), r.try_get(3)))
            .collect::<Result<Vec<_>, _>>(),
            Backend::Postgres { pool, .. } => sqlx::query(
                "SELECT id, worker, token, seq FROM tenure.tenure_chaos_log WHERE role = $1 ORDER BY id",
            )
            .bind(role)
            .fetch_all(pool)
            .await
            .map_err(|e| Error::store("postgres", "cannot read the chaos log", e))?
            .into_iter()
            .map(|r| row(r.try_get(0), r.try_get(1), r.try_get(2), r.try_get(3)))
            .collect::<Result<Vec<_>, _>>(),
        };
        rows.map_err(|e| ChaosError::Store(Error::store("chaos", "cannot decode the chaos log", e)))
    }

    /// Terminates every PostgreSQL connection tagged `app_name`; returns how many.
    pub async fn cut(&self, app_name: &str) -> Result<u64, ChaosError> {
        match self {
            Backend::Sqlite(_) => Ok(0),
            Backend::Postgres { pool, .. } => {
                let cut: i64 = sqlx::query_scalar(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = $1 AND pid <> pg_backend_pid()",
                )
                .bind(app_name)
                .fetch_one(pool)
                .await
                .map_err(|e| Error::store("postgres", "cannot terminate worker connections", e))?;
                Ok(cut.max(0) as u64)
            }
        }
    }
}

fn row(
    id: Result<i64, sqlx::Error>,
    worker: Result<String, sqlx::Error>,
    token: Result<i64, sqlx::Error>,
    seq: Result<i64, sqlx::Error>,
) -> Result<LogRow, sqlx::Error> {
    Ok(LogRow {
        id: id?,
        worker: worker?,
        token: token?.max(0) as u64,
        seq: seq?.max(0) as u64,
    })
}

fn log_resource(role: &str) -> String {
    format!("{role}-log")
}

fn short(error: impl std::fmt::Display) -> String {
    error.to_string().chars().take(200).collect()
}

async fn write_sqlite(
    db: &SqliteDatabase,
    role: &str,
    worker: &str,
    token: FencingToken,
    seq: u64,
    unfenced: bool,
) -> WriteOutcome {
    let mut tx = match db.begin_immediate().await {
        Ok(tx) => tx,
        Err(e) => return WriteOutcome::Error(short(e)),
    };
    if !unfenced {
        match tenure_sqlite::fence_in_transaction(&mut tx, &log_resource(role), token).await {
            Ok(()) => {}
            Err(Error::Fenced { .. }) => return WriteOutcome::Fenced,
            Err(e) => return WriteOutcome::Error(short(e)),
        }
    }
    let inserted = sqlx::query(
        "INSERT INTO tenure_chaos_log (role, worker, token, seq) VALUES (?1, ?2, ?3, ?4)",
    )
    .bind(role)
    .bind(worker)
    .bind(token.get() as i64)
    .bind(seq as i64)
    .execute(&mut *tx)
    .await;
    if let Err(e) = inserted {
        return WriteOutcome::Error(short(e));
    }
    match tx.commit().await {
        Ok(()) => WriteOutcome::Ok,
        Err(e) => WriteOutcome::Unknown(short(e)),
    }
}

async fn write_pg(
    pool: &PgPool,
    fence: &PgFence,
    role: &str,
    worker: &str,
    token: FencingToken,
    seq: u64,
    unfenced: bool,
) -> WriteOutcome {
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => return WriteOutcome::Error(short(e)),
    };
    if !unfenced {
        let resource = log_resource(role);
        let fenced: Boxed<'_, tenure::Result<()>> =
            Box::pin(fence.fence_in_transaction(&mut tx, &resource, token));
        match fenced.await {
            Ok(()) => {}
            Err(Error::Fenced { .. }) => return WriteOutcome::Fenced,
            Err(e) => return WriteOutcome::Error(short(e)),
        }
    }
    let inserted = sqlx::query(
        "INSERT INTO tenure.tenure_chaos_log (role, worker, token, seq) VALUES ($1, $2, $3, $4)",
    )
    .bind(role)
    .bind(worker)
    .bind(token.get() as i64)
    .bind(seq as i64)
    .execute(&mut *tx)
    .await;
    if let Err(e) = inserted {
        return WriteOutcome::Error(short(e));
    }
    match tx.commit().await {
        Ok(()) => WriteOutcome::Ok,
        Err(e) => WriteOutcome::Unknown(short(e)),
    }
}

/// A lease store whose writing calls run to completion on their own task, so a caller
/// that stops waiting (the elector abandons an acquire after its local window) never
/// drops a SQLite transaction half-way through `BEGIN IMMEDIATE`.
///
/// A mitigation for a tenure-sqlite bug this tool found (see the crate docs); workers
/// use it on SQLite unless told not to (`--sqlite-raw-leases` reproduces the wedge).
#[derive(Clone)]
pub struct DetachedLeases {
    inner: Arc<dyn LeaseStore>,
}

impl DetachedLeases {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        DetachedLeases { inner }
    }
}

fn joined<T>(result: Result<tenure::Result<T>, tokio::task::JoinError>) -> tenure::Result<T> {
    result.unwrap_or_else(|e| Err(Error::store("chaos", "a lease call's task failed", e)))
}

#[async_trait::async_trait]
impl LeaseStore for DetachedLeases {
    async fn try_acquire_or_renew(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
    ) -> tenure::Result<tenure::LeaseResult> {
        let (inner, role, owner) = (self.inner.clone(), role.to_owned(), owner.to_owned());
        joined(
            tokio::spawn(async move { inner.try_acquire_or_renew(&role, &owner, ttl).await }).await,
        )
    }

    async fn release(&self, role: &str, owner: &str, token: FencingToken) -> tenure::Result<bool> {
        let (inner, role, owner) = (self.inner.clone(), role.to_owned(), owner.to_owned());
        joined(tokio::spawn(async move { inner.release(&role, &owner, token).await }).await)
    }

    async fn get(&self, role: &str) -> tenure::Result<Option<tenure::LeaseInfo>> {
        self.inner.get(role).await
    }

    async fn list(&self) -> tenure::Result<Vec<tenure::LeaseInfo>> {
        self.inner.list().await
    }

    async fn wait_for_change(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: tokio::time::Instant,
    ) {
        self.inner.wait_for_change(role, observed, deadline).await
    }

    fn min_ttl(&self) -> Duration {
        self.inner.min_ttl()
    }
}
