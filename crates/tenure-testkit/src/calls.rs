//! Store calls that must answer, for tests: a store error fails the test and names the
//! call, so a scenario reads as the rule it checks rather than as error handling.

use std::future::Future;
use std::time::Duration;

use tenure::{FencingToken, LeaseResult, LeaseStore};

/// Calls of [`LeaseStore`] whose errors fail the test (granted or not is the answer).
pub trait MustAnswer {
    /// `try_acquire_or_renew(role, owner, ttl)`: acquired, renewed, or refused.
    fn try_acquire(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = LeaseResult> + Send;

    /// `release(role, owner, token)`: whether that term was the live one and is over.
    fn release_term(
        &self,
        role: &str,
        owner: &str,
        token: FencingToken,
    ) -> impl Future<Output = bool> + Send;
}

impl<S: LeaseStore + ?Sized> MustAnswer for S {
    async fn try_acquire(&self, role: &str, owner: &str, ttl: Duration) -> LeaseResult {
        self.try_acquire_or_renew(role, owner, ttl)
            .await
            .unwrap_or_else(|error| panic!("try_acquire_or_renew({role:?}, {owner:?}): {error}"))
    }

    async fn release_term(&self, role: &str, owner: &str, token: FencingToken) -> bool {
        self.release(role, owner, token)
            .await
            .unwrap_or_else(|error| panic!("release({role:?}, {owner:?}, {token}): {error}"))
    }
}
