//! [`SqliteNodeRegistry`]: heartbeat membership in the same file as the leases.
//!
//! One row per node: last heartbeat, first seen of its current membership, metadata as
//! JSON text. Heartbeats are write transactions on the store's monotonic time; reads
//! filter by liveness (nothing is live under a boot other than the file's) and never write.
//!
//! **Membership through a session.** The registries and stores of one
//! [`SqliteDatabase`] share its [`SessionLinks`](crate::links::SessionLinks). A node that
//! holds an open session of such a store (the node id is the session's owner, as for a
//! shard group's member) names it in its heartbeat (`tenure_nodes.session_id`), and every
//! reader counts the session's last keep-alive (`tenure_sessions.kept_at`, store time) as
//! a heartbeat of the node while the session is open (its row there, `expires_at` in
//! the future) and held by the node: the node's last heartbeat is the later of its own
//! and that keep-alive. The registry skips its own heartbeat transaction while the last
//! keep-alive of that session was less than half the TTL ago (on store time) and found
//! the node's row naming the session, so one write transaction per interval (the
//! keep-alive) keeps both; when keep-alives stop, the node's own heartbeats resume
//! before any reader sees it lapse (see `docs/semantics.md`). A closed session (its row
//! deleted) stops counting at once and wakes this database's membership waiters; a
//! leave deletes the node's row at once.
//!
//! **Other processes' joins and leaves** are no write of this process: a join (a
//! heartbeat that begins a membership) and a leave of a live node send a wake-up to the
//! other live nodes' processes (see `wake.rs`), so their membership waiters read at once
//! and otherwise poll slowly.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tenure::lease::validate_name;
use tenure::registry::{validate_heartbeat, Metadata, NodeInfo};
use tenure::session::HeartbeatsWritten;
use tenure::{Error, NodeRegistry, PeersLapse, Result};
use tokio::time::Instant;

use crate::clock::StoreNow;
use crate::database::{column, store_error, SqliteDatabase, SqliteOptions, WriterSlot};
use crate::links::Link;
use crate::BACKEND;

/// Rows of nodes that lapsed this long ago are deleted by later heartbeats, so ids of
/// past process incarnations do not pile up. Generous, because another registry on the
/// same file may use a longer liveness TTL.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// The in-process change signal of the membership (a name no role can have: roles hold
/// no NUL byte).
pub(crate) const MEMBERSHIP: &str = "\0membership";

/// A membership waiter polls the file every this many of the database's poll intervals
/// (100 ms by default) for joins and leaves written by other processes.
const MEMBERSHIP_POLLS: u32 = 10;

/// As [`MEMBERSHIP_POLLS`], while a node heartbeating through the registry hears
/// wake-ups (1 s by default): joins and leaves then wake it, whichever process wrote
/// them, and the poll only catches what no wake announced (a lost datagram, a session
/// closed without a leave, a node that a keep-alive brought back).
const WOKEN_MEMBERSHIP_POLLS: u32 = 100;

// The statements of a heartbeat, run in one `BEGIN IMMEDIATE` transaction after
// `READ_BOOT`. Times are monotonic nanoseconds. Public (through `statements`) only so the benchmark issues exactly
// the registry's statements.

/// When node row `n` was last heard of at store time `now` (a parameter): its own last
/// heartbeat, or the last keep-alive of the session it names while that session is open
/// at `now` and held by the node, whichever is later. A closed session has no row; a
/// migrated one not kept alive since has no `kept_at`: neither counts. A row naming no
/// session reads no session row (`CASE` evaluates the lookup only for one that does).
macro_rules! heard {
    ($now:literal) => {
        concat!(
            "CASE WHEN n.session_id IS NULL THEN n.last_heartbeat ELSE \
             max(n.last_heartbeat, coalesce((SELECT s.kept_at FROM tenure_sessions s \
             WHERE s.id = n.session_id AND s.owner = n.node_id AND s.expires_at > ",
            $now,
            "), n.last_heartbeat)) END"
        )
    };
}

/// Reads, at store time `?1`, the nodes other than `?2` last heard of (by their own
/// heartbeat or their session's last keep-alive, even once the session ended, when their
/// liveness falls back to their own heartbeat) after `?4`: when the first of them was
/// last heard of (see `heard!`), and how many were heard of after `?3` (are live).
const PEERS: &str = concat!(
    "SELECT min(heard), count(*) FILTER (WHERE heard > ?3) FROM (SELECT ",
    heard!("?1"),
    " AS heard, max(n.last_heartbeat, coalesce((SELECT k.kept_at FROM tenure_sessions k \
     WHERE k.id = n.session_id AND k.owner = n.node_id), n.last_heartbeat)) AS recent \
     FROM tenure_nodes n WHERE n.node_id <> ?2) WHERE recent > ?4"
);

/// When the first node other than `owner` lapses unless heard from again, for a
/// registry of TTL `ttl`, read at store time `now` in a write transaction (so under the
/// current boot): see [`PeersLapse`]. A node that lapsed less than a TTL ago makes it
/// zero, though its session ended.
pub(crate) async fn peers_lapse(
    conn: &mut sqlx::SqliteConnection,
    now: &StoreNow,
    owner: &str,
    ttl: Duration,
) -> Result<PeersLapse> {
    let (first, live): (Option<i64>, i64) = sqlx::query_as(PEERS)
        .bind(now.mono)
        .bind(owner)
        .bind(live_bound(now.mono, ttl))
        .bind(live_bound(now.mono, ttl.saturating_mul(2)))
        .fetch_one(conn)
        .await
        .map_err(store_error("cannot read the other members"))?;
    let after = match first {
        None => ttl,
        Some(heard) => {
            let lapses = i128::from(heard).saturating_add(nanos(ttl));
            let after = (lapses - i128::from(now.mono)).max(0);
            Duration::from_nanos(u64::try_from(after).unwrap_or(u64::MAX))
        }
    };
    Ok(PeersLapse {
        after,
        live: usize::try_from(live).unwrap_or(usize::MAX),
        ttl,
    })
}

/// Reads node `?1` at store time `?2`: when it was last heard of (see `heard!`),
/// `first_seen, metadata`.
#[doc(hidden)]
pub const READ_NODE: &str = concat!(
    "SELECT ",
    heard!("?2"),
    ", first_seen, metadata FROM tenure_nodes n WHERE node_id = ?1"
);
/// Writes node `?1`: last heartbeat `?2`, first seen `?3`, metadata `?4`, and the
/// session `?5` (NULL for none) whose keep-alives count as its heartbeats.
#[doc(hidden)]
pub const UPSERT_NODE: &str =
    "INSERT INTO tenure_nodes (node_id, last_heartbeat, first_seen, metadata, session_id) \
     VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (node_id) DO UPDATE SET last_heartbeat = excluded.last_heartbeat, \
     first_seen = excluded.first_seen, metadata = excluded.metadata, \
     session_id = excluded.session_id";
/// Deletes nodes last heard of at or before `?1` (own heartbeats and the keep-alives
/// of the session they name).
#[doc(hidden)]
pub const FORGET_NODES: &str = "DELETE FROM tenure_nodes WHERE last_heartbeat <= ?1 \
     AND NOT EXISTS (SELECT 1 FROM tenure_sessions s \
         WHERE s.id = tenure_nodes.session_id AND s.kept_at > ?1)";

/// The `last_heartbeat` at or below which a heartbeat at store time `now` deletes rows
/// ([`FORGET_NODES`]): nodes lapsed for [`FORGET_AFTER`] beyond `ttl`.
#[doc(hidden)]
pub fn forget_bound(now: i64, ttl: Duration) -> i64 {
    live_bound(now, ttl.saturating_add(FORGET_AFTER))
}

fn nanos(duration: Duration) -> i128 {
    i128::try_from(duration.as_nanos()).unwrap_or(i128::MAX)
}

/// `now < last + ttl`, exactly, without overflow.
fn is_live(last: i64, ttl: Duration, now: i64) -> bool {
    i128::from(now) < i128::from(last).saturating_add(nanos(ttl))
}

/// The smallest `last_heartbeat` that is still live at `now`, as a bound for SQL
/// (`last_heartbeat > bound`).
fn live_bound(now: i64, ttl: Duration) -> i64 {
    let bound = i128::from(now).saturating_sub(nanos(ttl));
    i64::try_from(bound.max(i128::from(i64::MIN))).unwrap_or(i64::MIN)
}

/// Heartbeat membership kept in a SQLite file, shared by every process on the host
/// that opens it.
///
/// A node is live while `now < last_heartbeat + ttl` on store time; `ttl` belongs to
/// this registry value, so processes sharing a file should agree on it.
/// [`wait_for_members_change`](NodeRegistry::wait_for_members_change) wakes at once for a
/// join or leave written through the same [`SqliteDatabase`], and within ten polling
/// intervals (100 ms by default) for one written by another process.
///
/// # Examples
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use tenure::{Metadata, NodeRegistry};
/// use tenure_sqlite::SqliteNodeRegistry;
///
/// let dir = tempfile::tempdir().unwrap();
/// let registry = SqliteNodeRegistry::open(dir.path().join("nodes.db"), Duration::from_secs(10)).await?;
/// let mut metadata = Metadata::new();
/// metadata.insert("addr".into(), "10.0.0.7:8080".into());
/// registry.heartbeat_with("node-a", &metadata).await?;
/// assert_eq!(registry.live_nodes().await?, ["node-a"]);
/// # Ok::<(), tenure::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct SqliteNodeRegistry {
    db: SqliteDatabase,
    ttl: Duration,
    /// What this registry's last successful heartbeat of each node wrote.
    written: Arc<HeartbeatsWritten>,
    /// The nodes heartbeating through this registry that hear wake-ups (see `wake.rs`):
    /// while there is one, the others' joins and leaves wake this process.
    listening: Arc<Mutex<BTreeSet<String>>>,
}

impl SqliteNodeRegistry {
    /// A registry over an opened database where a node is live for `ttl` after a
    /// heartbeat; `ttl == 0` is [`Error::InvalidArgument`].
    pub fn new(db: &SqliteDatabase, ttl: Duration) -> Result<Self> {
        if ttl.is_zero() {
            return Err(Error::invalid("ttl", "must be greater than zero"));
        }
        db.links().registry_made(ttl);
        Ok(SqliteNodeRegistry {
            db: db.clone(),
            ttl,
            written: Arc::default(),
            listening: Arc::default(),
        })
    }

    /// Opens the file at `path` (see [`SqliteDatabase::open`]) as a registry.
    pub async fn open(path: impl AsRef<Path>, ttl: Duration) -> Result<Self> {
        Self::open_with(path, ttl, SqliteOptions::default()).await
    }

    /// Opens the file at `path` with options (an injected clock, for instance).
    pub async fn open_with(
        path: impl AsRef<Path>,
        ttl: Duration,
        options: SqliteOptions,
    ) -> Result<Self> {
        if ttl.is_zero() {
            return Err(Error::invalid("ttl", "must be greater than zero"));
        }
        Self::new(&SqliteDatabase::open_with(path, options).await?, ttl)
    }

    /// The database this registry writes to.
    pub fn database(&self) -> &SqliteDatabase {
        &self.db
    }

    async fn record(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        validate_heartbeat(node_id, metadata)?;
        let metadata_json = metadata
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| Error::store(BACKEND, "cannot encode metadata", e))?;
        if self.db.listen_for_wakes(node_id) {
            let mut listening = self.listening.lock();
            // Every heartbeat passes here: no new string once the node is known.
            if !listening.contains(node_id) {
                listening.insert(node_id.to_owned());
            }
        }
        // Only a session whose id the file could have handed out is named.
        let link = self
            .db
            .links()
            .of(node_id)
            .filter(|link| i64::try_from(link.id).is_ok());
        // Skipped while the store's keep-alive stood in for it less than half the TTL
        // ago on store time: when keep-alives stop, the node's own heartbeats resume
        // before any reader sees it lapse.
        if let Some(link) = link {
            if self
                .written
                .stood_in(node_id, metadata_json.as_deref(), &link)
                && is_live(link.kept, self.ttl / 2, self.db.now()?.mono)
            {
                return Ok(());
            }
        }
        let written = self
            .write_heartbeat(node_id, metadata_json.clone(), link)
            .await;
        match written {
            Ok(()) => {
                self.written
                    .wrote(node_id, link.map(|link| link.id), metadata_json);
                Ok(())
            }
            Err(error) => {
                // Unknown whether it was written: the next heartbeat writes.
                self.written.forget(node_id);
                Err(error)
            }
        }
    }

    /// The heartbeat's write transaction, naming `link`'s session (if any).
    async fn write_heartbeat(
        &self,
        node_id: &str,
        metadata_json: Option<String>,
        link: Option<Link>,
    ) -> Result<()> {
        let session = link.and_then(|link| i64::try_from(link.id).ok());
        let (writer, mut tx) = self.db.begin_write().await?;
        let now = self.db.write_now(&mut tx).await?.mono;
        let current = sqlx::query(READ_NODE)
            .bind(node_id)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error("cannot read the node"))?;
        let (last, first_seen, kept_metadata, joined) = match current {
            Some(row) => {
                let last: i64 = column(&row, 0)?;
                let first: i64 = column(&row, 1)?;
                let kept: String = column(&row, 2)?;
                // A node that lapsed starts a new membership.
                let live = is_live(last, self.ttl, now);
                let first = if live { first } else { now };
                (last.max(now), first, kept, !live)
            }
            None => (now, now, "{}".to_owned(), true),
        };
        sqlx::query(UPSERT_NODE)
            .bind(node_id)
            .bind(last)
            .bind(first_seen)
            .bind(metadata_json.unwrap_or(kept_metadata))
            .bind(session)
            .execute(&mut *tx)
            .await
            .map_err(store_error("cannot record the heartbeat"))?;
        let forget = forget_bound(now, self.ttl);
        sqlx::query(FORGET_NODES)
            .bind(forget)
            .execute(&mut *tx)
            .await
            .map_err(store_error("cannot forget long-lapsed nodes"))?;
        self.commit_and_tell(
            writer,
            tx,
            "cannot commit the heartbeat",
            joined.then_some(node_id),
        )
        .await
    }

    /// Commits a write of the membership, then, if `changed` joined or left by it, tells
    /// this process's waiters and the other live nodes' processes (see
    /// [`SqliteDatabase::commit_then`]).
    async fn commit_and_tell(
        &self,
        writer: WriterSlot,
        tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        doing: &'static str,
        changed: Option<&str>,
    ) -> Result<()> {
        let registry = self.clone();
        let changed = changed.map(str::to_owned);
        let tell = async move {
            if let Some(node) = changed {
                registry.db.signal_change(MEMBERSHIP);
                registry.wake_members(&node).await;
            }
        };
        SqliteDatabase::commit_then(writer, tx, doing, tell).await
    }

    /// Tells the processes of the live nodes other than `changed` that the membership
    /// changed (`changed` joined or left). Best effort: a node that does not hear it
    /// finds the change at its next poll.
    async fn wake_members(&self, changed: &str) {
        match self.live_nodes().await {
            Ok(nodes) => {
                for node in nodes.iter().filter(|node| *node != changed) {
                    self.db.wake(node, MEMBERSHIP);
                }
            }
            Err(error) => {
                tracing::debug!(%error, "cannot read whom to wake; the others' polls find the change")
            }
        }
    }

    /// The live rows, sorted by id, and the store time they were judged at.
    async fn live_rows(
        &self,
        with_details: bool,
    ) -> Result<(Vec<sqlx::sqlite::SqliteRow>, StoreNow)> {
        let now = self.db.read_now()?;
        // Heartbeats recorded under another boot are stale, whatever their times say.
        let sql = if with_details {
            concat!(
                "SELECT node_id, heard, first_seen, metadata FROM \
                 (SELECT node_id, ",
                heard!("?3"),
                " AS heard, first_seen, metadata FROM tenure_nodes n) \
                 WHERE heard > ?1 AND (SELECT boot_id FROM tenure_boot WHERE id = 0) = ?2 \
                 ORDER BY node_id"
            )
        } else {
            concat!(
                "SELECT node_id FROM tenure_nodes n WHERE ",
                heard!("?3"),
                " > ?1 AND (SELECT boot_id FROM tenure_boot WHERE id = 0) = ?2 \
                 ORDER BY node_id"
            )
        };
        let rows = sqlx::query(sql)
            .bind(live_bound(now.mono, self.ttl))
            .bind(&now.boot_id)
            .bind(now.mono)
            .fetch_all(self.db.pool())
            .await
            .map_err(store_error("cannot read nodes"))?;
        Ok((rows, now))
    }
}

#[async_trait]
impl NodeRegistry for SqliteNodeRegistry {
    async fn record_heartbeat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        self.record(node_id, metadata).await
    }

    async fn live_nodes(&self) -> Result<Vec<String>> {
        let (rows, _) = self.live_rows(false).await?;
        rows.iter().map(|row| column(row, 0)).collect()
    }

    async fn members(&self) -> Result<Vec<NodeInfo>> {
        let (rows, now) = self.live_rows(true).await?;
        rows.iter()
            .map(|row| {
                let node_id: String = column(row, 0)?;
                let last: i64 = column(row, 1)?;
                let first: i64 = column(row, 2)?;
                let metadata: String = column(row, 3)?;
                let metadata: Metadata = serde_json::from_str(&metadata).map_err(|e| {
                    Error::store(BACKEND, format!("corrupt metadata of node {node_id:?}"), e)
                })?;
                Ok(NodeInfo {
                    node_id,
                    last_heartbeat: now.wall_at(last)?,
                    first_seen: now.wall_at(first)?,
                    metadata,
                    now: now.wall,
                })
            })
            .collect()
    }

    async fn leave(&self, node_id: &str) -> Result<bool> {
        validate_name("node_id", node_id)?;
        // Gone: a heartbeat after the leave writes, whatever keeps a session alive.
        self.written.forget(node_id);
        let (writer, mut tx) = self.db.begin_write().await?;
        let now = self.db.write_now(&mut tx).await?.mono;
        let last: Option<i64> = sqlx::query_scalar(READ_NODE)
            .bind(node_id)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error("cannot read the node"))?;
        sqlx::query("DELETE FROM tenure_nodes WHERE node_id = ?1")
            .bind(node_id)
            .execute(&mut *tx)
            .await
            .map_err(store_error("cannot remove the node"))?;
        let was_live = last.is_some_and(|last| is_live(last, self.ttl, now));
        self.listening.lock().remove(node_id);
        let left = was_live.then_some(node_id);
        self.commit_and_tell(writer, tx, "cannot commit the leave", left)
            .await?;
        Ok(was_live)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn wait_for_members_change(&self, observed: &[String], deadline: Instant) {
        let polls = if self.listening.lock().is_empty() {
            MEMBERSHIP_POLLS
        } else {
            WOKEN_MEMBERSHIP_POLLS
        };
        let poll = self.db.poll_interval() * polls;
        let unchanged = || async { Ok(self.live_nodes().await? == observed) };
        self.db
            .wait_polling(MEMBERSHIP, false, poll, deadline, unchanged)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_arithmetic_is_exact_and_saturates() {
        let ttl = Duration::from_nanos(10);
        assert!(is_live(100, ttl, 109));
        assert!(!is_live(100, ttl, 110));
        assert_eq!(live_bound(110, ttl), 100);
        assert!(is_live(i64::MAX, Duration::MAX, i64::MAX));
        assert_eq!(live_bound(i64::MIN + 5, ttl), i64::MIN);
        assert_eq!(live_bound(0, Duration::MAX), i64::MIN);
    }
}
