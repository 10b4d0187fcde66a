//! What only the Kubernetes backend has to get right, on a real API server: tokens
//! across an operator deleting objects and across `leaseTransitions` passing `i32::MAX`,
//! expiry judged from a contender's own first sighting, sessions ended by a takeover,
//! and the errors a user sees for a wrong setup.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tenure::{Error, FencingToken, LeaseStore, NodeRegistry};
use tenure_kube::names::{object_name, Kind};
use tenure_kube::{KubeLeaseStore, KubeNodeRegistry};
use tenure_testkit::MustAnswer;

use common::{field, kubectl};

const TTL: Duration = Duration::from_secs(2);

async fn term(store: &KubeLeaseStore, role: &str, owner: &str) -> FencingToken {
    let result = store.try_acquire(role, owner, TTL).await;
    assert!(result.acquired, "{owner} must get {role}: {result:?}");
    result.fencing_token
}

async fn release(store: &KubeLeaseStore, role: &str, owner: &str, token: FencingToken) {
    assert!(store.release_term(role, owner, token).await);
}

/// An operator deletes a role's Lease between terms, then the epoch counter and the
/// Lease together: the next term's token is still above every token before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_objects_never_bring_a_token_back() {
    let namespace = common::new_namespace("deleted");
    let store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let first = term(&store, "jobs/a", "node-1").await;
    release(&store, "jobs/a", "node-1", first).await;
    let object = object_name(Kind::Role, "jobs/a");
    kubectl(&["delete", "lease", "-n", &namespace, &object]);

    let second = term(&store, "jobs/a", "node-2").await;
    assert!(second > first, "after a delete: {second} must pass {first}");
    release(&store, "jobs/a", "node-2", second).await;

    // Another role keeps the highest epoch in use; then the counter and jobs/a go.
    let other = term(&store, "jobs/b", "node-1").await;
    kubectl(&[
        "delete",
        "lease",
        "-n",
        &namespace,
        "tenure.epochs",
        &object,
    ]);
    let third = term(&store, "jobs/a", "node-3").await;
    assert!(
        third > second && third > other,
        "after the counter went too: {third} must pass {second} and {other}"
    );
    assert_eq!(
        field(&namespace, &object, "{.spec.holderIdentity}"),
        "node-3",
        "kubectl reads the holder"
    );
}

/// `leaseTransitions` is an int32: at `i32::MAX` the next change of holder takes a
/// fresh epoch and counts from zero, and the token still grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_transitions_past_i32_keep_tokens_growing() {
    let namespace = common::new_namespace("transitions");
    let store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let object = object_name(Kind::Role, "wrap");
    let first = term(&store, "wrap", "node-1").await;
    release(&store, "wrap", "node-1", first).await;
    kubectl(&[
        "patch",
        "lease",
        "-n",
        &namespace,
        &object,
        "--type=merge",
        "-p",
        &format!(r#"{{"spec":{{"leaseTransitions":{}}}}}"#, i32::MAX - 1),
    ]);
    let at_max = term(&store, "wrap", "node-2").await;
    assert!(at_max > first);
    assert_eq!(
        field(&namespace, &object, "{.spec.leaseTransitions}"),
        i32::MAX.to_string()
    );
    release(&store, "wrap", "node-2", at_max).await;
    let wrapped = term(&store, "wrap", "node-3").await;
    assert!(wrapped > at_max, "{wrapped} must pass {at_max}");
    assert_eq!(field(&namespace, &object, "{.spec.leaseTransitions}"), "0");
    let info = store.get("wrap").await.unwrap().unwrap();
    assert_eq!(info.fencing_token, wrapped);
}

/// A process that first reads a record counts the holder's time from that read, not
/// from any clock inside the record: it cannot take over before a full TTL of seeing
/// the record unchanged, and it can right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_counts_from_its_own_first_sighting() {
    let namespace = common::new_namespace("sighting");
    let holder = KubeLeaseStore::new(common::tenant(&namespace).await);
    let token = term(&holder, "r", "node-a").await;
    // The holder stalls (never renews again); the contender arrives one TTL later.
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    let contender = KubeLeaseStore::new(common::tenant(&namespace).await);
    let seen_at = tokio::time::Instant::now();
    let refused = contender.try_acquire("r", "node-b", TTL).await;
    assert!(!refused.acquired, "first sighting: {refused:?}");
    assert_eq!(refused.fencing_token, token);
    assert!(refused.remaining() > TTL - Duration::from_millis(500));
    tokio::time::sleep(TTL / 2).await;
    let still = contender.try_acquire("r", "node-b", TTL).await;
    assert!(!still.acquired, "half a TTL after the first sighting");
    tokio::time::sleep_until(seen_at + TTL + common::EXPIRY_MARGIN).await;
    let taken = contender.try_acquire("r", "node-b", TTL).await;
    assert!(taken.acquired && taken.fencing_token > token, "{taken:?}");
}

/// A member whose session a takeover ended never again believes it holds anything:
/// its keep-alive answers that the session ended, and so does acquiring under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_by_a_takeover_stays_ended() {
    let namespace = common::new_namespace("session-ended");
    let member = KubeLeaseStore::new(common::tenant(&namespace).await);
    let session = member.open_session("node-a", TTL).await.unwrap();
    let held = member.acquire_in_session("g/0", session.id).await.unwrap();
    assert!(held.acquired);

    let other = KubeLeaseStore::new(common::tenant(&namespace).await);
    assert!(!other.try_acquire("g/0", "node-b", TTL).await.acquired);
    tokio::time::sleep(TTL + common::EXPIRY_MARGIN).await;
    let taken = other.try_acquire("g/0", "node-b", TTL).await;
    assert!(taken.acquired && taken.fencing_token > held.fencing_token);
    let session_object = format!("tenure.session-{:x}", session.id.get());
    assert_eq!(
        field(
            &namespace,
            &session_object,
            "{.metadata.annotations.tenure\\.dev/ended}"
        ),
        "true",
        "the takeover ended the session before taking the role"
    );
    assert_eq!(member.keep_alive(session.id, TTL).await, None);
    assert!(matches!(
        member.acquire_in_session("g/1", session.id).await,
        Err(Error::SessionEnded(id)) if id == session.id
    ));
}

/// Waiting on a released role wakes from the watch, in well under a retry interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_a_waiter_in_another_process_at_once() {
    let namespace = common::new_namespace("push");
    let holder = KubeLeaseStore::new(common::tenant(&namespace).await);
    let waiter = Arc::new(KubeLeaseStore::new(common::tenant(&namespace).await));
    let token = term(&holder, "r", "node-a").await;
    let task = {
        let waiter = Arc::clone(&waiter);
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            waiter
                .wait_for_change("r", token, start + Duration::from_secs(30))
                .await;
            start
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = tokio::time::Instant::now();
    release(&holder, "r", "node-a", token).await;
    task.await.unwrap();
    let woke = released.elapsed();
    assert!(
        woke < Duration::from_secs(2),
        "woke {woke:?} after the release"
    );
    assert!(waiter.try_acquire("r", "node-b", TTL).await.acquired);
}

/// Why connecting with the kubeconfig at `path` to `url` fails (it must).
async fn connect_error(path: &std::path::Path, url: &str) -> String {
    common::try_connect_kubeconfig(path, url)
        .await
        .unwrap_err()
        .to_string()
}

/// Wrong set-ups fail with what to fix: a sub-second TTL, a namespace without the
/// Role, a namespace that does not exist, an API server nobody listens on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_setups_say_what_to_fix() {
    let namespace = common::new_namespace("setup");
    let store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let error = store
        .try_acquire_or_renew("r", "a", Duration::from_millis(1500))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::InvalidArgument { field: "ttl", reason } if reason.contains("whole number of seconds")),
        "{error}"
    );

    // The tenant's token in a namespace where no RoleBinding grants it leases.
    let unbound = common::server().tenant_kubeconfig("kube-public").unwrap();
    let error = connect_error(&unbound, "kube:kube-public").await;
    assert!(
        error.contains("refused to get leases") && error.contains("kube-public"),
        "{error}"
    );
    assert!(
        error.contains("get, list, watch, create, update and patch"),
        "{error}"
    );

    let admin = common::server().admin_kubeconfig().to_owned();
    let error = connect_error(&admin, "kube:no-such-namespace").await;
    assert!(
        error.contains("namespace no-such-namespace does not exist"),
        "{error}"
    );

    // A kubeconfig whose server nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let text = std::fs::read_to_string(&admin).unwrap();
    let moved = text.replace(
        &format!("127.0.0.1:{}", common::server().port()),
        &format!("127.0.0.1:{port}"),
    );
    assert_ne!(moved, text, "the admin kubeconfig names the server's port");
    let dir = std::env::temp_dir().join(format!("tenure-kube-closed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    std::fs::write(&path, moved).unwrap();
    let error = connect_error(&path, "kube:default").await;
    assert!(
        error.contains("cannot reach the Kubernetes API server"),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The race an operator's delete can open: contender X takes an epoch, then, before X
/// writes with it, contender Y creates the role's object (with a later epoch), holds a
/// term and releases it, and an operator deletes the object. X's term must still come
/// out above Y's: an epoch taken before an incarnation of the object was deleted may
/// never start a term on a later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_taken_before_a_delete_never_starts_a_term() {
    let namespace = common::new_namespace("epoch-race");
    let object = object_name(Kind::Role, "race");
    let paused = Arc::new(tokio::sync::Notify::new());
    let resume = Arc::new(tokio::sync::Notify::new());
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let hook: Arc<
        dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync,
    > = {
        let (paused, resume, first) = (paused.clone(), resume.clone(), first.clone());
        Arc::new(move || {
            let (paused, resume, first) = (paused.clone(), resume.clone(), first.clone());
            Box::pin(async move {
                if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    paused.notify_one();
                    resume.notified().await;
                }
            })
        })
    };
    let x = KubeLeaseStore::new(common::tenant(&namespace).await).pause_after_epoch(hook);
    let y = KubeLeaseStore::new(common::tenant(&namespace).await);
    let x_task = tokio::spawn(async move { x.try_acquire_or_renew("race", "node-x", TTL).await });
    paused.notified().await;

    let y_token = term(&y, "race", "node-y").await;
    release(&y, "race", "node-y", y_token).await;
    kubectl(&["delete", "lease", "-n", &namespace, &object]);
    resume.notify_one();

    let x_result = x_task.await.unwrap().unwrap();
    assert!(x_result.acquired, "{x_result:?}");
    assert!(
        x_result.fencing_token > y_token,
        "token went back: node-y had {y_token}, then node-x got {}",
        x_result.fencing_token
    );
}

type AllocationHook = Arc<
    dyn Fn(usize) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync,
>;

/// A store whose epoch allocations are recorded (each one's batch size) and whose first
/// allocation is held, after it took its callers and before it writes, until `resume`
/// is notified (it tells `paused` first).
struct HeldStore {
    store: Arc<KubeLeaseStore>,
    batches: Arc<parking_lot::Mutex<Vec<usize>>>,
    paused: Arc<tokio::sync::Notify>,
    resume: Arc<tokio::sync::Notify>,
}

async fn store_holding_first_allocation(namespace: &str) -> HeldStore {
    let batches = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let paused = Arc::new(tokio::sync::Notify::new());
    let resume = Arc::new(tokio::sync::Notify::new());
    let hook: AllocationHook = {
        let (batches, paused, resume) = (batches.clone(), paused.clone(), resume.clone());
        Arc::new(move |batch| {
            let (batches, paused, resume) = (batches.clone(), paused.clone(), resume.clone());
            Box::pin(async move {
                let first = {
                    let mut batches = batches.lock();
                    batches.push(batch);
                    batches.len() == 1
                };
                if first {
                    paused.notify_one();
                    resume.notified().await;
                }
            })
        })
    };
    let store = KubeLeaseStore::new(common::tenant(namespace).await).pause_in_allocation(hook);
    HeldStore {
        store: Arc::new(store),
        batches,
        paused,
        resume,
    }
}

/// Takes an epoch on a task of its own.
fn take_epoch(store: &Arc<KubeLeaseStore>) -> tokio::task::JoinHandle<u64> {
    let store = store.clone();
    tokio::spawn(async move { store.take_epoch().await.unwrap() })
}

/// Callers of one store that arrive while an allocation is in flight are served
/// together by the next one, one counter write for all of them, each with its own
/// epoch; callers of several stores at once never share an epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_get_distinct_epochs_from_one_write() {
    let namespace = common::new_namespace("epoch-batch");
    let HeldStore {
        store,
        batches,
        paused,
        resume,
    } = store_holding_first_allocation(&namespace).await;
    let first = take_epoch(&store);
    paused.notified().await;
    let queued: Vec<_> = (0..15).map(|_| take_epoch(&store)).collect();
    // Let every queued caller join before the first allocation goes on.
    tokio::time::sleep(Duration::from_millis(200)).await;
    resume.notify_one();
    let first = first.await.unwrap();
    let mut rest = Vec::new();
    for task in queued {
        rest.push(task.await.unwrap());
    }
    assert_eq!(
        *batches.lock(),
        vec![1, 15],
        "the 15 that arrived during the first allocation share the next one"
    );
    assert!(rest.iter().all(|&epoch| epoch > first), "{first} {rest:?}");
    let mut all: Vec<u64> = rest.iter().copied().chain([first]).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 16, "distinct: {all:?}");

    // Three stores, 16 callers each, all at once.
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(Arc::new(KubeLeaseStore::new(
            common::tenant(&namespace).await,
        )));
    }
    let tasks: Vec<_> = (0..48).map(|i| take_epoch(&stores[i % 3])).collect();
    let mut epochs = Vec::new();
    for task in tasks {
        epochs.push(task.await.unwrap());
    }
    assert!(epochs.iter().all(|&epoch| epoch > all[15]));
    epochs.sort_unstable();
    epochs.dedup();
    assert_eq!(epochs.len(), 48, "distinct across stores: {epochs:?}");
    // One store's calls one after another grow.
    let a = stores[0].take_epoch().await.unwrap();
    let b = stores[0].take_epoch().await.unwrap();
    assert!(a > epochs[47] && b > a, "{a} then {b}");
}

/// An epoch is reserved by a counter write sent after its caller asked: a caller that
/// arrives while an allocation is in flight is not served from that allocation's block,
/// so its epoch passes one another store took before it asked (as a role's first term
/// must pass every epoch a deleted incarnation used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_is_reserved_after_its_caller_asked() {
    let namespace = common::new_namespace("epoch-after");
    let HeldStore {
        store: x,
        batches,
        paused,
        resume,
    } = store_holding_first_allocation(&namespace).await;
    let y = KubeLeaseStore::new(common::tenant(&namespace).await);
    // X's first allocation is held before its write (X has not read the counter yet).
    let x1 = take_epoch(&x);
    paused.notified().await;
    // Meanwhile Y takes an epoch, and only then does X's second caller ask.
    let from_y = y.take_epoch().await.unwrap();
    let x2 = take_epoch(&x);
    tokio::time::sleep(Duration::from_millis(200)).await;
    resume.notify_one();
    let (x1, x2) = (x1.await.unwrap(), x2.await.unwrap());
    assert!(x2 > from_y, "asked after Y's {from_y}, got {x2}");
    assert!(x2 > x1 && x1 != from_y, "{x1} {x2} {from_y}");
    assert_eq!(
        *batches.lock(),
        vec![1, 1],
        "x2 waited for its own allocation"
    );

    // X now knows the counter as it wrote it; Y moves it on; X's next write on the stale
    // version loses and reads again, still above Y's.
    let from_y = y.take_epoch().await.unwrap();
    let x3 = x.take_epoch().await.unwrap();
    assert!(x3 > from_y && x3 > x2, "{x3} after {from_y} and {x2}");
}

/// A member whose store keeps its session alive is heard of through the session: its
/// registry writes no heartbeat of its own meanwhile (one write per member per interval,
/// the keep-alive), another process still sees it live for as long as it lasts, and once
/// the session ends its own heartbeats come back; with neither it lapses after its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keep_alive_is_its_members_heartbeat() {
    let namespace = common::new_namespace("session-beat");
    let conn = common::tenant(&namespace).await;
    let store = KubeLeaseStore::new(conn.clone());
    let registry = KubeNodeRegistry::new(conn, TTL).unwrap();
    let reader = KubeNodeRegistry::new(common::tenant(&namespace).await, TTL).unwrap();
    let session = store.open_session("node-a", TTL).await.unwrap();
    registry.heartbeat("node-a").await.unwrap();
    let object = object_name(Kind::Member, "node-a");
    let version = field(&namespace, &object, "{.metadata.resourceVersion}");
    assert_eq!(reader.live_nodes().await.unwrap(), vec!["node-a"]);
    let first_seen = reader.members().await.unwrap()[0].first_seen;
    for _ in 0..9 {
        tokio::time::sleep(TTL / 3).await;
        assert!(store.keep_alive(session.id, TTL).await.is_some());
        registry.heartbeat("node-a").await.unwrap();
        let members = reader.members().await.unwrap();
        assert_eq!(members.len(), 1, "{members:?}");
        assert_eq!(
            members[0].first_seen, first_seen,
            "one membership throughout"
        );
        assert!(members[0].heartbeat_age() < TTL / 2, "{members:?}");
    }
    assert_eq!(
        field(&namespace, &object, "{.metadata.resourceVersion}"),
        version,
        "no heartbeat write of its own while the session was kept alive"
    );

    assert!(store.close_session(session.id).await.unwrap());
    registry.heartbeat("node-a").await.unwrap();
    assert_ne!(
        field(&namespace, &object, "{.metadata.resourceVersion}"),
        version,
        "the session ended: the member heartbeats itself"
    );
    assert_eq!(reader.live_nodes().await.unwrap(), vec!["node-a"]);
    assert_eq!(reader.members().await.unwrap()[0].first_seen, first_seen);
    tokio::time::sleep(TTL + common::EXPIRY_MARGIN).await;
    assert!(reader.live_nodes().await.unwrap().is_empty());
}
