//! The opened database file: its pool, its store time and its in-process change signals.
//!
//! [`SqliteDatabase`] is what the lease store, the node registry and the fence share:
//! one connection pool over one file and one host clock (monotonic time and boot id).
//! Opening checks the path first so that a wrong path is a clear error and never a
//! stray new file or a scribbled-on foreign one.

use std::collections::HashMap;
use std::fmt;
use std::fs::OpenOptions;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use tenure::{Error, FencingToken, Result};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::clock::{HostClock, HostTime, SystemHostClock};
use crate::BACKEND;

/// The first 16 bytes of every SQLite database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// The schema version this crate writes and understands. Version 1 kept wall-clock
/// nanoseconds and a high-water mark (`tenure_clock`); opening such a file migrates it.
const SCHEMA_VERSION: i64 = 2;

/// The tables, created idempotently. Times are nanoseconds of the host's monotonic
/// clock, meaningful only under the boot recorded in `tenure_boot` (one row, written by
/// the first write transaction under each boot).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tenure_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_boot (
    id      INTEGER PRIMARY KEY CHECK (id = 0),
    boot_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_leases (
    role       TEXT PRIMARY KEY NOT NULL,
    holder     TEXT,
    token      INTEGER NOT NULL CHECK (token >= 1),
    expires_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_nodes (
    node_id        TEXT PRIMARY KEY NOT NULL,
    last_heartbeat INTEGER NOT NULL,
    first_seen     INTEGER NOT NULL,
    metadata       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tenure_nodes_last_heartbeat ON tenure_nodes (last_heartbeat);
CREATE TABLE IF NOT EXISTS tenure_fences (
    resource TEXT PRIMARY KEY NOT NULL,
    highest  INTEGER NOT NULL
);
";

/// How the database is opened and how waiting contenders poll it.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tenure_sqlite::{ManualHostClock, SqliteOptions};
///
/// let clock = ManualHostClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
/// let options = SqliteOptions::new()
///     .with_clock(clock)
///     .busy_timeout(Duration::from_secs(2))
///     .poll_interval(Duration::from_millis(5));
/// # let _ = options;
/// ```
#[derive(Clone)]
pub struct SqliteOptions {
    clock: Arc<dyn HostClock>,
    busy_timeout: Duration,
    max_connections: u32,
    poll_interval: Duration,
}

impl fmt::Debug for SqliteOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteOptions")
            .field("clock", &self.clock)
            .field("busy_timeout", &self.busy_timeout)
            .field("max_connections", &self.max_connections)
            .field("poll_interval", &self.poll_interval)
            .finish()
    }
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            clock: Arc::new(SystemHostClock),
            busy_timeout: Duration::from_secs(5),
            max_connections: 8,
            poll_interval: Duration::from_millis(10),
        }
    }
}

impl SqliteOptions {
    /// The defaults: the host's clocks, 5 s busy timeout, 8 connections, 10 ms polling.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes store time from `clock` instead of the host's ([`SystemHostClock`]);
    /// tests inject a [`ManualHostClock`](crate::ManualHostClock) to pass time, step
    /// the wall clock alone, or reboot.
    pub fn with_clock(mut self, clock: impl HostClock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How long one statement waits for another process's write lock before failing
    /// with a store error. Only used by `open`; a pool passed to `from_pool` keeps its
    /// own setting.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// The size of the connection pool `open` creates (at least 1).
    pub fn max_connections(mut self, connections: u32) -> Self {
        self.max_connections = connections.max(1);
        self
    }

    /// How often a waiting contender re-reads its role when no in-process signal woke
    /// it (a release by another process can only be seen by reading). At least 1 ms.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(Duration::from_millis(1));
        self
    }
}

/// One SQLite database file shared by a lease store, a node registry and a fence.
///
/// Cloning is cheap and shares the pool. Every write is one `BEGIN IMMEDIATE`
/// transaction, so writers in any process on the host serialise on the file's write
/// lock; the pool waits up to the busy timeout for it.
///
/// # Store time
///
/// Store time is the host's `CLOCK_MONOTONIC` (or the injected [`HostClock`]), the
/// clock tokio's and std's `Instant` read, so expiry in the file and every holder's
/// local deadline run on one clock: a wall-clock step (an NTP step, `date -s`) neither
/// expires a live lease early nor keeps a dead one alive. Every process sharing the
/// file must therefore run on this host and in one time namespace (as containers do
/// unless given their own).
///
/// The monotonic clock restarts at boot, so the file records the boot id its times
/// belong to. The first write under a new boot id (in its own write transaction, so
/// concurrent processes agree) expires every lease and drops every heartbeat, and keeps
/// every token; until then, reads treat the old times the same way. The wall clock is
/// only for answers: a stored time `t` is shown as `wall now + (t - monotonic now)`, so
/// `expires_at - now` of an answer is exact even while the wall clock steps.
///
/// # Examples
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use tenure::{FenceStore, LeaseStore, NodeRegistry};
/// use tenure_sqlite::SqliteDatabase;
///
/// let dir = tempfile::tempdir().unwrap();
/// let db = SqliteDatabase::open(dir.path().join("tenure.db")).await?;
/// let store = db.lease_store();
/// let lease = store.try_acquire_or_renew("reports", "node-a", Duration::from_secs(15)).await?;
/// assert!(lease.acquired);
/// db.fence().admit("report-table", lease.fencing_token).await?;
/// let registry = db.node_registry(Duration::from_secs(10))?;
/// registry.heartbeat("node-a").await?;
/// # Ok::<(), tenure::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct SqliteDatabase {
    inner: Arc<Inner>,
}

struct Inner {
    pool: SqlitePool,
    clock: Arc<dyn HostClock>,
    poll_interval: Duration,
    /// Per role, woken when a write through this database ends or replaces a term.
    changes: Mutex<HashMap<String, Arc<Notify>>>,
    path: Option<PathBuf>,
    /// One of the stores' write transactions at a time in this process: the others
    /// queue here instead of in SQLite's busy handler, which sleeps 1 to 100 ms between
    /// tries (16 writers in one process fell to ~150 commits/s).
    writer: Arc<Semaphore>,
}

impl fmt::Debug for SqliteDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteDatabase")
            .field("path", &self.inner.path)
            .field("clock", &self.inner.clock)
            .field("poll_interval", &self.inner.poll_interval)
            .finish_non_exhaustive()
    }
}

impl SqliteDatabase {
    /// Opens (creating if needed, with mode 0600) the database file at `path`, switches
    /// it to WAL mode and creates the schema; safe when several processes open one file
    /// at once.
    ///
    /// The parent directory must exist. A missing directory, a directory path, a
    /// read-only or unreadable file, or a file that is not a SQLite database is an error
    /// naming the path and the problem, and nothing is created or written.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// [`open`](Self::open) with options (clock, busy timeout, pool size, polling).
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref();
        check_path(path)?;
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .busy_timeout(options.busy_timeout)
            // Tokens must survive power loss: every commit reaches the disk.
            .synchronous(SqliteSynchronous::Full);
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections)
            // A local file cannot drop a connection: a ping before each checkout would
            // only add a round trip to sqlx's worker thread.
            .test_before_acquire(false)
            .connect_with(connect)
            .await
            .map_err(|e| Error::store(BACKEND, format!("cannot open {}", path.display()), e))?;
        enable_wal(&pool, path, options.busy_timeout).await?;
        let db = Self::build(pool, options, Some(path.to_owned()));
        db.install_schema().await?;
        tracing::debug!(path = %path.display(), "opened sqlite store");
        Ok(db)
    }

    /// Uses an existing pool (its journal mode and busy timeout are left as they are)
    /// and creates the schema if missing.
    pub async fn from_pool(pool: SqlitePool) -> Result<Self> {
        Self::from_pool_with(pool, SqliteOptions::default()).await
    }

    /// [`from_pool`](Self::from_pool) with options (the clock and the polling interval
    /// apply; the pool's own connection settings are kept).
    pub async fn from_pool_with(pool: SqlitePool, options: SqliteOptions) -> Result<Self> {
        let db = Self::build(pool, options, None);
        db.install_schema().await?;
        Ok(db)
    }

    fn build(pool: SqlitePool, options: SqliteOptions, path: Option<PathBuf>) -> Self {
        SqliteDatabase {
            inner: Arc::new(Inner {
                pool,
                clock: options.clock,
                poll_interval: options.poll_interval,
                changes: Mutex::new(HashMap::new()),
                path,
                writer: Arc::new(Semaphore::new(1)),
            }),
        }
    }

    async fn install_schema(&self) -> Result<()> {
        // An up-to-date file opens without a write transaction (and its fsync): every
        // `tenure` command opens the store once, so this is most of their start-up.
        let current: Option<i64> =
            sqlx::query_scalar("SELECT value FROM tenure_meta WHERE key = 'schema_version'")
                .fetch_optional(&self.inner.pool)
                .await
                .ok()
                .flatten();
        if current == Some(SCHEMA_VERSION) {
            return Ok(());
        }
        let mut tx = self.begin_immediate().await?;
        create_schema_at(&mut tx, self.inner.clock.as_ref()).await?;
        tx.commit()
            .await
            .map_err(|e| Error::store(BACKEND, "cannot commit the schema", e))
    }

    /// The connection pool, for the caller's own tables and fenced transactions.
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// The file this database was opened from (`None` for [`from_pool`](Self::from_pool)).
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// A lease store over this database.
    pub fn lease_store(&self) -> crate::SqliteLeaseStore {
        crate::SqliteLeaseStore::new(self)
    }

    /// A node registry over this database where a node is live for `ttl` after a
    /// heartbeat; `ttl == 0` is [`Error::InvalidArgument`].
    pub fn node_registry(&self, ttl: Duration) -> Result<crate::SqliteNodeRegistry> {
        crate::SqliteNodeRegistry::new(self, ttl)
    }

    /// The fence table of this database.
    pub fn fence(&self) -> crate::SqliteFence {
        crate::SqliteFence::new(self)
    }

    /// Begins a `BEGIN IMMEDIATE` transaction: it takes the file's write lock at once
    /// (waiting up to the busy timeout), so a fenced read-modify-write in it cannot fail
    /// half-way with a busy snapshot. Use it for
    /// [`fence_in_transaction`](crate::fence_in_transaction).
    ///
    /// Cancel-safe: the BEGIN runs on its own task, so if the caller's future is dropped
    /// while SQLite waits for the write lock, the task still finishes and dropping the
    /// transaction it returns rolls back. (Dropped mid-begin, sqlx would hand the
    /// connection back to the pool holding the write lock for good.)
    ///
    /// The stores' own writes queue for one in-process writer slot before they begin;
    /// a transaction begun here does not take that slot, so it meets them (and other
    /// processes) at SQLite's write lock and busy timeout.
    pub async fn begin_immediate(&self) -> Result<Transaction<'static, Sqlite>> {
        let pool = self.inner.pool.clone();
        tokio::spawn(async move { pool.begin_with("BEGIN IMMEDIATE").await })
            .await
            .map_err(|e| Error::store(BACKEND, "the write transaction task failed", e))?
            .map_err(|e| Error::store(BACKEND, "cannot begin a write transaction", e))
    }

    /// [`begin_immediate`](Self::begin_immediate) for the stores' own writes, after
    /// taking this process's writer slot; keep the slot until the transaction ends.
    /// (Other processes, and the caller's own `begin_immediate` transactions, still
    /// meet at SQLite's write lock.)
    pub(crate) async fn begin_write(
        &self,
    ) -> Result<(OwnedSemaphorePermit, Transaction<'static, Sqlite>)> {
        let slot = Arc::clone(&self.inner.writer)
            .acquire_owned()
            .await
            .map_err(|e| Error::store(BACKEND, "the writer queue is closed", e))?;
        Ok((slot, self.begin_immediate().await?))
    }

    /// Store time for a read, or for checking input before a transaction. A read
    /// compares [`StoreNow::boot_id`] with the file's in the same statement and treats
    /// the file's times as past when they differ.
    pub(crate) fn now(&self) -> Result<StoreNow> {
        StoreNow::from_host(self.inner.clock.now()?)
    }

    /// Store time for a write, inside its transaction (so the write lock orders the
    /// readings): the first write under a new boot starts it (see `start_boot`).
    pub(crate) async fn write_now(&self, conn: &mut SqliteConnection) -> Result<StoreNow> {
        let now = self.now()?;
        let recorded: Option<String> = sqlx::query_scalar(READ_BOOT)
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error("cannot read the boot id of the store"))?;
        if recorded.as_deref() != Some(now.boot_id.as_str()) {
            start_boot(conn, &now).await?;
            if let Some(previous) = recorded {
                tracing::info!(
                    previous,
                    boot_id = now.boot_id,
                    "the sqlite store is used under a new boot: every lease expired and \
                     every heartbeat is stale; tokens are kept"
                );
            }
        }
        Ok(now)
    }

    pub(crate) fn poll_interval(&self) -> Duration {
        self.inner.poll_interval
    }

    /// The signal for `role`, woken by writes through this database that change a term.
    pub(crate) fn change_signal(&self, role: &str) -> Arc<Notify> {
        let mut changes = self.inner.changes.lock();
        match changes.get(role) {
            Some(signal) => Arc::clone(signal),
            None => {
                let signal = Arc::new(Notify::new());
                changes.insert(role.to_owned(), Arc::clone(&signal));
                signal
            }
        }
    }

    pub(crate) fn signal_change(&self, role: &str) {
        if let Some(signal) = self.inner.changes.lock().get(role) {
            signal.notify_waiters();
        }
    }
}

/// Store time of one call: the monotonic reading in the file's unit (nanoseconds) and
/// the wall clock read with it, for showing stored times.
#[derive(Clone, Debug)]
pub(crate) struct StoreNow {
    pub(crate) boot_id: String,
    pub(crate) mono: i64,
    pub(crate) wall: SystemTime,
}

impl StoreNow {
    fn from_host(host: HostTime) -> Result<StoreNow> {
        Ok(StoreNow {
            mono: mono_nanos(host.monotonic)?,
            boot_id: host.boot_id,
            wall: host.wall,
        })
    }

    /// A stored monotonic time as a wall-clock time: `wall + (at - mono)`.
    pub(crate) fn wall_at(&self, at: i64) -> Result<SystemTime> {
        let ahead = i128::from(at) - i128::from(self.mono);
        let by = Duration::from_nanos(u64::try_from(ahead.unsigned_abs()).unwrap_or(u64::MAX));
        let shown = if ahead >= 0 {
            self.wall.checked_add(by)
        } else {
            self.wall.checked_sub(by)
        };
        shown.ok_or_else(|| {
            Error::store_msg(
                BACKEND,
                "a stored time cannot be shown as a wall-clock time",
            )
        })
    }
}

/// A monotonic reading in nanoseconds, the unit of the file's times.
fn mono_nanos(monotonic: Duration) -> Result<i64> {
    i64::try_from(monotonic.as_nanos()).map_err(|_| {
        Error::store_msg(
            BACKEND,
            format!("the monotonic clock reads {monotonic:?}, more than 292 years"),
        )
    })
}

/// The store time of the host's own clocks in the file's unit (monotonic nanoseconds).
/// Public (through `statements`) only so the benchmark reads exactly the store's clock.
#[doc(hidden)]
pub fn monotonic_nanos() -> Result<i64> {
    mono_nanos(crate::clock::monotonic_now()?)
}

/// Reads the boot id the file's times belong to: the first statement of every write
/// transaction. Public (through `statements`) only so the benchmark issues exactly the
/// store's statement.
#[doc(hidden)]
pub const READ_BOOT: &str = "SELECT boot_id FROM tenure_boot WHERE id = 0";

/// Starts a boot in the file: every lease ends now (tokens stay), every heartbeat is
/// forgotten, and the file records the boot id its times now belong to.
async fn start_boot(conn: &mut SqliteConnection, now: &StoreNow) -> Result<()> {
    sqlx::query("UPDATE tenure_leases SET expires_at = ?1")
        .bind(now.mono)
        .execute(&mut *conn)
        .await
        .map_err(store_error("cannot expire the leases of a past boot"))?;
    sqlx::query("DELETE FROM tenure_nodes")
        .execute(&mut *conn)
        .await
        .map_err(store_error("cannot forget the heartbeats of a past boot"))?;
    record_boot(conn, &now.boot_id).await
}

async fn record_boot(conn: &mut SqliteConnection, boot_id: &str) -> Result<()> {
    sqlx::query("INSERT OR REPLACE INTO tenure_boot (id, boot_id) VALUES (0, ?1)")
        .bind(boot_id)
        .execute(conn)
        .await
        .map(drop)
        .map_err(store_error("cannot record the boot id"))
}

/// Creates tenure's tables in the database behind `conn` if they are missing, or
/// migrates older ones (run it inside a write transaction). [`SqliteDatabase::open`]
/// and [`SqliteDatabase::from_pool`] call it; call it yourself only when you fence
/// writes in a database you open some other way.
pub async fn create_schema(conn: &mut SqliteConnection) -> Result<()> {
    create_schema_at(conn, &SystemHostClock).await
}

/// [`create_schema`] with the clock a migration converts times with.
async fn create_schema_at(conn: &mut SqliteConnection, clock: &dyn HostClock) -> Result<()> {
    // Statement by statement: the schema has no `;` inside a statement.
    for statement in SCHEMA.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        sqlx::query(statement)
            .execute(&mut *conn)
            .await
            .map_err(|e| Error::store(BACKEND, "cannot create the schema", e))?;
    }
    let version: Option<i64> =
        sqlx::query_scalar("SELECT value FROM tenure_meta WHERE key = 'schema_version'")
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| Error::store(BACKEND, "cannot read the schema version", e))?;
    match version {
        None => {
            sqlx::query("INSERT INTO tenure_meta (key, value) VALUES ('schema_version', ?1)")
                .bind(SCHEMA_VERSION)
                .execute(&mut *conn)
                .await
                .map_err(|e| Error::store(BACKEND, "cannot record the schema version", e))?;
            Ok(())
        }
        Some(SCHEMA_VERSION) => Ok(()),
        Some(1) => migrate_from_wall_clock(conn, &StoreNow::from_host(clock.now()?)?).await,
        Some(other) => Err(Error::store_msg(
            BACKEND,
            format!(
                "the database has tenure schema version {other}, this build understands \
                 {SCHEMA_VERSION}: upgrade tenure"
            ),
        )),
    }
}

/// Migrates a schema-1 file (wall-clock nanoseconds, with the high-water mark in
/// `tenure_clock`) to monotonic time under the current boot, keeping every token.
///
/// Every stored time moves by the same amount, from the old store time (the wall clock,
/// never below the high-water mark) to the monotonic clock, so each lease and heartbeat
/// keeps exactly the time it had left: a lease live when the file is migrated stays
/// live for the rest of its TTL (its holder may still be an older tenure, which cannot
/// renew once `tenure_clock` is gone and so steps down by its own deadline), and an
/// expired one stays expired.
async fn migrate_from_wall_clock(conn: &mut SqliteConnection, now: &StoreNow) -> Result<()> {
    let high_water: Option<i64> =
        sqlx::query_scalar("SELECT high_water FROM tenure_clock WHERE id = 0")
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error("cannot read the schema-1 store clock"))?;
    let wall = to_nanos(now.wall)
        .map_err(|_| Error::store_msg(BACKEND, "the wall clock reads a time outside 1677..2262"))?;
    let old_now = high_water.map_or(wall, |mark| mark.max(wall));
    let moved = |t: i64| {
        let at = i128::from(t) - i128::from(old_now) + i128::from(now.mono);
        i64::try_from(at.clamp(i128::from(i64::MIN), i128::from(i64::MAX))).unwrap_or(i64::MIN)
    };
    let leases: Vec<(String, i64)> = sqlx::query_as("SELECT role, expires_at FROM tenure_leases")
        .fetch_all(&mut *conn)
        .await
        .map_err(store_error("cannot read the schema-1 leases"))?;
    for (role, expires_at) in &leases {
        sqlx::query("UPDATE tenure_leases SET expires_at = ?2 WHERE role = ?1")
            .bind(role)
            .bind(moved(*expires_at))
            .execute(&mut *conn)
            .await
            .map_err(store_error("cannot migrate a lease"))?;
    }
    let nodes: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT node_id, last_heartbeat, first_seen FROM tenure_nodes")
            .fetch_all(&mut *conn)
            .await
            .map_err(store_error("cannot read the schema-1 nodes"))?;
    for (node_id, last, first) in &nodes {
        sqlx::query(
            "UPDATE tenure_nodes SET last_heartbeat = ?2, first_seen = ?3 WHERE node_id = ?1",
        )
        .bind(node_id)
        .bind(moved(*last))
        .bind(moved(*first))
        .execute(&mut *conn)
        .await
        .map_err(store_error("cannot migrate a node"))?;
    }
    // Gone, so a schema-1 tenure still running on the file fails every call rather
    // than mixing wall-clock times into monotonic ones.
    sqlx::query("DROP TABLE tenure_clock")
        .execute(&mut *conn)
        .await
        .map_err(store_error("cannot drop the schema-1 store clock"))?;
    record_boot(conn, &now.boot_id).await?;
    sqlx::query("UPDATE tenure_meta SET value = ?1 WHERE key = 'schema_version'")
        .bind(SCHEMA_VERSION)
        .execute(&mut *conn)
        .await
        .map_err(store_error("cannot record the schema version"))?;
    tracing::info!(
        leases = leases.len(),
        nodes = nodes.len(),
        "migrated the sqlite store to schema {SCHEMA_VERSION}: store time is the monotonic clock"
    );
    Ok(())
}

/// Rejects every path `open` must not touch, before SQLite sees it; creates a missing
/// file with mode 0600.
fn check_path(path: &Path) -> Result<()> {
    let shown = path.display();
    let bad = |reason: String| Error::invalid("path", reason);
    if path.as_os_str().is_empty() {
        return Err(bad("the database path is empty".to_owned()));
    }
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(bad(format!(
                "{shown}: {} is not a directory",
                parent.display()
            )))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(bad(format!(
                "{shown}: directory {} does not exist (create it first)",
                parent.display()
            )))
        }
        Err(e) => {
            return Err(Error::store(
                BACKEND,
                format!("{shown}: cannot inspect directory {}", parent.display()),
                e,
            ))
        }
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            return Err(bad(format!(
                "{shown} is a directory, expected a database file"
            )))
        }
        Ok(meta) if !meta.is_file() => {
            return Err(bad(format!("{shown} is not a regular file")));
        }
        Ok(meta) if meta.permissions().readonly() => {
            return Err(bad(format!(
                "{shown} is read-only: tenure must write to it (chmod u+w, or pick another file)"
            )))
        }
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::store(
                BACKEND,
                format!("{shown}: cannot inspect the file"),
                e,
            ))
        }
    }
    // Create with 0600 (leases and membership are nobody else's business), or open
    // the existing file read-write to learn early that we may not write it.
    let mut file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            return Err(Error::store(
                BACKEND,
                format!("{shown}: permission denied (tenure must read and write it)"),
                e,
            ))
        }
        Err(e) => {
            return Err(Error::store(
                BACKEND,
                format!("{shown}: cannot open the file"),
                e,
            ))
        }
    };
    let mut header = Vec::with_capacity(SQLITE_MAGIC.len());
    (&mut file)
        .take(SQLITE_MAGIC.len() as u64)
        .read_to_end(&mut header)
        .map_err(|e| Error::store(BACKEND, format!("{shown}: cannot read the file"), e))?;
    // An empty file is an empty database to SQLite (and is what we just created).
    if !header.is_empty() && header.as_slice() != SQLITE_MAGIC {
        return Err(bad(format!(
            "{shown} is not a SQLite database (it has other content; refusing to touch it)"
        )));
    }
    Ok(())
}

/// Switches the file to WAL (a persistent setting), retrying while another process
/// holds the lock: the switch needs an exclusive lock the busy timeout does not cover.
async fn enable_wal(pool: &SqlitePool, path: &Path, busy_timeout: Duration) -> Result<()> {
    let give_up = tokio::time::Instant::now() + busy_timeout.max(Duration::from_secs(1));
    loop {
        let attempt: std::result::Result<String, sqlx::Error> =
            sqlx::query_scalar("PRAGMA journal_mode = WAL")
                .fetch_one(pool)
                .await;
        match attempt {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(Error::store_msg(
                    BACKEND,
                    format!(
                        "{}: cannot switch to WAL journal mode (it stays {mode:?}); \
                         is the file on a network file system?",
                        path.display()
                    ),
                ))
            }
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                return Err(Error::store(
                    BACKEND,
                    format!("{}: cannot switch to WAL journal mode", path.display()),
                    e,
                ))
            }
        }
    }
}

fn is_busy(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with any extended code.
            .is_some_and(|code| matches!(code & 0xff, 5 | 6)),
        _ => false,
    }
}

/// Nanoseconds since the Unix epoch, or `Err` outside the years 1677..2262.
pub(crate) fn to_nanos(time: SystemTime) -> std::result::Result<i64, ()> {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).map_err(|_| ()),
        Err(before) => i64::try_from(before.duration().as_nanos())
            .map(|n| -n)
            .map_err(|_| ()),
    }
}

/// A token read from the file; tokens are stored as positive INTEGERs.
pub(crate) fn token_from_db(value: i64) -> Result<FencingToken> {
    u64::try_from(value)
        .map(FencingToken::from)
        .map_err(|_| Error::store_msg(BACKEND, format!("corrupt token {value} in the database")))
}

/// A token to store or compare: at most `i64::MAX`, SQLite's largest INTEGER.
pub(crate) fn token_to_db(token: FencingToken) -> Result<i64> {
    i64::try_from(token.get()).map_err(|_| {
        Error::invalid(
            "token",
            format!(
                "{token} is larger than the sqlite backend's maximum {}",
                i64::MAX
            ),
        )
    })
}

/// Maps a sqlx failure to [`Error::Store`], saying what was being done.
pub(crate) fn store_error(doing: &str) -> impl FnOnce(sqlx::Error) -> Error + '_ {
    move |e| Error::store(BACKEND, doing.to_owned(), e)
}

/// Column `index` of `row`, decoded; a failure is a store error (a corrupt row).
pub(crate) fn column<'r, T>(row: &'r sqlx::sqlite::SqliteRow, index: usize) -> Result<T>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    sqlx::Row::try_get(row, index).map_err(store_error("cannot decode a row"))
}

/// Parses `sqlite:PATH` or `sqlite://PATH` into the file path.
///
/// The error never repeats the URL; it says what shape was expected.
pub fn path_from_url(url: &str) -> Result<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| {
            Error::invalid(
                "url",
                "a sqlite url must start with sqlite: or sqlite:// (e.g. sqlite:/var/lib/tenure.db)",
            )
        })?;
    if rest.is_empty() {
        return Err(Error::invalid(
            "url",
            "the sqlite url has no file path (e.g. sqlite:/var/lib/tenure.db)",
        ));
    }
    if rest == ":memory:" || rest.starts_with(":memory:") {
        return Err(Error::invalid(
            "url",
            "an in-memory sqlite database is not supported: leases must be shared and durable; \
             use a file path",
        ));
    }
    if rest.contains('?') {
        return Err(Error::invalid(
            "url",
            "sqlite url query parameters are not supported: give only the file path",
        ));
    }
    // Caught here, or the file system refuses it later as a store failure, not bad usage.
    if rest.contains('\0') {
        return Err(Error::invalid(
            "url",
            "the sqlite url's path holds a NUL byte, which no file name can",
        ));
    }
    Ok(PathBuf::from(rest))
}

/// Opens the database named by a `sqlite:PATH` or `sqlite://PATH` url
/// (`sqlite:///abs/path` and `sqlite:/abs/path` are the same file).
pub async fn connect(url: &str) -> Result<SqliteDatabase> {
    connect_with(url, SqliteOptions::default()).await
}

/// [`connect`] with options.
pub async fn connect_with(url: &str, options: SqliteOptions) -> Result<SqliteDatabase> {
    let path = path_from_url(url)?;
    SqliteDatabase::open_with(path, options).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_nanos_cover_1677_to_2262() {
        let epoch = SystemTime::UNIX_EPOCH;
        assert_eq!(to_nanos(epoch + Duration::from_nanos(7)), Ok(7));
        assert_eq!(to_nanos(epoch - Duration::from_secs(5)), Ok(-5_000_000_000));
        assert!(to_nanos(epoch + Duration::from_secs(300 * 365 * 86_400)).is_err());
    }

    /// A stored time is shown at its distance from the monotonic reading, on either
    /// side, out to the extremes of the file's range.
    #[test]
    fn stored_times_shown_on_the_wall_clock() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let now = StoreNow {
            boot_id: "b".to_owned(),
            mono: 1_000,
            wall,
        };
        assert_eq!(now.wall_at(1_000).unwrap(), wall);
        assert_eq!(
            now.wall_at(1_500).unwrap(),
            wall + Duration::from_nanos(500)
        );
        assert_eq!(now.wall_at(400).unwrap(), wall - Duration::from_nanos(600));
        assert!(now.wall_at(i64::MAX).is_ok());
        assert!(now.wall_at(i64::MIN).is_ok());
    }

    #[test]
    fn urls() {
        assert_eq!(
            path_from_url("sqlite:/a/b.db").unwrap(),
            Path::new("/a/b.db")
        );
        assert_eq!(
            path_from_url("sqlite:///a/b.db").unwrap(),
            Path::new("/a/b.db")
        );
        assert_eq!(
            path_from_url("sqlite://rel.db").unwrap(),
            Path::new("rel.db")
        );
        assert_eq!(path_from_url("sqlite:rel.db").unwrap(), Path::new("rel.db"));
        for bad in [
            "",
            "postgres://u:secret@h/db",
            "sqlite:",
            "sqlite://",
            "sqlite::memory:",
            "sqlite:/a.db?mode=ro",
        ] {
            match path_from_url(bad) {
                Err(Error::InvalidArgument {
                    field: "url",
                    reason,
                }) => {
                    assert!(!reason.contains("secret"), "{reason}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
