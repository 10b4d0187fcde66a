//! Membership through a session: a node that holds a session of a store over the same
//! [`SqliteDatabase`] as its registry is kept alive by the session's keep-alives, and
//! the registry skips its own heartbeat writes meanwhile.
//!
//! A control runs the same steps with a registry over another `SqliteDatabase` of the
//! same file (which shares no store's sessions, as every registry did before): there
//! every heartbeat writes.

use std::time::Duration;

use tenure::{LeaseStore, Metadata, NodeRegistry};
use tenure_sqlite::{SqliteDatabase, SqliteLeaseStore, SqliteNodeRegistry};
use tokio::time::Instant;

/// The member TTL: several round trips fit in it on a loaded 2-core machine.
const TTL: Duration = Duration::from_secs(2);
/// The session TTL (a shard member's `lease_ttl` is at least the registry's TTL).
const SESSION_TTL: Duration = Duration::from_secs(6);
/// The keep-alive and heartbeat period: a third of the member TTL, as a shard member's.
const EVERY: Duration = Duration::from_millis(666);

/// A fresh file, the database over it and a store over that database.
async fn setup() -> (tempfile::TempDir, SqliteDatabase, SqliteLeaseStore) {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(dir.path().join("m.db")).await.unwrap();
    let store = db.lease_store();
    (dir, db, store)
}

fn group() -> Metadata {
    Metadata::from([("group".to_owned(), "g".to_owned())])
}

/// The node row's own `last_heartbeat` (moved only by a heartbeat write).
async fn own_heartbeat(db: &SqliteDatabase, node: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT last_heartbeat FROM tenure_nodes WHERE node_id = ?1")
        .bind(node)
        .fetch_optional(db.pool())
        .await
        .unwrap()
}

/// Whether two times a reader reported are the same store time: store times are
/// monotonic and shown on the wall clock through an offset read each time, so the same
/// one may be shown a few microseconds apart.
fn same_time(a: std::time::SystemTime, b: std::time::SystemTime) -> bool {
    let apart = a.duration_since(b).or_else(|_| b.duration_since(a));
    apart.is_ok_and(|apart| apart < Duration::from_millis(5))
}

/// Runs a shard member's two loops for `for_how_long`: the session kept alive and a
/// heartbeat, each every [`EVERY`].
async fn keep_alive_and_beat(
    store: &SqliteLeaseStore,
    registry: &dyn NodeRegistry,
    session: tenure::SessionId,
    node: &str,
    for_how_long: Duration,
) {
    let until = Instant::now() + for_how_long;
    while Instant::now() < until {
        let kept = store
            .keep_alive_session(session, SESSION_TTL)
            .await
            .unwrap();
        assert!(kept.is_some(), "the session lives");
        registry.heartbeat_with(node, &group()).await.unwrap();
        tokio::time::sleep(EVERY).await;
    }
}

/// The point: while the session is kept alive, the member's heartbeats write nothing
/// (its row's own `last_heartbeat` stays where the first heartbeats left it, for more
/// than a TTL) and it stays live, with `members()` reporting the keep-alive as its last
/// heartbeat and its membership unbroken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_kept_alive_by_its_session_writes_no_heartbeat_and_stays_live() {
    let (dir, db, store) = setup().await;
    let registry = db.node_registry(TTL).unwrap();
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    let first = registry.members().await.unwrap()[0].first_seen;
    // The first keep-alive finds the row naming the session; from then on the
    // keep-alive is the heartbeat.
    keep_alive_and_beat(&store, &registry, session.id, "m", EVERY).await;
    let written = own_heartbeat(&db, "m").await;
    keep_alive_and_beat(&store, &registry, session.id, "m", TTL + TTL / 2).await;
    assert_eq!(
        own_heartbeat(&db, "m").await,
        written,
        "a heartbeat was written while the session kept the member alive"
    );
    assert_eq!(registry.live_nodes().await.unwrap(), ["m"]);
    let members = registry.members().await.unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert!(
        same_time(members[0].first_seen, first),
        "one membership throughout: {members:?}"
    );
    assert_eq!(members[0].metadata, group());
    let heard = members[0].now.duration_since(members[0].last_heartbeat);
    assert!(
        heard.is_ok_and(|ago| ago < TTL / 2),
        "the last keep-alive counts as the last heartbeat: {members:?}"
    );
    // A reader of another database of the file (another process) sees the same.
    let reader = SqliteNodeRegistry::open(dir.path().join("m.db"), TTL)
        .await
        .unwrap();
    assert_eq!(reader.live_nodes().await.unwrap(), ["m"]);
}

/// Control: a registry sharing no store's sessions (every registry before) writes each
/// heartbeat, and a member whose heartbeats stop lapses after a TTL though its session
/// is kept alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_registry_writes_every_heartbeat() {
    let (dir, db, store) = setup().await;
    let registry = SqliteNodeRegistry::open(dir.path().join("m.db"), TTL)
        .await
        .unwrap();
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    let written = own_heartbeat(&db, "m").await;
    keep_alive_and_beat(&store, &registry, session.id, "m", EVERY * 2).await;
    assert_ne!(own_heartbeat(&db, "m").await, written);
    let until = Instant::now() + TTL + TTL / 4;
    while Instant::now() < until {
        store
            .keep_alive_session(session.id, SESSION_TTL)
            .await
            .unwrap();
        tokio::time::sleep(EVERY).await;
    }
    assert!(registry.live_nodes().await.unwrap().is_empty());
}

/// A member kept alive by its session goes at once when the session closes (waking a
/// membership waiter), though its row is there; and when the session is kept alive but
/// the member leaves, it goes at once too, and its next heartbeat joins again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_session_or_a_leave_removes_the_member_at_once() {
    let (_dir, db, store) = setup().await;
    let registry = db.node_registry(TTL).unwrap();
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    // Past the member's own heartbeat by more than a TTL: live through the session.
    keep_alive_and_beat(&store, &registry, session.id, "m", TTL + TTL / 2).await;
    assert_eq!(registry.live_nodes().await.unwrap(), ["m"]);

    // A leave while the session is kept alive.
    assert!(registry.leave("m").await.unwrap());
    assert!(registry.live_nodes().await.unwrap().is_empty());
    store
        .keep_alive_session(session.id, SESSION_TTL)
        .await
        .unwrap();
    assert!(registry.live_nodes().await.unwrap().is_empty());
    // Joining again writes, naming the session again.
    registry.heartbeat_with("m", &group()).await.unwrap();
    assert_eq!(registry.live_nodes().await.unwrap(), ["m"]);
    keep_alive_and_beat(&store, &registry, session.id, "m", TTL + TTL / 2).await;
    assert_eq!(registry.live_nodes().await.unwrap(), ["m"]);

    // The close wakes a waiter at once and the member is gone.
    let observed = registry.live_nodes().await.unwrap();
    let waiter = {
        let registry = registry.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            registry
                .wait_for_members_change(&observed, started + Duration::from_secs(30))
                .await;
            started.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.close_session(session.id).await.unwrap());
    let waited = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the close woke the waiter")
        .unwrap();
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert!(registry.live_nodes().await.unwrap().is_empty());
    assert!(registry.members().await.unwrap().is_empty());
}

/// A session whose keep-alives stop stops counting a TTL after its last keep-alive
/// (when `members()` said it would), though the session row itself lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_goes_a_ttl_after_its_sessions_last_keep_alive() {
    let (_dir, db, store) = setup().await;
    let registry = db.node_registry(TTL).unwrap();
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    keep_alive_and_beat(&store, &registry, session.id, "m", TTL + TTL / 2).await;
    // Both loops stop (a stalled process); the session has SESSION_TTL left.
    let member = registry.members().await.unwrap().remove(0);
    let lapses = member.last_heartbeat + TTL;
    assert!(lapses > member.now, "{member:?}");
    let left = lapses.duration_since(member.now).unwrap();
    tokio::time::sleep(left.saturating_sub(Duration::from_millis(300))).await;
    assert_eq!(registry.live_nodes().await.unwrap(), ["m"], "not yet");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(registry.live_nodes().await.unwrap().is_empty(), "lapsed");
}

/// When keep-alives stop but the heartbeat loop goes on, the member's own heartbeats
/// resume before any reader sees it lapse: it stays live past a TTL after the last
/// keep-alive, in one membership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_resume_when_keep_alives_stop() {
    let (_dir, db, store) = setup().await;
    let registry = db.node_registry(TTL).unwrap();
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    keep_alive_and_beat(&store, &registry, session.id, "m", TTL).await;
    let first = registry.members().await.unwrap()[0].first_seen;
    let written = own_heartbeat(&db, "m").await;
    let until = Instant::now() + TTL * 2;
    while Instant::now() < until {
        registry.heartbeat_with("m", &group()).await.unwrap();
        assert_eq!(registry.live_nodes().await.unwrap(), ["m"]);
        tokio::time::sleep(EVERY).await;
    }
    assert_ne!(own_heartbeat(&db, "m").await, written);
    let members = registry.members().await.unwrap();
    assert!(same_time(members[0].first_seen, first), "{members:?}");
}
