//! Store calls that must answer, for tests: a store error fails the test and names the
//! call, so a scenario reads as the rule it checks rather than as error handling.

use std::future::Future;
use std::time::Duration;

use tenure::lease::{ChangesRead, PrefixChanges};
use tenure::{FencingToken, LeaseResult, LeaseStore, SessionGrant, SessionId};

/// Calls of [`LeaseStore`] whose errors fail the test (granted or not is the answer).
pub trait MustAnswer {
    /// `try_acquire_or_renew(role, owner, ttl)`: acquired, renewed, or refused.
    fn try_acquire(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = LeaseResult> + Send;

    /// `try_acquire_or_renew_with_value(role, owner, ttl, value)`: the same, advertising
    /// `value` with the term.
    fn try_acquire_with_value(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        value: Option<&str>,
    ) -> impl Future<Output = LeaseResult> + Send;

    /// `keep_alive_session(session, ttl)`: the session's new grant, or `None` once it is
    /// over.
    fn keep_alive(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> impl Future<Output = Option<SessionGrant>> + Send;

    /// `release(role, owner, token)`: whether that term was the live one and is over.
    fn release_term(
        &self,
        role: &str,
        owner: &str,
        token: FencingToken,
    ) -> impl Future<Output = bool> + Send;

    /// `try_acquire_or_queue(role, owner, ttl, None)`: acquired, renewed, or queued,
    /// advertising no value.
    fn acquire_or_queue(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = LeaseResult> + Send;

    /// `list_prefix_changes(read)`: what changed under the prefix (all of it without a
    /// mark).
    fn changes(&self, read: ChangesRead<'_>) -> impl Future<Output = PrefixChanges> + Send;
}

impl<S: LeaseStore + ?Sized> MustAnswer for S {
    async fn try_acquire(&self, role: &str, owner: &str, ttl: Duration) -> LeaseResult {
        self.try_acquire_or_renew(role, owner, ttl)
            .await
            .unwrap_or_else(|error| panic!("try_acquire_or_renew({role:?}, {owner:?}): {error}"))
    }

    async fn try_acquire_with_value(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        value: Option<&str>,
    ) -> LeaseResult {
        self.try_acquire_or_renew_with_value(role, owner, ttl, value)
            .await
            .unwrap_or_else(|error| {
                panic!("try_acquire_or_renew_with_value({role:?}, {owner:?}): {error}")
            })
    }

    async fn keep_alive(&self, session: SessionId, ttl: Duration) -> Option<SessionGrant> {
        self.keep_alive_session(session, ttl)
            .await
            .unwrap_or_else(|error| panic!("keep_alive_session({session:?}): {error}"))
    }

    async fn release_term(&self, role: &str, owner: &str, token: FencingToken) -> bool {
        self.release(role, owner, token)
            .await
            .unwrap_or_else(|error| panic!("release({role:?}, {owner:?}, {token}): {error}"))
    }

    async fn acquire_or_queue(&self, role: &str, owner: &str, ttl: Duration) -> LeaseResult {
        self.try_acquire_or_queue(role, owner, ttl, None)
            .await
            .unwrap_or_else(|error| panic!("try_acquire_or_queue({role:?}, {owner:?}): {error}"))
    }

    async fn changes(&self, read: ChangesRead<'_>) -> PrefixChanges {
        self.list_prefix_changes(read)
            .await
            .unwrap_or_else(|error| panic!("list_prefix_changes({read:?}): {error}"))
    }
}

/// Checks that `answer` is a refusal telling that `holder` holds the role; the failure
/// names `why` and shows the answer.
#[track_caller]
pub fn assert_refused(answer: &LeaseResult, holder: &str, why: &str) {
    assert!(!answer.acquired, "{why}: {answer:?}");
    assert_eq!(answer.holder, holder);
}
