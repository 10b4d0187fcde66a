//! The opened database file: its pool, the in-process writer queue and change signals,
//! WAL and the checks made before a path is opened.
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
use std::time::Duration;

use parking_lot::Mutex;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use tenure::{Error, FencingToken, Result};

use crate::clock::{HostClock, StoreNow, SystemHostClock};
use crate::file::{refuse_hard_links, refuse_shared_file_system, FileIdentity, FsTarget};
use crate::links::SessionLinks;
use crate::schema::{create_schema_at, enter_boot, READ_BOOT, SCHEMA_VERSION};
use crate::wake::{Signals, Wakes};
use crate::BACKEND;

mod wait;
mod writer;

pub(crate) use writer::WriterSlot;
use writer::{install_busy_handler, keep_unless_stuck_in_a_transaction, WriterQueue};

/// The first 16 bytes of every SQLite database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

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

    /// How often a waiting contender re-reads its role when nothing woke it (a release
    /// by another process that frees the role can only be seen by reading; one that
    /// hands it to a queued candidate wakes that candidate's process, and the others
    /// queued there then poll at 100 ms or this, whichever is longer). At least 1 ms.
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
/// unless given their own). A second kernel on the file is refused where it can be
/// told: at `open` by the file system, at its first write when the file's last boot began
/// after its own (a reboot's predecessor began before it), and at its second write by
/// the boot ids the file keeps (a reboot never brings an old one back).
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
    /// Per role, woken when a write through this database ends or replaces a term, or
    /// when another process's hands this process a term (`wakes`).
    changes: Arc<Signals>,
    /// This process's queued owners' listeners, and the sender of wake-ups to other
    /// processes' (none for a database without a file of its own).
    wakes: Option<Wakes>,
    path: Option<PathBuf>,
    /// The file `open` opened, to notice it deleted, replaced or hard-linked later.
    file: Option<FileIdentity>,
    /// One of the stores' write transactions at a time in this process (see
    /// `writer.rs`).
    writer: WriterQueue,
    /// The sessions the stores over this database keep alive, by owner: what its
    /// registries count as heartbeats (see `links.rs`).
    links: SessionLinks,
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
    /// naming the path and the problem, and nothing is created or written. So is a
    /// file on a network or shared file system (NFS, SMB, FUSE, 9P, ...: several
    /// kernels would share it) and a file with a second name (a hard link: SQLite
    /// would keep a WAL and lock per name). Every later call fails once the file is
    /// deleted, replaced or hard-linked.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// [`open`](Self::open) with options (clock, busy timeout, pool size, polling).
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref();
        let opened = check_path(path)?;
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .busy_timeout(options.busy_timeout)
            // Tokens must survive power loss: every commit reaches the disk.
            .synchronous(SqliteSynchronous::Full);
        let busy_timeout = options.busy_timeout;
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections)
            // Replaces the handler `busy_timeout` set: the same wait, tried every ms.
            .after_connect(move |conn, _| Box::pin(install_busy_handler(conn, busy_timeout)))
            // A local file cannot drop a connection: a ping before each checkout would
            // only add a round trip to sqlx's worker thread.
            .test_before_acquire(false)
            .after_release(|conn, _| Box::pin(keep_unless_stuck_in_a_transaction(conn)))
            .connect_with(connect)
            .await
            .map_err(|e| Error::store(BACKEND, format!("cannot open {}", path.display()), e))?;
        enable_wal(&pool, path, options.busy_timeout).await?;
        let db = Self::build(
            pool,
            options,
            Some(path.to_owned()),
            Some(FileIdentity::new(path.to_owned(), &opened)),
        );
        db.install_schema().await?;
        tracing::debug!(path = %path.display(), "opened sqlite store");
        Ok(db)
    }

    /// Closes the database's connections, waiting for those in use to come back (every
    /// later call fails). The last connection to the file checkpoints the WAL into it
    /// and removes it: a process that exits with its connections open leaves the WAL
    /// behind, and the next process to open the file alone must first read all of it
    /// (up to SQLite's 1,000-page checkpoint threshold, 4 MB) to rebuild its index.
    pub async fn close(&self) {
        let pool = &self.inner.pool;
        // Each connection taken and closed here: sqlx's pool close leaves open a
        // connection that was still on its way back to the pool (a call's last one),
        // and the process then exits with it.
        let mut taken = Vec::new();
        for _ in 0..pool.size() {
            match pool.acquire().await {
                Ok(connection) => taken.push(connection),
                Err(_) => break,
            }
        }
        for connection in taken {
            if let Err(error) = connection.close().await {
                tracing::debug!(%error, "closing a connection failed");
            }
        }
        pool.close().await;
    }

    /// Uses an existing pool (its journal mode and busy timeout are left as they are)
    /// and creates the schema if missing.
    pub async fn from_pool(pool: SqlitePool) -> Result<Self> {
        Self::from_pool_with(pool, SqliteOptions::default()).await
    }

    /// [`from_pool`](Self::from_pool) with options (the clock and the polling interval
    /// apply; the pool's own connection settings are kept).
    pub async fn from_pool_with(pool: SqlitePool, options: SqliteOptions) -> Result<Self> {
        let db = Self::build(pool, options, None, None);
        db.install_schema().await?;
        Ok(db)
    }

    fn build(
        pool: SqlitePool,
        options: SqliteOptions,
        path: Option<PathBuf>,
        file: Option<FileIdentity>,
    ) -> Self {
        SqliteDatabase {
            inner: Arc::new(Inner {
                pool,
                clock: options.clock,
                poll_interval: options.poll_interval,
                changes: Arc::new(Mutex::new(HashMap::new())),
                path,
                wakes: file.as_ref().map(|file| {
                    let (dev, ino) = file.dev_ino();
                    Wakes::new(dev, ino)
                }),
                file,
                writer: WriterQueue::new(),
                links: SessionLinks::default(),
            }),
        }
    }

    async fn install_schema(&self) -> Result<()> {
        // An up-to-date file opens without a write transaction (and its fsync): every
        // `tenure` command opens the store once, so this is most of their start-up.
        // Also whether the file has every column this build adds without a new version
        // (see `create_schema`).
        let current: Option<(i64, bool)> = sqlx::query_as(
            "SELECT value, EXISTS (SELECT 1 FROM pragma_table_info('tenure_sessions') \
             WHERE name = 'terms_handed') FROM tenure_meta WHERE key = 'schema_version'",
        )
        .fetch_optional(&self.inner.pool)
        .await
        .ok()
        .flatten();
        if current == Some((SCHEMA_VERSION, true)) {
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
    /// heartbeat; `ttl == 0` is [`Error::InvalidArgument`]. A node that holds a session
    /// of a store over this database (its id the session's owner, as a shard group's
    /// member) is kept alive by that session's keep-alives, and the registry skips its
    /// own heartbeat writes meanwhile (see `docs/semantics.md`).
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
    ///
    /// Fails (rolling back) when the file `open` opened was deleted, replaced or
    /// hard-linked since: a write there would be lost, or start tokens again at 1.
    pub async fn begin_immediate(&self) -> Result<Transaction<'static, Sqlite>> {
        let pool = self.inner.pool.clone();
        let begun = tokio::spawn(async move { pool.begin_with("BEGIN IMMEDIATE").await })
            .await
            .map_err(|e| Error::store(BACKEND, "the write transaction task failed", e))?;
        let tx = match begun {
            Ok(tx) => tx,
            Err(e) => {
                // A file deleted or replaced under the store can fail the BEGIN itself
                // (its shared-memory file went with it): name that, not the symptom.
                self.check_file()?;
                return Err(Error::store(BACKEND, "cannot begin a write transaction", e));
            }
        };
        // Checked under the write lock, after every earlier write of this file committed.
        self.check_file()?;
        Ok(tx)
    }

    /// Fails when the file `open` opened is no longer the one at its path, or has
    /// another name now (one `stat` of the path; nothing for `from_pool`).
    pub(crate) fn check_file(&self) -> Result<()> {
        match &self.inner.file {
            Some(file) => file.check(),
            None => Ok(()),
        }
    }

    /// [`begin_immediate`](Self::begin_immediate) for the stores' own writes, after
    /// taking this process's writer slot; keep the slot until the transaction ends.
    /// (Other processes, and the caller's own `begin_immediate` transactions, still
    /// meet at SQLite's write lock.)
    pub(crate) async fn begin_write(&self) -> Result<(WriterSlot, Transaction<'static, Sqlite>)> {
        let slot = self.inner.writer.take().await?;
        Ok((slot, self.begin_immediate().await?))
    }

    /// Commits a write begun with [`begin_write`](Self::begin_write), then runs `then`
    /// (telling others what the write changed), both on a task of their own: a caller
    /// that gives up while the commit is on its way (a timeout, a dropped future) does
    /// not stop the commit, and a write that lands is told of whether or not anyone
    /// still waits for its answer. The writer's slot is held until the commit ends.
    /// `then` runs also when the commit fails: a waiter woken for nothing reads and
    /// waits again, which is cheaper than news lost for a write that did land.
    pub(crate) async fn commit_then(
        writer: WriterSlot,
        tx: Transaction<'static, Sqlite>,
        doing: &'static str,
        then: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        tokio::spawn(async move {
            let committed = tx.commit().await;
            drop(writer);
            then.await;
            committed
        })
        .await
        .map_err(|e| Error::store(BACKEND, doing, e))?
        .map_err(store_error(doing))
    }

    /// Store time for a read, or for checking input before a transaction. A read
    /// compares [`StoreNow::boot_id`] with the file's in the same statement and treats
    /// the file's times as past when they differ.
    pub(crate) fn now(&self) -> Result<StoreNow> {
        StoreNow::from_host(self.inner.clock.now()?)
    }

    /// [`now`](Self::now) for a read, after checking the file is still the one at its
    /// path (a read of a deleted file would show terms no new process can see).
    pub(crate) fn read_now(&self) -> Result<StoreNow> {
        self.check_file()?;
        self.now()
    }

    /// Store time for a write, inside its transaction (so the write lock orders the
    /// readings): the first write under a new boot starts it (see `enter_boot`), and a
    /// write under a boot the file saw before the latest one is refused: it comes from
    /// a second kernel sharing the file, not from a reboot.
    pub(crate) async fn write_now(&self, conn: &mut SqliteConnection) -> Result<StoreNow> {
        let now = self.now()?;
        let recorded: Option<String> = sqlx::query_scalar(READ_BOOT)
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error("cannot read the boot id of the store"))?;
        if recorded.as_deref() != Some(now.boot_id.as_str()) {
            enter_boot(conn, recorded.as_deref(), &now).await?;
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

    /// The sessions the stores over this database keep alive, by owner.
    pub(crate) fn links(&self) -> &SessionLinks {
        &self.inner.links
    }
}

/// Rejects every path `open` must not touch, before SQLite sees it; creates a missing
/// file with mode 0600. Returns what the file was when opened, to tell it later from
/// another file at the path.
fn check_path(path: &Path) -> Result<std::fs::Metadata> {
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
        Ok(meta) if meta.is_dir() => refuse_shared_file_system(path, FsTarget::Path(parent))?,
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
    // The file itself too: a single file bind-mounted into a container lives on
    // another file system than the directory it shows up in.
    refuse_shared_file_system(path, FsTarget::File(&file))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::store(BACKEND, format!("{shown}: cannot inspect the file"), e))?;
    refuse_hard_links(path, &meta)?;
    // The file is closed here, before SQLite opens it: closing a descriptor drops every
    // POSIX lock this process holds on the file, SQLite's included, so one must never
    // be closed while SQLite has the file open.
    Ok(meta)
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

/// A token read from the file (stored as a positive INTEGER).
pub(crate) fn token_from_db(value: i64) -> Result<FencingToken> {
    tenure::lease::token_from_i64(BACKEND, value)
}

/// A token to store or compare: at most `i64::MAX`, SQLite's largest INTEGER.
pub(crate) fn token_to_db(token: FencingToken) -> Result<i64> {
    tenure::lease::token_to_i64("token", BACKEND, token)
}

/// Maps a sqlx failure to [`Error::Store`], saying what was being done.
pub(crate) fn store_error(doing: &str) -> impl FnOnce(sqlx::Error) -> Error + '_ {
    move |e| Error::store(BACKEND, doing.to_owned(), e)
}

/// Runs `query` (one statement) on `conn`; a failure is a store error saying what it was
/// `doing`.
pub(crate) async fn execute<'q>(
    conn: &mut SqliteConnection,
    query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    doing: &str,
) -> Result<()> {
    query
        .execute(conn)
        .await
        .map(drop)
        .map_err(store_error(doing))
}

/// Column `index` of `row`, decoded; a failure is a store error (a corrupt row).
pub(crate) fn column<'r, T>(row: &'r sqlx::sqlite::SqliteRow, index: usize) -> Result<T>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    sqlx::Row::try_get(row, index).map_err(store_error("cannot decode a row"))
}
