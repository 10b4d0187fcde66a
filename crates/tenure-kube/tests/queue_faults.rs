//! The queue of candidates on the Kubernetes API under faults the shared
//! `queue_fault_scenarios!` cannot make: a release or `hand_over` written on a stale
//! copy of the role (its conditional `PUT` must get 409 and change nothing), a
//! candidacy object an operator deletes mid-queue, and the role's object deleted and
//! created again after a handover spent a place.

mod common;

use std::time::Duration;

use tenure::{FencingToken, LeaseResult, LeaseStore};
use tenure_kube::names::{candidacy_name, object_name, Kind};
use tenure_kube::KubeLeaseStore;
use tenure_testkit::{eventually, MustAnswer};

use common::{field, kubectl, put};

const TTL: Duration = Duration::from_secs(8);
const ROLE: &str = "jobs/faulted";

async fn holder(store: &KubeLeaseStore) -> Option<(String, FencingToken)> {
    let info = store.get(ROLE).await.unwrap()?;
    let token = info.fencing_token;
    info.live_holder().map(|holder| (holder.to_owned(), token))
}

/// `owner` takes the free role.
async fn acquires(store: &KubeLeaseStore, owner: &str) -> LeaseResult {
    let answer = store.acquire_or_queue(ROLE, owner, TTL).await;
    assert!(answer.acquired);
    answer
}

async fn queued(store: &KubeLeaseStore, owner: &str) {
    let answer = store.acquire_or_queue(ROLE, owner, TTL).await;
    assert!(!answer.acquired, "{owner} queues: {answer:?}");
}

/// Waits (at most 10 s) until `store`'s view of the queue is `expected`.
async fn until_candidates(store: &KubeLeaseStore, expected: &[&str]) {
    let within = Duration::from_secs(10);
    eventually(within, Duration::from_millis(50), || async {
        let now = store.candidates(ROLE).await.unwrap();
        if now == expected {
            Ok(())
        } else {
            Err(format!("candidates {now:?}, not {expected:?}"))
        }
    })
    .await;
}

/// Setup: node-a holds a term written by store A (which keeps that version as its own,
/// to end the term with no read); node-b and node-c queue. Another store of node-a's
/// (a restarted process with the same owner id) releases the term, handing it to
/// node-b. A, still believing its copy, then releases and hands over with the old
/// token: each is one `PUT` on the stale version, refused (the object's version does
/// not move), then a read: both answer `false`, node-b keeps its term and node-c its
/// place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_on_a_stale_copy_gets_a_conflict_and_changes_nothing() {
    let namespace = common::new_namespace("stale-put");
    let role_object = object_name(Kind::Role, ROLE);
    let (stale, requests) = common::counted(&namespace).await;
    let a = acquires(&stale, "node-a").await;
    let other = KubeLeaseStore::new(common::tenant(&namespace).await);
    queued(&other, "node-b").await;
    queued(&other, "node-c").await;
    until_candidates(&stale, &["node-b", "node-c"]).await;

    let restarted = KubeLeaseStore::new(common::tenant(&namespace).await);
    assert!(
        restarted
            .release_term(ROLE, "node-a", a.fencing_token)
            .await
    );
    let (next, b) = holder(&other).await.expect("handed to node-b");
    assert_eq!(next, "node-b");
    assert!(b > a.fencing_token);
    let version = field(&namespace, &role_object, "{.metadata.resourceVersion}");

    requests.take();
    assert!(!stale.release_term(ROLE, "node-a", a.fencing_token).await);
    assert!(!stale
        .hand_over(ROLE, "node-a", a.fencing_token, Some("node-c"))
        .await
        .unwrap());
    let sent = requests.take();
    let puts = sent
        .iter()
        .filter(|r| **r == put(&namespace, &role_object))
        .count();
    assert!(puts >= 1, "the stale copy was written on: {sent:?}");
    assert_eq!(
        field(&namespace, &role_object, "{.metadata.resourceVersion}"),
        version,
        "every write on the stale copy was refused: {sent:?}"
    );
    assert_eq!(
        holder(&other).await,
        Some(("node-b".to_owned(), b)),
        "node-b's term goes on"
    );
    assert_eq!(other.candidates(ROLE).await.unwrap(), ["node-c"]);
    let renewed = other.acquire_or_queue(ROLE, "node-b", TTL).await;
    assert!(
        renewed.acquired && renewed.fencing_token == b,
        "{renewed:?}"
    );
}

/// Setup: node-a holds; node-b and node-c queue, each on a store of its own. An
/// operator deletes node-b's candidacy object (the documented way to withdraw it): the
/// release hands the role to node-c, never node-b. node-b's next refresh, conditional
/// on the object it wrote, joins the queue again at the back, behind node-d, and its
/// turn comes after node-d's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidacy_deleted_by_an_operator_is_withdrawn() {
    let namespace = common::new_namespace("deleted-candidacy");
    let holder_store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let b_store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let c_store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let a = acquires(&holder_store, "node-a").await;
    queued(&b_store, "node-b").await;
    queued(&c_store, "node-c").await;
    until_candidates(&holder_store, &["node-b", "node-c"]).await;

    kubectl(&[
        "delete",
        "lease",
        "-n",
        &namespace,
        &candidacy_name(ROLE, "node-b"),
    ]);
    until_candidates(&holder_store, &["node-c"]).await;
    assert!(
        holder_store
            .release_term(ROLE, "node-a", a.fencing_token)
            .await
    );
    let (next, c) = holder(&holder_store).await.expect("handed on");
    assert_eq!(next, "node-c", "the deleted candidacy is withdrawn");
    assert!(c > a.fencing_token);

    queued(&holder_store, "node-d").await;
    queued(&b_store, "node-b").await;
    until_candidates(&c_store, &["node-d", "node-b"]).await;
    assert!(c_store.release_term(ROLE, "node-c", c).await);
    let (next, d) = holder(&c_store).await.expect("handed on");
    assert_eq!(next, "node-d");
    assert!(d > c);
}

/// Setup: node-a holds; node-b then node-c queue; node-a's release hands the role to
/// node-b (its place spent), which dies at once (it neither renews nor refreshes). An
/// operator deletes the role's object. node-x takes the role anew (the object created
/// again, its token above every earlier one) and releases it while node-b's candidacy
/// object still looks live: the spent place must not be handed the role a second time.
/// node-c's place, from before the delete, counts as spent too (the object cannot tell
/// it from node-b's), so the role is free, and node-c, live, takes it at its next call.
/// (Before candidacies named the object's uid, node-b was handed the role again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_place_stays_spent_across_a_delete_of_the_role() {
    let namespace = common::new_namespace("spent-recreated");
    let role_object = object_name(Kind::Role, ROLE);
    let store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let a = acquires(&store, "node-a").await;
    queued(&store, "node-b").await;
    queued(&store, "node-c").await;
    assert!(store.release_term(ROLE, "node-a", a.fencing_token).await);
    let (next, b) = holder(&store).await.expect("handed to node-b");
    assert_eq!(next, "node-b");

    kubectl(&["delete", "lease", "-n", &namespace, &role_object]);
    let x_store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let x = x_store.acquire_or_queue(ROLE, "node-x", TTL).await;
    assert!(x.acquired, "{x:?}");
    assert!(x.fencing_token > b, "tokens grow across the delete: {x:?}");
    assert!(x_store.release_term(ROLE, "node-x", x.fencing_token).await);
    assert_eq!(
        holder(&x_store).await,
        None,
        "node-b's spent place was handed the role again"
    );
    let c = store.acquire_or_queue(ROLE, "node-c", TTL).await;
    assert!(c.acquired && c.fencing_token > x.fencing_token, "{c:?}");
}

/// Setup: 31 owners queue and lead in turn by handovers (31 places spent); o31 queues
/// with a 2 s TTL and is handed the role (32 spent: the list is full); o32 queues, and
/// when o31's term lapses takes the role over by itself (a 33rd place spent, so the
/// list drops o00's). o00 never refreshed: its candidacy still shows its spent place,
/// live for a minute. o32's release must not hand the role to o00 again: the write that
/// dropped o00's place cleared its candidacy first. (Before, the acquire never cleared
/// a dropped place, and a release cleared one only after its write, while the
/// successor's release could already read the list without it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_dropped_from_the_full_list_is_not_handed_the_role_again() {
    let namespace = common::new_namespace("dropped-place");
    let store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let long = Duration::from_secs(60);
    let first = store.acquire_or_queue(ROLE, "holder", long).await;
    assert!(first.acquired);
    let owners: Vec<String> = (0..31).map(|i| format!("o{i:02}")).collect();
    for owner in &owners {
        let answer = store.acquire_or_queue(ROLE, owner, long).await;
        assert!(!answer.acquired, "{owner} queues: {answer:?}");
    }
    let mut current = ("holder".to_owned(), first.fencing_token);
    for owner in &owners {
        assert!(store.release_term(ROLE, &current.0, current.1).await);
        current = holder(&store).await.expect("handed on");
        assert_eq!(&current.0, owner, "handed in order");
    }
    let short = store
        .acquire_or_queue(ROLE, "o31", Duration::from_secs(2))
        .await;
    assert!(!short.acquired);
    assert!(store.release_term(ROLE, &current.0, current.1).await);
    let (next, _) = holder(&store).await.expect("handed to o31");
    assert_eq!(next, "o31");
    queued(&store, "o32").await;

    // o31 never renews: its term lapses within its candidacy's 2 s, and o32 takes over.
    let within = Duration::from_secs(15);
    let taken = eventually(within, Duration::from_millis(200), || async {
        let answer = store.acquire_or_queue(ROLE, "o32", long).await;
        if answer.acquired {
            Ok(answer)
        } else {
            Err(format!("o32 never took over: {answer:?}"))
        }
    })
    .await;
    assert!(store.release_term(ROLE, "o32", taken.fencing_token).await);
    assert_eq!(
        holder(&store).await,
        None,
        "every place was spent: the release frees the role"
    );
    assert_eq!(
        field(
            &namespace,
            &candidacy_name(ROLE, "o00"),
            "{.spec.holderIdentity}"
        ),
        "",
        "o00's dropped place was cleared"
    );
}
