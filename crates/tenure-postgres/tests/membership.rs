//! Membership through a session: a node that holds a session of the store its registry
//! was made from ([`PgLeaseStore::registry`]) is kept alive by the session's
//! keep-alives, and the registry skips its own heartbeat writes meanwhile.
//!
//! The scenarios of `tenure_testkit::session_membership` run here on a fresh schema
//! each; their control runs the same steps with a registry made by
//! [`PgNodeRegistry::new`] (which shares no store's sessions, as every registry did
//! before): there the member lapses.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tenure_testkit::session_membership::{
    group, keep_alive_and_beat, MembershipStorage, EVERY, SESSION_TTL, TTL,
};

use sqlx::PgPool;
use tenure::{LeaseStore, NodeRegistry};
use tenure_postgres::{PgLeaseStore, PgNodeRegistry, Schema};

use common::table;
use tenure_testkit::in_time;
use tenure_testkit::registry::waited_for_change;

/// A fresh migrated schema, its pool of 4 tagged `app`, and a store on them.
async fn setup(app: &str) -> (PgPool, Schema, PgLeaseStore) {
    common::with_store(common::migrated(app).await)
}

/// One test's fresh migrated schema, its pool of 4 tagged `app`, and a store on them.
struct Storage {
    pool: PgPool,
    schema: Schema,
    store: PgLeaseStore,
}

impl Storage {
    async fn open(app: &str) -> Self {
        let (pool, schema, store) = setup(app).await;
        Self {
            pool,
            schema,
            store,
        }
    }
}

impl MembershipStorage for Storage {
    type Store = PgLeaseStore;
    type Registry = PgNodeRegistry;
    /// The node row's own `last_heartbeat`, in microseconds since the epoch.
    type Heartbeat = Option<i64>;

    fn store(&self) -> &PgLeaseStore {
        &self.store
    }

    fn registry(&self, ttl: Duration) -> PgNodeRegistry {
        self.store.registry(ttl).unwrap()
    }

    async fn unlinked(&self) -> PgNodeRegistry {
        PgNodeRegistry::new(self.pool.clone(), self.schema.clone(), TTL).unwrap()
    }

    /// A registry on a pool of its own.
    async fn reader(&self) -> PgNodeRegistry {
        let server = tenure_testkit::postgres::PgServer::shared().expect("shared server");
        let other = common::pool(server, 2, "membership-skip-other").await;
        PgNodeRegistry::new(other, self.schema.clone(), TTL).unwrap()
    }

    async fn own_heartbeat(&self, node: &str) -> Option<i64> {
        let nodes = table(&self.schema, "tenure_nodes");
        sqlx::query_scalar(&format!(
            "SELECT (extract(epoch FROM last_heartbeat) * 1000000)::bigint FROM {nodes}
             WHERE node_id = $1"
        ))
        .bind(node)
        .fetch_optional(&self.pool)
        .await
        .unwrap()
    }
}

tenure_testkit::session_membership_scenarios!(Storage::open("membership").await);

/// A schema whose node and session tables predate membership through sessions gets
/// the columns from `migrate`, and its rows keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_heartbeat_session_columns() {
    let (pool, schema, _leases) = common::first_version("membership-upgrade").await;
    let nodes = table(&schema, "tenure_nodes");
    let sessions = table(&schema, "tenure_sessions");
    let store = common::upgraded(
        &pool,
        &schema,
        &format!(
            "CREATE TABLE {nodes} (
                node_id text PRIMARY KEY,
                first_seen timestamptz NOT NULL,
                last_heartbeat timestamptz NOT NULL,
                metadata jsonb NOT NULL DEFAULT '{{}}'
            );
            INSERT INTO {nodes} VALUES ('old', now(), now(), '{{}}');
            CREATE TABLE {sessions} (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                owner text NOT NULL,
                expires_at timestamptz NOT NULL
            );"
        ),
    )
    .await;
    let registry = store.registry(TTL).unwrap();
    assert_eq!(registry.live_nodes().await.unwrap(), ["old"]);
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    keep_alive_and_beat(&store, &registry, session.id, "m", EVERY).await;
    assert_eq!(registry.live_nodes().await.unwrap(), ["m", "old"]);
}

/// A wait for a change trusts the read it follows only while the listener heard
/// nothing since that read began: a join notified between the read and the wait (and
/// delivered before the wait subscribed) still ends the wait at once. With nothing
/// notified, the wait lasts to its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_between_a_read_and_the_wait_is_not_missed() {
    let (pool, schema, store) = setup("membership-between").await;
    let registry = store.registry(TTL).unwrap();
    let other = PgNodeRegistry::new(pool.clone(), schema.clone(), TTL).unwrap();
    registry.heartbeat("a").await.unwrap();
    // Nothing changes: the wait lasts (and starts the listener).
    let half = Duration::from_millis(500);
    let observed = registry.live_nodes().await.unwrap();
    assert!(waited_for_change(&registry, &observed, half).await >= half);
    let observed = member_ids(&registry).await;
    assert_eq!(observed, ["a"]);
    let waited = waited_for_change(&registry, &observed, half).await;
    assert!(
        waited >= half,
        "nothing changed after the read: the wait lasts"
    );
    let observed = member_ids(&registry).await;
    other.heartbeat("b").await.unwrap();
    // The join's notification reaches the listener before the wait begins.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waited = waited_for_change(&registry, &observed, Duration::from_secs(30)).await;
    assert!(
        waited < Duration::from_secs(5),
        "a join after the read was missed: waited {waited:?}"
    );
}

/// The ids `members()` shows, in its order.
async fn member_ids(registry: &dyn NodeRegistry) -> Vec<String> {
    let members = registry.members().await.unwrap();
    members.into_iter().map(|m| m.node_id).collect()
}

/// Heartbeats whose statement hangs on the server (the node's row locked by another
/// transaction, as behind a stalled backend) are given up after an interval each and the
/// next sent, without a server backend left waiting per give-up; once the lock is freed
/// the node is live again. A leave sent while they hang lands when the lock is freed, and
/// no heartbeat given up earlier brings the node back after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_hung_on_the_server_are_given_up_and_a_leave_still_lands() {
    const APP: &str = "membership-hung";
    const INTERVAL: Duration = Duration::from_millis(200);
    let (pool, schema, _store) = setup(APP).await;
    let server = tenure_testkit::postgres::PgServer::shared().expect("shared server");
    let admin = common::pool(server, 2, "membership-hung-admin").await;
    let registry: Arc<dyn NodeRegistry> =
        Arc::new(PgNodeRegistry::new(pool, schema.clone(), TTL).unwrap());
    let live = || async {
        registry
            .live_nodes()
            .await
            .unwrap()
            .contains(&"m".to_owned())
    };
    let within = |bound: Duration, what: &'static str| {
        let until = std::time::Instant::now() + bound;
        move || assert!(std::time::Instant::now() < until, "{what} within {bound:?}")
    };
    // The backends of this registry's pool waiting on a lock, by pid.
    let waiting = || async {
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
             WHERE application_name = $1 AND wait_event_type = 'Lock'",
        )
        .bind(APP)
        .fetch_all(&admin)
        .await
        .unwrap();
        pids
    };
    let lock_the_row = || common::row_locked(&admin, &schema, "tenure_nodes", "m");

    let cancel = tokio_util::sync::CancellationToken::new();
    let beating = tenure::spawn_heartbeat(
        registry.clone(),
        "m",
        Default::default(),
        INTERVAL,
        cancel.clone(),
    );
    let check = within(Duration::from_secs(5), "the first heartbeat lands");
    while !live().await {
        check();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Heartbeats hang: each is given up and the next sent, and the server ends the
    // given-up ones instead of keeping a backend waiting for each.
    let blocker = lock_the_row().await;
    let mut seen = std::collections::BTreeSet::new();
    let check = within(Duration::from_secs(10), "eight heartbeats given up");
    while seen.len() < 8 {
        check();
        let now = waiting().await;
        assert!(
            now.len() <= 7,
            "{} backends of given-up heartbeats wait at once",
            now.len()
        );
        seen.extend(now);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    blocker.rollback().await.unwrap();
    let check = within(
        TTL + Duration::from_secs(1),
        "live again once the lock is freed",
    );
    while !live().await {
        check();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A leave sent while heartbeats hang lands after them.
    let blocker = lock_the_row().await;
    let check = within(Duration::from_secs(5), "a heartbeat hangs");
    while waiting().await.is_empty() {
        check();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    let leave = format!("DELETE FROM {}", table(&schema, "tenure_nodes"));
    let leave_waits = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE $2",
        )
        .bind(APP)
        .bind(format!("%{leave}%"))
        .fetch_one(&admin)
        .await
        .unwrap();
        n > 0
    };
    let check = within(Duration::from_secs(5), "the leave is sent");
    while !leave_waits().await {
        check();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    blocker.rollback().await.unwrap();
    in_time(
        TTL + INTERVAL + Duration::from_secs(1),
        beating,
        "the heartbeat loop ends after its leave",
    )
    .await
    .unwrap();
    assert!(!live().await, "the leave removed the node");
    // Every statement given up earlier has ended or landed once none waits any more.
    let check = within(Duration::from_secs(5), "no statement left waiting");
    while !waiting().await.is_empty() {
        check();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !live().await,
        "no heartbeat given up earlier brought the node back"
    );
}
