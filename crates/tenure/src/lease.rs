//! The lease store contract: one atomic step on store time per call.
//!
//! A lease is `(role, owner, fencing token, expires_at)`. [`LeaseStore`] is the trait
//! every backend implements and every elector drives. Its input rules live in one place,
//! `validate` (so every backend rejects the same bad input with the same message), and
//! the change feed of a prefix in `changes`; both are re-exported here.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::session::{SessionGrant, SessionId};
use crate::{Error, FencingToken, Result};

mod changes;
mod validate;

pub use changes::{mark_to_i64, ChangeMark, ChangeRow, ChangesRead, ListedLease, PrefixChanges};
pub use validate::{
    token_from_i64, token_to_i64, validate_name, validate_release, validate_roles,
    validate_successor, validate_ttl, validate_value,
};

/// How many calls the default [`LeaseStore::acquire_many_in_session`] makes at once.
pub const ACQUIRE_MANY_IN_FLIGHT: usize = 16;

/// The default of [`LeaseStore::acquire_batch_size`].
pub const ACQUIRE_BATCH_SIZE: usize = 64;

/// The longest role, owner or node id, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// The longest value a term can advertise (a URL, `host:port`), in bytes.
pub const MAX_VALUE_LEN: usize = 1024;

/// One contender's call of [`LeaseStore::contend`]: renew its live term, start a
/// new one, or learn who holds the role; with `queue`, also wait in line for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireRequest<'a> {
    /// The role contended for.
    pub role: &'a str,
    /// Who contends.
    pub owner: &'a str,
    /// How long the term lasts from the store's now, unless renewed.
    pub ttl: Duration,
    /// What a term this call starts advertises (see
    /// [`LeaseStore::try_acquire_or_renew_with_value`]).
    pub value: Option<&'a str>,
    /// Whether a caller refused because another owner holds the live term joins the
    /// role's queue (see [`LeaseStore::try_acquire_or_queue`]).
    pub queue: bool,
}

impl AcquireRequest<'_> {
    /// Checks every field as the contract rules (names, a TTL of at least `min_ttl`
    /// with `now + ttl` representable, the value) and returns `now + ttl`. The backends
    /// call it before touching their store, so bad input is refused alike (the
    /// in-memory store checks the same rules, the names after its renewal fast path).
    pub fn validate(&self, min_ttl: Duration, now: SystemTime) -> Result<SystemTime> {
        validate_name("role", self.role)?;
        validate_name("owner", self.owner)?;
        let ends = validate_ttl(self.ttl, min_ttl, now)?;
        validate_value("value", self.value)?;
        Ok(ends)
    }
}

/// How a holder ends its term, for [`LeaseStore::end_term`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover<'a> {
    /// [`LeaseStore::release`]: to the oldest live candidate, or free.
    Release,
    /// [`LeaseStore::hand_over`]: to this candidate (the oldest for `None`), or not at
    /// all.
    To(Option<&'a str>),
    /// [`LeaseStore::hand_to_session`]: to the newest live session of this owner, or as
    /// [`Handover::Release`] when it has none.
    ToSessionOf(&'a str),
}

impl<'a> Handover<'a> {
    /// The candidate named, if any.
    pub fn successor(&self) -> Option<&'a str> {
        match self {
            Handover::Release | Handover::ToSessionOf(_) => None,
            Handover::To(successor) => *successor,
        }
    }
}

/// One holder's call of [`LeaseStore::end_term`]: its live term `(role, owner, token)`
/// and how that term ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndRequest<'a> {
    /// The role held.
    pub role: &'a str,
    /// Who holds it.
    pub owner: &'a str,
    /// The token of the term that ends.
    pub token: FencingToken,
    /// Who gets the role next.
    pub how: Handover<'a>,
}

impl EndRequest<'_> {
    /// Checks the names (role, owner, and the successor named, if any) as the contract
    /// rules. Every backend calls it before touching its store.
    pub fn validate(&self) -> Result<()> {
        validate_release(self.role, self.owner)?;
        validate_successor(self.how.successor())?;
        match self.how {
            Handover::ToSessionOf(to) => validate_name("to", to),
            _ => Ok(()),
        }
    }
}

/// The answer to [`LeaseStore::try_acquire_or_renew`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseResult {
    /// Whether the caller holds the lease after the call (acquired or renewed).
    pub acquired: bool,
    /// The token of the current term: the caller's when `acquired`, the holder's otherwise.
    pub fencing_token: FencingToken,
    /// When the current term ends unless renewed, on store time.
    pub expires_at: SystemTime,
    /// The owner holding the lease after the call.
    pub holder: String,
    /// The store time at which the call was decided.
    pub now: SystemTime,
}

impl LeaseResult {
    /// Time left in the current term as judged by the store at the call (`expires_at - now`).
    pub fn remaining(&self) -> Duration {
        self.expires_at
            .duration_since(self.now)
            .unwrap_or(Duration::ZERO)
    }
}

/// A read-only view of one role's lease, from [`LeaseStore::get`] and [`LeaseStore::list`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseInfo {
    /// The role this lease is for.
    pub role: String,
    /// The owner of the latest term, or `None` once it was released.
    pub holder: Option<String>,
    /// The latest token handed out for this role (it survives release and expiry).
    pub fencing_token: FencingToken,
    /// When the latest term ends (or ended), on store time.
    pub expires_at: SystemTime,
    /// The store time at which this view was read.
    pub now: SystemTime,
    /// The value the latest term advertised when it began (see
    /// [`LeaseStore::try_acquire_or_renew_with_value`]); `None` when it advertised none
    /// or was released.
    #[serde(default)]
    pub value: Option<String>,
}

impl LeaseInfo {
    /// The live holder, if any: set, not released, and `now < expires_at`.
    pub fn live_holder(&self) -> Option<&str> {
        match &self.holder {
            Some(holder) if self.now < self.expires_at => Some(holder),
            _ => None,
        }
    }

    /// Time left in the current term at `now` (zero when expired or released).
    pub fn remaining(&self) -> Duration {
        if self.live_holder().is_none() {
            return Duration::ZERO;
        }
        self.expires_at
            .duration_since(self.now)
            .unwrap_or(Duration::ZERO)
    }
}

/// What a waiter learned of a role's term from [`LeaseStore::wait_for_successor`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TermChange {
    /// Nothing known: the deadline passed, the wake was spurious, or the backend's push
    /// does not say. The caller asks the store.
    Unknown,
    /// The observed term ended and no term is live.
    Ended,
    /// The observed term ended and a term of `holder` under `fencing_token` began (a
    /// release handed it over, or a contender acquired it).
    Began {
        /// The new term's holder.
        holder: String,
        /// The new term's token.
        fencing_token: FencingToken,
        /// The session the new term is held under, when it is held under one and the
        /// push says which (`None` otherwise: a lease of its own, or a backend whose
        /// push does not carry it). A holder that did not acquire the term itself (see
        /// [`LeaseStore::hand_to_session`]) works on it only when this is its current
        /// session.
        session: Option<SessionId>,
    },
}

/// A store of renewable, fenced leases, one per role.
///
/// Every call is one atomic step decided on *store time* (the injected clock for
/// in-memory stores, the server's clock for shared ones):
///
/// 1. held by `owner` and live (`now < expires_at`): **renew**, `expires_at = now + ttl`,
///    token unchanged;
/// 2. free, released or expired (`now >= expires_at`), even when the expired holder is
///    `owner` itself: **acquire** with token = previous + 1 (the first is 1);
/// 3. otherwise **not acquired**, and the result describes the live holder.
///
/// Tokens are never handed out twice for a role: the counter survives release, expiry
/// and (for durable backends) restarts.
///
/// The trait is object safe: the CLI picks a backend from a URL and holds an
/// `Arc<dyn LeaseStore>`.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Renews the caller's live term, or starts a new one, or reports the live holder.
    /// A term it starts advertises no value; see
    /// [`try_acquire_or_renew_with_value`](Self::try_acquire_or_renew_with_value).
    async fn try_acquire_or_renew(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<LeaseResult> {
        self.try_acquire_or_renew_with_value(role, owner, ttl, None)
            .await
    }

    /// [`try_acquire_or_renew`](Self::try_acquire_or_renew) that advertises `value`
    /// with the term it starts: a new term keeps `value` beside its holder and token,
    /// for [`get`](Self::get), [`list`](Self::list) and [`crate::observe()`] to show. A
    /// renewal keeps the value its term began with (a term's value never changes), and
    /// a release drops it. `value` is at most [`MAX_VALUE_LEN`] bytes with no NUL
    /// ([`validate_value`]); a bad one is refused before anything is written.
    async fn try_acquire_or_renew_with_value(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        value: Option<&str>,
    ) -> Result<LeaseResult> {
        self.contend(AcquireRequest {
            role,
            owner,
            ttl,
            value,
            queue: false,
        })
        .await
    }

    /// The one step behind [`try_acquire_or_renew_with_value`](Self::try_acquire_or_renew_with_value)
    /// and [`try_acquire_or_queue`](Self::try_acquire_or_queue), which every backend
    /// implements: `request.queue` says which of the two is asked.
    async fn contend(&self, request: AcquireRequest<'_>) -> Result<LeaseResult>;

    /// Ends the term `(role, owner, token)` at once so a successor need not wait out the
    /// TTL. Returns whether it did; releasing a term that is no longer live is a no-op
    /// returning `false`.
    async fn release(&self, role: &str, owner: &str, token: FencingToken) -> Result<bool> {
        self.end_term(EndRequest {
            role,
            owner,
            token,
            how: Handover::Release,
        })
        .await
    }

    /// The one step behind [`release`](Self::release) and
    /// [`hand_over`](Self::hand_over), which every backend implements: `end.how` says
    /// which of the two is asked.
    async fn end_term(&self, end: EndRequest<'_>) -> Result<bool>;

    /// [`try_acquire_or_renew_with_value`](Self::try_acquire_or_renew_with_value) for a
    /// contender that waits its turn in line: when another owner holds the live term,
    /// the caller is also queued as a **candidate** for `role` until `now + ttl` (a
    /// candidate already queued and still live keeps its place and is refreshed; a
    /// lapsed one joins again at the back). The same atomic step decides the lease and
    /// the queue.
    ///
    /// A [`release`](Self::release) hands the role to the oldest live candidate in the
    /// step that ends the term, so a handover needs no contest: the new term has token
    /// + 1, the candidate as holder, the value it queued with, and lasts until the
    /// candidacy would have lapsed (so a candidate that died in the queue holds the role
    /// no longer than it would have stayed queued). The candidate learns of it from
    /// [`wait_for_successor`](Self::wait_for_successor) and renews. Acquiring by any
    /// call removes the caller's candidacy. Order is kept for releases only: a term that
    /// lapses without release goes to whichever contender asks first, as in
    /// [`try_acquire_or_renew`](Self::try_acquire_or_renew).
    ///
    async fn try_acquire_or_queue(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        value: Option<&str>,
    ) -> Result<LeaseResult> {
        self.contend(AcquireRequest {
            role,
            owner,
            ttl,
            value,
            queue: true,
        })
        .await
    }

    /// Removes `owner` from `role`'s queue of candidates (see
    /// [`try_acquire_or_queue`](Self::try_acquire_or_queue)); returns whether it was
    /// queued and live. A contender that stops waiting withdraws, so no release hands
    /// the role to it.
    async fn withdraw(&self, role: &str, owner: &str) -> Result<bool>;

    /// The owners of `role`'s live candidates, oldest first (see
    /// [`try_acquire_or_queue`](Self::try_acquire_or_queue)): who a release would hand
    /// the role to, and whom [`hand_over`](Self::hand_over) may name. Reads only.
    async fn candidates(&self, role: &str) -> Result<Vec<String>>;

    /// Ends the live term `(role, owner, token)` and, in the same atomic step, begins
    /// the next one for a live candidate of the role (see
    /// [`try_acquire_or_queue`](Self::try_acquire_or_queue)): `successor`, or the
    /// oldest for `None`. A planned handoff to a chosen member: the successor's term is
    /// as a release would have handed it (token + 1, its queued value, lasting as long
    /// as its candidacy). Returns whether it did; when the term is not live, or there is
    /// no such candidate, nothing changes (the term goes on) and the answer is `false`.
    ///
    /// etcd takes two transactions for it (see that backend), so there a successor that
    /// leaves between them is replaced by the next candidate, or by nobody.
    async fn hand_over(
        &self,
        role: &str,
        owner: &str,
        token: FencingToken,
        successor: Option<&str>,
    ) -> Result<bool> {
        self.end_term(EndRequest {
            role,
            owner,
            token,
            how: Handover::To(successor),
        })
        .await
    }

    /// Ends the live term `(role, owner, token)` and, in the same atomic step, begins
    /// the next one under the newest live session of owner `to` (see
    /// [`open_session`](Self::open_session)): token + 1, holder `to`, no value, live
    /// while that session is, as if `to` had acquired it there with
    /// [`acquire_in_session`](Self::acquire_in_session). When `to` has no live session
    /// the step is a [`release`](Self::release). Returns whether the term ended.
    ///
    /// For a planned move of a shard to a member known to want it: the member learns of
    /// its new term from [`wait_for_successor`](Self::wait_for_successor)
    /// ([`TermChange::Began`] naming its session) and works on it with no call of its
    /// own, so the move costs the store one step and no contest. The shard is held
    /// even if the member no longer wants it (it then releases it, or its session's
    /// end frees it); a member that restarted under a new session is not handed the
    /// terms meant for its earlier one once the new one is open. The owner is named, not
    /// a session: one owner name must stand for one such member (a term handed to a
    /// session of the same name that some other part of the program opened is held,
    /// unworked, until that session ends).
    ///
    /// A backend that cannot do it in one step releases instead (etcd and Kubernetes
    /// do, today): `to` then acquires as after any release. In memory, PostgreSQL and
    /// SQLite it is one step.
    async fn hand_to_session(
        &self,
        role: &str,
        owner: &str,
        token: FencingToken,
        to: &str,
    ) -> Result<bool> {
        self.end_term(EndRequest {
            role,
            owner,
            token,
            how: Handover::ToSessionOf(to),
        })
        .await
    }

    /// Reads a role's lease without changing it; `None` if the role never had one.
    async fn get(&self, role: &str) -> Result<Option<LeaseInfo>>;

    /// Every role's lease, sorted by role.
    async fn list(&self) -> Result<Vec<LeaseInfo>> {
        self.list_prefix("").await
    }

    /// The leases of the roles that start with `prefix` (a shard group's `G/`), sorted
    /// by role; every role's for `""`. Reads only those roles where the backend can, so
    /// a group's members need not read every role of the store.
    async fn list_prefix(&self, prefix: &str) -> Result<Vec<LeaseInfo>>;

    /// What changed among the leases of the roles that start with `read.prefix` since
    /// the read that gave `read.since`, so that a reader keeping its own copy of them (a shard
    /// member's view of its group) reads what changed, not every lease each time.
    ///
    /// With no mark, every lease of the prefix ([`PrefixChanges::complete`]).
    /// Otherwise at least: every lease whose term changed after that read (began, was
    /// released or ended, moved from a session to a lease of its own), and every lease
    /// held without a session (whose expiry moves with each renewal, which is no change
    /// of term); and, for each of `read.sessions` that has not been forgotten, how long
    /// it has left. A lease held under a session that is neither returned nor among
    /// [`PrefixChanges::sessions`] lapsed. A store may return more (a complete read is
    /// always a correct answer, and this default gives one). A store that cannot find
    /// the leases held without a session, nor tell when one lapsed, lists them only when
    /// their term changed and says how many leases are held instead
    /// ([`PrefixChanges::held`]); a reader whose copy counts otherwise reads again
    /// completely.
    ///
    /// Applying each answer to the copy the previous answers built gives, lease for
    /// lease, what [`list_prefix`](Self::list_prefix) would have returned at this read
    /// (the conformance suite checks this). The work of a read that is not complete
    /// grows with what changed, not with the number of leases, on the backends that
    /// implement it (in memory, PostgreSQL, SQLite, and etcd, whose server still reads
    /// the prefix's term records to filter them).
    async fn list_prefix_changes(&self, read: ChangesRead<'_>) -> Result<PrefixChanges> {
        let leases = self.list_prefix(read.prefix).await?;
        Ok(PrefixChanges {
            leases: leases
                .into_iter()
                .map(|info| ListedLease {
                    info,
                    session: None,
                })
                .collect(),
            complete: true,
            sessions: Vec::new(),
            mark: None,
            held: None,
        })
    }

    /// Waits until the term `observed` of `role` has ended (released, or replaced by a
    /// term with another token) or until `deadline`, whichever comes first.
    ///
    /// A backend that can push (a notification, a watch) returns as soon as the change
    /// happens, so a released lease is taken over in one round trip rather than one
    /// retry interval. It may return early spuriously; callers then just try again. It
    /// must not return early in a loop when its push channel is broken: then it sleeps
    /// to the deadline, as this default does.
    async fn wait_for_change(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: tokio::time::Instant,
    ) {
        let _ = (role, observed);
        tokio::time::sleep_until(deadline).await;
    }

    /// [`wait_for_change`](Self::wait_for_change) that also says what the change was,
    /// when the backend's push carries it: a queued candidate learns from the push alone
    /// that a release handed the role to it (or to another candidate, and then it keeps
    /// waiting without asking the store), so a handover costs the store the same work
    /// however many candidates wait.
    ///
    /// [`TermChange::Unknown`] (the default's only answer) tells the caller to ask the
    /// store; a backend answers [`TermChange::Began`] or [`TermChange::Ended`] only for
    /// a term other than `observed`.
    async fn wait_for_successor(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: tokio::time::Instant,
    ) -> TermChange {
        self.wait_for_change(role, observed, deadline).await;
        TermChange::Unknown
    }

    /// Waits until a term with a token above `after` begins on `role`, or until
    /// `deadline`. For observers of a role that has no live holder (see
    /// [`crate::observe()`]): [`wait_for_change`](Self::wait_for_change) waits for a
    /// live term to end, this for the next one to begin.
    ///
    /// A backend that can push returns as soon as the term begins; it may return early
    /// spuriously. This default sleeps to the deadline, so observers of a store that
    /// cannot push poll.
    async fn wait_for_term(&self, role: &str, after: FencingToken, deadline: tokio::time::Instant) {
        let _ = (role, after);
        tokio::time::sleep_until(deadline).await;
    }

    /// The smallest TTL this backend can honour (etcd: one second).
    fn min_ttl(&self) -> Duration {
        Duration::from_millis(1)
    }

    /// How many roles a caller with many to take (a shard member taking over thousands)
    /// should put in one [`acquire_many_in_session`](Self::acquire_many_in_session) call:
    /// as many as one round trip carries without holding the store's locks so long that
    /// the renewals queued behind them miss their deadlines. [`ACQUIRE_BATCH_SIZE`] by
    /// default; never 0.
    fn acquire_batch_size(&self) -> usize {
        ACQUIRE_BATCH_SIZE
    }

    /// How a wait of this store learns of a change written through another handle (by
    /// another process): `None` when the store pushes it, so a wait wakes as it
    /// commits (the default); otherwise the interval its waits read the store at
    /// (SQLite). A waiter that may learn of a change later than that (a shard member
    /// watching for requests to drain it) reads on a slower cadence of its own instead
    /// of waiting, so that it does not cost a read per interval.
    fn change_poll(&self) -> Option<Duration> {
        None
    }

    /// Opens a session for `owner`, live until `now + ttl` on store time (see
    /// [`crate::session`]). Ids are never handed out twice. Bad `owner` or `ttl` is
    /// [`Error::InvalidArgument`], with the rules of [`try_acquire_or_renew`](Self::try_acquire_or_renew).
    async fn open_session(&self, owner: &str, ttl: Duration) -> Result<SessionGrant>;

    /// Keeps a live session alive: its expiry becomes `now + ttl` (never earlier than it
    /// was), and so does every role held under it, in one write however many roles
    /// that is. `None` when the session has ended (expired or closed): it is never
    /// revived, and its roles are free.
    async fn keep_alive_session(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> Result<Option<SessionGrant>>;

    /// Acquires `role` under a live `session`, in one atomic step on store time:
    ///
    /// 1. held under this same session and live: acquired, token unchanged, nothing
    ///    written;
    /// 2. free, released or expired (a plain lease past its expiry, or one held under a
    ///    session that ended): a new term under the session, token = previous + 1,
    ///    holder = the session's owner, expiring with the session;
    /// 3. otherwise: not acquired; the result describes the live holder.
    ///
    /// A role held under a session is live exactly while the session is; its
    /// `expires_at` (here, in [`get`](Self::get) and [`list`](Self::list)) is the
    /// session's. [`release`](Self::release) ends such a term as any other (the session
    /// goes on), and [`try_acquire_or_renew`](Self::try_acquire_or_renew) by the holder
    /// turns it into a plain lease of its own TTL. A session that has ended is
    /// [`Error::SessionEnded`].
    async fn acquire_in_session(&self, role: &str, session: SessionId) -> Result<LeaseResult>;

    /// Acquires each of `roles` under a live `session`: the answers are those of
    /// [`acquire_in_session`](Self::acquire_in_session) called once per role, in the
    /// order of `roles`. Each role is its own atomic step (some may be taken while
    /// others are held elsewhere). Backends that can take a batch in one round trip do:
    /// a member winning thousands of shards at once (a cold start, a join) then waits
    /// one round trip, not one per shard. This default makes the
    /// calls [`ACQUIRE_MANY_IN_FLIGHT`] at a time.
    ///
    /// An error says nothing of which roles were taken: any of them may have been, then
    /// or later (a request may still be on its way), and the caller must treat every
    /// role of the batch so. A session that has ended is [`Error::SessionEnded`]; a bad
    /// role is [`Error::InvalidArgument`] before anything is written.
    async fn acquire_many_in_session(
        &self,
        roles: &[String],
        session: SessionId,
    ) -> Result<Vec<LeaseResult>> {
        validate_roles(roles)?;
        let mut answers = Vec::with_capacity(roles.len());
        for wave in roles.chunks(ACQUIRE_MANY_IN_FLIGHT) {
            let mut calls = Vec::with_capacity(wave.len());
            for role in wave {
                calls.push(self.acquire_in_session(role, session));
            }
            for answer in futures_util::future::join_all(calls).await {
                answers.push(answer?);
            }
        }
        Ok(answers)
    }

    /// Ends a session at once and releases every role held under it (tokens are kept;
    /// waiters on those roles are woken as for a release). Returns whether the session
    /// was live.
    async fn close_session(&self, session: SessionId) -> Result<bool>;
}

/// [`LeaseStore::acquire_in_session`] as a batch of one role, for backends whose
/// [`LeaseStore::acquire_many_in_session`] is the one acquire under a session they
/// write. An answer that is not exactly one is [`Error::Store`] naming `backend`.
pub async fn acquire_in_session_as_batch<S>(
    store: &S,
    backend: &'static str,
    role: &str,
    session: SessionId,
) -> Result<LeaseResult>
where
    S: LeaseStore + ?Sized,
{
    let mut answers = store
        .acquire_many_in_session(&[role.to_owned()], session)
        .await?;
    match (answers.pop(), answers.is_empty()) {
        (Some(answer), true) => Ok(answer),
        _ => Err(Error::store_msg(
            backend,
            "an acquire of one role was not answered with one answer",
        )),
    }
}

/// For a backend's waits ([`LeaseStore::wait_for_change`] and its kin): whether `role`
/// is a name no call accepts, having then slept to `deadline`. No term of such a role
/// can begin or end, and returning at once would spin a caller that waits in a loop.
pub async fn wait_out_bad_role(role: &str, deadline: tokio::time::Instant) -> bool {
    if validate_name("role", role).is_ok() {
        return false;
    }
    tokio::time::sleep_until(deadline).await;
    true
}
