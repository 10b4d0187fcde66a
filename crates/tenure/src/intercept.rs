//! Fault injection for lease stores: one intercepting [`LeaseStore`] whose hooks delay,
//! hang, fail or rewrite any call on its way to a store and its answer on the way back.
//!
//! A fault test needs a store that misbehaves in one particular way: a renewal that
//! hangs, a store that grants half the TTL asked for, a process frozen mid-call. Rather
//! than a hand-written store wrapper per fault (each forwarding every trait method), an
//! [`InterceptStore`] wraps any store and passes every call, described as a plain
//! [`Call`], through a stack of [`Interceptor`]s. Each one sees the call and a [`Next`]
//! (the rest of the stack, then the store), so it can
//!
//! - **delay** it: sleep (on tokio time, so paused-clock tests stay deterministic), then
//!   call `next.run(call)`;
//! - **hang** it: wait for a `CancellationToken`, a `Notify` or forever before going on;
//! - **fail** it: answer [`Reply::error`] without calling `next`;
//! - **rewrite** it: change the call's arguments before `next.run`, or the answer after;
//! - anything else a stalled network or process does: run `next` in its own task so the
//!   request reaches the store even when the caller stops waiting, or hold the call
//!   between two polls of the store's future.
//!
//! The first interceptor added is the outermost: it sees the call first and the answer
//! last. Adding a [`LeaseStore`] method means editing this module only: a [`Call`]
//! variant and its [`Reply`] (in `call.rs`), and the one place that forwards calls to
//! the store (here).
//!
//! Node registries have their own, smaller wrapper: [`FilteredRegistry`].
//!
//! # Examples
//!
//! A store that is down while a switch is on:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
//! use tenure::{Error, InMemoryLeaseStore, LeaseStore};
//!
//! /// Fails every call while `down` is set.
//! struct Outage {
//!     down: AtomicBool,
//! }
//!
//! #[async_trait::async_trait]
//! impl Interceptor for Outage {
//!     async fn intercept(&self, call: Call, next: Next) -> Reply {
//!         if self.down.load(Ordering::SeqCst) {
//!             return Reply::error(&call, Error::store_msg("memory", "injected outage"));
//!         }
//!         next.run(call).await
//!     }
//! }
//!
//! let outage = Arc::new(Outage { down: AtomicBool::new(true) });
//! let store = InterceptStore::new(Arc::new(InMemoryLeaseStore::new())).with(outage.clone());
//! let ttl = Duration::from_secs(10);
//! assert!(store.try_acquire_or_renew("reports", "node-a", ttl).await.is_err());
//! outage.down.store(false, Ordering::SeqCst);
//! assert!(store.try_acquire_or_renew("reports", "node-a", ttl).await?.acquired);
//! # Ok::<(), tenure::Error>(())
//! # }).unwrap();
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{
    AcquireRequest, ChangesRead, EndRequest, FencingToken, Handover, LeaseInfo, LeaseResult,
    LeaseStore, PrefixChanges, Result, SessionGrant, SessionId, TermChange,
};

mod call;
mod registry;

pub use call::{Call, Reply};
pub use registry::{FilteredRegistry, RegistryFilter};

/// A hook on every call through an [`InterceptStore`].
#[async_trait]
pub trait Interceptor: Send + Sync + 'static {
    /// Handles `call`: pass it on with `next.run(call)` (changed or not, now or later,
    /// in this task or another), or answer it without the store. `next` runs the
    /// interceptors after this one, then the store.
    async fn intercept(&self, call: Call, next: Next) -> Reply;

    /// The smallest TTL the store honours as seen through this interceptor, given
    /// `below`, the one of the interceptors after it and the store. Unchanged by default.
    fn min_ttl(&self, below: Duration) -> Duration {
        below
    }

    /// The store's [`LeaseStore::acquire_batch_size`] as seen through this interceptor,
    /// given `below`, that of the interceptors after it and the store. Unchanged by
    /// default.
    fn acquire_batch_size(&self, below: usize) -> usize {
        below
    }

    /// The store's [`LeaseStore::change_poll`] as seen through this interceptor, given
    /// `below`, that of the interceptors after it and the store. Unchanged by default.
    fn change_poll(&self, below: Option<Duration>) -> Option<Duration> {
        below
    }
}

/// The rest of an [`InterceptStore`]'s stack after one interceptor: the interceptors
/// added after it, then the store.
///
/// It owns what it needs (`Send + 'static`), so an interceptor may move it into a task
/// of its own, and clones cheaply, so it may pass a call on as several (one per role of
/// a batch, say).
#[derive(Clone)]
pub struct Next {
    store: Arc<dyn LeaseStore>,
    hooks: Arc<[Arc<dyn Interceptor>]>,
    at: usize,
}

impl Next {
    /// Passes `call` on to the next interceptor, or to the store after the last one.
    pub async fn run(self, call: Call) -> Reply {
        let Some(hook) = self.hooks.get(self.at).cloned() else {
            return forward(self.store.as_ref(), call).await;
        };
        let rest = Next {
            at: self.at + 1,
            ..self
        };
        hook.intercept(call, rest).await
    }
}

/// The one place a call reaches the store.
async fn forward(store: &dyn LeaseStore, call: Call) -> Reply {
    match call {
        Call::TryAcquireOrRenew {
            role,
            owner,
            ttl,
            value,
            queue,
        } => {
            let value = value.as_deref();
            let request = AcquireRequest {
                role: &role,
                owner: &owner,
                ttl,
                value,
                queue,
            };
            Reply::Lease(store.contend(request).await)
        }
        Call::Withdraw { role, owner } => Reply::Released(store.withdraw(&role, &owner).await),
        Call::Candidates { role } => Reply::Candidates(store.candidates(&role).await),
        Call::HandOver {
            role,
            owner,
            token,
            successor,
        } => Reply::Released(
            store
                .hand_over(&role, &owner, token, successor.as_deref())
                .await,
        ),
        Call::HandToSession {
            role,
            owner,
            token,
            to,
        } => Reply::Released(store.hand_to_session(&role, &owner, token, &to).await),
        Call::Release { role, owner, token } => {
            Reply::Released(store.release(&role, &owner, token).await)
        }
        Call::Get { role } => Reply::Info(store.get(&role).await),
        Call::List { prefix } => Reply::List(store.list_prefix(&prefix).await),
        Call::ListChanges {
            prefix,
            since,
            sessions,
        } => {
            let read = ChangesRead {
                prefix: &prefix,
                since,
                sessions: &sessions,
            };
            Reply::Changes(store.list_prefix_changes(read).await)
        }
        Call::WaitForChange {
            role,
            observed,
            deadline,
        } => {
            store.wait_for_change(&role, observed, deadline).await;
            Reply::Changed
        }
        Call::WaitForSuccessor {
            role,
            observed,
            deadline,
        } => Reply::Succession(store.wait_for_successor(&role, observed, deadline).await),
        Call::WaitForTerm {
            role,
            after,
            deadline,
        } => {
            store.wait_for_term(&role, after, deadline).await;
            Reply::Changed
        }
        Call::OpenSession { owner, ttl } => Reply::Session(store.open_session(&owner, ttl).await),
        Call::KeepAliveSession { session, ttl } => {
            Reply::KeptAlive(store.keep_alive_session(session, ttl).await)
        }
        Call::AcquireInSession { role, session } => {
            Reply::Lease(store.acquire_in_session(&role, session).await)
        }
        Call::AcquireManyInSession { roles, session } => {
            Reply::Leases(store.acquire_many_in_session(&roles, session).await)
        }
        Call::CloseSession { session } => Reply::Released(store.close_session(session).await),
    }
}

/// A [`LeaseStore`] that passes every call through a stack of [`Interceptor`]s before
/// (and instead of, if one says so) the store it wraps.
///
/// With no interceptor it is the store itself.
pub struct InterceptStore {
    store: Arc<dyn LeaseStore>,
    hooks: Arc<[Arc<dyn Interceptor>]>,
}

impl InterceptStore {
    /// Wraps `store` with an empty stack.
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        InterceptStore {
            store,
            hooks: Arc::new([]),
        }
    }

    /// Adds `hook` below the ones added before: they see each call before it does, and
    /// its answer after it. Keep a clone of the `Arc` to flip the hook's switches.
    pub fn with(self, hook: Arc<dyn Interceptor>) -> Self {
        let hooks = self.hooks.iter().cloned().chain([hook]).collect();
        InterceptStore { hooks, ..self }
    }

    async fn call(&self, call: Call) -> Reply {
        let next = Next {
            store: self.store.clone(),
            hooks: self.hooks.clone(),
            at: 0,
        };
        next.run(call).await
    }
}

#[async_trait]
impl LeaseStore for InterceptStore {
    async fn contend(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        let call = Call::TryAcquireOrRenew {
            role: request.role.to_owned(),
            owner: request.owner.to_owned(),
            ttl: request.ttl,
            value: request.value.map(str::to_owned),
            queue: request.queue,
        };
        self.call(call).await.into_lease()
    }

    async fn candidates(&self, role: &str) -> Result<Vec<String>> {
        let call = Call::Candidates {
            role: role.to_owned(),
        };
        self.call(call).await.into_candidates()
    }

    async fn withdraw(&self, role: &str, owner: &str) -> Result<bool> {
        let call = Call::Withdraw {
            role: role.to_owned(),
            owner: owner.to_owned(),
        };
        self.call(call).await.into_released()
    }

    async fn wait_for_successor(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: Instant,
    ) -> TermChange {
        let call = Call::WaitForSuccessor {
            role: role.to_owned(),
            observed,
            deadline,
        };
        self.call(call).await.into_succession()
    }

    async fn end_term(&self, end: EndRequest<'_>) -> Result<bool> {
        let (role, owner, token) = (end.role.to_owned(), end.owner.to_owned(), end.token);
        let call = match end.how {
            Handover::Release => Call::Release { role, owner, token },
            Handover::To(successor) => Call::HandOver {
                role,
                owner,
                token,
                successor: successor.map(str::to_owned),
            },
            Handover::ToSessionOf(to) => Call::HandToSession {
                role,
                owner,
                token,
                to: to.to_owned(),
            },
        };
        self.call(call).await.into_released()
    }

    async fn get(&self, role: &str) -> Result<Option<LeaseInfo>> {
        let call = Call::Get {
            role: role.to_owned(),
        };
        self.call(call).await.into_info()
    }

    async fn list_prefix(&self, prefix: &str) -> Result<Vec<LeaseInfo>> {
        self.call(Call::List {
            prefix: prefix.to_owned(),
        })
        .await
        .into_list()
    }

    async fn list_prefix_changes(&self, read: ChangesRead<'_>) -> Result<PrefixChanges> {
        self.call(Call::ListChanges {
            prefix: read.prefix.to_owned(),
            since: read.since,
            sessions: read.sessions.to_vec(),
        })
        .await
        .into_changes()
    }

    async fn wait_for_change(&self, role: &str, observed: FencingToken, deadline: Instant) {
        let call = Call::WaitForChange {
            role: role.to_owned(),
            observed,
            deadline,
        };
        // Any answer ends the wait: the caller reads the store again either way.
        let _ = self.call(call).await;
    }

    async fn wait_for_term(&self, role: &str, after: FencingToken, deadline: Instant) {
        let call = Call::WaitForTerm {
            role: role.to_owned(),
            after,
            deadline,
        };
        let _ = self.call(call).await;
    }

    fn min_ttl(&self) -> Duration {
        self.hooks
            .iter()
            .rev()
            .fold(self.store.min_ttl(), |below, hook| hook.min_ttl(below))
    }

    fn acquire_batch_size(&self) -> usize {
        self.hooks
            .iter()
            .rev()
            .fold(self.store.acquire_batch_size(), |below, hook| {
                hook.acquire_batch_size(below)
            })
    }

    fn change_poll(&self) -> Option<Duration> {
        self.hooks
            .iter()
            .rev()
            .fold(self.store.change_poll(), |below, hook| {
                hook.change_poll(below)
            })
    }

    async fn open_session(&self, owner: &str, ttl: Duration) -> Result<SessionGrant> {
        let call = Call::OpenSession {
            owner: owner.to_owned(),
            ttl,
        };
        match self.call(call).await {
            Reply::Session(result) => result,
            other => Err(other.mismatch("open_session")),
        }
    }

    async fn keep_alive_session(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> Result<Option<SessionGrant>> {
        match self.call(Call::KeepAliveSession { session, ttl }).await {
            Reply::KeptAlive(result) => result,
            other => Err(other.mismatch("keep_alive_session")),
        }
    }

    async fn acquire_in_session(&self, role: &str, session: SessionId) -> Result<LeaseResult> {
        let call = Call::AcquireInSession {
            role: role.to_owned(),
            session,
        };
        self.call(call).await.into_lease()
    }

    async fn acquire_many_in_session(
        &self,
        roles: &[String],
        session: SessionId,
    ) -> Result<Vec<LeaseResult>> {
        let call = Call::AcquireManyInSession {
            roles: roles.to_vec(),
            session,
        };
        match self.call(call).await {
            Reply::Leases(result) => result,
            other => Err(other.mismatch("acquire_many_in_session")),
        }
    }

    async fn close_session(&self, session: SessionId) -> Result<bool> {
        self.call(Call::CloseSession { session })
            .await
            .into_released()
    }
}

#[cfg(test)]
mod tests;
