//! # tenure-sqlite: the embedded default backend
//!
//! Leases, heartbeat membership and fences in one local SQLite file (bundled SQLite,
//! nothing to install), shared by every process on the host that opens the file.
//!
//! - [`SqliteLeaseStore`]: the [`tenure::LeaseStore`] contract. Tokens are durable
//!   (a lease row is never deleted; release clears the holder and keeps the token), and
//!   every write is one `BEGIN IMMEDIATE` transaction, so writers in any process
//!   serialise on the file's write lock.
//! - [`SqliteNodeRegistry`]: the [`tenure::NodeRegistry`] contract in the same file. A
//!   node holding a session of a store over the same [`SqliteDatabase`] (a shard group's
//!   member) is kept alive by the session's keep-alives: its own heartbeats write
//!   nothing meanwhile.
//! - [`fence_in_transaction`] and [`SqliteFence`]: the compare-and-reject that makes a
//!   fencing token protect your own writes.
//!
//! Store time is the host's monotonic clock (`CLOCK_MONOTONIC`, the clock of every
//! local deadline), recorded with the kernel's boot id: a wall-clock step neither
//! expires a live lease early nor keeps a dead one alive, and a file used under a new
//! boot treats every lease as expired and keeps every token (see [`SqliteDatabase`];
//! tests inject a [`ManualHostClock`]). The wall clock only turns stored times into the
//! `SystemTime`s of answers. The file is opened in WAL mode with a busy timeout (5 s by
//! default) and created with mode 0600.
//!
//! A contender waiting on [`LeaseStore::wait_for_change`](tenure::LeaseStore::wait_for_change)
//! (or an observer on [`LeaseStore::wait_for_term`](tenure::LeaseStore::wait_for_term))
//! is woken at once by a release (or a new term) through the same [`SqliteDatabase`],
//! and by polling the role's row (every 10 ms by default) for one by another process.
//! On Linux the process whose waits watch a role (one at a time per role) is woken at
//! once by another process's write too, every such write announcing itself on a
//! datagram socket named after the file and the role, and its waits then poll every
//! 10 s: a leader waiting for handoff requests reads the file a few times a minute
//! instead of a hundred times a second, and a shard member waiting for drain requests
//! instead of once a second.
//!
//! A lease row holds `role`, `holder`, `token`, `expires_at`, `session_id` (the session
//! a term is held under, if any), and the value the term advertised when it began
//! (`value`, with `value_token`, the token of the term that wrote it).
//!
//! The queue of candidates (contenders that wait their turn with
//! [`LeaseStore::try_acquire_or_queue`](tenure::LeaseStore::try_acquire_or_queue)) is
//! `tenure_candidates`: one row per `(role, owner)` with its place `seq` (arrival
//! order within the role), its `expires_at` on store time and the `value` its term will
//! advertise. A release hands the role to the oldest live candidate in its own
//! transaction; a waiter for a successor
//! ([`LeaseStore::wait_for_successor`](tenure::LeaseStore::wait_for_successor)) polls
//! the role's row as any waiter does and answers from what it read, writing nothing.
//! A new boot forgets every candidacy.
//!
//! ## The elector over a file
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use tenure::{FenceStore, LeaseLeaderElector, LeaseLeaderOptions};
//! use tokio_util::sync::CancellationToken;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let db = tenure_sqlite::connect(&format!("sqlite:{}", dir.path().join("tenure.db").display())).await?;
//! let fence = db.fence();
//! let elector = LeaseLeaderElector::new(Arc::new(db.lease_store()), LeaseLeaderOptions::default())?;
//! elector
//!     .run("reports", move |token, _leadership| {
//!         let fence = fence.clone();
//!         async move {
//!             fence.admit("report-table", token).await?;
//!             Ok::<(), tenure::Error>(()) // returning while leader releases the lease
//!         }
//!     }, CancellationToken::new())
//!     .await?;
//! # Ok::<(), tenure::Error>(())
//! # }).unwrap();
//! ```
#![deny(missing_docs)]

mod clock;
mod database;
mod fence;
mod file;
mod lease;
mod links;
mod registry;
mod schema;
mod url;
mod wake;

pub use clock::{HostClock, HostTime, ManualHostClock, SystemHostClock};
pub use database::{SqliteDatabase, SqliteOptions};
pub use fence::{fence_in_transaction, SqliteFence};
pub use lease::SqliteLeaseStore;
pub use registry::SqliteNodeRegistry;
pub use schema::create_schema;
pub use url::{connect, connect_with, path_from_url};

/// The store's write steps and statements, for `tenure bench`'s raw baseline only; not
/// a supported API, it changes with the store. It stays public (hidden) because the
/// baseline must run the store's own transaction bodies on a plain connection: a copy
/// in the bench would drift from the store it is meant to measure.
#[doc(hidden)]
pub mod statements {
    pub use crate::clock::monotonic_nanos;
    pub use crate::lease::{release_lease, write_lease, LeaseWrite};
    pub use crate::registry::{forget_bound, FORGET_NODES, READ_NODE, UPSERT_NODE};
    pub use crate::schema::READ_BOOT;
}

/// The backend name in [`tenure::Error::Store`].
const BACKEND: &str = "sqlite";

/// Compile-time checks: the public futures are `Send`, so they run on any runtime
/// flavour and inside `tokio::spawn` (a plain `raw_sql` call once broke this).
#[cfg(test)]
#[allow(dead_code)]
mod send_checks {
    fn is_send<T: Send>(_: T) {}

    fn open_and_schema(path: &'static std::path::Path, conn: &'static mut sqlx::SqliteConnection) {
        is_send(crate::SqliteDatabase::open(path));
        is_send(crate::connect("sqlite:x.db"));
        is_send(crate::create_schema(conn));
    }

    fn fence(conn: &'static mut sqlx::SqliteConnection) {
        is_send(crate::fence_in_transaction(
            conn,
            "r",
            tenure::FencingToken::from(1),
        ));
    }
}
