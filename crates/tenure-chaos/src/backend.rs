//! The stores a chaos run drives: leases for the elector, and the fenced log.
//!
//! The log is a sequence of `(role, worker, token, seq)` entries. A leader appends one
//! per write, fenced: the fence check and the append commit together or not at all, so
//! the log's commit order is what the checker reads back.
//!
//! - SQL stores ([`Sql`]): a table whose id order is commit order. SQLite has one writer
//!   at a time (`BEGIN IMMEDIATE`); on PostgreSQL the fence row's lock is held from
//!   before the insert until commit. In the negative control (no fence) SQLite still
//!   serialises writers; on PostgreSQL id order is then only insert order.
//! - etcd (feature `etcd`, [`crate::etcd`]): one key per entry, written in a transaction
//!   guarded by the term's lease key; the etcd revision of the write is its commit order.
//! - Kubernetes (feature `kube`, [`crate::kube`]): a chain of Lease objects holding the
//!   highest admitted token and the entries; an append is one conditional write of the
//!   current object, and (object, line) is its commit order.

use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, PgPool, Postgres, Row, Sqlite,
    Transaction, Type,
};
use tenure::{Error, FencingToken, LeaseStore, NodeRegistry};
use tenure_postgres::{PgFence, PgLeaseStore, PgNodeRegistry, Schema};
use tenure_sqlite::{SqliteDatabase, SqliteOptions};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ChaosError;

/// One row of the fenced log, in commit order (`id`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LogRow {
    /// Commit order: the table's id, the etcd revision of the write, or on Kubernetes
    /// the log object's index and the entry's line in it (see [`crate::kube`]).
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

/// One entry a leader appends to the log.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    /// The role the log belongs to.
    pub role: &'a str,
    /// The writing worker incarnation.
    pub worker: &'a str,
    /// The token it writes under.
    pub token: FencingToken,
    /// The worker's sequence number.
    pub seq: u64,
}

/// How to reach the store.
#[derive(Clone, Copy, Debug)]
pub struct Connect<'a> {
    /// PostgreSQL application name, which is how `cut` finds the workers' connections.
    pub app_name: &'a str,
    /// The lease TTL: a worker must notice a dead server within about a term.
    pub ttl: Duration,
    /// How long a SQLite statement waits for another process's write lock (see
    /// [`Backend::open`]).
    pub sqlite_busy: Duration,
    /// Proxies to connect through instead of the URL's host(s) (PostgreSQL: the first;
    /// etcd: all, as the endpoints; Kubernetes: the first, as the server); empty for a
    /// direct connection.
    pub via: &'a [SocketAddr],
    /// Kubernetes: the kubeconfig to use; `None`: found as `kubectl` finds it
    /// (`$KUBECONFIG`, `~/.kube/config`, the pod's service account).
    pub kubeconfig: Option<&'a Path>,
}

/// An open store: SQLite file, PostgreSQL pool, etcd client or Kubernetes client.
#[derive(Clone)]
pub enum Backend {
    /// A SQLite database file.
    Sqlite(Sql<SqliteLog>),
    /// A PostgreSQL pool with tenure's stores on it.
    Postgres(Sql<PgLog>),
    /// An etcd cluster.
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::EtcdLog),
    /// A Kubernetes API server (one namespace); boxed, as its client is large.
    #[cfg(feature = "kube")]
    Kube(Box<crate::kube::KubeLog>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Sqlite(_) => "Backend::Sqlite",
            Backend::Postgres(_) => "Backend::Postgres",
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => "Backend::Etcd",
            #[cfg(feature = "kube")]
            Backend::Kube(_) => "Backend::Kube",
        })
    }
}

impl Backend {
    /// Opens `url` (`sqlite:PATH`, `postgres://...` or, with the `etcd` feature,
    /// `etcd://...`, with the `kube` feature `kube:[NAMESPACE]`).
    ///
    /// SQLite statements wait up to `sqlite_busy` for another process's write lock.
    /// Keep it below the elector's local window (about the TTL): the elector abandons an
    /// acquire that has not answered by then, and an abandoned `BEGIN IMMEDIATE` that
    /// later gets the lock leaves a transaction open on a pooled connection, holding the
    /// file's write lock for good (found by this tool; see the crate docs).
    pub async fn open(url: &str, connect: Connect<'_>) -> Result<Self, ChaosError> {
        if url.starts_with("sqlite:") {
            // Other processes' releases are only seen by reading; poll often enough to
            // measure takeover, not so often that five workers swamp two cores.
            let options = SqliteOptions::new()
                .poll_interval(Duration::from_millis(20))
                .busy_timeout(connect.sqlite_busy);
            let db = tenure_sqlite::connect_with(url, options).await?;
            return Ok(Backend::Sqlite(Sql(SqliteLog { db })));
        }
        if url.starts_with("etcd:") {
            #[cfg(feature = "etcd")]
            return Ok(Backend::Etcd(
                crate::etcd::EtcdLog::open(url, connect).await?,
            ));
            #[cfg(not(feature = "etcd"))]
            return Err(ChaosError::Usage(crate::config::NO_ETCD.to_owned()));
        }
        if url.starts_with("kube:") {
            #[cfg(feature = "kube")]
            return Ok(Backend::Kube(Box::new(
                crate::kube::KubeLog::open(url, connect).await?,
            )));
            #[cfg(not(feature = "kube"))]
            return Err(ChaosError::Usage(crate::config::NO_KUBE.to_owned()));
        }
        PgLog::open(url, connect)
            .await
            .map(|log| Backend::Postgres(Sql(log)))
    }

    /// The lease store the elector runs on.
    pub fn leases(&self) -> Arc<dyn LeaseStore> {
        match self {
            Backend::Sqlite(sql) => Arc::new(sql.0.db.lease_store()),
            Backend::Postgres(sql) => Arc::new(sql.0.leases.clone()),
            #[cfg(feature = "etcd")]
            Backend::Etcd(etcd) => etcd.leases(),
            #[cfg(feature = "kube")]
            Backend::Kube(kube) => kube.leases(),
        }
    }

    /// The membership registry shard members heartbeat into, judging a member live for
    /// `ttl` after its last heartbeat.
    pub fn registry(&self, ttl: Duration) -> Result<Arc<dyn NodeRegistry>, ChaosError> {
        Ok(match self {
            Backend::Sqlite(sql) => Arc::new(sql.0.db.node_registry(ttl)?),
            Backend::Postgres(sql) => Arc::new(PgNodeRegistry::new(
                sql.0.pool.clone(),
                Schema::default(),
                ttl,
            )?),
            #[cfg(feature = "etcd")]
            Backend::Etcd(etcd) => etcd.registry(ttl)?,
            #[cfg(feature = "kube")]
            Backend::Kube(kube) => kube.registry(ttl)?,
        })
    }

    /// Creates tenure's schema and the log table (done once, by the orchestrator).
    pub async fn prepare(&self) -> Result<(), ChaosError> {
        match self {
            Backend::Sqlite(sql) => sql.create_log().await,
            Backend::Postgres(sql) => {
                sql.0.leases.migrate().await?;
                sql.create_log().await
            }
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Ok(()),
            #[cfg(feature = "kube")]
            Backend::Kube(_) => Ok(()),
        }
    }

    /// Appends `entry` to the log, fenced on the role's log (each shard's role has its
    /// own fence) unless `unfenced` (the
    /// negative control).
    pub async fn write(&self, entry: Entry<'_>, unfenced: bool) -> WriteOutcome {
        match self {
            Backend::Sqlite(sql) => sql.append(entry, unfenced).await,
            Backend::Postgres(sql) => sql.append(entry, unfenced).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(etcd) => etcd.append(entry, unfenced).await,
            #[cfg(feature = "kube")]
            Backend::Kube(kube) => kube.append(entry, unfenced).await,
        }
    }

    /// The log rows of `role`, in commit order.
    pub async fn read_log(&self, role: &str) -> Result<Vec<LogRow>, ChaosError> {
        match self {
            Backend::Sqlite(sql) => sql.read_log(role).await,
            Backend::Postgres(sql) => sql.read_log(role).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(etcd) => etcd.read_log(role).await,
            #[cfg(feature = "kube")]
            Backend::Kube(kube) => kube.read_log(role).await,
        }
    }

    /// Terminates every PostgreSQL connection tagged `app_name` (other stores: none);
    /// returns how many.
    pub async fn terminate_connections(&self, app_name: &str) -> Result<u64, ChaosError> {
        match self {
            Backend::Postgres(sql) => sql.0.terminate(app_name).await,
            _ => Ok(0),
        }
    }

    /// Starts holding `role`'s lease row locked (PostgreSQL: `FOR UPDATE`; SQLite: the
    /// file's write lock) in a transaction of its own, as a client stalled inside a
    /// transaction would, until `release` is cancelled; then rolls it back. `None` on
    /// stores with no such lock (etcd, Kubernetes).
    pub fn hold_lock(
        &self,
        role: &str,
        release: CancellationToken,
    ) -> Option<JoinHandle<Result<(), ChaosError>>> {
        let role = role.to_owned();
        match self {
            Backend::Sqlite(sql) => {
                let sql = sql.clone();
                Some(tokio::spawn(
                    async move { sql.hold_lock(&role, release).await },
                ))
            }
            Backend::Postgres(sql) => {
                let sql = sql.clone();
                Some(tokio::spawn(
                    async move { sql.hold_lock(&role, release).await },
                ))
            }
            _ => None,
        }
    }
}

/// The resource the role's log is fenced on (SQL stores).
fn log_resource(role: &str) -> String {
    format!("{role}-log")
}

/// A store error with its causes, short enough for a history line.
pub(crate) fn short(error: impl std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        // Many errors repeat their cause in their own message; say it once.
        let said = inner.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = inner.source();
    }
    text.chars().take(300).collect()
}

/// What the SQL stores do differently in a fenced append: how a write transaction
/// begins, which fence runs in it, and the statements' dialect. [`Sql`] holds the
/// shape they share.
#[async_trait]
pub trait Dialect: Send + Sync {
    /// The sqlx database.
    type Db: Database;
    /// The backend name in errors.
    const NAME: &'static str;
    /// Creates the log table.
    const CREATE: &'static str;
    /// Inserts `(role, worker, token, seq)`.
    const INSERT: &'static str;
    /// Selects `(id, worker, token, seq)` of one role, in id order.
    const SELECT: &'static str;
    /// Inside a write transaction, locks the lease of one role (beside what beginning
    /// the transaction already locks).
    const LOCK: &'static str;

    /// The pool.
    fn pool(&self) -> &sqlx::Pool<Self::Db>;

    /// Begins a write transaction.
    async fn begin(&self) -> tenure::Result<Transaction<'static, Self::Db>>;

    /// Checks and advances the fence of `resource` inside the transaction on `conn`.
    async fn fence(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        resource: &str,
        token: FencingToken,
    ) -> tenure::Result<()>;
}

/// A SQL store's fenced log, one shape for every [`Dialect`].
#[derive(Clone, Debug)]
pub struct Sql<D>(pub D);

impl<D> Sql<D>
where
    D: Dialect,
    for<'q> <D::Db as Database>::Arguments<'q>: IntoArguments<'q, D::Db>,
    for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
    for<'q> String: Encode<'q, D::Db> + Decode<'q, D::Db> + Type<D::Db>,
    for<'q> i64: Encode<'q, D::Db> + Decode<'q, D::Db> + Type<D::Db>,
    usize: ColumnIndex<<D::Db as Database>::Row>,
{
    async fn create_log(&self) -> Result<(), ChaosError> {
        sqlx::query(D::CREATE)
            .execute(self.0.pool())
            .await
            .map_err(|e| Error::store(D::NAME, "cannot create the chaos log", e))?;
        Ok(())
    }

    /// Begin, fence (unless `unfenced`), insert, commit. Nothing is written unless the
    /// commit is sent, so only a failed commit leaves the outcome unknown.
    async fn append(&self, entry: Entry<'_>, unfenced: bool) -> WriteOutcome {
        let mut tx = match self.0.begin().await {
            Ok(tx) => tx,
            Err(e) => return WriteOutcome::Error(short(e)),
        };
        if !unfenced {
            match self
                .0
                .fence(&mut tx, &log_resource(entry.role), entry.token)
                .await
            {
                Ok(()) => {}
                Err(Error::Fenced { .. }) => return WriteOutcome::Fenced,
                Err(e) => return WriteOutcome::Error(short(e)),
            }
        }
        let inserted = sqlx::query(D::INSERT)
            .bind(entry.role.to_owned())
            .bind(entry.worker.to_owned())
            .bind(entry.token.get() as i64)
            .bind(entry.seq as i64)
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

    /// See [`Backend::hold_lock`]. Released before the lock was taken (a store slow to
    /// answer), it gives up taking it.
    async fn hold_lock(&self, role: &str, release: CancellationToken) -> Result<(), ChaosError> {
        let locked = async {
            let mut tx = self.0.begin().await?;
            sqlx::query(D::LOCK)
                .bind(role.to_owned())
                .execute(&mut *tx)
                .await
                .map_err(|e| Error::store(D::NAME, "cannot lock a lease", e))?;
            Ok::<_, ChaosError>(tx)
        };
        let tx = tokio::select! {
            _ = release.cancelled() => return Ok(()),
            tx = locked => tx?,
        };
        release.cancelled().await;
        tx.rollback()
            .await
            .map_err(|e| Error::store(D::NAME, "cannot free a locked lease", e))?;
        Ok(())
    }

    async fn read_log(&self, role: &str) -> Result<Vec<LogRow>, ChaosError> {
        let rows = sqlx::query(D::SELECT)
            .bind(role.to_owned())
            .fetch_all(self.0.pool())
            .await
            .map_err(|e| Error::store(D::NAME, "cannot read the chaos log", e))?;
        let decode = |r: &<D::Db as Database>::Row| -> Result<LogRow, sqlx::Error> {
            Ok(LogRow {
                id: r.try_get(0)?,
                worker: r.try_get(1)?,
                token: r.try_get::<i64, _>(2)?.max(0) as u64,
                seq: r.try_get::<i64, _>(3)?.max(0) as u64,
            })
        };
        rows.iter()
            .map(decode)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ChaosError::Store(Error::store(D::NAME, "cannot decode the chaos log", e)))
    }
}

/// The SQLite side of [`Sql`].
#[derive(Clone, Debug)]
pub struct SqliteLog {
    db: SqliteDatabase,
}

#[async_trait]
impl Dialect for SqliteLog {
    type Db = Sqlite;
    const NAME: &'static str = "sqlite";
    const CREATE: &'static str = "CREATE TABLE IF NOT EXISTS tenure_chaos_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        role TEXT NOT NULL, worker TEXT NOT NULL, token INTEGER NOT NULL, seq INTEGER NOT NULL)";
    const INSERT: &'static str =
        "INSERT INTO tenure_chaos_log (role, worker, token, seq) VALUES (?1, ?2, ?3, ?4)";
    const SELECT: &'static str =
        "SELECT id, worker, token, seq FROM tenure_chaos_log WHERE role = ?1 ORDER BY id";
    // `BEGIN IMMEDIATE` took the file's write lock: every write waits already.
    const LOCK: &'static str = "SELECT ?1";

    fn pool(&self) -> &sqlx::Pool<Sqlite> {
        self.db.pool()
    }

    async fn begin(&self) -> tenure::Result<Transaction<'static, Sqlite>> {
        // Cancel-safe (see tenure-sqlite), and it takes the write lock up front, which
        // is what makes id order commit order.
        self.db.begin_immediate().await
    }

    async fn fence(
        &self,
        conn: &mut sqlx::SqliteConnection,
        resource: &str,
        token: FencingToken,
    ) -> tenure::Result<()> {
        tenure_sqlite::fence_in_transaction(conn, resource, token).await
    }
}

/// The PostgreSQL side of [`Sql`].
#[derive(Clone, Debug)]
pub struct PgLog {
    pool: PgPool,
    leases: PgLeaseStore,
    fence: PgFence,
}

impl PgLog {
    async fn open(url: &str, connect: Connect<'_>) -> Result<Self, ChaosError> {
        let mut options = PgConnectOptions::from_str(url)
            .map_err(|_| {
                ChaosError::Usage(
                    "the store is not a valid PostgreSQL URL; expected postgres://USER:PASSWORD@HOST:PORT/DB"
                        .to_owned(),
                )
            })?
            .application_name(connect.app_name);
        if let Some(proxy) = connect.via.first() {
            options = options.host(&proxy.ip().to_string()).port(proxy.port());
        }
        // A worker must notice a dead server within about a term, not hang.
        let within = connect.ttl.max(Duration::from_secs(1));
        // The workers' terms are as durable as `connect` makes them, whatever the server's
        // default (the throwaway server commits asynchronously; see the runner).
        let options =
            tokio::time::timeout(within, tenure_postgres::durable_commit_options(options))
                .await
                .map_err(|_| {
                    Error::store_msg(
                        "postgres",
                        format!("the chaos store did not answer within {within:?}"),
                    )
                })??;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(within)
            .connect_with(options)
            .await
            .map_err(|e| Error::store("postgres", "cannot connect to the chaos store", e))?;
        let leases = PgLeaseStore::new(pool.clone(), Schema::default());
        let fence = PgFence::new(pool.clone(), Schema::default());
        Ok(PgLog {
            pool,
            leases,
            fence,
        })
    }

    async fn terminate(&self, app_name: &str) -> Result<u64, ChaosError> {
        let cut: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
        )
        .bind(app_name)
        .fetch_one(&self.pool)
        .await
        .map_err(|e| Error::store("postgres", "cannot terminate worker connections", e))?;
        Ok(cut.max(0) as u64)
    }
}

#[async_trait]
impl Dialect for PgLog {
    type Db = Postgres;
    const NAME: &'static str = "postgres";
    const CREATE: &'static str = "CREATE TABLE IF NOT EXISTS tenure.tenure_chaos_log (
        id bigserial PRIMARY KEY,
        role text NOT NULL, worker text NOT NULL, token bigint NOT NULL, seq bigint NOT NULL)";
    const INSERT: &'static str =
        "INSERT INTO tenure.tenure_chaos_log (role, worker, token, seq) VALUES ($1, $2, $3, $4)";
    const SELECT: &'static str =
        "SELECT id, worker, token, seq FROM tenure.tenure_chaos_log WHERE role = $1 ORDER BY id";
    const LOCK: &'static str = "SELECT 1 FROM tenure.tenure_leases WHERE role = $1 FOR UPDATE";

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn begin(&self) -> tenure::Result<Transaction<'static, Postgres>> {
        self.pool
            .begin()
            .await
            .map_err(|e| Error::store("postgres", "cannot begin a transaction", e))
    }

    async fn fence(
        &self,
        conn: &mut sqlx::PgConnection,
        resource: &str,
        token: FencingToken,
    ) -> tenure::Result<()> {
        self.fence.fence_in_transaction(conn, resource, token).await
    }
}
