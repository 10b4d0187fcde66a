//! Membership: heartbeats, liveness and its boundary, leaving, metadata, waiting for a
//! change, and bad input.

use std::sync::Arc;
use std::time::Duration;

use tenure::Metadata;

use super::assert_invalid;
use crate::RegistryBackend;

/// A waiter on the membership returns at once when what it observed is already stale,
/// and is woken by a join and by a leave made through another instance, well before its
/// deadline (a push, not a poll of the deadline).
pub async fn scenario_members_change_wakes_waiters(backend: &dyn RegistryBackend) {
    let fx = backend.create(Duration::from_secs(60)).await;
    let registry = fx.registry();
    registry.heartbeat("node-a").await.unwrap();
    let start = tokio::time::Instant::now();
    registry
        .wait_for_members_change(&[], start + Duration::from_secs(60))
        .await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "a stale view must not be waited on"
    );

    let other = fx.reopen().await;
    for (change, expected) in [
        ("join node-b", ["node-a", "node-b"].as_slice()),
        ("leave node-a", &["node-b"]),
    ] {
        let observed = registry.live_nodes().await.unwrap();
        let waiter = {
            let registry = Arc::clone(&registry);
            tokio::spawn(async move {
                let start = tokio::time::Instant::now();
                registry
                    .wait_for_members_change(&observed, start + Duration::from_secs(60))
                    .await;
                start.elapsed()
            })
        };
        // Let the waiter subscribe; then change the membership through another instance.
        tokio::time::sleep(Duration::from_millis(200)).await;
        if change.starts_with("join") {
            other.heartbeat("node-b").await.unwrap();
        } else {
            assert!(other.leave("node-a").await.unwrap());
        }
        let waited = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("a waiter must wake on {change}"))
            .unwrap();
        assert!(
            waited < Duration::from_secs(5),
            "woke {waited:?} after {change}, expected a push"
        );
        assert_eq!(
            registry.live_nodes().await.unwrap(),
            expected,
            "after {change}"
        );
    }
}

/// The liveness TTL the registry scenarios use (etcd's minimum).
pub const REGISTRY_TTL: Duration = Duration::from_secs(1);

/// A heartbeat makes a node live; it lapses after the TTL; a refresh keeps it.
pub async fn scenario_heartbeat_liveness(backend: &dyn RegistryBackend) {
    let fx = backend.create(REGISTRY_TTL).await;
    let registry = fx.registry();
    assert!(registry.live_nodes().await.unwrap().is_empty());
    registry.heartbeat("node-a").await.unwrap();
    registry.heartbeat("node-b").await.unwrap();
    assert_eq!(registry.live_nodes().await.unwrap(), ["node-a", "node-b"]);
    fx.pass_time(REGISTRY_TTL * 6 / 10).await;
    registry.heartbeat("node-a").await.unwrap();
    fx.pass_time(REGISTRY_TTL * 6 / 10).await;
    assert_eq!(
        registry.live_nodes().await.unwrap(),
        ["node-a"],
        "b lapsed, a refreshed"
    );
    fx.pass_time(REGISTRY_TTL).await;
    assert!(
        registry.live_nodes().await.unwrap().is_empty(),
        "everyone lapsed"
    );
}

/// The exact liveness boundary: live before `last + ttl`, gone at it.
pub async fn scenario_heartbeat_boundary(backend: &dyn RegistryBackend) {
    let fx = backend.create(REGISTRY_TTL).await;
    if !fx.exact_clock() {
        return;
    }
    let registry = fx.registry();
    registry.heartbeat("node-a").await.unwrap();
    fx.pass_time(REGISTRY_TTL - Duration::from_nanos(1)).await;
    assert_eq!(registry.live_nodes().await.unwrap(), ["node-a"]);
    fx.pass_time(Duration::from_nanos(1)).await;
    assert!(registry.live_nodes().await.unwrap().is_empty());
}

/// The live set is sorted, whatever the heartbeat order.
pub async fn scenario_live_set_sorted(backend: &dyn RegistryBackend) {
    let fx = backend.create(REGISTRY_TTL).await;
    let registry = fx.registry();
    for id in ["node-c", "node-a", "node-d", "node-b"] {
        registry.heartbeat(id).await.unwrap();
    }
    assert_eq!(
        registry.live_nodes().await.unwrap(),
        ["node-a", "node-b", "node-c", "node-d"]
    );
    let members: Vec<_> = registry
        .members()
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.node_id)
        .collect();
    assert_eq!(members, ["node-a", "node-b", "node-c", "node-d"]);
}

/// `leave` removes a node at once.
pub async fn scenario_leave(backend: &dyn RegistryBackend) {
    let fx = backend.create(REGISTRY_TTL).await;
    let registry = fx.registry();
    registry.heartbeat("node-a").await.unwrap();
    registry.heartbeat("node-b").await.unwrap();
    assert!(registry.leave("node-a").await.unwrap());
    assert_eq!(registry.live_nodes().await.unwrap(), ["node-b"]);
    assert!(
        !registry.leave("node-a").await.unwrap(),
        "second leave is a no-op"
    );
    assert!(!registry.leave("never").await.unwrap());
}

/// Metadata round-trips; `heartbeat` keeps it, `heartbeat_with` replaces it; times are set.
pub async fn scenario_metadata_and_times(backend: &dyn RegistryBackend) {
    let fx = backend.create(REGISTRY_TTL).await;
    let registry = fx.registry();
    let mut meta = Metadata::new();
    meta.insert("addr".into(), "10.0.0.7:8080".into());
    meta.insert("zone".into(), "eu-1 \"quoted\" ünïcode".into());
    registry.heartbeat_with("node-a", &meta).await.unwrap();
    let first = registry.members().await.unwrap().remove(0);
    assert_eq!(first.metadata, meta);
    assert_eq!(first.first_seen, first.last_heartbeat);
    fx.pass_time(REGISTRY_TTL / 4).await;
    registry.heartbeat("node-a").await.unwrap();
    let second = registry.members().await.unwrap().remove(0);
    assert_eq!(second.metadata, meta, "plain heartbeat keeps metadata");
    assert_eq!(second.first_seen, first.first_seen);
    assert!(second.last_heartbeat > first.last_heartbeat);
    assert!(second.now >= second.last_heartbeat);
    let mut replaced = Metadata::new();
    replaced.insert("version".into(), "2".into());
    registry.heartbeat_with("node-a", &replaced).await.unwrap();
    assert_eq!(registry.members().await.unwrap()[0].metadata, replaced);
    // A node that lapsed and comes back starts a new membership.
    fx.pass_time(REGISTRY_TTL + REGISTRY_TTL / 4).await;
    registry.heartbeat("node-a").await.unwrap();
    let back = registry.members().await.unwrap().remove(0);
    assert!(
        back.first_seen > second.first_seen,
        "first_seen restarts after a lapse"
    );
}

/// Bad node ids and oversized metadata are `InvalidArgument`.
pub async fn scenario_registry_bad_input(backend: &dyn RegistryBackend) {
    let fx = backend.create(REGISTRY_TTL).await;
    let registry = fx.registry();
    assert_invalid(registry.heartbeat("").await, "node_id");
    assert_invalid(registry.heartbeat("a\0b").await, "node_id");
    assert_invalid(registry.heartbeat(&"x".repeat(256)).await, "node_id");
    assert_invalid(registry.leave("").await, "node_id");
    let mut big = Metadata::new();
    big.insert(
        "k".into(),
        "v".repeat(tenure::registry::MAX_METADATA_VALUE_LEN + 1),
    );
    assert_invalid(registry.heartbeat_with("node-a", &big).await, "metadata");
    let mut many = Metadata::new();
    for i in 0..=tenure::registry::MAX_METADATA_ENTRIES {
        many.insert(format!("k{i}"), "v".into());
    }
    assert_invalid(registry.heartbeat_with("node-a", &many).await, "metadata");
    assert!(
        registry.live_nodes().await.unwrap().is_empty(),
        "rejected calls create nothing"
    );
}
