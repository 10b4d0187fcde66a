//! The queue of candidates on etcd beyond the shared scenarios: what a handover costs
//! etcd however many candidates wait (counted by a private member's own gRPC counters),
//! and a handover whose releaser stopped between its two transactions (finished by a
//! plain contender, or by the queued elector it was for).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tenure::{ElectionState, FencingToken, LeaseResult, LeaseStore, TermChange};
use tenure_etcd::requests::{Keys, TermRecord};
use tenure_etcd::EtcdLeaseStore;
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::{in_time, MustAnswer};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

const ROLE: &str = "queued";
const TTL: Duration = Duration::from_secs(10);

async fn store_on(endpoint: &str, prefix: &str) -> Arc<EtcdLeaseStore> {
    store_for(endpoint, prefix, false).await
}

/// A store as `connect` makes it for an etcd whose keep-alive answers truly (`safe`: a
/// successor answers its first call from its candidacy's lease) or for one whose
/// version it cannot trust (its first call renews, keep-alive first).
async fn store_for(endpoint: &str, prefix: &str, safe: bool) -> Arc<EtcdLeaseStore> {
    let client = common::client(&[endpoint.to_owned()]).await;
    Arc::new(common::store_for(client, prefix, safe))
}

/// Starts a test on the shared etcd under a fresh prefix tagged `tag`: the server's
/// endpoint, the prefix, its keys and a raw client.
async fn on_shared_etcd(tag: &str) -> (String, String, Keys, etcd_client::Client) {
    common::init_tracing();
    let endpoint = EtcdServer::shared().expect("shared etcd server").endpoint();
    let prefix = common::unique_prefix(tag);
    let keys = Keys::new(&prefix).unwrap();
    let raw = common::client(std::slice::from_ref(&endpoint)).await;
    (endpoint, prefix, keys, raw)
}

/// node-a asks `store` for the role for `ttl` (queueing if it is held).
async fn node_a_asks(store: &EtcdLeaseStore, ttl: Duration) -> LeaseResult {
    store.acquire_or_queue(ROLE, "node-a", ttl).await
}

/// The first of the two transactions of node-a's release of its term `a` (the store's
/// own, `tenure_etcd::requests::release_txn`), for a test to send raw, as if node-a
/// stopped before the one that begins the next term; `ttl_secs` is the term's TTL.
fn node_a_release_txn(keys: &Keys, a: &LeaseResult, ttl_secs: i64) -> etcd_client::Txn {
    let record = TermRecord {
        owner: "node-a".into(),
        token: Some(a.fencing_token.get()),
        expires_at_ns: tenure_etcd::requests::to_ns(std::time::SystemTime::now()),
        ttl_secs,
        lease_secs: ttl_secs,
        released: true,
    };
    let token = i64::try_from(a.fencing_token.get()).unwrap();
    tenure_etcd::requests::release_txn(keys, ROLE, "node-a", token, &record).unwrap()
}

/// Waits (10 s at most) until an elector's watch shows it following a holder; `what`
/// says what failed otherwise.
async fn follows(state: &mut tokio::sync::watch::Receiver<ElectionState>, what: &str) {
    let following = |s: &ElectionState| matches!(s, ElectionState::Follower { holder: Some(_) });
    in_time(Duration::from_secs(10), state.wait_for(following), what).await;
}

/// A candidate as the elector waits: on `wait_for_successor`, keeping its place when the
/// role goes to another, renewing once it is handed the role; reports its token.
fn wait_turn(
    store: Arc<EtcdLeaseStore>,
    owner: String,
    mut observed: FencingToken,
    began: mpsc::UnboundedSender<(String, FencingToken)>,
) {
    tokio::spawn(async move {
        loop {
            let deadline = Instant::now() + Duration::from_secs(60);
            match store.wait_for_successor(ROLE, observed, deadline).await {
                TermChange::Began {
                    holder,
                    fencing_token,
                    ..
                } if holder != owner => observed = fencing_token,
                TermChange::Began { fencing_token, .. } => {
                    let renewed = store.acquire_or_queue(ROLE, &owner, TTL).await;
                    assert!(renewed.acquired && renewed.fencing_token == fencing_token);
                    let _ = began.send((owner, fencing_token));
                    return;
                }
                other => panic!("{owner} was told {other:?}"),
            }
        }
    });
}

/// Setup: a private etcd member (so its counters count only this test), a holder and 16
/// candidates, each its own store and client as separate processes would be, waiting as
/// the elector does. A release hands the role to the oldest candidate, and that
/// candidate's first call after is its next; the other 15 learn it from their watch and
/// wait again. Counted at the member, a handover is the release and begin transactions
/// and the revoke of the old term's etcd lease, with no read and no new watch, the
/// second time too, with one candidate fewer. The successor's first call adds nothing
/// when the store trusts etcd's keep-alive (it answers from the candidacy's lease) and a
/// renewal (1 Txn, 1 LeaseKeepAlive) when it does not. A candidate's refresh is 1 Txn
/// and 1 LeaseKeepAlive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_costs_the_same_however_many_wait() {
    common::init_tracing();
    for safe in [true, false] {
        handovers_cost_the_same(safe).await;
    }
}

async fn handovers_cost_the_same(safe: bool) {
    let server = EtcdServer::start().expect("private etcd");
    let endpoint = server.endpoint();
    let prefix = common::unique_prefix("queue-cost");
    let holder = store_for(&endpoint, &prefix, safe).await;
    let a = holder.acquire_or_queue(ROLE, "node-a", TTL).await;
    assert!(a.acquired);
    let (began, mut begun) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    for i in 0..16 {
        let owner = format!("node-{i:02}");
        let store = store_for(&endpoint, &prefix, safe).await;
        let queued = store.acquire_or_queue(ROLE, &owner, TTL).await;
        assert!(!queued.acquired && queued.holder == "node-a");
        wait_turn(store.clone(), owner.clone(), a.fencing_token, began.clone());
        candidates.push((owner, store));
    }
    // Every waiter has read the role and started its watch.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let handover: &[(&str, u64)] = if safe {
        &[("LeaseRevoke", 1), ("Txn", 2)]
    } else {
        &[("LeaseKeepAlive", 1), ("LeaseRevoke", 1), ("Txn", 3)]
    };
    let mut releaser = (holder, "node-a".to_owned(), a.fencing_token);
    for expected in ["node-00", "node-01"] {
        let before = common::calls(&server.host_port()).await;
        let (store, owner, token) = &releaser;
        assert!(store.release(ROLE, owner, *token).await.unwrap());
        let (next, next_token) = timeout(Duration::from_secs(10), begun.recv())
            .await
            .expect("the successor learned of its term")
            .unwrap();
        assert_eq!(next, expected, "the oldest candidate");
        assert!(next_token > *token);
        // Let the others see the new term and wait again.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cost = common::calls_since(&before, &common::calls(&server.host_port()).await);
        let expected_cost: BTreeMap<String, u64> = handover
            .iter()
            .map(|(method, n)| ((*method).to_owned(), *n))
            .collect();
        assert_eq!(
            cost, expected_cost,
            "one handover with 16 waiting (safe: {safe})"
        );
        let store = candidates
            .iter()
            .find(|(o, _)| *o == next)
            .map(|(_, s)| s.clone())
            .unwrap();
        releaser = (store, next, next_token);
    }

    // A candidate refreshing its place: one transaction beside one keep-alive.
    let (owner, store) = &candidates[5];
    let before = common::calls(&server.host_port()).await;
    let refreshed = store.acquire_or_queue(ROLE, owner, TTL).await;
    assert!(!refreshed.acquired && refreshed.holder == "node-01");
    let cost = common::calls_since(&before, &common::calls(&server.host_port()).await);
    let expected_cost: BTreeMap<String, u64> = [("LeaseKeepAlive", 1), ("Txn", 1)]
        .into_iter()
        .map(|(method, n)| (method.to_owned(), n))
        .collect();
    assert_eq!(cost, expected_cost, "a refresh");
}

/// Setup: the shared etcd; a holder, two candidates, and a release sent as its raw
/// transaction (the store's own, `tenure_etcd::requests::release_txn`), as if the
/// releaser stopped before the transaction that begins the candidate's term. The role
/// then has no live term but stays reserved: a plain contender does not take it but
/// begins the oldest candidate's term and is refused naming it, and a waiter that
/// watched the release is told of that term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_finishes_a_handover_its_releaser_left() {
    let (endpoint, prefix, keys, mut raw) = on_shared_etcd("queue-left").await;
    let store = store_on(&endpoint, &prefix).await;
    let a = node_a_asks(&store, TTL).await;
    for owner in ["node-b", "node-c"] {
        let queued = store
            .try_acquire_or_queue(ROLE, owner, TTL, Some("b:1"))
            .await
            .unwrap();
        assert!(!queued.acquired);
    }
    let watcher = store_on(&endpoint, &prefix).await;
    let waiting = {
        let watcher = watcher.clone();
        tokio::spawn(async move {
            watcher
                .wait_for_successor(
                    ROLE,
                    a.fencing_token,
                    Instant::now() + Duration::from_secs(20),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let txn = node_a_release_txn(&keys, &a, 10);
    assert!(raw.txn(txn).await.unwrap().succeeded());
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.live_holder(), None, "between the two steps: {info:?}");
    assert!(
        raw.get(keys.handoff(ROLE), None).await.unwrap().count() == 1,
        "the role is reserved"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "a reserved role is no ended term");

    let plain = store_on(&endpoint, &prefix).await;
    let p = plain
        .try_acquire_or_renew(ROLE, "node-p", TTL)
        .await
        .unwrap();
    assert!(
        !p.acquired,
        "the reservation keeps plain contenders out: {p:?}"
    );
    assert_eq!(
        p.holder, "node-b",
        "and the contender began the oldest's term"
    );
    assert!(p.fencing_token > a.fencing_token);
    assert_eq!(
        waiting.await.unwrap(),
        TermChange::Began {
            holder: "node-b".into(),
            fencing_token: p.fencing_token,
            session: None,
        }
    );
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.value.as_deref(), Some("b:1"));
    assert_eq!(raw.get(keys.handoff(ROLE), None).await.unwrap().count(), 0);
    // node-b's own store renews the term it was handed, under the same token.
    let b = store
        .try_acquire_or_queue(ROLE, "node-b", TTL, Some("b:1"))
        .await
        .unwrap();
    assert!(b.acquired && b.fencing_token == p.fencing_token, "{b:?}");
}

/// Setup: the shared etcd, four electors on stores of their own joining one after
/// another (each a follower that has seen the leader before the next starts), and a
/// retry interval of a minute. Each leader in turn stops its work (so its elector
/// releases): the role goes to the follower that joined first of those left, pushed,
/// within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electors_lead_in_the_order_they_queued() {
    use tenure::{LeaseLeaderElector, LeaseLeaderOptions};
    use tokio_util::sync::CancellationToken;

    common::init_tracing();
    let endpoint = EtcdServer::shared().expect("shared etcd server").endpoint();
    let prefix = common::unique_prefix("queue-electors");
    let (started_tx, mut started) = mpsc::unbounded_channel::<(String, Instant)>();
    let mut stops = Vec::new();
    let mut handles = Vec::new();
    let owners = ["first", "second", "third", "fourth"];
    for (i, owner) in owners.into_iter().enumerate() {
        let options = LeaseLeaderOptions {
            owner_id: owner.to_owned(),
            lease_ttl: Duration::from_secs(10),
            renew_interval: Duration::from_secs(3),
            retry_interval: Duration::from_secs(60),
            ..Default::default()
        };
        let elector = LeaseLeaderElector::new(store_on(&endpoint, &prefix).await, options).unwrap();
        let mut state = elector.watch();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let started_tx = started_tx.clone();
        handles.push(tokio::spawn(async move {
            elector
                .run(
                    ROLE,
                    move |_token, leadership| {
                        let started_tx = started_tx.clone();
                        let mut stop_rx = stop_rx.clone();
                        async move {
                            let _ = started_tx.send((owner.to_owned(), Instant::now()));
                            tokio::select! {
                                _ = stop_rx.wait_for(|stop| *stop) => {}
                                _ = leadership.cancelled() => {}
                            }
                        }
                    },
                    CancellationToken::new(),
                )
                .await
        }));
        stops.push(stop_tx);
        if i == 0 {
            let (who, _) = timeout(Duration::from_secs(10), started.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(who, "first");
        } else {
            follows(&mut state, "the follower saw the leader (and so queued)").await;
        }
    }
    // Let the last follower's watch start.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for turn in 0..3 {
        let stopped = Instant::now();
        stops[turn].send(true).unwrap();
        let (who, at) = timeout(Duration::from_secs(10), started.recv())
            .await
            .expect("a handover within 10 s (the retry interval is a minute)")
            .unwrap();
        assert_eq!(who, owners[turn + 1], "queue order");
        let took = at.duration_since(stopped);
        assert!(
            took < Duration::from_secs(1),
            "handover {turn} took {took:?}"
        );
        in_time(
            Duration::from_secs(10),
            &mut handles[turn],
            "the elector that stopped returns",
        )
        .await
        .unwrap();
    }
    stops[3].send(true).unwrap();
    timeout(Duration::from_secs(10), &mut handles[3])
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Setup: the shared etcd; a holder and candidates b then c on one store. b's candidacy
/// ends under it (its etcd lease revoked, as an operator or etcd's expiry would): its
/// next refresh, on the lease this store remembered, fails and joins again, at the back.
/// A refresh of a live candidacy keeps its place (c stays ahead of d), and the queue's
/// key is the one `Keys::candidate` names, on an etcd lease of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidacy_that_ended_joins_again_at_the_back() {
    let (endpoint, prefix, keys, mut raw) = on_shared_etcd("queue-rejoin").await;
    let store = store_on(&endpoint, &prefix).await;
    let a = node_a_asks(&store, TTL).await;
    for owner in ["node-b", "node-c", "node-d"] {
        let queued = store.acquire_or_queue(ROLE, owner, TTL).await;
        assert!(!queued.acquired);
    }
    let b_key = raw.get(keys.candidate(ROLE, "node-b"), None).await.unwrap();
    let b_lease = b_key.kvs().first().expect("node-b's candidate key").lease();
    assert_ne!(b_lease, 0, "a candidate key is on an etcd lease");
    raw.lease_revoke(b_lease).await.unwrap();
    for owner in ["node-b", "node-c"] {
        let refreshed = store.acquire_or_queue(ROLE, owner, TTL).await;
        assert!(!refreshed.acquired && refreshed.holder == "node-a");
    }
    let mut token = a.fencing_token;
    let mut holder = "node-a".to_owned();
    for next in ["node-c", "node-d", "node-b"] {
        assert!(store.release(ROLE, &holder, token).await.unwrap());
        let info = store.get(ROLE).await.unwrap().unwrap();
        assert_eq!(info.live_holder(), Some(next), "{info:?}");
        assert!(info.fencing_token > token);
        (holder, token) = (next.to_owned(), info.fencing_token);
    }
}

/// Setup: the shared etcd; node-a holds for a minute, and an elector (node-b, retry
/// interval 2 s) waits in the queue as a follower. node-a's release is sent as its raw
/// first transaction only, as if node-a stopped before the one that begins node-b's
/// term: the role is reserved, no push says a term ended, and nobody else contends.
/// node-b's elector, on its retry timer, finishes the handover itself and leads, under
/// a token above node-a's, within two retry intervals: a stopped releaser never leaves
/// the role stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_elector_finishes_a_handover_its_releaser_left() {
    use tenure::{LeaseLeaderElector, LeaseLeaderOptions};
    use tokio_util::sync::CancellationToken;

    let (endpoint, prefix, keys, mut raw) = on_shared_etcd("queue-left-elector").await;
    let holder = store_on(&endpoint, &prefix).await;
    let a = node_a_asks(&holder, Duration::from_secs(60)).await;
    assert!(a.acquired);

    let retry = Duration::from_secs(2);
    let options = LeaseLeaderOptions {
        owner_id: "node-b".to_owned(),
        lease_ttl: TTL,
        renew_interval: Duration::from_secs(3),
        retry_interval: retry,
        ..Default::default()
    };
    let elector = LeaseLeaderElector::new(store_on(&endpoint, &prefix).await, options).unwrap();
    let mut state = elector.watch();
    let (led_tx, mut led) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            elector
                .run(
                    ROLE,
                    move |token, leadership: CancellationToken| {
                        let _ = led_tx.send((token, Instant::now()));
                        async move { leadership.cancelled().await }
                    },
                    shutdown,
                )
                .await
        }
    });
    follows(&mut state, "node-b follows node-a (and so is queued)").await;
    assert_eq!(holder.candidates(ROLE).await.unwrap(), ["node-b"]);

    let txn = node_a_release_txn(&keys, &a, 60);
    let stopped = Instant::now();
    assert!(raw.txn(txn).await.unwrap().succeeded());
    assert_eq!(
        raw.get(keys.handoff(ROLE), None).await.unwrap().count(),
        1,
        "the role is reserved for node-b"
    );

    let (b_token, at) = timeout(retry * 2 + Duration::from_secs(3), led.recv())
        .await
        .expect("node-b leads within two retry intervals")
        .unwrap();
    assert!(b_token > a.fencing_token);
    assert!(at.duration_since(stopped) <= retry * 2 + Duration::from_secs(1));
    let info = holder.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-b"));
    assert_eq!(info.fencing_token, b_token);
    assert_eq!(raw.get(keys.handoff(ROLE), None).await.unwrap().count(), 0);
    shutdown.cancel();
    in_time(Duration::from_secs(10), running, "the elector stops")
        .await
        .unwrap();
}
