//! The queue of candidates on the Kubernetes API, beyond the shared scenarios: what a
//! handover and a queue refresh cost in requests (counted on each store's own client),
//! the objects a candidacy is kept in, the housekeeping of lapsed candidacies, and
//! electors served in the order they queued.

mod common;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tenure::{FencingToken, LeaseStore, TermChange};
use tenure_kube::names::{candidacy_name, object_name, role_label, Kind};
use tenure_kube::KubeLeaseStore;
use tenure_testkit::MustAnswer;
use tokio::time::Instant;

use common::{field, put};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(4);
const ROLE: &str = "jobs/queue";

async fn queued(store: &KubeLeaseStore, owner: &str, ttl: Duration) {
    let answer = store
        .try_acquire_or_queue(ROLE, owner, ttl, Some(&format!("http://{owner}")))
        .await
        .unwrap();
    assert!(!answer.acquired, "{owner} queues: {answer:?}");
}

/// A release hands the role over with one request however many candidates wait, the
/// waiters learn who leads next with none, and the successor renews with one: two
/// requests per handover. A queue refresh is one request; reading who waits, none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_costs_two_requests_however_many_wait() {
    let namespace = common::new_namespace("handover");
    let role_object = object_name(Kind::Role, ROLE);
    let (holder, holder_requests) = common::counted(&namespace).await;
    let a = holder.acquire_or_queue(ROLE, "node-a", TTL).await;
    assert!(a.acquired);
    let mut candidates = Vec::new();
    for i in 0..6 {
        let (store, requests) = common::counted(&namespace).await;
        let store = Arc::new(store);
        let owner = format!("node-{i}");
        queued(&store, &owner, TTL).await;
        candidates.push((owner, store, requests));
    }
    // Every store's watch has listed the namespace and seen every candidacy (ample
    // time on a loaded machine; a store not yet synced would read, and the counts say so).
    tokio::time::sleep(Duration::from_secs(2)).await;

    for (owner, store, requests) in &candidates {
        requests.take();
        queued(store, owner, TTL).await;
        assert_eq!(
            requests.take(),
            [put(&namespace, &candidacy_name(ROLE, owner))],
            "a refresh of {owner}'s place"
        );
    }

    holder_requests.take();
    let owners: Vec<String> = candidates.iter().map(|(owner, ..)| owner.clone()).collect();
    assert_eq!(
        holder.candidates(ROLE).await.unwrap(),
        owners,
        "who waits, oldest first"
    );
    assert_eq!(
        holder_requests.take(),
        Vec::<String>::new(),
        "read from the watch"
    );

    let waiting: Vec<_> = candidates
        .iter()
        .map(|(_, store, _)| {
            let store = Arc::clone(store);
            tokio::spawn(async move {
                store
                    .wait_for_successor(ROLE, a.fencing_token, Instant::now() + TTL * 5)
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder_requests.take();
    for (_, _, requests) in &candidates {
        requests.take();
    }
    assert!(holder.release_term(ROLE, "node-a", a.fencing_token).await);
    assert_eq!(
        holder_requests.take(),
        [put(&namespace, &role_object)],
        "the release is one write"
    );
    let next = FencingToken::from(a.fencing_token.get() + 1);
    for change in waiting {
        assert_eq!(
            change.await.unwrap(),
            TermChange::Began {
                holder: "node-0".to_owned(),
                fencing_token: next,
                session: None,
            },
            "every waiter learns from the watch that node-0 queued first"
        );
    }
    for (owner, _, requests) in &candidates {
        assert_eq!(
            requests.take(),
            Vec::<String>::new(),
            "{owner} sent nothing"
        );
    }

    let (owner, successor, requests) = &candidates[0];
    let renewed = successor
        .try_acquire_or_queue(ROLE, owner, TTL, Some("http://node-0"))
        .await
        .unwrap();
    assert!(
        renewed.acquired && renewed.fencing_token == next,
        "{renewed:?}"
    );
    assert_eq!(
        requests.take(),
        [put(&namespace, &role_object)],
        "the successor renews with one write"
    );
    assert_eq!(
        successor.candidates(ROLE).await.unwrap(),
        owners[1..],
        "node-0 leads: its place is spent"
    );
    requests.take();
    // The others wait on the new term, still without a request.
    for (owner, store, requests) in &candidates[1..] {
        let change = store
            .wait_for_successor(ROLE, next, Instant::now() + Duration::from_millis(300))
            .await;
        assert_eq!(change, TermChange::Unknown, "{owner}: nothing changed");
        assert_eq!(
            requests.take(),
            Vec::<String>::new(),
            "{owner} sent nothing"
        );
    }

    // node-0 leads past its candidacy's TTL (renewing, as the others refresh their
    // places): its spent candidacy lapses, and the next release still writes once.
    let until = Instant::now() + TTL + Duration::from_millis(500);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let renewed = successor.acquire_or_queue(ROLE, owner, TTL).await;
        assert!(renewed.acquired, "{renewed:?}");
        for (owner, store, _) in &candidates[1..] {
            queued(store, owner, TTL).await;
        }
    }
    requests.take();
    assert!(successor.release_term(ROLE, owner, next).await);
    assert_eq!(
        requests.take(),
        [put(&namespace, &role_object)],
        "a spent place that lapsed needs no write"
    );
    let info = successor.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-1"));
}

/// A candidacy is its own Lease object, labelled with its role; a refresh keeps its
/// place (`acquireTime`); the write that hands it the role lists that place as spent, so
/// the next release does not hand it back, and withdrawing a spent place answers false
/// and clears it; queued again, it has a new place and its turn comes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidacy_keeps_its_place_until_its_turn_is_spent() {
    let namespace = common::new_namespace("candidacy");
    let store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let role_object = object_name(Kind::Role, ROLE);
    let b_object = candidacy_name(ROLE, "node-b");
    let a = store.acquire_or_queue(ROLE, "node-a", TTL).await;
    queued(&store, "node-b", TTL).await;
    let joined = field(&namespace, &b_object, "{.spec.acquireTime}");
    assert_eq!(
        field(&namespace, &b_object, "{.spec.holderIdentity}"),
        "node-b"
    );
    assert_eq!(
        field(&namespace, &b_object, "{.spec.leaseDurationSeconds}"),
        "4"
    );
    assert_eq!(
        field(
            &namespace,
            &b_object,
            "{.metadata.labels.tenure\\.dev/kind}"
        ),
        "candidate"
    );
    assert_eq!(
        field(
            &namespace,
            &b_object,
            "{.metadata.labels.tenure\\.dev/role}"
        ),
        role_label(ROLE)
    );
    assert_eq!(
        field(
            &namespace,
            &b_object,
            "{.metadata.annotations.tenure\\.dev/value}"
        ),
        "http://node-b"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    queued(&store, "node-b", TTL).await;
    assert_eq!(
        field(&namespace, &b_object, "{.spec.acquireTime}"),
        joined,
        "a refresh keeps the place"
    );

    assert!(store.release_term(ROLE, "node-a", a.fencing_token).await);
    assert_eq!(
        field(&namespace, &role_object, "{.spec.holderIdentity}"),
        "node-b"
    );
    let secs: u64 = field(&namespace, &role_object, "{.spec.leaseDurationSeconds}")
        .parse()
        .unwrap();
    assert!(
        (1..=4).contains(&secs),
        "the handed term lasts what was left of the candidacy: {secs}"
    );
    let used = field(
        &namespace,
        &role_object,
        "{.metadata.annotations.tenure\\.dev/used-candidacies}",
    );
    assert!(used.starts_with(&format!("{b_object}=")), "{used}");
    assert!(
        !store.withdraw(ROLE, "node-b").await.unwrap(),
        "a spent place is not queued"
    );
    assert_eq!(field(&namespace, &b_object, "{.spec.holderIdentity}"), "");

    let b = store.acquire_or_queue(ROLE, "node-b", TTL).await;
    assert!(b.acquired, "node-b renews the term it was handed: {b:?}");
    queued(&store, "node-c", TTL).await;
    assert!(store.release_term(ROLE, "node-b", b.fencing_token).await);
    let c = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(c.live_holder(), Some("node-c"));
    queued(&store, "node-b", TTL).await;
    assert_ne!(
        field(&namespace, &b_object, "{.spec.acquireTime}"),
        joined,
        "queued again: a new place"
    );
    assert!(store.release_term(ROLE, "node-c", c.fencing_token).await);
    let again = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(again.live_holder(), Some("node-b"), "its new place's turn");
    assert!(again.fencing_token > c.fencing_token);
}

/// A candidate that died in the queue is cleared by the next release that sees it
/// lapsed, so a process that starts later, which would count it live for one more TTL,
/// never hands the role to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_candidacy_is_cleared_for_readers_that_start_later() {
    let namespace = common::new_namespace("lapsed");
    let holder = KubeLeaseStore::new(common::tenant(&namespace).await);
    let a = holder.acquire_or_queue(ROLE, "node-a", TTL).await;
    {
        let dying = KubeLeaseStore::new(common::tenant(&namespace).await);
        queued(&dying, "node-x", Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(holder.release_term(ROLE, "node-a", a.fencing_token).await);
    assert_eq!(holder.get(ROLE).await.unwrap().unwrap().live_holder(), None);
    let x_object = candidacy_name(ROLE, "node-x");
    assert_eq!(field(&namespace, &x_object, "{.spec.holderIdentity}"), "");

    let late = KubeLeaseStore::new(common::tenant(&namespace).await);
    let d = late.acquire_or_queue(ROLE, "node-d", TTL).await;
    assert!(d.acquired);
    assert!(late.release_term(ROLE, "node-d", d.fencing_token).await);
    assert_eq!(
        late.get(ROLE).await.unwrap().unwrap().live_holder(),
        None,
        "the cleared candidacy is never handed the role"
    );
}

/// Electors on separate connections lead in the order they queued: when the leader
/// stops, its release hands the role to the contender that queued first, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electors_lead_in_the_order_they_queued() {
    let namespace = common::new_namespace("electors");
    let terms: Arc<Mutex<Vec<(String, u64, Instant)>>> = Arc::default();
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for owner in ["first", "second", "third"] {
        let stop = CancellationToken::new();
        let elector = common::elector(&namespace, owner, TTL).await;
        let (terms, shutdown) = (Arc::clone(&terms), stop.clone());
        tasks.push(tokio::spawn(async move {
            elector
                .run(
                    ROLE,
                    move |token, leadership| {
                        let terms = Arc::clone(&terms);
                        async move {
                            terms
                                .lock()
                                .push((owner.to_owned(), token.get(), Instant::now()));
                            leadership.cancelled().await;
                            Ok::<(), tenure::Error>(())
                        }
                    },
                    shutdown,
                )
                .await
        }));
        stops.push(stop);
        // Each is queued (or leads) before the next starts.
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    for stop in &stops[..2] {
        let before = terms.lock().len();
        let stopped = Instant::now();
        stop.cancel();
        let deadline = stopped + TTL;
        while terms.lock().len() == before {
            assert!(
                Instant::now() < deadline,
                "no successor: {:?}",
                terms.lock()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (_, _, began) = terms.lock()[before].clone();
        eprintln!("successor began {:?} after the stop", began - stopped);
    }
    stops[2].cancel();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let terms = terms.lock().clone();
    let owners: Vec<&str> = terms.iter().map(|(owner, ..)| owner.as_str()).collect();
    assert_eq!(owners, ["first", "second", "third"], "{terms:?}");
    assert!(
        terms.windows(2).all(|pair| pair[1].1 == pair[0].1 + 1),
        "each handover is the next token: {terms:?}"
    );
}
