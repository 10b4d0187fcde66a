//! Bad input: every call the store rules name refuses it with `InvalidArgument` naming the
//! field, and creates nothing.

use std::time::Duration;

use tenure::Error;

use super::listing::all_roles;
use super::token;
use crate::fixture::begin;
use crate::LeaseBackend;
use crate::MustAnswer;

/// Panics unless `result` is `InvalidArgument` naming `field`.
pub(crate) fn assert_invalid<T: std::fmt::Debug>(result: tenure::Result<T>, field: &str) {
    match result {
        Err(Error::InvalidArgument { field: f, .. }) if f == field => {}
        other => panic!("expected InvalidArgument for {field}, got {other:?}"),
    }
}

/// Every bad input the lease store rules name is `InvalidArgument` naming the field.
pub async fn scenario_bad_input(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    let long = "x".repeat(256);
    assert_invalid(store.try_acquire_or_renew("", "a", ttl).await, "role");
    assert_invalid(store.try_acquire_or_renew("r", "", ttl).await, "owner");
    assert_invalid(store.try_acquire_or_renew("r\0x", "a", ttl).await, "role");
    assert_invalid(store.try_acquire_or_renew("r", "a\0", ttl).await, "owner");
    assert_invalid(store.try_acquire_or_renew(&long, "a", ttl).await, "role");
    assert_invalid(store.try_acquire_or_renew("r", &long, ttl).await, "owner");
    assert_invalid(
        store.try_acquire_or_renew("r", "a", Duration::ZERO).await,
        "ttl",
    );
    assert_invalid(
        store.try_acquire_or_renew("r", "a", Duration::MAX).await,
        "ttl",
    );
    let min = store.min_ttl();
    if min > Duration::from_millis(1) {
        assert_invalid(
            store
                .try_acquire_or_renew("r", "a", min - Duration::from_millis(1))
                .await,
            "ttl",
        );
    }
    assert_invalid(store.release("", "a", token(1)).await, "role");
    assert_invalid(store.release("r", "", token(1)).await, "owner");
    assert_invalid(store.get("").await, "role");
    // 255 bytes is the limit, and allowed.
    let max = "y".repeat(255);
    let ok = store.try_acquire(&max, &max, ttl).await;
    assert!(ok.acquired);
    // Nothing was created by the rejected calls.
    let roles = all_roles(&*store).await;
    assert_eq!(roles, [max]);
}
