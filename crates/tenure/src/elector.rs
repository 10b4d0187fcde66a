//! Fenced leader election on top of any [`LeaseStore`].
//!
//! **Guarantees.** For one role, at most one elector's `leadership` is live at any store
//! time, provided the elector's process is not paused and its monotonic clock does not
//! run slower than the store's by more than `max_clock_drift`: the elector cancels
//! `leadership` at `sent + min(lease_ttl, expires_at - now) * (1 - max_clock_drift) -
//! work_grace`, where `sent` is the instant just before its last successful acquire or
//! renew was sent and `expires_at - now` is what that answer granted on store time (a
//! store may grant less than asked), whatever the store is doing. It never calls `work`
//! for a term whose deadline has passed. Each term runs `work` with a fencing token
//! larger than every earlier one.
//!
//! **Non-guarantees.** A process that is paused (GC, SIGSTOP, a frozen VM) can still act
//! after its lease has gone: it has no running code to notice. Only fences, which reject
//! writes stamped with an older token, stop such a leader. Clock *offset* between hosts
//! does not matter (all expiry is judged on store time); clock *rate* beyond the drift
//! bound does.

use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasher;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod follower;
mod leader;
mod term;

use term::{Answer, HandoffRequest, TermEnd};

use crate::error::BoxError;
use crate::lease::{validate_name, validate_successor, validate_value};
use crate::{Error, FencingToken, LeaseStore, Result};

/// How long after the holder's expiry a waiting contender tries again, so it does not
/// arrive a hair before the store considers the lease expired.
const EXPIRY_MARGIN: Duration = Duration::from_millis(2);

/// Options of a [`LeaseLeaderElector`]; checked by [`LeaseLeaderOptions::validate`].
///
/// ```
/// use std::time::Duration;
/// use tenure::LeaseLeaderOptions;
/// let options = LeaseLeaderOptions {
///     lease_ttl: Duration::from_secs(15),
///     renew_interval: Duration::from_secs(5),
///     ..Default::default()
/// };
/// assert!(options.validate().is_ok());
/// ```
#[derive(Clone, Debug)]
pub struct LeaseLeaderOptions {
    /// This contender's owner id, unique per process incarnation. Default: host name,
    /// process id and a random suffix.
    pub owner_id: String,
    /// How long a term lasts without renewal. Default 30 s.
    pub lease_ttl: Duration,
    /// How often the leader renews. Default 10 s; must be below the leadership window
    /// `lease_ttl * (1 - max_clock_drift) - work_grace`. When the store grants less than
    /// `lease_ttl`, renewals come sooner in proportion.
    pub renew_interval: Duration,
    /// How often a follower retries when nothing else wakes it. Default 2 s, jittered.
    pub retry_interval: Duration,
    /// Jitter on retries, as a fraction: a wait of `d` becomes one in
    /// `d * [1 - j, 1 + j]`. Default 0.2.
    pub retry_jitter: f64,
    /// The largest rate difference tolerated between this host's monotonic clock and the
    /// store's clock, as a fraction. Default 0.01 (1%).
    pub max_clock_drift: f64,
    /// How long before the local deadline `leadership` is cancelled, so work has that
    /// long to stop while the lease is still surely its own (`tenure run` sets it to the
    /// time it needs to kill its command). Default zero: cancel at the local deadline.
    pub work_grace: Duration,
    /// A value each of this contender's terms advertises (where followers reach the
    /// leader: a URL, `host:port`), kept in the store with the term and shown by
    /// [`LeaseStore::get`] and [`crate::observe()`]. At most
    /// [`MAX_VALUE_LEN`](crate::lease::MAX_VALUE_LEN) bytes, no NUL. Default none.
    pub advertise: Option<String>,
    /// Whether a leader acts on handoff requests left in the store by
    /// [`crate::handoff::request_handoff`] (`tenure handoff`): from its first renewal
    /// on it watches the role's request role, by the store's push, with a read a minute
    /// when nothing wakes it (SQLite's waits poll its file). Default false: a process
    /// that leads many roles pays that per role; `tenure run` turns it on.
    pub accept_handoff_requests: bool,
}

impl Default for LeaseLeaderOptions {
    fn default() -> Self {
        LeaseLeaderOptions {
            owner_id: default_owner_id(),
            lease_ttl: Duration::from_secs(30),
            renew_interval: Duration::from_secs(10),
            retry_interval: Duration::from_secs(2),
            retry_jitter: 0.2,
            max_clock_drift: 0.01,
            work_grace: Duration::ZERO,
            advertise: None,
            accept_handoff_requests: false,
        }
    }
}

/// `host-pid-random`: unique per process incarnation.
pub fn default_owner_id() -> String {
    crate::owner::host_owner_id()
}

impl LeaseLeaderOptions {
    /// Checks the options: one rule per option, each checked once, in an order where a
    /// rule only leans on options already checked. The error names the option; its
    /// message shows the value and the bound it breaks.
    pub fn validate(&self) -> Result<()> {
        validate_name("owner_id", &self.owner_id)?;
        if self.lease_ttl.is_zero() {
            return Err(Error::invalid("lease_ttl", "must be greater than zero"));
        }
        if !(0.0..0.5).contains(&self.max_clock_drift) {
            return Err(Error::invalid(
                "max_clock_drift",
                format!("{} must be in [0, 0.5)", self.max_clock_drift),
            ));
        }
        if self.work_grace >= self.local_window() {
            return Err(Error::invalid(
                "work_grace",
                format!(
                    "{:?} must be less than lease_ttl * (1 - max_clock_drift) = {:?} * (1 - {}) = {:?}",
                    self.work_grace,
                    self.lease_ttl,
                    self.max_clock_drift,
                    self.local_window()
                ),
            ));
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.leadership_window() {
            return Err(Error::invalid(
                "renew_interval",
                format!(
                    "{:?} must be greater than zero and less than lease_ttl * (1 - max_clock_drift) - work_grace = {:?} * (1 - {}) - {:?} = {:?}",
                    self.renew_interval,
                    self.lease_ttl,
                    self.max_clock_drift,
                    self.work_grace,
                    self.leadership_window()
                ),
            ));
        }
        if self.retry_interval.is_zero() {
            return Err(Error::invalid(
                "retry_interval",
                "must be greater than zero",
            ));
        }
        if !(0.0..=1.0).contains(&self.retry_jitter) {
            return Err(Error::invalid(
                "retry_jitter",
                format!("{} must be in [0, 1]", self.retry_jitter),
            ));
        }
        validate_value("advertise", self.advertise.as_deref())
    }

    /// How long after sending a successful request the elector still trusts its term
    /// when the store granted the whole `lease_ttl`: `lease_ttl * (1 - max_clock_drift)`.
    pub fn local_window(&self) -> Duration {
        self.lease_ttl.mul_f64(1.0 - self.max_clock_drift)
    }

    /// How long after sending a successful request the elector keeps `leadership`
    /// uncancelled when the store granted the whole `lease_ttl`: the local window less
    /// `work_grace`.
    pub fn leadership_window(&self) -> Duration {
        self.leadership_window_for(self.lease_ttl)
    }

    /// The leadership window of an answer that left `granted` on store time: a store may
    /// grant less than asked (etcd reusing a spare lease), and never more counts.
    pub(crate) fn leadership_window_for(&self, granted: Duration) -> Duration {
        granted
            .min(self.lease_ttl)
            .mul_f64(1.0 - self.max_clock_drift)
            .saturating_sub(self.work_grace)
    }

    /// How long after sending a successful request the next renewal is due: the renew
    /// interval, or for a grant shorter than `lease_ttl` the same fraction of that
    /// grant's leadership window as the renew interval is of the full one. (Scaling by
    /// the grant alone is not enough: `work_grace` shortens a short window by as much
    /// as a full one, and the renewal would fall after the deadline.)
    pub(crate) fn renew_after(&self, granted: Duration) -> Duration {
        if granted >= self.lease_ttl {
            return self.renew_interval;
        }
        // `validate` keeps the renew interval inside the full window, so the ratio is
        // below one and the renewal falls inside the short window too.
        let fraction = self.renew_interval.as_secs_f64() / self.leadership_window().as_secs_f64();
        self.leadership_window_for(granted).mul_f64(fraction)
    }
}

/// What an elector is doing, published through [`LeaseLeaderElector::watch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElectionState {
    /// Not running (before `run`, or after it returned).
    Idle,
    /// Contending; `holder` is the live holder from the last answer, if known.
    Follower {
        /// The live holder and its token, if the last answer named one.
        holder: Option<(String, FencingToken)>,
    },
    /// Leading the term with this token.
    Leader {
        /// The current term's fencing token.
        fencing_token: FencingToken,
    },
}

impl ElectionState {
    /// True while leading.
    pub fn is_leader(&self) -> bool {
        matches!(self, ElectionState::Leader { .. })
    }
}

/// What a leader's work may return: `()` or a `Result<(), E>`.
pub trait WorkOutcome: Send + 'static {
    /// The outcome as a result.
    fn into_result(self) -> std::result::Result<(), BoxError>;
}

impl WorkOutcome for () {
    fn into_result(self) -> std::result::Result<(), BoxError> {
        Ok(())
    }
}

impl<E: Into<BoxError> + Send + 'static> WorkOutcome for std::result::Result<(), E> {
    fn into_result(self) -> std::result::Result<(), BoxError> {
        self.map_err(Into::into)
    }
}

/// Runs work as the single leader of a role, fenced and renewed.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use tenure::{InMemoryLeaseStore, LeaseLeaderElector, LeaseLeaderOptions, TokioClock};
/// use tokio_util::sync::CancellationToken;
///
/// let store = Arc::new(InMemoryLeaseStore::with_clock(TokioClock::new()));
/// let elector = LeaseLeaderElector::new(store, LeaseLeaderOptions::default()).unwrap();
/// elector
///     .run("reports", |token, _leadership| async move {
///         println!("leading with fencing token {token}");
///     }, CancellationToken::new())
///     .await
///     .unwrap();
/// # });
/// ```
pub struct LeaseLeaderElector {
    store: Arc<dyn LeaseStore>,
    options: LeaseLeaderOptions,
    state: watch::Sender<ElectionState>,
    rng: Mutex<SmallRng>,
    /// Per role, the token of a term whose release failed or timed out: the store may
    /// still apply it, so no work runs under that token again (see `contend`).
    pending_releases: Mutex<HashMap<String, FencingToken>>,
    /// The current term's local deadline, `None` while not leading.
    deadline: watch::Sender<Option<Instant>>,
    /// A planned handoff waiting for the leader loop to act on it.
    handoff: Mutex<Option<HandoffRequest>>,
    /// Wakes the leader loop for `handoff`.
    handoff_requested: Notify,
    /// Per role, the request-role token of the last handoff request acted on.
    handoffs_acted: Mutex<HashMap<String, FencingToken>>,
}

impl std::fmt::Debug for LeaseLeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLeaderElector")
            .field("options", &self.options)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl LeaseLeaderElector {
    /// An elector over `store`; fails with [`Error::InvalidArgument`] on bad options.
    pub fn new(store: Arc<dyn LeaseStore>, options: LeaseLeaderOptions) -> Result<Self> {
        options.validate()?;
        check_min_ttl(options.lease_ttl, store.as_ref())?;
        // Seeded from the owner id: distinct owners get distinct jitter, and a test
        // with fixed owner ids is reproducible.
        let seed = rustc_hash::FxBuildHasher.hash_one(&options.owner_id);
        Ok(LeaseLeaderElector {
            store,
            options,
            state: watch::Sender::new(ElectionState::Idle),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            pending_releases: Mutex::new(HashMap::new()),
            deadline: watch::Sender::new(None),
            handoff: Mutex::new(None),
            handoff_requested: Notify::new(),
            handoffs_acted: Mutex::new(HashMap::new()),
        })
    }

    /// The options in force.
    pub fn options(&self) -> &LeaseLeaderOptions {
        &self.options
    }

    /// The owner id this elector contends as.
    pub fn owner_id(&self) -> &str {
        &self.options.owner_id
    }

    /// A receiver of the elector's state, for callbacks, health checks and metrics.
    pub fn watch(&self) -> watch::Receiver<ElectionState> {
        self.state.subscribe()
    }

    /// A receiver of the current term's local deadline: the monotonic instant at which
    /// `leadership` is cancelled unless a renewal moves it (`None` while not leading).
    /// It moves on every successful renewal, so a second enforcer outside the work (a
    /// watchdog that kills the work at that instant plus its own grace) can hold the
    /// same deadline even when this process stops running.
    pub fn deadline(&self) -> watch::Receiver<Option<Instant>> {
        self.deadline.subscribe()
    }

    /// Hands the term this elector leads to a successor, as planned (a deploy, a
    /// drain): the work's `leadership` is cancelled and the work awaited, then one store
    /// step ends the term and begins the successor's (token + 1), so nobody contends
    /// and the successor starts as soon as it hears of it. `successor` names a
    /// contender waiting in the role's queue (its owner id); `None` hands to the
    /// oldest waiting one.
    ///
    /// The elector first reads who waits ([`LeaseStore::candidates`]): when nobody (or
    /// not the named successor) waits, it answers `Ok(false)` and the work goes on
    /// untouched. Returns `Ok(true)` once the term passed to a successor; this elector
    /// then waits in the queue as any contender. `Ok(false)` also when this elector does
    /// not lead, and in the rare case that the successor stopped waiting between that
    /// read and the handoff: then the work was stopped, and the elector leads on (it
    /// renews, and `work` is called again with the same token). A store error is
    /// returned as is; the term then runs out or is taken back as after any failed
    /// release.
    pub async fn hand_off(&self, successor: Option<&str>) -> Result<bool> {
        validate_successor(successor)?;
        let ElectionState::Leader { fencing_token } = *self.state.borrow() else {
            return Ok(false);
        };
        let (answer, answered) = oneshot::channel();
        let request = HandoffRequest {
            token: fencing_token,
            successor: successor.map(str::to_owned),
            answer,
        };
        if let Some(earlier) = self.handoff.lock().replace(request) {
            let _ = earlier.answer.send(Ok(false));
        }
        self.handoff_requested.notify_one();
        // The leader loop drops the request unanswered only when `run` ends first, or
        // the term ends while it reads who waits: not handed over, either way.
        answered.await.unwrap_or(Ok(false))
    }

    /// Contends for `role` until `shutdown` fires or `work` returns while leader.
    ///
    /// After a term ends locally (the local deadline passed while the store was slow),
    /// the store may still hold this owner's lease; contending then renews it, and
    /// `work` is called again with the same token. The two calls never overlap, and
    /// fences treat them as one term. The exception is a term whose release failed or
    /// timed out (here or in an earlier `run` of this elector): that release may still
    /// reach the store and end the term under the new work, so the elector releases it
    /// again and contends for a new term, with a new token, instead.
    ///
    /// Each term calls `work(token, leadership)` once; `leadership` is cancelled when the
    /// term ends (lost, local deadline, shutdown) and the elector awaits the work before
    /// contending again, so work must return promptly once `leadership` is cancelled.
    /// A term whose deadline has passed by the time work could be called (the old work
    /// took that long to stop) gets no work call: the elector contends again instead.
    /// Returns `Ok(())` on shutdown (after releasing the lease), or `work`'s own outcome
    /// when it returns while leading (after releasing; a renewal still in flight is let
    /// answer first, within the term's deadline). A panic in work comes back as
    /// [`Error::WorkPanicked`]. Store errors are logged and retried, never returned.
    pub async fn run<W, Fut>(
        &self,
        role: &str,
        mut work: W,
        shutdown: CancellationToken,
    ) -> Result<()>
    where
        W: FnMut(FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        validate_name("role", role)?;
        // A contender that never leads still reports that it does not.
        metrics::gauge!("tenure_is_leader", "role" => role.to_owned()).set(0.0);
        let outcome = self.run_terms(role, &mut work, &shutdown).await;
        self.state.send_replace(ElectionState::Idle);
        outcome
    }

    async fn run_terms<W, Fut>(
        &self,
        role: &str,
        work: &mut W,
        shutdown: &CancellationToken,
    ) -> Result<()>
    where
        W: FnMut(FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        // The answer that ended the last term, if it decides what comes next.
        let mut last: Option<Answer> = None;
        loop {
            let term = match last.take() {
                // A renewal began a new term while the old work wound down; by now its
                // deadline may have passed, and then we contend again at once.
                Some(answer) if answer.result.acquired => match self.begin(role, &answer) {
                    Some(term) => term,
                    None => continue,
                },
                observed => match self.contend(role, observed, shutdown).await? {
                    Some(term) => term,
                    None => return Ok(()),
                },
            };
            match self.lead(role, term, work, shutdown).await {
                TermEnd::Shutdown => return Ok(()),
                TermEnd::WorkReturned(outcome) => return outcome,
                TermEnd::Lost(answer) => last = answer,
                // `end_term` answers a handoff and reports it as `Lost(None)`.
                TermEnd::HandOff(_) => {}
            }
        }
    }
}

/// `lease_ttl` must be one the store can honour (etcd: whole seconds, at least one).
pub(crate) fn check_min_ttl(lease_ttl: Duration, store: &dyn LeaseStore) -> Result<()> {
    if lease_ttl < store.min_ttl() {
        return Err(Error::invalid(
            "lease_ttl",
            format!(
                "{lease_ttl:?} is below the store's minimum of {:?}",
                store.min_ttl()
            ),
        ));
    }
    Ok(())
}

/// The outcome of a work task: its own result, [`Error::Work`] for its error, and
/// [`Error::WorkPanicked`] for a panic (contained by the task). For electors of other
/// kinds that spawn work the same way.
pub fn work_outcome<T: WorkOutcome>(
    joined: std::result::Result<T, tokio::task::JoinError>,
) -> Result<()> {
    match joined {
        Ok(outcome) => outcome.into_result().map_err(Error::Work),
        Err(join) if join.is_panic() => {
            let panic = join.into_panic();
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned());
            Err(Error::WorkPanicked(message))
        }
        Err(_) => Err(Error::WorkPanicked("work task was cancelled".to_owned())),
    }
}
