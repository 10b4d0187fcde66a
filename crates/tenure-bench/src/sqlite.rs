//! `sqlite:PATH` and `sqlite:throwaway`: the SQLite store beside its own statements.
//!
//! The raw side runs the store's own write steps (`tenure_sqlite::statements`) in one
//! `BEGIN IMMEDIATE` transaction on a plain connection with the store's settings (WAL,
//! `synchronous = FULL`, 5 s busy timeout): what the store adds is its pool, its
//! writer queue and its checks. Two store
//! handles on separate `SqliteDatabase`s see each other's releases only by polling, so
//! the release bound is the polling interval.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tenure::{Error, LeaseStore, Result};
use tenure_sqlite::statements::{self, LeaseWrite};
use tenure_sqlite::{SqliteDatabase, SqliteOptions};

use crate::backend::{unexpected, Backend, Client, Counter, Handles, BENCH_TTL, REGISTRY_TTL};
use crate::report::Floor;
use crate::BenchError;

const BACKEND: &str = "sqlite";

/// The store's default; the raw connections use the same.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The store's default polling interval for changes made through another handle.
const POLL: Duration = Duration::from_millis(10);

pub(crate) struct Sqlite {
    url: String,
    path: PathBuf,
    /// The throwaway directory, removed on drop.
    throwaway: Option<Throwaway>,
}

pub(crate) struct Throwaway(PathBuf);

impl Drop for Throwaway {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(%error, dir = %self.0.display(), "cannot remove the throwaway directory");
        }
    }
}

fn err(what: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| Error::store(BACKEND, what, e)
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl Sqlite {
    /// Opens (creating if missing) the file of `url`.
    pub(crate) async fn open(url: &str, throwaway: Option<Throwaway>) -> Result<Sqlite> {
        let path = tenure_sqlite::path_from_url(url)?;
        // Creates the file and the schema, as the CLI would.
        let db = tenure_sqlite::connect(url).await?;
        db.pool().close().await;
        Ok(Sqlite {
            url: url.to_owned(),
            path,
            throwaway,
        })
    }

    /// A fresh file in a temporary directory, removed when the run ends.
    pub(crate) async fn throwaway(run_id: &str) -> Result<Sqlite, BenchError> {
        let dir = std::env::temp_dir().join(format!("tenure-bench-{run_id}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| BenchError::Setup(format!("cannot create {}: {e}", dir.display())))?;
        let guard = Throwaway(dir.clone());
        let url = format!("sqlite:{}", dir.join("bench.db").display());
        Ok(Sqlite::open(&url, Some(guard)).await?)
    }

    async fn database(&self, connections: usize) -> Result<SqliteDatabase> {
        let options = SqliteOptions::new()
            .max_connections(u32::try_from(connections).unwrap_or(u32::MAX))
            .busy_timeout(BUSY_TIMEOUT)
            .poll_interval(POLL);
        tenure_sqlite::connect_with(&self.url, options).await
    }
}

/// One plain connection issuing the store's statements.
struct RawClient {
    conn: SqliteConnection,
}

impl RawClient {
    /// `BEGIN IMMEDIATE`, the boot-id read and the store's clock: the start of every
    /// store write.
    async fn begin(&mut self) -> Result<(sqlx::Transaction<'_, sqlx::Sqlite>, i64)> {
        let mut tx = self
            .conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(err("raw begin"))?;
        let _boot: Option<String> = sqlx::query_scalar(statements::READ_BOOT)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err("raw boot-id read"))?;
        Ok((tx, statements::monotonic_nanos()?))
    }

    /// The store's lease step on a plain connection; an answer other than `new_term`
    /// is an error.
    async fn take(&mut self, role: &str, owner: &str, new_term: bool) -> Result<u64> {
        let (mut tx, now) = self.begin().await?;
        let expires_at = now.saturating_add(nanos(BENCH_TTL));
        match statements::write_lease(&mut tx, role, owner, now, expires_at).await? {
            LeaseWrite::Written { token, new_term: n } if n == new_term => {
                tx.commit().await.map_err(err("raw commit"))?;
                u64::try_from(token).map_err(|_| unexpected(format!("token {token} of {role}")))
            }
            other => Err(unexpected(format!("raw write of {role}: {other:?}"))),
        }
    }
}

#[async_trait]
impl Client for RawClient {
    async fn acquire(&mut self, role: &str, owner: &str) -> Result<u64> {
        self.take(role, owner, true).await
    }

    async fn renew(&mut self, role: &str, owner: &str) -> Result<()> {
        self.take(role, owner, false).await.map(drop)
    }

    async fn release(&mut self, role: &str, owner: &str, token: u64) -> Result<()> {
        let (mut tx, now) = self.begin().await?;
        let token = i64::try_from(token).unwrap_or(i64::MAX);
        if !statements::release_lease(&mut tx, role, owner, token, now).await? {
            return Err(unexpected(format!("raw release of {role}: not held")));
        }
        tx.commit().await.map_err(err("raw commit"))
    }

    async fn heartbeat(&mut self, node: &str) -> Result<()> {
        let (mut tx, now) = self.begin().await?;
        let current: Option<(i64, i64, String)> = sqlx::query_as(statements::READ_NODE)
            .bind(node)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err("raw node read"))?;
        // The registry's liveness decision, reduced to the live case the bench sets up.
        let (last, first, metadata) = current.unwrap_or((now, now, "{}".to_owned()));
        sqlx::query(statements::UPSERT_NODE)
            .bind(node)
            .bind(last.max(now))
            .bind(first)
            .bind(metadata)
            .bind(None::<i64>)
            .execute(&mut *tx)
            .await
            .map_err(err("raw node write"))?;
        sqlx::query(statements::FORGET_NODES)
            .bind(statements::forget_bound(now, REGISTRY_TTL))
            .execute(&mut *tx)
            .await
            .map_err(err("raw node cleanup"))?;
        tx.commit().await.map_err(err("raw commit"))
    }
}

#[async_trait]
impl Backend for Sqlite {
    async fn stores(&self, clients: usize, registry_ttl: Duration) -> Result<Handles> {
        let db = self.database(clients).await?;
        Ok(Handles {
            leases: Arc::new(db.lease_store()),
            registry: Arc::new(db.node_registry(registry_ttl)?),
        })
    }

    async fn raw(&self, clients: usize) -> Result<Vec<Box<dyn Client>>> {
        let options = SqliteConnectOptions::new()
            .filename(&self.path)
            .create_if_missing(false)
            .busy_timeout(BUSY_TIMEOUT)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full);
        let mut out: Vec<Box<dyn Client>> = Vec::with_capacity(clients);
        for _ in 0..clients {
            let conn = options
                .connect()
                .await
                .map_err(err("cannot open a raw connection"))?;
            out.push(Box::new(RawClient { conn }));
        }
        Ok(out)
    }

    fn raw_label(&self) -> &'static str {
        "the store's statements (tenure_sqlite::statements) in one BEGIN IMMEDIATE transaction \
         on a plain sqlx connection, WAL, synchronous=FULL"
    }

    async fn pair(&self) -> Result<(Arc<dyn LeaseStore>, Arc<dyn LeaseStore>)> {
        Ok((
            Arc::new(self.database(2).await?.lease_store()),
            Arc::new(self.database(2).await?.lease_store()),
        ))
    }

    async fn requests(&self) -> Result<Counter> {
        Ok(Counter::NotMeasured(
            "in-process library: no server round trips (each write is one BEGIN IMMEDIATE \
             transaction on the file)"
                .to_owned(),
        ))
    }

    fn requests_label(&self) -> &'static str {
        "none"
    }

    async fn release_floor(&self, _trials: usize, _run_id: &str) -> Result<Floor> {
        Ok(Floor {
            label: "polling interval of a separate handle (a release by another handle or \
                    process is seen by reading)"
                .to_owned(),
            latency: None,
            bound_ms: Some(POLL.as_secs_f64() * 1e3),
        })
    }

    fn release_goal_ms(&self) -> Option<f64> {
        Some(50.0)
    }

    async fn version(&self) -> Option<String> {
        let mut conn = SqliteConnectOptions::new()
            .filename(&self.path)
            .create_if_missing(false)
            .connect()
            .await
            .ok()?;
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        let _ = conn.close().await;
        Some(format!("SQLite {version}"))
    }

    async fn close(&self) {
        if let Some(dir) = &self.throwaway {
            tracing::debug!(dir = %dir.0.display(), "removing the throwaway database");
        }
    }
}
