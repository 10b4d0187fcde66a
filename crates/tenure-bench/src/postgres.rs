//! `postgres://...` and `postgres:throwaway`: the PostgreSQL store beside its own SQL.
//!
//! The store side is what `tenure_postgres::connect` builds (a pool sized to the
//! client count); the raw side issues `tenure_postgres::statements` on one plain
//! `PgConnection` per client. Statements per operation come from
//! `pg_stat_statements`: a throwaway server is restarted with it preloaded; on a
//! user's server it is used when installed. The release floor is the same handover
//! without the store or the elector: raw release, the notification reaching a
//! `PgListener`, raw acquire.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener};
use sqlx::{ConnectOptions, Connection, PgConnection, Row};
use tenure::{Error, LeaseStore, Result};
use tenure_postgres::statements;
use tenure_throwaway::postgres::PgServer;
use tokio::time::{timeout, Instant};

use crate::backend::{
    blocking, unexpected, Backend, Client, Counter, Handles, BENCH_TTL, REGISTRY_TTL,
};
use crate::report::Floor;
use crate::stats::summarize;
use crate::BenchError;

const BACKEND: &str = "postgres";

/// The schema the bench's tables live in, apart from a user's `tenure` schema.
const SCHEMA: &str = "tenure_bench";

pub(crate) struct Postgres {
    url: String,
    options: PgConnectOptions,
    /// Why statements cannot be counted, if they cannot.
    no_counter: Option<String>,
    server: Option<Arc<PgServer>>,
}

fn err(what: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| Error::store(BACKEND, what, e)
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// `"tenure_bench"."table"`: the schema name needs no escaping.
fn table(name: &str) -> String {
    format!("\"{SCHEMA}\".\"{name}\"")
}

/// The channel the store notifies lease changes on.
fn channel() -> String {
    format!("tenure:{SCHEMA}")
}

impl Postgres {
    pub(crate) async fn open(
        url: &str,
        server: Option<Arc<PgServer>>,
    ) -> Result<Postgres, BenchError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|_| {
                BenchError::Usage(
                    "--store is not a valid PostgreSQL URL; expected \
                     postgres://USER:PASSWORD@HOST:PORT/DATABASE"
                        .to_owned(),
                )
            })?
            .application_name("tenure-bench");
        // Creates the schema and checks the server answers, with scrubbed errors.
        let backend = tenure_postgres::connect(url, connect_options(1)).await?;
        backend.pool.close().await;
        let mut pg = Postgres {
            url: url.to_owned(),
            options,
            no_counter: None,
            server,
        };
        pg.no_counter = pg.counter_problem().await;
        Ok(pg)
    }

    /// Starts a server with `pg_stat_statements` preloaded; it stops when the run ends.
    pub(crate) async fn throwaway() -> Result<Postgres, BenchError> {
        let server =
            Arc::new(blocking("start a throwaway PostgreSQL server", PgServer::start).await?);
        let admin = Arc::clone(&server);
        blocking("preload pg_stat_statements", move || {
            // Preloading needs a restart; the harness keeps the data directory and port.
            admin.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")?;
            admin.restart()?;
            admin.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        })
        .await?;
        let url = server.url();
        Postgres::open(&url, Some(server)).await
    }

    async fn conn(&self) -> Result<PgConnection> {
        self.options
            .connect()
            .await
            .map_err(err("cannot open a raw connection"))
    }

    /// Why `pg_stat_statements` cannot be read here, or `None` when it can.
    async fn counter_problem(&self) -> Option<String> {
        let mut conn = match self.conn().await {
            Ok(conn) => conn,
            Err(error) => return Some(error.to_string()),
        };
        let problem = match sqlx::query(COUNT_SQL).fetch_one(&mut conn).await {
            Ok(_) => None,
            Err(_) => Some(
                "pg_stat_statements is not readable on this server (it needs \
                 shared_preload_libraries = 'pg_stat_statements' and CREATE EXTENSION; \
                 postgres:throwaway sets both up)"
                    .to_owned(),
            ),
        };
        let _ = conn.close().await;
        problem
    }
}

/// Waits for the next notification about `role`.
async fn next_note(listener: &mut PgListener, role: &str) -> Result<()> {
    loop {
        let note = timeout(Duration::from_secs(10), listener.recv())
            .await
            .map_err(|_| Error::store_msg(BACKEND, "no notification within 10 s"))?
            .map_err(err("listener failed"))?;
        if note.payload() == role {
            return Ok(());
        }
    }
}

fn connect_options(connections: usize) -> tenure_postgres::ConnectOptions {
    connect_options_with(connections, REGISTRY_TTL)
}

fn connect_options_with(
    connections: usize,
    registry_ttl: Duration,
) -> tenure_postgres::ConnectOptions {
    tenure_postgres::ConnectOptions {
        schema: SCHEMA.to_owned(),
        registry_ttl,
        max_connections: u32::try_from(connections).unwrap_or(u32::MAX),
        ..Default::default()
    }
}

/// Calls of every statement this user ran in this database, leaving out the reads of
/// `pg_stat_statements` itself and the store's set-up of each connection it takes (one
/// `SET client_connection_check_interval` per connection, kept between calls: a cost of
/// the connection, like its login, not of the operations run on it).
const COUNT_SQL: &str = "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements \
     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND userid = (SELECT oid FROM pg_roles WHERE rolname = current_user) \
     AND query NOT ILIKE '%pg_stat_statements%' \
     AND query NOT ILIKE 'SET client_connection_check_interval%'";

/// Row versions written (inserted, updated, deleted) in the bench's tables.
const ROWS_WRITTEN_SQL: &str =
    "SELECT COALESCE(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint \
     FROM pg_stat_user_tables WHERE schemaname = $1";

/// One plain connection issuing the store's statements.
struct RawClient {
    conn: PgConnection,
    sql: Arc<Sql>,
}

struct Sql {
    acquire: String,
    release: String,
    heartbeat: String,
    channel: String,
}

impl Sql {
    fn new() -> Sql {
        Sql {
            acquire: statements::acquire_statement(
                &table("tenure_leases"),
                &table("tenure_sessions"),
                &table("tenure_candidates"),
            ),
            release: statements::release_statement(
                &table("tenure_leases"),
                &table("tenure_sessions"),
                &table("tenure_candidates"),
            ),
            heartbeat: statements::heartbeat_statement(
                &table("tenure_nodes"),
                &table("tenure_sessions"),
            ),
            channel: channel(),
        }
    }

    /// The acquire-or-renew statement for `owner`; returns the token when it holds.
    async fn acquire(&self, conn: &mut PgConnection, role: &str, owner: &str) -> Result<u64> {
        let row = sqlx::query(&self.acquire)
            .bind(role)
            .bind(owner)
            .bind(micros(BENCH_TTL))
            .bind(&self.channel)
            .fetch_one(conn)
            .await
            .map_err(err("raw acquire"))?;
        let holder: Option<String> = row.try_get(0).map_err(err("raw acquire: holder"))?;
        if holder.as_deref() != Some(owner) {
            return Err(unexpected(format!(
                "raw acquire of {role}: held by another"
            )));
        }
        let token: i64 = row.try_get(1).map_err(err("raw acquire: token"))?;
        u64::try_from(token).map_err(|_| unexpected(format!("raw acquire of {role}: bad token")))
    }

    async fn release(
        &self,
        conn: &mut PgConnection,
        role: &str,
        owner: &str,
        token: u64,
    ) -> Result<()> {
        let released: i64 = sqlx::query_scalar(&self.release)
            .bind(role)
            .bind(owner)
            .bind(i64::try_from(token).unwrap_or(i64::MAX))
            .bind(&self.channel)
            .fetch_one(conn)
            .await
            .map_err(err("raw release"))?;
        if released != 1 {
            return Err(unexpected(format!("raw release of {role}: not held")));
        }
        Ok(())
    }
}

#[async_trait]
impl Client for RawClient {
    async fn acquire(&mut self, role: &str, owner: &str) -> Result<u64> {
        self.sql.acquire(&mut self.conn, role, owner).await
    }

    async fn renew(&mut self, role: &str, owner: &str) -> Result<()> {
        self.sql
            .acquire(&mut self.conn, role, owner)
            .await
            .map(drop)
    }

    async fn release(&mut self, role: &str, owner: &str, token: u64) -> Result<()> {
        self.sql.release(&mut self.conn, role, owner, token).await
    }

    async fn heartbeat(&mut self, node: &str) -> Result<()> {
        sqlx::query(&self.sql.heartbeat)
            .bind(micros(REGISTRY_TTL))
            .bind(node)
            .bind(None::<String>)
            .bind(format!("tenure-members:{SCHEMA}"))
            .bind(None::<i64>)
            .execute(&mut self.conn)
            .await
            .map_err(err("raw heartbeat"))?;
        Ok(())
    }
}

#[async_trait]
impl Backend for Postgres {
    async fn stores(&self, clients: usize, registry_ttl: Duration) -> Result<Handles> {
        let options = connect_options_with(clients, registry_ttl);
        let backend = tenure_postgres::connect(&self.url, options).await?;
        Ok(Handles {
            leases: Arc::new(backend.leases),
            registry: Arc::new(backend.registry),
        })
    }

    async fn raw(&self, clients: usize) -> Result<Vec<Box<dyn Client>>> {
        let sql = Arc::new(Sql::new());
        let mut out: Vec<Box<dyn Client>> = Vec::with_capacity(clients);
        for _ in 0..clients {
            out.push(Box::new(RawClient {
                conn: self.conn().await?,
                sql: Arc::clone(&sql),
            }));
        }
        Ok(out)
    }

    fn raw_label(&self) -> &'static str {
        "the store's statements (tenure_postgres::statements) on one plain sqlx PgConnection \
         per client"
    }

    async fn pair(&self) -> Result<(Arc<dyn LeaseStore>, Arc<dyn LeaseStore>)> {
        let a = tenure_postgres::connect(&self.url, connect_options(2)).await?;
        let b = tenure_postgres::connect(&self.url, connect_options(2)).await?;
        Ok((Arc::new(a.leases), Arc::new(b.leases)))
    }

    async fn requests(&self) -> Result<Counter> {
        if let Some(problem) = &self.no_counter {
            return Ok(Counter::NotMeasured(problem.clone()));
        }
        let mut conn = self.conn().await?;
        let calls: i64 = sqlx::query_scalar(COUNT_SQL)
            .fetch_one(&mut conn)
            .await
            .map_err(err("cannot read pg_stat_statements"))?;
        let _ = conn.close().await;
        Ok(Counter::Count(u64::try_from(calls).unwrap_or(0)))
    }

    fn requests_label(&self) -> &'static str {
        "statements counted by pg_stat_statements (this user and database)"
    }

    fn counter_lag(&self) -> Duration {
        // A backend flushes its table counters after a transaction at most once a
        // second, and an idle one only after 10 s (PGSTAT_IDLE_INTERVAL).
        Duration::from_secs(11)
    }

    async fn rows_written(&self) -> Result<Counter> {
        // In a steady state the counters' lag (see `counter_lag`) is the same at both
        // ends of a window.
        let mut conn = self.conn().await?;
        let rows: i64 = sqlx::query_scalar(ROWS_WRITTEN_SQL)
            .bind(SCHEMA)
            .fetch_one(&mut conn)
            .await
            .map_err(err("cannot read pg_stat_user_tables"))?;
        let _ = conn.close().await;
        Ok(Counter::Count(u64::try_from(rows).unwrap_or(0)))
    }

    async fn release_floor(&self, trials: usize, run_id: &str) -> Result<Floor> {
        let sql = Sql::new();
        let role = format!("{run_id}-floor");
        let owners = ["floor-a", "floor-b"];
        let mut conns = [self.conn().await?, self.conn().await?];
        let mut listener =
            PgListener::connect_with(&sqlx::PgPool::connect_lazy_with(self.options.clone()))
                .await
                .map_err(err("cannot open a listener"))?;
        listener
            .listen(&sql.channel)
            .await
            .map_err(err("cannot listen"))?;
        let mut token = sql.acquire(&mut conns[0], &role, owners[0]).await?;
        // Every new term notifies too: take the first term's notification.
        next_note(&mut listener, &role).await?;
        let mut samples = Vec::with_capacity(trials);
        for trial in 0..trials {
            let (from, to) = (trial % 2, (trial + 1) % 2);
            tokio::time::sleep(Duration::from_millis(5)).await;
            let start = Instant::now();
            sql.release(&mut conns[from], &role, owners[from], token)
                .await?;
            next_note(&mut listener, &role).await?;
            token = sql.acquire(&mut conns[to], &role, owners[to]).await?;
            samples.push(start.elapsed());
            // The new term's notification, so it is not taken for the next release.
            next_note(&mut listener, &role).await?;
        }
        Ok(Floor {
            label: "raw release -> PgListener -> raw acquire".to_owned(),
            latency: Some(summarize(&samples)),
            bound_ms: None,
        })
    }

    fn release_goal_ms(&self) -> Option<f64> {
        Some(3.0)
    }

    async fn version(&self) -> Option<String> {
        let mut conn = self.conn().await.ok()?;
        let version: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        let _ = conn.close().await;
        let owned = if self.server.is_some() {
            " (throwaway server)"
        } else {
            ""
        };
        Some(format!("PostgreSQL {version}{owned}"))
    }

    async fn close(&self) {
        if let Some(server) = &self.server {
            let server = Arc::clone(server);
            let _ = tokio::task::spawn_blocking(move || server.stop()).await;
        }
    }
}
