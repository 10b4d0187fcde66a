//! Membership through a session, as scenarios for every backend whose registry counts
//! the keep-alives of a store's sessions as heartbeats (PostgreSQL, SQLite, etcd). Each
//! runs on one test's [`MembershipStorage`], with a registry that shares the store's
//! sessions (the control, [`an_unlinked_registry_writes_every_heartbeat`], with one that
//! shares none); the tests of each backend open that storage, and
//! [`session_membership_scenarios!`](crate::session_membership_scenarios) makes them.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tenure::{LeaseStore, Metadata, NodeRegistry};
use tokio::time::Instant;

use crate::in_time;
use crate::registry::waited_for_change;

/// The member TTL: several round trips fit in it on a loaded 2-core machine.
pub const TTL: Duration = Duration::from_secs(2);
/// The session TTL (a shard member's `lease_ttl` is at least the registry's TTL).
pub const SESSION_TTL: Duration = Duration::from_secs(6);
/// The keep-alive and heartbeat period: a third of the member TTL, as a shard member's.
pub const EVERY: Duration = Duration::from_millis(666);

/// One test's storage for these scenarios, as a backend's tests open it: the store, the
/// registries on the same storage, and a look at a member's own heartbeat.
pub trait MembershipStorage {
    /// The store whose sessions keep members alive.
    type Store: LeaseStore;
    /// The backend's registry.
    type Registry: NodeRegistry + 'static;
    /// A member's own heartbeat as the storage holds it, moved only by a heartbeat write
    /// (its row's `last_heartbeat`, say).
    type Heartbeat: PartialEq + Debug;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// A registry of member TTL `ttl` that shares the store's sessions.
    fn registry(&self, ttl: Duration) -> Self::Registry;

    /// A registry of member TTL [`TTL`] on the same storage that shares no store's
    /// sessions (as every registry did before membership through sessions).
    fn unlinked(&self) -> impl Future<Output = Self::Registry>;

    /// A registry of member TTL [`TTL`] on the same storage, as another process would
    /// open it.
    fn reader(&self) -> impl Future<Output = Self::Registry>;

    /// Member `node`'s own heartbeat.
    fn own_heartbeat(&self, node: &str) -> impl Future<Output = Self::Heartbeat>;

    /// Whether two times `members()` reported are the same store time: equal, unless the
    /// store shows its times on the wall clock through an offset read each time (then it
    /// may show one a few microseconds apart).
    fn same_time(&self, a: SystemTime, b: SystemTime) -> bool {
        a == b
    }
}

/// The metadata the member heartbeats with.
pub fn group() -> Metadata {
    Metadata::from([("group".to_owned(), "g".to_owned())])
}

/// Runs a shard member's two loops for `for_how_long`: the session kept alive and a
/// heartbeat, each every [`EVERY`].
pub async fn keep_alive_and_beat(
    store: &dyn LeaseStore,
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
/// heartbeat and its membership unbroken; and a [`reader`](MembershipStorage::reader)
/// (another process's registry, opened once the rest has run) sees the same.
pub async fn a_member_kept_alive_by_its_session_writes_no_heartbeat_and_stays_live(
    storage: &impl MembershipStorage,
) {
    let (store, registry) = (storage.store(), &storage.registry(TTL));
    let own_heartbeat = || storage.own_heartbeat("m");
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    let first = registry.members().await.unwrap()[0].first_seen;
    // The first keep-alive finds the row naming the session; from then on the
    // keep-alive is the heartbeat.
    keep_alive_and_beat(store, registry, session.id, "m", EVERY).await;
    let written = own_heartbeat().await;
    keep_alive_and_beat(store, registry, session.id, "m", TTL + TTL / 2).await;
    assert_eq!(
        own_heartbeat().await,
        written,
        "a heartbeat was written while the session kept the member alive"
    );
    assert_eq!(registry.live_nodes().await.unwrap(), ["m"]);
    let members = registry.members().await.unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert!(
        storage.same_time(members[0].first_seen, first),
        "one membership throughout: {members:?}, first seen {first:?}"
    );
    assert_eq!(members[0].metadata, group());
    let heard = members[0].now.duration_since(members[0].last_heartbeat);
    assert!(
        heard.is_ok_and(|ago| ago < TTL / 2),
        "the last keep-alive counts as the last heartbeat: {members:?}"
    );
    let reader = storage.reader().await;
    assert_eq!(reader.live_nodes().await.unwrap(), ["m"]);
}

/// When keep-alives stop but the heartbeat loop goes on, the member's own heartbeats
/// resume before any reader sees it lapse: it stays live past a TTL after the last
/// keep-alive, in one membership.
pub async fn heartbeats_resume_when_keep_alives_stop(storage: &impl MembershipStorage) {
    let (store, registry) = (storage.store(), &storage.registry(TTL));
    let own_heartbeat = || storage.own_heartbeat("m");
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    keep_alive_and_beat(store, registry, session.id, "m", TTL).await;
    let first = registry.members().await.unwrap()[0].first_seen;
    let written = own_heartbeat().await;
    let until = Instant::now() + TTL * 2;
    while Instant::now() < until {
        registry.heartbeat_with("m", &group()).await.unwrap();
        assert_eq!(registry.live_nodes().await.unwrap(), ["m"]);
        tokio::time::sleep(EVERY).await;
    }
    assert_ne!(own_heartbeat().await, written);
    let members = registry.members().await.unwrap();
    assert!(
        storage.same_time(members[0].first_seen, first),
        "{members:?}, first seen {first:?}"
    );
}

/// A member kept alive by its session goes at once when the session closes (waking a
/// membership waiter), though its row is there; and when the session is kept alive but
/// the member leaves, it goes at once too, and its next heartbeat joins again.
pub async fn a_closed_session_or_a_leave_removes_the_member_at_once(
    storage: &impl MembershipStorage,
) {
    let store = storage.store();
    let registry: Arc<dyn NodeRegistry> = Arc::new(storage.registry(TTL));
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    // Past the member's own heartbeat by more than a TTL: live through the session.
    keep_alive_and_beat(store, registry.as_ref(), session.id, "m", TTL + TTL / 2).await;
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
    keep_alive_and_beat(store, registry.as_ref(), session.id, "m", TTL + TTL / 2).await;
    assert_eq!(registry.live_nodes().await.unwrap(), ["m"]);

    // The close wakes a waiter at once and the member is gone.
    let observed = registry.live_nodes().await.unwrap();
    let waiter = {
        let registry = registry.clone();
        tokio::spawn(async move {
            waited_for_change(registry.as_ref(), &observed, Duration::from_secs(30)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.close_session(session.id).await.unwrap());
    let waited = in_time(Duration::from_secs(10), waiter, "the close woke the waiter").await;
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert!(registry.live_nodes().await.unwrap().is_empty());
    assert!(registry.members().await.unwrap().is_empty());
}

/// Control: a registry sharing no store's sessions (every registry before) writes each
/// heartbeat, and a member whose heartbeats stop lapses after a TTL though its session
/// is kept alive.
pub async fn an_unlinked_registry_writes_every_heartbeat(storage: &impl MembershipStorage) {
    let (store, registry) = (storage.store(), &storage.unlinked().await);
    let own_heartbeat = || storage.own_heartbeat("m");
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    let written = own_heartbeat().await;
    keep_alive_and_beat(store, registry, session.id, "m", EVERY * 2).await;
    assert_ne!(own_heartbeat().await, written);
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

/// A session whose keep-alives stop stops counting a TTL after its last keep-alive
/// (when `members()` said it would), though the session row itself lives on.
pub async fn a_member_goes_a_ttl_after_its_sessions_last_keep_alive(
    storage: &impl MembershipStorage,
) {
    let (store, registry) = (storage.store(), &storage.registry(TTL));
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry.heartbeat_with("m", &group()).await.unwrap();
    keep_alive_and_beat(store, registry, session.id, "m", TTL + TTL / 2).await;
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

/// A keep-alive tells when the first other member lapses
/// ([`SessionGrant::peers_lapse`](tenure::SessionGrant::peers_lapse)), as `members()`
/// judges it, and how many others are live: a TTL from now when there is none, the other member's lapse while it is
/// kept alive and after it stops, and zero once it lapsed, though its session ended with
/// its membership and its own heartbeat is older than two TTLs. The store tells nothing
/// before there is a registry sharing its sessions, nor when two have different TTLs.
pub async fn a_keep_alive_tells_when_the_first_other_member_lapses(
    storage: &impl MembershipStorage,
) {
    let store = storage.store();
    let registry = |ttl| storage.registry(ttl);
    let untold = || async {
        let session = store.open_session("m", SESSION_TTL).await.unwrap();
        let kept = store.keep_alive_session(session.id, SESSION_TTL).await;
        kept.unwrap().expect("m lives").peers_lapse
    };
    assert_eq!(untold().await, None, "no registry");
    let one = registry(TTL);
    keep_alive_tells_lapses(store, &one).await;
    let _longer = registry(TTL * 2);
    assert_eq!(untold().await, None, "two registry TTLs");
}

async fn keep_alive_tells_lapses(store: &dyn LeaseStore, registry: &dyn NodeRegistry) {
    let rounding = Duration::from_millis(1);
    let near = |told: Duration, expected: Duration| told.abs_diff(expected) <= rounding;
    let a = store.open_session("a", SESSION_TTL).await.unwrap();
    let b = store.open_session("b", TTL).await.unwrap();
    registry.heartbeat_with("a", &group()).await.unwrap();
    let alone = store.keep_alive_session(a.id, SESSION_TTL).await.unwrap();
    let alone = alone
        .expect("a lives")
        .peers_lapse
        .expect("the store tells");
    assert_eq!(alone.ttl, TTL, "judged by the registry's TTL");
    assert!(
        near(alone.after, TTL),
        "no other member: a TTL, told {alone:?}"
    );
    assert_eq!(alone.live, 0, "no other member");

    // b's session lives as long as its membership, and keeps it for more than two TTLs
    // after b's own last heartbeat: when b's session ends, so does its membership, and
    // its own heartbeat is long past. Both members heartbeat as a shard member does, each
    // stood in for by its session's keep-alive (so writing nothing; on etcd the node
    // key's lease is kept alive).
    registry.heartbeat_with("b", &group()).await.unwrap();
    let beat = |node| async move { registry.heartbeat_with(node, &group()).await.unwrap() };
    let until = Instant::now() + 2 * TTL + TTL / 2;
    while Instant::now() < until {
        for session in [a.id, b.id] {
            let ttl = if session == b.id { TTL } else { SESSION_TTL };
            let kept = store.keep_alive_session(session, ttl).await.unwrap();
            assert!(kept.is_some(), "the session lives");
        }
        beat("a").await;
        beat("b").await;
        tokio::time::sleep(EVERY).await;
    }
    let b_lapses = |members: Vec<tenure::NodeInfo>| {
        let b = members
            .into_iter()
            .find(|m| m.node_id == "b")
            .expect("b is live");
        b.last_heartbeat + TTL
    };
    let lapses_at = b_lapses(registry.members().await.unwrap());
    // b's keep-alives stop; a's go on: each tells b's lapse, sooner and sooner.
    for _ in 0..2 {
        let told = store.keep_alive_session(a.id, SESSION_TTL).await.unwrap();
        let told = told.expect("a lives");
        let lapse = told.peers_lapse.expect("the store tells");
        assert_eq!(lapse.live, 1, "b is live");
        let lapse = lapse.after;
        let expected = lapses_at.duration_since(told.now).unwrap_or_default();
        assert!(
            near(lapse, expected),
            "b lapses in {expected:?}, told {lapse:?}"
        );
        beat("a").await;
        tokio::time::sleep(TTL / 3).await;
    }
    let told = store.keep_alive_session(a.id, SESSION_TTL).await.unwrap();
    let left = lapses_at
        .duration_since(told.expect("a lives").now)
        .unwrap_or_default();
    keep_alive_and_beat(
        store,
        registry,
        a.id,
        "a",
        left + Duration::from_millis(200),
    )
    .await;
    assert_eq!(registry.live_nodes().await.unwrap(), ["a"], "b lapsed");
    let told = store.keep_alive_session(a.id, SESSION_TTL).await.unwrap();
    let lapse = told.expect("a lives").peers_lapse.expect("the store tells");
    assert_eq!(lapse.after, Duration::ZERO, "b lapsed less than a TTL ago");
    assert_eq!(lapse.live, 0, "b lapsed");
}

/// Generates one `#[tokio::test]` (multi-thread, two workers) per scenario of
/// [`session_membership`](crate::session_membership), each on the
/// [`MembershipStorage`] `$storage` opens (an expression evaluated in each test; it may
/// `.await`).
///
/// ```text
/// tenure_testkit::session_membership_scenarios!(Storage::open("membership").await);
/// ```
#[macro_export]
macro_rules! session_membership_scenarios {
    ($storage:expr) => {
        $crate::scenario_tests!(session_membership; $storage;
            [flavor = "multi_thread", worker_threads = 2];
            a_member_kept_alive_by_its_session_writes_no_heartbeat_and_stays_live,
            an_unlinked_registry_writes_every_heartbeat,
            a_closed_session_or_a_leave_removes_the_member_at_once,
            a_member_goes_a_ttl_after_its_sessions_last_keep_alive,
            a_keep_alive_tells_when_the_first_other_member_lapses,
            heartbeats_resume_when_keep_alives_stop);
    };
}
