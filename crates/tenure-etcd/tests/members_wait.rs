//! Waits for a change of the members share one watch per registry: a shard member waits
//! again about once a TTL while nothing changes, and each wait must not open a stream
//! of its own.

mod common;

use std::time::Duration;

use tenure::NodeRegistry;
use tenure_etcd::EtcdNodeRegistry;
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::in_time;
use tenure_testkit::registry::waited_for_change;

const TTL: Duration = Duration::from_secs(30);

/// Setup: a private etcd (its counters see only this test), a registry with one member,
/// and another registry (another process) that joins a second member later.
/// Five waits in a row while nothing changes each last to their deadline and, together,
/// open one watch stream and read the members at most once (the first wait, as the
/// watch opened after the caller's read); a join during the sixth ends it at once,
/// with no new stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_share_one_watch() {
    let (server, registry, other) = setup("members-wait-shared").await;
    registry.heartbeat("n1").await.unwrap();
    let observed = registry.live_nodes().await.unwrap();

    let before = common::calls(&server.host_port()).await;
    for wait in 0..5 {
        let waited = waited_for_change(&registry, &observed, Duration::from_millis(300)).await;
        assert!(
            waited >= Duration::from_millis(300),
            "wait {wait} ended after {waited:?} with nothing changed"
        );
    }
    let cost = common::calls_since(&before, &common::calls(&server.host_port()).await);
    assert_eq!(
        cost.get("Watch"),
        Some(&1),
        "one stream for five waits: {cost:?}"
    );
    assert!(
        cost.get("Txn").copied().unwrap_or(0) <= 1,
        "at most one read of the members: {cost:?}"
    );

    let before = common::calls(&server.host_port()).await;
    join_wakes_a_wait(&registry, &observed, &other).await;
    let cost = common::calls_since(&before, &common::calls(&server.host_port()).await);
    assert_eq!(cost.get("Watch"), None, "no new stream: {cost:?}");
    assert_eq!(registry.live_nodes().await.unwrap(), ["n1", "n2"]);
}

/// Setup: a private etcd, a registry whose waits have opened the shared watch, and a
/// second registry. While the server is down a wait lasts to its deadline (the broken
/// watch makes no wait return early, and none spins); once the server is back, a wait
/// opens a new watch, and a join during it ends it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_recover_after_the_server_restarts() {
    let (server, registry, other) = setup("members-wait-restart").await;
    let registry = registry
        .with_request_timeout(Duration::from_secs(1))
        .unwrap();
    registry.heartbeat("n1").await.unwrap();
    let observed = registry.live_nodes().await.unwrap();
    waited_for_change(&registry, &observed, Duration::from_millis(300)).await;

    server.kill();
    for wait in 0..2 {
        let waited = waited_for_change(&registry, &observed, Duration::from_secs(1)).await;
        assert!(
            waited >= Duration::from_secs(1),
            "wait {wait} with the server down ended after {waited:?}"
        );
    }

    server.restart().expect("etcd restarts");
    let healthy = tokio::time::Instant::now() + Duration::from_secs(30);
    let observed = loop {
        match registry.live_nodes().await {
            Ok(live) => break live,
            Err(error) => {
                assert!(
                    tokio::time::Instant::now() < healthy,
                    "etcd is back: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(observed, ["n1"]);
    // A wait that began while the broken watch was still in its slot sleeps to its
    // deadline; within two such waits a new watch is open.
    for _ in 0..2 {
        waited_for_change(&registry, &observed, Duration::from_secs(1)).await;
    }
    join_wakes_a_wait(&registry, &observed, &other).await;
}

/// A private etcd (its counters see only this test), a registry on it under a fresh
/// prefix, and another registry there (another process).
async fn setup(tag: &str) -> (EtcdServer, EtcdNodeRegistry, EtcdNodeRegistry) {
    let server = EtcdServer::start().expect("private etcd");
    let prefix = common::unique_prefix(tag);
    let registry = || async {
        let client = common::client(&[server.endpoint()]).await;
        EtcdNodeRegistry::new(client, &prefix, TTL).unwrap()
    };
    let (registry, other) = (registry().await, registry().await);
    (server, registry, other)
}

/// A wait of `registry` on `observed` that `other` ends by joining `n2` while it waits
/// ends at once, not at its deadline.
async fn join_wakes_a_wait(
    registry: &EtcdNodeRegistry,
    observed: &[String],
    other: &EtcdNodeRegistry,
) {
    let waiter = {
        let registry = registry.clone();
        let observed = observed.to_vec();
        tokio::spawn(async move { waited_for_change(&registry, &observed, TTL).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    other.heartbeat("n2").await.unwrap();
    let waited = in_time(Duration::from_secs(10), waiter, "a join wakes the wait").await;
    assert!(
        waited < Duration::from_secs(5),
        "woke {waited:?} after the join"
    );
}
