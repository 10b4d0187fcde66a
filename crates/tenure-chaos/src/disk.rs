//! A disk that stops answering, for SQLite workers: the `lock/disk` fault.
//!
//! A SQLite commit (synchronous = FULL) syncs the write-ahead log while it holds the
//! file's write lock, and a disk that stalls (a failing device, a saturated volume, a
//! frozen network block device) holds the commit there: the caller's deadline passes,
//! every other process's write waits out its busy timeout, and when the disk answers
//! again the commit lands, after its caller gave up on it. No other fault produces a
//! call that hangs inside the store past the busy timeout while the process around it
//! runs on.
//!
//! [`install`] registers, as SQLite's default, a VFS that is the default one with one
//! change: a file's sync first waits while the process's disk is stalled ([`stall`]),
//! and fails with an I/O error while the disk is failing ([`fail`]: a device that
//! answers EIO). The worker process installs it before opening a SQLite store; the
//! nemesis stalls it with SIGUSR1 (`lock/disk`), makes it fail with SIGPWR
//! (`lock/disk-error`) and heals it with SIGUSR2; `tests/disk_errors.rs` drives it in
//! one process.

use std::ffi::{c_char, c_int, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

use libsqlite3_sys as ffi;

use crate::ChaosError;

/// The name the stalling VFS is registered under.
pub const VFS_NAME: &CStr = c"tenure-chaos-stalling-disk";

/// Whether syncs wait, and the wake-up of those waiting.
static STALLED: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// Syncs that found the disk stalled and waited, since the process started.
static HELD_SYNCS: AtomicUsize = AtomicUsize::new(0);

/// Whether syncs fail, and how many did since the process started.
static FAILING: AtomicBool = AtomicBool::new(false);
static FAILED_SYNCS: AtomicUsize = AtomicUsize::new(0);

/// The VFS this one wraps (SQLite's default when [`install`] first ran), or why none.
static REAL_VFS: OnceLock<Result<RealVfs, String>> = OnceLock::new();

/// A pointer to a VFS SQLite owns for the life of the process.
struct RealVfs(*mut ffi::sqlite3_vfs);

// SAFETY: SQLite's VFS objects are process-wide, never freed, and safe to call from any
// thread (SQLite is built thread-safe).
unsafe impl Send for RealVfs {}
unsafe impl Sync for RealVfs {}

/// The method tables handed out: the first field is what SQLite reads through a file's
/// `pMethods`; `real` is the table it replaced, whose sync is called after the wait.
#[repr(C)]
struct StallingMethods {
    methods: ffi::sqlite3_io_methods,
    real: *const ffi::sqlite3_io_methods,
}

/// One stalling table per real table seen (the default VFS hands out one or two),
/// leaked: files keep pointing at them until the process exits.
static TABLES: Mutex<Vec<TablePair>> = Mutex::new(Vec::new());

/// A real method table and the stalling copy of it.
struct TablePair {
    real: *const ffi::sqlite3_io_methods,
    stalling: *const StallingMethods,
}

// SAFETY: both tables are immutable once made and live as long as the process.
unsafe impl Send for TablePair {}

/// Registers the stalling VFS as SQLite's default for every connection this process
/// opens from now on. Idempotent.
pub fn install() -> Result<(), ChaosError> {
    REAL_VFS
        .get_or_init(register)
        .as_ref()
        .map(|_| ())
        .map_err(|why| ChaosError::Setup(format!("cannot install the stalling disk: {why}")))
}

/// Stalls (`true`) or resumes (`false`) every sync of the files opened through the
/// stalling VFS in this process.
pub fn stall(on: bool) {
    let (stalled, wake) = &STALLED;
    *stalled.lock().unwrap_or_else(|e| e.into_inner()) = on;
    if !on {
        wake.notify_all();
    }
}

/// Syncs that waited for a stalled disk since the process started.
pub fn held_syncs() -> usize {
    HELD_SYNCS.load(Ordering::Acquire)
}

/// Makes every sync of the files opened through the VFS in this process fail with
/// `SQLITE_IOERR_FSYNC` (`true`), as a device answering EIO does, or succeed again
/// (`false`). A failed sync does not sync: what SQLite wrote before it stays in the page
/// cache, and SQLite does not count the commit it was for as done.
pub fn fail(on: bool) {
    FAILING.store(on, Ordering::Release);
}

/// Syncs that failed since the process started.
pub fn failed_syncs() -> usize {
    FAILED_SYNCS.load(Ordering::Acquire)
}

fn register() -> Result<RealVfs, String> {
    // SAFETY: `sqlite3_vfs_find` initialises SQLite and returns a VFS it owns for good;
    // the copy made from it is leaked, as SQLite keeps the pointer it is registered
    // with.
    unsafe {
        let real = ffi::sqlite3_vfs_find(ptr::null());
        if real.is_null() {
            return Err("SQLite has no default VFS".to_owned());
        }
        let mut stalling: ffi::sqlite3_vfs = ptr::read(real);
        stalling.pNext = ptr::null_mut();
        stalling.zName = VFS_NAME.as_ptr();
        stalling.xOpen = Some(open);
        let stalling = Box::into_raw(Box::new(stalling));
        // Set before registering: a connection opened on another thread the moment
        // the VFS is registered finds it.
        let rc = ffi::sqlite3_vfs_register(stalling, 1);
        if rc != ffi::SQLITE_OK {
            drop(Box::from_raw(stalling));
            return Err(format!("sqlite3_vfs_register answered {rc}"));
        }
        Ok(RealVfs(real))
    }
}

/// Opens a file through the real VFS, then points it at the stalling copy of its
/// method table.
unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let Some(Ok(RealVfs(real))) = REAL_VFS.get() else {
        return ffi::SQLITE_CANTOPEN;
    };
    // SAFETY: SQLite passes a file of the real VFS's size (this VFS copies it), which
    // the real open fills in; the real VFS reads its own settings from its own object.
    unsafe {
        let Some(real_open) = (**real).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let rc = real_open(*real, name, file, flags, out_flags);
        if rc == ffi::SQLITE_OK && !(*file).pMethods.is_null() {
            (*file).pMethods = stalling_table((*file).pMethods);
        }
        rc
    }
}

/// The stalling copy of `real`, made at its first use.
fn stalling_table(real: *const ffi::sqlite3_io_methods) -> *const ffi::sqlite3_io_methods {
    let mut tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
    let stalling = match tables.iter().find(|pair| pair.real == real) {
        Some(pair) => pair.stalling,
        None => {
            // SAFETY: `real` is a method table SQLite's VFS handed out; they are
            // static in SQLite.
            let mut methods = unsafe { ptr::read(real) };
            methods.xSync = Some(sync);
            let stalling: *const StallingMethods =
                Box::into_raw(Box::new(StallingMethods { methods, real }));
            tables.push(TablePair { real, stalling });
            stalling
        }
    };
    stalling.cast()
}

/// Waits while the disk is stalled, fails while it is failing, and otherwise syncs
/// through the real method table.
unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    {
        let (stalled, wake) = &STALLED;
        let mut on = stalled.lock().unwrap_or_else(|e| e.into_inner());
        if *on {
            HELD_SYNCS.fetch_add(1, Ordering::AcqRel);
        }
        while *on {
            on = wake.wait(on).unwrap_or_else(|e| e.into_inner());
        }
    }
    if FAILING.load(Ordering::Acquire) {
        FAILED_SYNCS.fetch_add(1, Ordering::AcqRel);
        return ffi::SQLITE_IOERR_FSYNC;
    }
    // SAFETY: only files opened by `open` reach this function, and their `pMethods`
    // points at the first field of a `StallingMethods`.
    unsafe {
        let table = (*file).pMethods.cast::<StallingMethods>();
        match (*(*table).real).xSync {
            Some(real_sync) => real_sync(file, flags),
            None => ffi::SQLITE_IOERR_FSYNC,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use sqlx::{Connection, SqliteConnection};

    use super::*;

    /// Waits, for at most `limit`, until `done` holds.
    async fn until(limit: Duration, done: impl Fn() -> bool) -> bool {
        let give_up = tokio::time::Instant::now() + limit;
        while !done() {
            if tokio::time::Instant::now() > give_up {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    #[tokio::test]
    async fn a_commit_waits_for_a_stalled_disk_and_lands_when_it_answers() {
        install().expect("the VFS installs");
        install().expect("installing twice is harmless");
        let dir = std::env::temp_dir().join(format!("tenure-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let options = SqliteConnectOptions::new()
            .filename(dir.join("stall.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .vfs(VFS_NAME.to_str().expect("an ASCII name"));
        let mut writer = SqliteConnection::connect_with(&options)
            .await
            .expect("opens through the stalling VFS");
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&mut writer)
            .await
            .expect("a table");
        let held = held_syncs();
        stall(true);
        let insert = tokio::spawn(async move {
            sqlx::query("INSERT INTO t VALUES (1)")
                .execute(&mut writer)
                .await
                .map(|_| writer)
        });
        let reached = until(Duration::from_secs(10), || held_syncs() > held).await;
        let mut reader = SqliteConnection::connect_with(&options)
            .await
            .expect("a second connection");
        let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(&mut reader)
            .await
            .expect("a read beside the stalled commit");
        let finished_while_stalled = insert.is_finished();
        stall(false);
        let writer = insert
            .await
            .expect("the insert task")
            .expect("the commit lands");
        let after: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(&mut reader)
            .await
            .expect("a read after");
        drop((writer, reader));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(reached, "the commit never reached the disk's sync");
        assert!(
            !finished_while_stalled,
            "the commit ended while the disk was stalled"
        );
        assert_eq!(seen, 0, "a commit held at its sync is not visible");
        assert_eq!(after, 1, "the commit landed when the disk answered");
    }
}
