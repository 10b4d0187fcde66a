//! The rules of one term: the first acquire, renewal, refusal while live, takeover after
//! expiry and the exact expiry boundary.

use std::time::Duration;

use super::token;
use crate::fixture::begin;
use crate::LeaseBackend;
use crate::{assert_refused, MustAnswer};

/// The first acquire of a role gets token 1 and the full TTL.
pub async fn scenario_first_acquire_gets_token_one(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    assert!(a.acquired, "first acquire must succeed: {a:?}");
    assert_eq!(a.holder, "node-a");
    assert!(
        a.fencing_token >= token(1),
        "tokens start at 1 or above: {a:?}"
    );
    if fx.exact_clock() {
        assert_eq!(a.fencing_token, token(1), "the first token is 1");
        assert_eq!(a.expires_at, a.now + ttl, "expires_at = now + ttl");
    } else {
        let granted = a.expires_at.duration_since(a.now).unwrap();
        assert!(
            granted <= ttl && granted + Duration::from_millis(100) >= ttl,
            "granted {granted:?} for ttl {ttl:?}"
        );
    }
}

/// Renewing by the holder keeps the token and moves expiry forward.
pub async fn scenario_renew_keeps_token_and_extends(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let first = store.try_acquire("alpha", "node-a", ttl).await;
    fx.pass_time(ttl / 2).await;
    let renewed = store.try_acquire("alpha", "node-a", ttl).await;
    assert!(renewed.acquired, "holder must renew: {renewed:?}");
    assert_eq!(
        renewed.fencing_token, first.fencing_token,
        "renewal keeps the token"
    );
    assert!(
        renewed.expires_at > first.expires_at,
        "renewal extends expiry"
    );
    // Past the first expiry, the renewed term still holds.
    fx.pass_time(ttl / 2 + ttl / 8).await;
    let other = store.try_acquire("alpha", "node-b", ttl).await;
    assert_refused(&other, "node-a", "renewed term must still be live");
}

/// A different owner is refused while the lease is live, and told who holds it.
pub async fn scenario_other_owner_refused_while_live(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    let b = store.try_acquire("alpha", "node-b", ttl).await;
    assert_refused(&b, "node-a", "second owner must be refused");
    assert_eq!(
        b.fencing_token, a.fencing_token,
        "refusal reports the holder's token"
    );
    assert_eq!(
        b.expires_at, a.expires_at,
        "refusal reports the holder's expiry"
    );
    assert!(b.now < b.expires_at && b.remaining() <= ttl);
    let info = store.get("alpha").await.unwrap().expect("lease exists");
    assert_eq!(info.live_holder(), Some("node-a"));
}

/// After the TTL another owner takes over with a strictly higher token.
pub async fn scenario_takeover_after_expiry(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    fx.pass_time(ttl).await;
    let b = store.try_acquire("alpha", "node-b", ttl).await;
    assert!(b.acquired, "expired lease must be taken: {b:?}");
    assert!(
        b.fencing_token > a.fencing_token,
        "takeover raises the token"
    );
    let late = store.try_acquire("alpha", "node-a", ttl).await;
    assert_refused(
        &late,
        "node-b",
        "the lapsed holder cannot come back while b holds",
    );
}

/// Expiry is exact: live strictly before `expires_at`, free at `expires_at`.
pub async fn scenario_expiry_boundary(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    if fx.exact_clock() {
        fx.pass_time(ttl - Duration::from_nanos(1)).await;
        let early = store.try_acquire("alpha", "node-b", ttl).await;
        assert!(
            !early.acquired,
            "one nanosecond before expiry the lease is live"
        );
        fx.pass_time(Duration::from_nanos(1)).await;
    } else {
        fx.pass_time(ttl / 4).await;
        let early = store.try_acquire("alpha", "node-b", ttl).await;
        assert!(!early.acquired, "well before expiry the lease is live");
        assert!(early.now < a.expires_at);
        fx.pass_time(ttl - ttl / 4).await;
    }
    let at = store.try_acquire("alpha", "node-b", ttl).await;
    assert!(at.now >= a.expires_at, "time passed the expiry");
    assert!(at.acquired, "at expires_at the lease is free: {at:?}");
    assert!(at.fencing_token > a.fencing_token);
}

/// The same owner after its own lapse gets a new term and token, never the old one.
pub async fn scenario_own_lapse_gets_new_token(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let first = store.try_acquire("alpha", "node-a", ttl).await;
    fx.pass_time(ttl).await;
    let again = store.try_acquire("alpha", "node-a", ttl).await;
    assert!(again.acquired);
    assert!(
        again.fencing_token > first.fencing_token,
        "a lapsed term is never resumed"
    );
    let info = store.get("alpha").await.unwrap().unwrap();
    assert_eq!(info.fencing_token, again.fencing_token);
}
