//! Helpers shared by this crate's integration tests: pools and fresh schemas on a
//! throwaway server.
#![allow(dead_code)]

use std::io::Write;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tenure_postgres::{PgLeaseStore, Schema};
use tenure_testkit::postgres::PgServer;

/// A pool on `server` of at most `max` connections, tagged with `app` (so tests can
/// find and terminate its backends).
pub async fn pool(server: &PgServer, max: u32, app: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options(server).application_name(app))
        .await
        .expect("connect to the test server")
}

/// A pool that does not connect until used (for servers that are down).
pub fn lazy_pool(server: &PgServer, max: u32, app: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options(server).application_name(app))
}

pub fn options(server: &PgServer) -> PgConnectOptions {
    PgConnectOptions::from_str(&server.url()).expect("test url")
}

/// A schema name no other scenario in this run uses.
pub fn fresh_schema() -> Schema {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    Schema::new(&format!("t{}_{n}", std::process::id())).expect("valid schema")
}

/// Logs to the test output when RUST_LOG is set.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// For tests of upgrading: a pool of 4 on the shared server, tagged `app`, and a fresh
/// schema holding the lease table as the first `migrate` made it (no sessions, no
/// values); returns the pool, the schema and the table's quoted name.
pub async fn first_version(app: &str) -> (PgPool, Schema, String) {
    init_tracing();
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let pool = pool(server, 4, app).await;
    let schema = fresh_schema();
    let leases = table(&schema, "tenure_leases");
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA \"{}\";
         CREATE TABLE {leases} (
             role text PRIMARY KEY,
             holder text,
             fencing_token bigint NOT NULL CHECK (fencing_token > 0),
             expires_at timestamptz NOT NULL,
             term_txid bigint NOT NULL
         );",
        schema.name()
    ))
    .execute(&pool)
    .await
    .expect("create the first lease table");
    (pool, schema, leases)
}

/// A pool of 4 on the shared server, tagged `app`, and a fresh migrated schema.
pub async fn migrated(app: &str) -> (PgPool, Schema) {
    migrated_with(app, 4).await
}

/// A pool of `max` on the shared server, tagged `app`, and a fresh migrated schema.
pub async fn migrated_with(app: &str, max: u32) -> (PgPool, Schema) {
    init_tracing();
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let pool = pool(server, max, app).await;
    let schema = fresh_schema();
    tenure_postgres::migrate(&pool, &schema)
        .await
        .expect("migrate");
    (pool, schema)
}

/// `pool` and `schema` (from [`migrated`], say) with a store on them.
pub fn with_store((pool, schema): (PgPool, Schema)) -> (PgPool, Schema, PgLeaseStore) {
    let store = PgLeaseStore::new(pool.clone(), schema.clone());
    (pool, schema, store)
}

/// Runs `sql` (tables and rows as an earlier version left them) on `pool`, then
/// `migrate` twice, the second run having nothing left to do; returns a store on the
/// upgraded `schema`.
pub async fn upgraded(pool: &PgPool, schema: &Schema, sql: &str) -> PgLeaseStore {
    sqlx::raw_sql(sql).execute(pool).await.unwrap();
    tenure_postgres::migrate(pool, schema).await.unwrap();
    tenure_postgres::migrate(pool, schema).await.unwrap();
    PgLeaseStore::new(pool.clone(), schema.clone())
}

/// `"schema"."name"`, quoted.
pub fn table(schema: &Schema, name: &str) -> String {
    format!("\"{}\".\"{name}\"", schema.name())
}

/// A transaction on `pool` holding the row lock of `key` in `schema`'s table `name`
/// (`tenure_leases` by role, `tenure_nodes` by node id): statements on that row wait,
/// inside the server, until it ends.
pub async fn row_locked(
    pool: &PgPool,
    schema: &Schema,
    name: &str,
    key: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let column = if name == "tenure_nodes" {
        "node_id"
    } else {
        "role"
    };
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM {} WHERE {column} = $1 FOR UPDATE",
        table(schema, name)
    ))
    .bind(key)
    .execute(&mut *blocker)
    .await
    .unwrap();
    blocker
}

/// Spawns `sql` on `pool` behind `pg_sleep(seconds)` in the same simple-query message, so
/// it runs `seconds` after it arrived with the `statement_timestamp()` of its arrival: a
/// call held up inside the server (behind a lock or a starved backend). The task fails
/// if the statement does.
pub fn run_late(pool: &PgPool, seconds: f64, sql: String) -> tokio::task::JoinHandle<()> {
    let pool = pool.clone();
    tokio::spawn(async move {
        sqlx::raw_sql(&format!("SELECT pg_sleep({seconds}); {sql}"))
            .execute(&pool)
            .await
            .unwrap();
    })
}

/// Polls `found` every 10 ms until it gives a value; panics with `what` once `deadline`
/// has passed without one.
pub async fn poll_until<T>(
    deadline: Instant,
    what: &str,
    mut found: impl FnMut() -> Option<T>,
) -> T {
    let within = deadline.saturating_duration_since(Instant::now());
    tenure_testkit::eventually(within, Duration::from_millis(10), || {
        let found = found();
        async move { found.ok_or_else(|| what.to_owned()) }
    })
    .await
}

/// Collects every log line written through it (a clone per `fmt` writer), so a test can
/// read what was logged.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Everything written so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
