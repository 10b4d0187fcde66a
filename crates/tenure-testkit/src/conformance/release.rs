//! Ending a term early: release hands over at once, a stale release changes nothing, a
//! waiter is pushed the release, and the token counter survives release and reopening.

use std::time::Duration;

use super::{spawn_term_waiter, token};
use crate::fixture::begin;
use crate::LeaseBackend;
use crate::{in_time, MustAnswer};

/// Release lets a successor in at once, with a higher token; the counter survives.
pub async fn scenario_release_hands_over(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    assert!(
        store.release_term("alpha", "node-a", a.fencing_token).await,
        "live term releases"
    );
    let info = store
        .get("alpha")
        .await
        .unwrap()
        .expect("released lease is still listed");
    assert_eq!(
        info.live_holder(),
        None,
        "released lease has no live holder: {info:?}"
    );
    assert!(
        info.fencing_token >= a.fencing_token,
        "release keeps the counter"
    );
    let b = store.try_acquire("alpha", "node-b", ttl).await;
    assert!(b.acquired, "successor acquires at once: {b:?}");
    assert!(b.fencing_token > a.fencing_token);
    assert!(store.release_term("alpha", "node-b", b.fencing_token).await);
    let a2 = store.try_acquire("alpha", "node-a", ttl).await;
    assert!(
        a2.acquired && a2.fencing_token > b.fencing_token,
        "counter survives release"
    );
}

/// Releasing anything but the live term is a no-op returning false.
pub async fn scenario_stale_release_is_noop(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    assert!(
        !store.release_term("alpha", "node-a", token(1)).await,
        "unknown role"
    );
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    assert!(
        !store.release_term("alpha", "node-b", a.fencing_token).await,
        "wrong owner"
    );
    assert!(
        !store
            .release_term("alpha", "node-a", a.fencing_token.next())
            .await,
        "wrong token"
    );
    let still = store.try_acquire("alpha", "node-b", ttl).await;
    assert!(!still.acquired, "failed releases must not free the lease");
    fx.pass_time(ttl).await;
    let b = store.try_acquire("alpha", "node-b", ttl).await;
    assert!(b.acquired);
    assert!(
        !store.release_term("alpha", "node-a", a.fencing_token).await,
        "lapsed term"
    );
    let held = store.try_acquire("alpha", "node-c", ttl).await;
    assert!(
        !held.acquired && held.holder == "node-b",
        "stale release must not free b's term"
    );
    assert!(store.release_term("alpha", "node-b", b.fencing_token).await);
    assert!(
        !store.release_term("alpha", "node-b", b.fencing_token).await,
        "double release"
    );
}

/// Tokens survive release and a reopened store: never handed out twice.
pub async fn scenario_token_survives_reopen(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    assert!(store.release_term("alpha", "node-a", a.fencing_token).await);
    let reopened = fx.reopen().await;
    let b = reopened.try_acquire("alpha", "node-b", ttl).await;
    assert!(
        b.acquired && b.fencing_token > a.fencing_token,
        "token after reopen: {b:?}"
    );
    // The new instance reads the term before waiting it out: a contender on a backend
    // that judges expiry by observation (Kubernetes) counts from its first sighting.
    let again = fx.reopen().await;
    again.get("alpha").await.unwrap();
    fx.pass_time(ttl).await;
    let c = again.try_acquire("alpha", "node-c", ttl).await;
    assert!(
        c.acquired && c.fencing_token > b.fencing_token,
        "token after expiry and reopen"
    );
}

/// A waiting contender wakes when the observed term is released, long before its deadline.
pub async fn scenario_wait_wakes_on_release(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    // Already changed: returns at once.
    let start = tokio::time::Instant::now();
    store
        .wait_for_change(
            "alpha",
            a.fencing_token.next(),
            start + Duration::from_secs(60),
        )
        .await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "a term already over must not be waited on"
    );

    let waiter = spawn_term_waiter(&store, "alpha", a.fencing_token);
    // Let the waiter subscribe; then release through another instance.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = fx.reopen().await;
    assert!(other.release_term("alpha", "node-a", a.fencing_token).await);
    let waited = in_time(
        Duration::from_secs(10),
        waiter,
        "waiter must wake on release",
    )
    .await;
    assert!(
        waited < Duration::from_secs(5),
        "woke after {waited:?}, expected a push"
    );
}
