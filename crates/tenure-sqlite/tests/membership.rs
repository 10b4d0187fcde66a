//! Membership through a session: a node that holds a session of a store over the same
//! [`SqliteDatabase`] as its registry is kept alive by the session's keep-alives, and
//! the registry skips its own heartbeat writes meanwhile.
//!
//! A control runs the same steps with a registry over another `SqliteDatabase` of the
//! same file (which shares no store's sessions, as every registry did before): there
//! every heartbeat writes.

use std::sync::Arc;
use std::time::Duration;

use tenure_testkit::registry::waited_for_change;
use tenure_testkit::session_membership::{MembershipStorage, TTL};

use tenure::NodeRegistry;
use tenure_sqlite::{SqliteDatabase, SqliteLeaseStore, SqliteNodeRegistry};

/// One test's fresh file, the database over it and a store over that database.
struct Storage {
    dir: tempfile::TempDir,
    db: SqliteDatabase,
    store: SqliteLeaseStore,
}

impl Storage {
    async fn open() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(dir.path().join("m.db")).await.unwrap();
        let store = db.lease_store();
        Self { dir, db, store }
    }
}

impl MembershipStorage for Storage {
    type Store = SqliteLeaseStore;
    type Registry = SqliteNodeRegistry;
    /// The node row's own `last_heartbeat`.
    type Heartbeat = Option<i64>;

    fn store(&self) -> &SqliteLeaseStore {
        &self.store
    }

    fn registry(&self, ttl: Duration) -> SqliteNodeRegistry {
        self.db.node_registry(ttl).unwrap()
    }

    /// A registry over another database of the file.
    async fn unlinked(&self) -> SqliteNodeRegistry {
        SqliteNodeRegistry::open(self.dir.path().join("m.db"), TTL)
            .await
            .unwrap()
    }

    /// A registry over another database of the file.
    async fn reader(&self) -> SqliteNodeRegistry {
        self.unlinked().await
    }

    async fn own_heartbeat(&self, node: &str) -> Option<i64> {
        sqlx::query_scalar("SELECT last_heartbeat FROM tenure_nodes WHERE node_id = ?1")
            .bind(node)
            .fetch_optional(self.db.pool())
            .await
            .unwrap()
    }

    /// Store times are monotonic and shown on the wall clock through an offset read each
    /// time, so the same one may be shown a few microseconds apart.
    fn same_time(&self, a: std::time::SystemTime, b: std::time::SystemTime) -> bool {
        let apart = a.duration_since(b).or_else(|_| b.duration_since(a));
        apart.is_ok_and(|apart| apart < Duration::from_millis(5))
    }
}

tenure_testkit::session_membership_scenarios!(Storage::open().await);

/// Waits in the background, up to 20 s, for `registry`'s live members to differ from
/// `observed`; the task answers how long it waited.
fn wait_for_a_change(
    registry: &Arc<SqliteNodeRegistry>,
    observed: &[&str],
) -> tokio::task::JoinHandle<Duration> {
    let registry = Arc::clone(registry);
    let observed: Vec<String> = observed.iter().map(|node| (*node).to_owned()).collect();
    tokio::spawn(async move {
        waited_for_change(registry.as_ref(), &observed, Duration::from_secs(20)).await
    })
}

/// How long `waiter` (from [`wait_for_a_change`]) waited; fails, naming `what` was not
/// seen, unless it answers within `bound`.
async fn seen_within(
    waiter: tokio::task::JoinHandle<Duration>,
    bound: Duration,
    what: &str,
) -> Duration {
    tokio::time::timeout(bound, waiter)
        .await
        .unwrap_or_else(|_| panic!("{what} was not seen within {bound:?}"))
        .unwrap()
}

/// A join and a leave written through another handle of the file (another process, as
/// far as the file can tell) wake a membership waiter at once: both handles poll every
/// second here, so membership waiters read the file every 100 s while one of their
/// nodes hears wake-ups, and only the wake can bring the news within the bound. A
/// waiter whose registry heartbeats no node polls as before (every 10 s here).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_and_a_leave_in_another_process_wake_a_membership_waiter() {
    use tenure_sqlite::SqliteOptions;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wake.db");
    let open = || async {
        let options = SqliteOptions::new().poll_interval(Duration::from_secs(1));
        let db = SqliteDatabase::open_with(&path, options).await.unwrap();
        Arc::new(SqliteNodeRegistry::new(&db, TTL).unwrap())
    };
    let (a, b) = (open().await, open().await);
    a.record_heartbeat("node-a", None).await.unwrap();
    let joined = wait_for_a_change(&a, &["node-a"]);
    // The waiter has read the members once and sleeps on its poll.
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.record_heartbeat("node-b", None).await.unwrap();
    let took = seen_within(joined, Duration::from_secs(2), "node-b's join").await;
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(a.live_nodes().await.unwrap(), ["node-a", "node-b"]);

    let left = wait_for_a_change(&a, &["node-a", "node-b"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(b.leave("node-b").await.unwrap());
    seen_within(left, Duration::from_secs(2), "node-b's leave").await;
}

/// A join whose wake-up never arrives (its writer died after the commit, or the
/// datagram was lost; here a handle made from a pool, which knows no file to wake
/// through) is still seen, at the waiter's slow poll: one second here (polls of
/// 10 ms), so later than a wake but within the bound.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_whose_wake_is_lost_is_seen_at_the_slow_poll() {
    use tenure_sqlite::SqliteOptions;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lost.db");
    let options = SqliteOptions::new().poll_interval(Duration::from_millis(10));
    let db = SqliteDatabase::open_with(&path, options).await.unwrap();
    let a = Arc::new(SqliteNodeRegistry::new(&db, TTL).unwrap());
    let pool =
        sqlx::SqlitePool::connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(&path))
            .await
            .unwrap();
    let silent = SqliteDatabase::from_pool(pool).await.unwrap();
    let b = SqliteNodeRegistry::new(&silent, TTL).unwrap();
    a.record_heartbeat("node-a", None).await.unwrap();
    let waiter = wait_for_a_change(&a, &["node-a"]);
    // The waiter has read the members once and sleeps on its slow poll.
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.record_heartbeat("node-b", None).await.unwrap();
    let took = seen_within(waiter, Duration::from_secs(5), "node-b's join").await;
    // Seen by the poll, not a wake: the fault happened, and its cost is bounded.
    assert!(
        took >= Duration::from_millis(500),
        "woken at {took:?}: no lost wake"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(a.live_nodes().await.unwrap(), ["node-a", "node-b"]);
}
