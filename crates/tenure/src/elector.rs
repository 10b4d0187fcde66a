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
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use tokio::sync::{oneshot, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::error::BoxError;
use crate::lease::{validate_name, validate_value};
use crate::{Error, FencingToken, LeaseResult, LeaseStore, Result, TermChange};

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
}

impl std::fmt::Debug for LeaseLeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLeaderElector")
            .field("options", &self.options)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

/// One acquire or renew request, boxed so the leader loop can keep it in flight.
type AttemptFuture<'a> = std::pin::Pin<Box<dyn Future<Output = Attempt> + Send + 'a>>;

/// One acquire or renew request: the store's answer and the instants around it.
struct Attempt {
    sent: Instant,
    received: Instant,
    result: Result<LeaseResult>,
}

/// A store answer and the instants around it.
struct Answer {
    result: LeaseResult,
    sent: Instant,
    received: Instant,
}

/// A request from [`LeaseLeaderElector::hand_off`] to the leader loop.
struct HandoffRequest {
    /// The term the caller saw leading; a request for another term is refused.
    token: FencingToken,
    /// The candidate to hand to; `None` for the oldest waiting one.
    successor: Option<String>,
    /// Whether the term passed to a successor.
    answer: oneshot::Sender<Result<bool>>,
}

/// How one term ended.
enum TermEnd {
    Shutdown,
    /// Work was stopped for a planned handoff; the term goes on until handed over.
    HandOff(HandoffRequest),
    WorkReturned(Result<()>),
    /// Lost; the answer that told us so (if any) decides what to do next.
    Lost(Option<Answer>),
}

/// One term as its leader sees it, on the local monotonic clock.
#[derive(Clone, Debug)]
struct Term {
    token: FencingToken,
    /// Just before the last successful acquire or renew of this term was sent.
    sent: Instant,
    /// How long after `sent` `leadership` lasts: what the store granted, less drift and
    /// `work_grace`.
    window: Duration,
    /// How long after `sent` the next renewal is due.
    renew_after: Duration,
    /// When the next renewal is due (later than `sent + renew_after` after a failure).
    next_renew: Instant,
}

impl Term {
    /// The term an acquiring answer starts, or `None` when its deadline has passed
    /// already: work must never run for such a term.
    fn begin(options: &LeaseLeaderOptions, answer: &Answer) -> Option<Term> {
        let mut term = Term {
            token: answer.result.fencing_token,
            sent: answer.sent,
            window: Duration::ZERO,
            renew_after: Duration::ZERO,
            next_renew: answer.sent,
        };
        term.renewed(options, answer.sent, &answer.result);
        (Instant::now() < term.deadline()).then_some(term)
    }

    /// When `leadership` is cancelled unless a renewal moves it:
    /// `sent + min(lease_ttl, expires_at - now) * (1 - max_clock_drift) - work_grace`.
    fn deadline(&self) -> Instant {
        self.sent + self.window
    }

    /// A request sent at `sent` was answered with `result` holding the lease: the term
    /// (under `result`'s token) now runs from that answer.
    fn renewed(&mut self, options: &LeaseLeaderOptions, sent: Instant, result: &LeaseResult) {
        let granted = result.remaining();
        self.token = result.fencing_token;
        self.sent = sent;
        self.window = options.leadership_window_for(granted);
        self.renew_after = options.renew_after(granted);
        self.next_renew = sent + self.renew_after;
    }

    /// Whether a renewal answered at `received` was late: it (retries included) used
    /// more than half the slack between the renew schedule and the deadline.
    fn is_late(&self, received: Instant) -> bool {
        let spare = self.deadline().saturating_duration_since(received);
        let slack = self.window.saturating_sub(self.renew_after);
        spare < slack / 2
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
    /// Returns `Ok(true)` once the term passed to a successor; this elector then waits
    /// in the queue as any contender. `Ok(false)` when this elector does not lead, or
    /// when nobody (or not the named successor) was waiting: then the elector goes on
    /// leading (it renews, and `work` is called again with the same token). A store
    /// error is returned as is; the term then runs out or is taken back as after any
    /// failed release.
    pub async fn hand_off(&self, successor: Option<&str>) -> Result<bool> {
        if let Some(successor) = successor {
            validate_name("successor", successor)?;
        }
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
        // The leader loop drops the request unanswered only when `run` ends first.
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

    /// Sends one acquire or renew request.
    fn attempt<'a>(&'a self, role: &'a str) -> AttemptFuture<'a> {
        Box::pin(async move {
            let sent = Instant::now();
            // Queued: a release hands the role to the oldest waiting contender, so a
            // handover is one write however many wait.
            let result = self
                .store
                .try_acquire_or_queue(
                    role,
                    &self.options.owner_id,
                    self.options.lease_ttl,
                    self.options.advertise.as_deref(),
                )
                .await;
            Attempt {
                sent,
                received: Instant::now(),
                result,
            }
        })
    }

    /// The term an acquiring answer starts, or `None` (logged) when its deadline has
    /// passed already.
    fn begin(&self, role: &str, answer: &Answer) -> Option<Term> {
        let term = Term::begin(&self.options, answer);
        if term.is_none() {
            warn!(role, owner = %self.options.owner_id, token = %answer.result.fencing_token,
                granted = ?answer.result.remaining(), waited = ?answer.sent.elapsed(),
                "the term's local deadline passed before work could start; contending again");
        }
        term
    }

    /// Follower loop: returns the term won, or `None` on shutdown.
    async fn contend(
        &self,
        role: &str,
        mut observed: Option<Answer>,
        shutdown: &CancellationToken,
    ) -> Result<Option<Term>> {
        loop {
            if let Some(answer) = observed.take() {
                self.publish_follower(&answer.result);
                if !self.wait_turn(role, &answer, shutdown).await {
                    self.leave_queue(role).await;
                    return Ok(None);
                }
            }
            // An answer arriving after the local window could not start a usable term
            // (its deadline would have passed), so a call that has not answered by then
            // is abandoned; waiting on it could block this contender forever.
            let window = self.options.leadership_window();
            let attempt = tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    self.leave_queue(role).await;
                    return Ok(None);
                }
                attempt = tokio::time::timeout(window, self.attempt(role)) => attempt,
            };
            let Ok(Attempt {
                sent,
                received,
                result,
            }) = attempt
            else {
                warn!(role, owner = %self.options.owner_id, waited = ?window,
                    "acquire got no answer within the local window; retrying");
                continue;
            };
            match result {
                Ok(result) if result.acquired => {
                    let release_may_land = self.release_may_land(role, result.fencing_token);
                    let answer = Answer {
                        result,
                        sent,
                        received,
                    };
                    if release_may_land {
                        // The store still holds the term whose release is on its way:
                        // end it here, then contend for a new term (a new token).
                        warn!(role, owner = %self.options.owner_id, token = %answer.result.fencing_token,
                            "renewed a term whose release may still land; releasing it again first");
                        if let Some(term) = Term::begin(&self.options, &answer) {
                            if self.release(role, &term).await {
                                continue;
                            }
                        }
                    } else if let Some(term) = self.begin(role, &answer) {
                        return Ok(Some(term));
                    }
                }
                Ok(result) => {
                    self.release_may_land(role, result.fencing_token);
                    debug!(role, owner = %self.options.owner_id, holder = %result.holder,
                        token = %result.fencing_token, "lease held by another owner; waiting");
                    observed = Some(Answer {
                        result,
                        sent,
                        received,
                    });
                    continue;
                }
                Err(error) if !error.is_transient() => return Err(error),
                Err(error) => {
                    warn!(role, owner = %self.options.owner_id, %error,
                        "acquire failed; retrying after a store error");
                }
            }
            // A store error, or a term too short to use: try again after a pause.
            let wait = self.jittered(self.options.retry_interval);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(None),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Waits for this contender's turn after `answer` named another holder: a push that
    /// the term ended or was handed to us, the holder's expiry (plus a margin), or the
    /// retry interval (which refreshes our place in the queue), whichever is first.
    /// A push that the term went to another candidate is followed without asking the
    /// store: we keep our place and wait for the next change. Returns `false` on
    /// shutdown.
    async fn wait_turn(&self, role: &str, answer: &Answer, shutdown: &CancellationToken) -> bool {
        // The candidacy lasts `lease_ttl`; the renew interval is well inside it.
        let retry = self
            .jittered(self.options.retry_interval)
            .min(self.options.renew_interval);
        let retry = answer.received + retry;
        let expiry = answer.received + answer.result.remaining() + EXPIRY_MARGIN;
        let mut deadline = retry.min(expiry);
        let mut observed = answer.result.fencing_token;
        loop {
            let change = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return false,
                change = self.store.wait_for_successor(role, observed, deadline) => change,
            };
            match change {
                TermChange::Began {
                    holder,
                    fencing_token,
                } if holder != self.options.owner_id && Instant::now() < retry => {
                    debug!(role, owner = %self.options.owner_id, %holder, token = %fencing_token,
                        "the term passed to another contender; keeping our place");
                    self.publish_holder(Some((holder, fencing_token)));
                    // The new term's expiry is unknown until our next attempt reads it.
                    observed = fencing_token;
                    deadline = retry;
                }
                _ => return true,
            }
        }
    }

    /// Leaves the queue when this contender stops waiting, so no release hands the role
    /// to it; a term a release handed it meanwhile (nobody would lead it) is released.
    /// Bounded by the leadership window: a store that does not answer by then leaves a
    /// candidacy that lapses on its own.
    async fn leave_queue(&self, role: &str) {
        let owner = self.options.owner_id.as_str();
        let left = tokio::time::timeout(self.options.leadership_window(), async {
            self.store.withdraw(role, owner).await?;
            if let Some(info) = self.store.get(role).await? {
                if info.live_holder() == Some(owner) {
                    self.store.release(role, owner, info.fencing_token).await?;
                }
            }
            Ok::<(), Error>(())
        })
        .await;
        match left {
            Ok(Ok(())) => debug!(role, owner, "left the queue"),
            Ok(Err(error)) => {
                warn!(role, owner, %error, "leaving the queue failed; the candidacy lapses on its own")
            }
            Err(_) => {
                warn!(
                    role,
                    owner, "leaving the queue timed out; the candidacy lapses on its own"
                )
            }
        }
    }

    fn publish_follower(&self, result: &LeaseResult) {
        self.publish_holder(Some((result.holder.clone(), result.fencing_token)));
    }

    fn publish_holder(&self, holder: Option<(String, FencingToken)>) {
        self.state.send_if_modified(|state| {
            let next = ElectionState::Follower {
                holder: holder.clone(),
            };
            if *state == next {
                false
            } else {
                *state = next;
                true
            }
        });
    }

    /// Leader loop for one term: run work, renew on schedule, and stop at the first of
    /// shutdown, work returning, the local deadline, or a renewal that lost the term.
    async fn lead<W, Fut>(
        &self,
        role: &str,
        mut term: Term,
        work: &mut W,
        shutdown: &CancellationToken,
    ) -> TermEnd
    where
        W: FnMut(FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let owner = self.options.owner_id.as_str();
        info!(role, owner, token = %term.token, window = ?term.window, "elected");
        metrics::counter!("tenure_terms_started_total", "role" => role.to_owned()).increment(1);
        metrics::gauge!("tenure_is_leader", "role" => role.to_owned()).set(1.0);
        metrics::gauge!("tenure_fencing_token", "role" => role.to_owned())
            .set(term.token.get() as f64);
        self.state.send_replace(ElectionState::Leader {
            fencing_token: term.token,
        });
        self.deadline.send_replace(Some(term.deadline()));

        let leadership = CancellationToken::new();
        // Work runs on its own task: if this future is dropped mid-term (the caller's
        // select! moved on, its task was aborted), nothing renews any more, so the work
        // must be told it no longer leads.
        let _cancel_on_drop = leadership.clone().drop_guard();
        let mut task: JoinHandle<Fut::Output> = tokio::spawn(work(term.token, leadership.clone()));
        let mut renewal: Option<AttemptFuture<'_>> = None;
        let end = loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break TermEnd::Shutdown,
                joined = &mut task => break TermEnd::WorkReturned(work_outcome(joined)),
                _ = self.handoff_requested.notified() => {
                    if let Some(request) = self.take_handoff(term.token) {
                        break TermEnd::HandOff(request);
                    }
                }
                _ = tokio::time::sleep_until(term.deadline()) => {
                    warn!(role, owner, token = %term.token,
                        reason = "local deadline passed without a successful renewal", "leadership lost");
                    break TermEnd::Lost(None);
                }
                attempt = in_flight(&mut renewal), if renewal.is_some() => {
                    renewal = None;
                    if let Some(lost) = self.renewal_answered(role, &mut term, attempt) {
                        break lost;
                    }
                    let deadline = Some(term.deadline());
                    self.deadline.send_if_modified(|published| {
                        let moved = *published != deadline;
                        *published = deadline;
                        moved
                    });
                }
                _ = tokio::time::sleep_until(term.next_renew), if renewal.is_none() => {
                    renewal = Some(self.attempt(role));
                }
            }
        };
        self.end_term(role, &term, &leadership, task, renewal, end)
            .await
    }

    /// Applies a renewal's answer to the term; returns how the term ended if it did.
    fn renewal_answered(&self, role: &str, term: &mut Term, attempt: Attempt) -> Option<TermEnd> {
        let owner = self.options.owner_id.as_str();
        let token = term.token;
        let Attempt {
            sent,
            received,
            result,
        } = attempt;
        metrics::histogram!("tenure_renew_latency_seconds", "role" => role.to_owned())
            .record((received - sent).as_secs_f64());
        let outcome = |outcome: &'static str| {
            metrics::counter!("tenure_renewals_total", "role" => role.to_owned(), "outcome" => outcome)
                .increment(1);
        };
        match result {
            Ok(result) if result.acquired && result.fencing_token == token => {
                outcome("ok");
                if term.is_late(received) {
                    warn!(role, owner, token = %token, latency = ?(received - sent),
                        spare = ?term.deadline().saturating_duration_since(received),
                        "renewed late: the local deadline was close");
                } else {
                    debug!(role, owner, token = %token, "renewed");
                }
                term.renewed(&self.options, sent, &result);
                None
            }
            Ok(result) => {
                outcome("lost");
                if result.acquired {
                    warn!(role, owner, token = %token, new_token = %result.fencing_token,
                        reason = "the term lapsed and a new one began", "leadership lost");
                } else {
                    warn!(role, owner, token = %token, holder = %result.holder,
                        holder_token = %result.fencing_token,
                        reason = "another owner holds the lease", "leadership lost");
                }
                Some(TermEnd::Lost(Some(Answer {
                    result,
                    sent,
                    received,
                })))
            }
            Err(error) => {
                outcome("failed");
                let retry =
                    self.jittered(self.options.retry_interval.min(self.options.renew_interval));
                warn!(role, owner, token = %token, %error, retry_in = ?retry,
                    deadline_in = ?term.deadline().saturating_duration_since(received),
                    "renewal failed; retrying after a store error");
                term.next_renew = received + retry;
                None
            }
        }
    }

    /// Ends a term: cancels `leadership` and says so once, waits for the work, and on
    /// shutdown or work returning lets a renewal in flight answer, then releases.
    async fn end_term<T: WorkOutcome>(
        &self,
        role: &str,
        term: &Term,
        leadership: &CancellationToken,
        task: JoinHandle<T>,
        renewal: Option<AttemptFuture<'_>>,
        end: TermEnd,
    ) -> TermEnd {
        leadership.cancel();
        self.deadline.send_replace(None);
        // Watchers learn of the loss now, not when the work gets round to returning.
        match &end {
            TermEnd::Lost(Some(answer)) if !answer.result.acquired => {
                self.publish_follower(&answer.result)
            }
            _ => {
                self.state
                    .send_replace(ElectionState::Follower { holder: None });
            }
        }
        metrics::gauge!("tenure_is_leader", "role" => role.to_owned()).set(0.0);
        match end {
            TermEnd::Lost(answer) => {
                // The term is over whatever a renewal in flight answers.
                drop(renewal);
                self.await_work(role, term.token, task).await;
                TermEnd::Lost(answer)
            }
            TermEnd::Shutdown => {
                let ((), held) = tokio::join!(
                    self.await_work(role, term.token, task),
                    self.settle(term, renewal)
                );
                self.give_up(role, held).await;
                TermEnd::Shutdown
            }
            TermEnd::WorkReturned(outcome) => {
                // The work has returned: `task` is finished, nothing to wait for.
                let held = self.settle(term, renewal).await;
                self.give_up(role, held).await;
                TermEnd::WorkReturned(outcome)
            }
            TermEnd::HandOff(request) => {
                let ((), held) = tokio::join!(
                    self.await_work(role, term.token, task),
                    self.settle(term, renewal)
                );
                let handed = match held {
                    Some(held) => {
                        self.hand_over(role, &held, request.successor.as_deref())
                            .await
                    }
                    None => Ok(false),
                };
                let _ = request.answer.send(handed);
                // Contend again: queued behind the successor, or renewing the term when
                // nobody took it.
                TermEnd::Lost(None)
            }
        }
    }

    /// Waits for the work of an ended term; a failure or panic there is logged, since
    /// the term is over anyway.
    async fn await_work<T: WorkOutcome>(
        &self,
        role: &str,
        token: FencingToken,
        task: JoinHandle<T>,
    ) {
        if let Err(error) = work_outcome(task.await) {
            error!(role, owner = %self.options.owner_id, token = %token, %error,
                "leader work failed after leadership ended");
        }
    }

    /// Lets a renewal still in flight answer (bounded by the term's deadline) before the
    /// term is released, and returns the term to release, if the store may still hold
    /// one for us. Until it answers, the renewal may hold the store (SQLite's writer slot
    /// and the file's write lock, which the release would queue behind), and one that
    /// reached the store after the release would start a new term nobody leads.
    async fn settle(&self, term: &Term, renewal: Option<AttemptFuture<'_>>) -> Option<Term> {
        let mut held = term.clone();
        let Some(renewal) = renewal else {
            return Some(held);
        };
        match tokio::time::timeout_at(term.deadline(), renewal).await {
            Ok(Attempt {
                sent,
                result: Ok(result),
                ..
            }) => {
                if !result.acquired {
                    // Another owner holds the lease: there is nothing of ours to release.
                    return None;
                }
                // Renewed, or a new term began: either way it is ours to release.
                held.renewed(&self.options, sent, &result);
            }
            // Failed or unanswered: release what we held, as far as we know.
            Ok(Attempt { result: Err(_), .. }) | Err(_) => {}
        }
        Some(held)
    }

    /// Gives up for good what `settle` left: releases the term, or, when the store
    /// answered that another owner holds it (and so queued us), leaves the queue.
    async fn give_up(&self, role: &str, held: Option<Term>) {
        match held {
            Some(held) => {
                self.release(role, &held).await;
            }
            None => self.leave_queue(role).await,
        }
    }

    /// Takes the waiting handoff request if it is for the term `token`; one for another
    /// term (the caller saw an earlier one) is answered `false`.
    fn take_handoff(&self, token: FencingToken) -> Option<HandoffRequest> {
        let request = self.handoff.lock().take()?;
        if request.token == token {
            return Some(request);
        }
        let _ = request.answer.send(Ok(false));
        None
    }

    /// Ends the term in one store step that begins the successor's: the named one, or
    /// the oldest waiting. Bounded by the term's local deadline. Whether it
    /// passed; when it did not, the term is still ours and contending renews it.
    async fn hand_over(&self, role: &str, term: &Term, successor: Option<&str>) -> Result<bool> {
        let owner = self.options.owner_id.as_str();
        let token = term.token;
        let step = self.store.hand_over(role, owner, token, successor);
        match tokio::time::timeout_at(term.deadline(), step).await {
            Ok(Ok(handed)) => {
                if handed {
                    info!(role, owner, token = %token, ?successor, "handed over");
                } else {
                    info!(role, owner, token = %token, ?successor, "no successor waiting; leading on");
                }
                Ok(handed)
            }
            Ok(Err(error)) => {
                self.pending_releases.lock().insert(role.to_owned(), token);
                Err(error)
            }
            Err(_) => {
                self.pending_releases.lock().insert(role.to_owned(), token);
                Err(Error::store_msg(
                    "elector",
                    "the handoff got no answer before the term's local deadline",
                ))
            }
        }
    }

    /// Releases the term, giving up at its local deadline (the lease is gone by then).
    /// Returns whether the store answered; a release that failed or timed out may still
    /// land, so its token is remembered as pending until the store shows another.
    async fn release(&self, role: &str, term: &Term) -> bool {
        let owner = self.options.owner_id.as_str();
        let token = term.token;
        let answered =
            tokio::time::timeout_at(term.deadline(), self.store.release(role, owner, token)).await;
        match answered {
            Ok(Ok(released)) => {
                if released {
                    info!(role, owner, token = %token, "released");
                } else {
                    debug!(role, owner, token = %token, "release found the term already over");
                }
                self.pending_releases.lock().remove(role);
                return true;
            }
            Ok(Err(error)) => {
                warn!(role, owner, token = %token, %error,
                    "release failed and may still land; the lease expires on its own")
            }
            Err(_) => {
                warn!(role, owner, token = %token,
                    "release timed out and may still land; the lease expires on its own")
            }
        }
        self.pending_releases.lock().insert(role.to_owned(), token);
        false
    }

    /// Whether a release of `role`'s term `token` may still land. A pending release of
    /// another term is forgotten: the store has moved past it (tokens only grow), so it
    /// can no longer end anything.
    fn release_may_land(&self, role: &str, token: FencingToken) -> bool {
        let mut pending = self.pending_releases.lock();
        match pending.get(role) {
            Some(pending_token) if *pending_token == token => true,
            Some(_) => {
                pending.remove(role);
                false
            }
            None => false,
        }
    }

    fn jittered(&self, base: Duration) -> Duration {
        let jitter = self.options.retry_jitter;
        if jitter == 0.0 {
            return base;
        }
        let factor = self.rng.lock().random_range(1.0 - jitter..=1.0 + jitter);
        base.mul_f64(factor)
    }
}

/// The answer of the renewal in flight; never ready while there is none.
async fn in_flight(renewal: &mut Option<AttemptFuture<'_>>) -> Attempt {
    match renewal {
        Some(attempt) => attempt.await,
        None => std::future::pending().await,
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
