//! The opened database file: its pool, its store time and its in-process change signals.
//!
//! [`SqliteDatabase`] is what the lease store, the node registry and the fence share:
//! one connection pool over one file, one clock, and one never-decreasing store time.
//! Opening checks the path first so that a wrong path is a clear error and never a
//! stray new file or a scribbled-on foreign one.

use std::collections::HashMap;
use std::fmt;
use std::fs::OpenOptions;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use tenure::{Clock, Error, FencingToken, Result, SystemClock};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::BACKEND;

/// The first 16 bytes of every SQLite database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// The schema version this crate writes and understands.
const SCHEMA_VERSION: i64 = 1;

/// The tables, created idempotently; times are nanoseconds since the Unix epoch.
///
/// `tenure_clock` holds the highest store time any write has used, so store time never
/// moves backwards even when the host's wall clock does.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tenure_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_clock (
    id         INTEGER PRIMARY KEY CHECK (id = 0),
    high_water INTEGER NOT NULL
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
INSERT OR IGNORE INTO tenure_clock (id, high_water) VALUES (0, -9223372036854775808);
";

/// How the database is opened and how waiting contenders poll it.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tenure::ManualClock;
/// use tenure_sqlite::SqliteOptions;
///
/// let clock = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
/// let options = SqliteOptions::new()
///     .with_clock(clock)
///     .busy_timeout(Duration::from_secs(2))
///     .poll_interval(Duration::from_millis(5));
/// # let _ = options;
/// ```
#[derive(Clone)]
pub struct SqliteOptions {
    clock: Arc<dyn Clock>,
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
            clock: Arc::new(SystemClock),
            busy_timeout: Duration::from_secs(5),
            max_connections: 8,
            poll_interval: Duration::from_millis(10),
        }
    }
}

impl SqliteOptions {
    /// The defaults: system clock, 5 s busy timeout, 8 connections, 10 ms polling.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes store time from `clock` (tests inject a [`tenure::ManualClock`]). Store
    /// time is still never allowed to move backwards.
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
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
/// Store time is the host clock (or the injected [`Clock`]), but never earlier than
/// the highest store time any write has already used: that high-water mark is kept in
/// the file and advanced in every write transaction. A wall clock stepped backwards
/// therefore cannot revive an expired lease nor make a lease live longer on store time;
/// store time simply stands still until the wall clock catches up, which can delay a
/// takeover by the size of the step (a liveness cost, never a safety one).
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
    clock: Arc<dyn Clock>,
    poll_interval: Duration,
    /// The highest store time this process has used or seen, so reads in one process
    /// never go backwards either (reads do not write the persisted mark).
    local_high: AtomicI64,
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
                local_high: AtomicI64::new(i64::MIN),
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
        create_schema(&mut tx).await?;
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

    /// The injected clock's reading, for checking input before a transaction (the
    /// decision itself uses store time inside the transaction).
    pub(crate) fn clock_now(&self) -> SystemTime {
        self.inner.clock.now()
    }

    /// Store time for a read: the clock, never below the persisted or the locally seen
    /// high-water mark.
    pub(crate) fn read_now(&self, persisted: i64) -> Result<i64> {
        let clock = to_nanos(self.inner.clock.now())
            .map_err(|_| Error::store_msg(BACKEND, "the clock reads a time outside 1677..2262"))?;
        let now = clock
            .max(persisted)
            .max(self.inner.local_high.load(Ordering::Acquire));
        self.inner.local_high.fetch_max(now, Ordering::AcqRel);
        Ok(now)
    }

    /// Store time for a write, inside its transaction: advances and returns the
    /// persisted high-water mark in one statement.
    pub(crate) async fn write_now(&self, conn: &mut SqliteConnection) -> Result<i64> {
        let candidate = self.read_now(i64::MIN)?;
        let now: i64 = sqlx::query_scalar(ADVANCE_CLOCK)
            .bind(candidate)
            .fetch_one(conn)
            .await
            .map_err(|e| Error::store(BACKEND, "cannot read the store clock", e))?;
        self.inner.local_high.fetch_max(now, Ordering::AcqRel);
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

/// Advances the persisted store time to at least `?1` and returns it: the first
/// statement of every write transaction. Public (through `statements`) only so the
/// benchmark issues exactly the store's statement.
#[doc(hidden)]
pub const ADVANCE_CLOCK: &str =
    "UPDATE tenure_clock SET high_water = max(high_water, ?1) WHERE id = 0 RETURNING high_water";

/// Creates tenure's tables in the database behind `conn` if they are missing (run it
/// inside a write transaction). [`SqliteDatabase::open`] and
/// [`SqliteDatabase::from_pool`] call it; call it yourself only when you fence writes
/// in a database you open some other way.
pub async fn create_schema(conn: &mut SqliteConnection) -> Result<()> {
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
        Some(other) => Err(Error::store_msg(
            BACKEND,
            format!(
                "the database has tenure schema version {other}, this build understands \
                 {SCHEMA_VERSION}: upgrade tenure"
            ),
        )),
    }
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

/// The inverse of [`to_nanos`].
pub(crate) fn from_nanos(nanos: i64) -> SystemTime {
    if nanos >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_nanos(nanos.unsigned_abs())
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
    fn nanos_round_trip() {
        for nanos in [
            0,
            1,
            -1,
            1_800_000_000_000_000_123,
            -5_000_000_000,
            i64::MAX,
        ] {
            assert_eq!(to_nanos(from_nanos(nanos)), Ok(nanos));
        }
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(300 * 365 * 86_400);
        assert!(to_nanos(far).is_err());
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
