//! Sharing the file's one write lock fairly between processes.
//!
//! SQLite keeps no queue for its write lock: a writer that finds it taken calls the
//! busy handler, which sleeps and tries again. SQLite's own handler sleeps longer and
//! longer (up to 100 ms a try), so a writer that has waited a while almost never finds
//! the lock free while another process writes back to back: a member's session
//! keep-alive waited 4.9 s behind another member taking thousands of shards. Two
//! halves fix it: every connection tries again each millisecond
//! ([`install_busy_handler`]), and a process that has written back to back for a while
//! leaves the lock free for a moment before its next write ([`WriterQueue`]).
//!
//! And a connection whose transaction failed to end is not handed out again
//! ([`keep_unless_stuck_in_a_transaction`]): it would refuse every later write, or hold
//! the lock.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use libsqlite3_sys::{sqlite3_busy_handler, SQLITE_OK};
use parking_lot::Mutex;
use sqlx::sqlite::SqliteConnection;
use sqlx::Connection;
use tenure::{Error, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::BACKEND;

/// How long the busy handler sleeps between two tries for a lock.
const TRY_EVERY: Duration = Duration::from_millis(1);

/// The longest run of back-to-back writes of one process before it pauses.
const MAX_WRITE_RUN: Duration = Duration::from_millis(20);

/// How long the lock is left free after such a run: a few of other processes' tries.
const WRITE_PAUSE: Duration = Duration::from_millis(3);

/// Makes `conn` wait for a lock by trying again every [`TRY_EVERY`], for about
/// `timeout` in all (the tries are counted, so it may run a little over).
pub(crate) async fn install_busy_handler(
    conn: &mut SqliteConnection,
    timeout: Duration,
) -> std::result::Result<(), sqlx::Error> {
    let tries = usize::try_from(timeout.as_millis() / TRY_EVERY.as_millis()).unwrap_or(usize::MAX);
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is this connection's open handle, locked for the call, and the
    // handler's argument is a count carried in the pointer's bits, never dereferenced.
    let rc = unsafe { sqlite3_busy_handler(db, Some(try_again), tries as *mut c_void) };
    if rc == SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Configuration(
            format!("sqlite3_busy_handler answered {rc}").into(),
        ))
    }
}

/// The pool's check of a connection coming back (`after_release`): `Ok(false)` closes
/// it. A COMMIT that fails on an I/O error (a disk answering EIO, a full disk) makes
/// SQLite end the transaction itself; the ROLLBACK sqlx then sends fails, as there is
/// nothing left to roll back, and sqlx goes on counting the transaction as open, so it
/// refuses every later `BEGIN IMMEDIATE` on that connection (`InvalidSavePointStatement`)
/// and the store could never write again through it. A connection sqlx still counts in
/// a transaction once the rollback queued by a dropped transaction has run (the ping
/// waits for it) is closed, whether SQLite ended the transaction or still holds it (and
/// the file's write lock with it).
pub(crate) async fn keep_unless_stuck_in_a_transaction(
    conn: &mut SqliteConnection,
) -> std::result::Result<bool, sqlx::Error> {
    if !conn.is_in_transaction() {
        return Ok(true);
    }
    conn.ping().await?;
    Ok(!conn.is_in_transaction())
}

/// SQLite's busy callback: sleep and try again (1) until `tries` tries were made,
/// then give up (0, and the statement fails with `SQLITE_BUSY`). It runs on the
/// connection's own worker thread, which is blocked on the statement anyway.
extern "C" fn try_again(tries: *mut c_void, tried: c_int) -> c_int {
    let tries = tries as usize;
    if usize::try_from(tried).unwrap_or(usize::MAX) >= tries {
        return 0;
    }
    std::thread::sleep(TRY_EVERY);
    1
}

/// One of the stores' write transactions at a time in this process: the others queue
/// here instead of in SQLite's busy handler (16 writers of one process meeting there
/// fell to about 150 commits/s). A run of back-to-back writes longer than
/// [`MAX_WRITE_RUN`] pauses for [`WRITE_PAUSE`], holding the queue, so a writer of
/// another process gets the lock in between.
#[derive(Debug)]
pub(crate) struct WriterQueue {
    slot: Arc<Semaphore>,
    run: Arc<Mutex<Run>>,
}

/// This process's current run of back-to-back writes.
#[derive(Debug)]
struct Run {
    /// When the run began.
    began: Instant,
    /// When the last write of the run ended (its slot was given back).
    ended: Instant,
}

/// The writer slot, held for one write transaction; the run goes on from when it is
/// dropped.
#[derive(Debug)]
pub(crate) struct WriterSlot {
    _permit: OwnedSemaphorePermit,
    run: Arc<Mutex<Run>>,
}

impl Drop for WriterSlot {
    fn drop(&mut self) {
        self.run.lock().ended = Instant::now();
    }
}

impl WriterQueue {
    pub(crate) fn new() -> WriterQueue {
        let now = Instant::now();
        WriterQueue {
            slot: Arc::new(Semaphore::new(1)),
            run: Arc::new(Mutex::new(Run {
                began: now,
                ended: now,
            })),
        }
    }

    /// Waits for this process's turn to write, pausing first if its run is long.
    pub(crate) async fn take(&self) -> Result<WriterSlot> {
        let permit = Arc::clone(&self.slot)
            .acquire_owned()
            .await
            .map_err(|e| Error::store(BACKEND, "the writer queue is closed", e))?;
        let long_run = {
            let now = Instant::now();
            let mut run = self.run.lock();
            // A write that starts a pause or more after the last one ended begins a run.
            if now.duration_since(run.ended) >= WRITE_PAUSE {
                run.began = now;
            }
            now.duration_since(run.began) >= MAX_WRITE_RUN
        };
        if long_run {
            tokio::time::sleep(WRITE_PAUSE).await;
            self.run.lock().began = Instant::now();
        }
        Ok(WriterSlot {
            _permit: permit,
            run: Arc::clone(&self.run),
        })
    }
}
