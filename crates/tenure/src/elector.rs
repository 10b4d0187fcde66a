//! Fenced leader election on top of any [`LeaseStore`].
//!
//! **Guarantees.** For one role, at most one elector's `leadership` is live at any store
//! time, provided the elector's process is not paused and its monotonic clock does not
//! run slower than the store's by more than `max_clock_drift`: the elector cancels
//! `leadership` at `sent + lease_ttl * (1 - max_clock_drift)`, where `sent` is the
//! instant just before its last successful acquire or renew was sent, whatever the store
//! is doing. Each term runs `work` with a fencing token larger than every earlier one.
//!
//! **Non-guarantees.** A process that is paused (GC, SIGSTOP, a frozen VM) can still act
//! after its lease has gone: it has no running code to notice. Only fences, which reject
//! writes stamped with an older token, stop such a leader. Clock *offset* between hosts
//! does not matter (all expiry is judged on store time); clock *rate* beyond the drift
//! bound does.

use std::future::Future;
use std::hash::BuildHasher;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::error::BoxError;
use crate::lease::validate_name;
use crate::{Error, FencingToken, LeaseResult, LeaseStore, Result};

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
    /// How often the leader renews. Default 10 s; must be below the local deadline
    /// window `lease_ttl * (1 - max_clock_drift)`.
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
        }
    }
}

/// `host-pid-random`: unique per process incarnation.
pub fn default_owner_id() -> String {
    crate::owner::host_owner_id()
}

impl LeaseLeaderOptions {
    /// Checks the options; the error names the option and the rule it breaks.
    pub fn validate(&self) -> Result<()> {
        validate_name("owner_id", &self.owner_id)?;
        for (field, value) in [
            ("lease_ttl", self.lease_ttl),
            ("renew_interval", self.renew_interval),
            ("retry_interval", self.retry_interval),
        ] {
            if value.is_zero() {
                return Err(Error::invalid(field, "must be greater than zero"));
            }
        }
        if !(0.0..0.5).contains(&self.max_clock_drift) {
            return Err(Error::invalid(
                "max_clock_drift",
                format!("{} must be in [0, 0.5)", self.max_clock_drift),
            ));
        }
        if !(0.0..=1.0).contains(&self.retry_jitter) {
            return Err(Error::invalid(
                "retry_jitter",
                format!("{} must be in [0, 1]", self.retry_jitter),
            ));
        }
        if self.renew_interval >= self.lease_ttl {
            return Err(Error::invalid(
                "renew_interval",
                format!(
                    "renew_interval ({:?}) must be less than lease_ttl ({:?})",
                    self.renew_interval, self.lease_ttl
                ),
            ));
        }
        if self.work_grace >= self.local_window() {
            return Err(Error::invalid(
                "work_grace",
                format!(
                    "work_grace ({:?}) must be less than lease_ttl * (1 - max_clock_drift) ({:?})",
                    self.work_grace,
                    self.local_window()
                ),
            ));
        }
        if !self.work_grace.is_zero() && self.renew_interval >= self.leadership_window() {
            return Err(Error::invalid(
                "renew_interval",
                format!(
                    "renew_interval ({:?}) must be less than lease_ttl * (1 - max_clock_drift) - work_grace ({:?})",
                    self.renew_interval,
                    self.leadership_window()
                ),
            ));
        }
        if self.renew_interval >= self.local_window() {
            return Err(Error::invalid(
                "renew_interval",
                format!(
                    "renew_interval ({:?}) must be less than lease_ttl * (1 - max_clock_drift) ({:?})",
                    self.renew_interval,
                    self.local_window()
                ),
            ));
        }
        Ok(())
    }

    /// How long after sending a successful request the elector still trusts its term.
    pub fn local_window(&self) -> Duration {
        self.lease_ttl.mul_f64(1.0 - self.max_clock_drift)
    }

    /// How long after sending a successful request the elector keeps `leadership`
    /// uncancelled: the local window less `work_grace`.
    pub fn leadership_window(&self) -> Duration {
        self.local_window().saturating_sub(self.work_grace)
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
}

impl std::fmt::Debug for LeaseLeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLeaderElector")
            .field("options", &self.options)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

type RenewalFuture<'a> = std::pin::Pin<Box<dyn Future<Output = Result<LeaseResult>> + Send + 'a>>;

/// How one term ended.
enum TermEnd {
    Shutdown,
    WorkReturned(Result<()>),
    /// Lost; the answer that told us so (if any) decides what to do next.
    Lost(Option<Answer>),
}

/// A store answer and the instants around it.
struct Answer {
    result: LeaseResult,
    sent: Instant,
    received: Instant,
}

impl LeaseLeaderElector {
    /// An elector over `store`; fails with [`Error::InvalidArgument`] on bad options.
    pub fn new(store: Arc<dyn LeaseStore>, options: LeaseLeaderOptions) -> Result<Self> {
        options.validate()?;
        if options.lease_ttl < store.min_ttl() {
            return Err(Error::invalid(
                "lease_ttl",
                format!(
                    "{:?} is below the store's minimum of {:?}",
                    options.lease_ttl,
                    store.min_ttl()
                ),
            ));
        }
        // Seeded from the owner id: distinct owners get distinct jitter, and a test
        // with fixed owner ids is reproducible.
        let seed = rustc_hash::FxBuildHasher.hash_one(&options.owner_id);
        Ok(LeaseLeaderElector {
            store,
            options,
            state: watch::Sender::new(ElectionState::Idle),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
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

    /// Contends for `role` until `shutdown` fires or `work` returns while leader.
    ///
    /// After a term ends locally (the local deadline passed while the store was slow),
    /// the store may still hold this owner's lease; contending then renews it, and
    /// `work` is called again with the same token. The two calls never overlap, and
    /// fences treat them as one term.
    ///
    /// Each term calls `work(token, leadership)` once; `leadership` is cancelled when the
    /// term ends (lost, local deadline, shutdown) and the elector awaits the work before
    /// contending again, so work must return promptly once `leadership` is cancelled.
    /// Returns `Ok(())` on shutdown (after releasing the lease), or `work`'s own outcome
    /// when it returns while leading (after releasing). A panic in work comes back as
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
        let mut last: Option<Answer> = None;
        loop {
            let term = match last.take() {
                Some(answer) if answer.result.acquired => answer,
                observed => match self.contend(role, observed, shutdown).await? {
                    Some(answer) => answer,
                    None => return Ok(()),
                },
            };
            match self.lead(role, term, work, shutdown).await {
                TermEnd::Shutdown => return Ok(()),
                TermEnd::WorkReturned(outcome) => return outcome,
                TermEnd::Lost(answer) => last = answer,
            }
        }
    }

    /// Follower loop: returns the winning answer, or `None` on shutdown.
    async fn contend(
        &self,
        role: &str,
        mut observed: Option<Answer>,
        shutdown: &CancellationToken,
    ) -> Result<Option<Answer>> {
        loop {
            if let Some(answer) = observed.take() {
                self.publish_follower(&answer.result);
                let deadline = self.follower_deadline(&answer);
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return Ok(None),
                    _ = self.store.wait_for_change(role, answer.result.fencing_token, deadline) => {}
                }
            }
            let sent = Instant::now();
            // An answer arriving after the local window could not start a usable term
            // (its deadline would have passed), so a call that has not answered by then
            // is abandoned; waiting on it could block this contender forever.
            let attempt = tokio::time::timeout(
                self.options.leadership_window(),
                self.store.try_acquire_or_renew(
                    role,
                    &self.options.owner_id,
                    self.options.lease_ttl,
                ),
            );
            let result = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(None),
                result = attempt => result,
            };
            let received = Instant::now();
            let Ok(result) = result else {
                warn!(role, owner = %self.options.owner_id, waited = ?(received - sent),
                    "acquire got no answer within the local window; retrying");
                continue;
            };
            match result {
                Ok(result) if result.acquired => {
                    return Ok(Some(Answer {
                        result,
                        sent,
                        received,
                    }))
                }
                Ok(result) => {
                    debug!(role, owner = %self.options.owner_id, holder = %result.holder,
                        token = %result.fencing_token, "lease held by another owner; waiting");
                    observed = Some(Answer {
                        result,
                        sent,
                        received,
                    });
                }
                Err(error) if !error.is_transient() => return Err(error),
                Err(error) => {
                    warn!(role, owner = %self.options.owner_id, %error,
                        "acquire failed; retrying after a store error");
                    let wait = self.jittered(self.options.retry_interval);
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// Wake at the holder's expiry (plus a margin) or after a jittered retry interval,
    /// whichever is first; a push from the store may wake us sooner.
    fn follower_deadline(&self, answer: &Answer) -> Instant {
        let retry = answer.received + self.jittered(self.options.retry_interval);
        let expiry = answer.received + answer.result.remaining() + EXPIRY_MARGIN;
        retry.min(expiry)
    }

    fn publish_follower(&self, result: &LeaseResult) {
        let holder = Some((result.holder.clone(), result.fencing_token));
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

    /// Leader loop for one term.
    async fn lead<W, Fut>(
        &self,
        role: &str,
        term: Answer,
        work: &mut W,
        shutdown: &CancellationToken,
    ) -> TermEnd
    where
        W: FnMut(FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let owner = self.options.owner_id.as_str();
        let token = term.result.fencing_token;
        let window = self.options.leadership_window();
        let mut deadline = term.sent + window;
        let mut next_renew = term.sent + self.options.renew_interval;

        info!(role, owner, token = %token, expires_in = ?term.result.remaining(), "elected");
        metrics::counter!("tenure_terms_started_total", "role" => role.to_owned()).increment(1);
        metrics::gauge!("tenure_is_leader", "role" => role.to_owned()).set(1.0);
        self.state.send_replace(ElectionState::Leader {
            fencing_token: token,
        });

        let leadership = CancellationToken::new();
        let mut task: JoinHandle<Fut::Output> = tokio::spawn(work(token, leadership.clone()));
        let mut renewal: Option<(Instant, RenewalFuture<'_>)> = None;

        let end = loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    self.stop_work(role, token, &leadership, task).await;
                    self.release(role, token, deadline).await;
                    break TermEnd::Shutdown;
                }
                joined = &mut task => {
                    leadership.cancel();
                    self.release(role, token, deadline).await;
                    break TermEnd::WorkReturned(work_outcome(joined));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    warn!(role, owner, token = %token, reason = "local deadline passed without a successful renewal",
                        "leadership lost");
                    self.state.send_replace(ElectionState::Follower { holder: None });
                    self.stop_work(role, token, &leadership, task).await;
                    break TermEnd::Lost(None);
                }
                result = async { match renewal.as_mut() { Some((_, answer)) => answer.await, None => std::future::pending().await } }, if renewal.is_some() => {
                    let Some((sent, _)) = renewal.take() else { continue };
                    let received = Instant::now();
                    metrics::histogram!("tenure_renew_latency_seconds", "role" => role.to_owned())
                        .record((received - sent).as_secs_f64());
                    match result {
                        Ok(result) if result.acquired && result.fencing_token == token => {
                            metrics::counter!("tenure_renewals_total", "role" => role.to_owned(), "outcome" => "ok").increment(1);
                            // Late: the renewal (retries included) used more than half the
                            // slack between the renew schedule and the local deadline.
                            let spare = deadline.saturating_duration_since(received);
                            let slack = window.saturating_sub(self.options.renew_interval);
                            if spare < slack / 2 {
                                warn!(role, owner, token = %token, spare = ?spare, latency = ?(received - sent),
                                    "renewed late: the local deadline was close");
                            } else {
                                debug!(role, owner, token = %token, "renewed");
                            }
                            deadline = sent + window;
                            next_renew = sent + self.options.renew_interval;
                        }
                        Ok(result) => {
                            metrics::counter!("tenure_renewals_total", "role" => role.to_owned(), "outcome" => "lost").increment(1);
                            if result.acquired {
                                warn!(role, owner, token = %token, new_token = %result.fencing_token,
                                    reason = "the term lapsed and a new one began", "leadership lost");
                            } else {
                                warn!(role, owner, token = %token, holder = %result.holder,
                                    holder_token = %result.fencing_token, reason = "another owner holds the lease",
                                    "leadership lost");
                            }
                            // Not leading from here on, even while the old work winds down.
                            if result.acquired {
                                self.state.send_replace(ElectionState::Follower { holder: None });
                            } else {
                                self.publish_follower(&result);
                            }
                            self.stop_work(role, token, &leadership, task).await;
                            break TermEnd::Lost(Some(Answer { result, sent, received }));
                        }
                        Err(error) => {
                            metrics::counter!("tenure_renewals_total", "role" => role.to_owned(), "outcome" => "failed").increment(1);
                            let retry = self.jittered(self.options.retry_interval.min(self.options.renew_interval));
                            warn!(role, owner, token = %token, %error, retry_in = ?retry,
                                deadline_in = ?deadline.saturating_duration_since(received),
                                "renewal failed; retrying after a store error");
                            next_renew = received + retry;
                        }
                    }
                }
                _ = tokio::time::sleep_until(next_renew), if renewal.is_none() => {
                    renewal = Some((
                        Instant::now(),
                        self.store.try_acquire_or_renew(role, owner, self.options.lease_ttl),
                    ));
                }
            }
        };
        metrics::gauge!("tenure_is_leader", "role" => role.to_owned()).set(0.0);
        end
    }

    /// Cancels the term's work and waits for it; a failure or panic there is logged,
    /// since the term is over anyway.
    async fn stop_work<T: WorkOutcome>(
        &self,
        role: &str,
        token: FencingToken,
        leadership: &CancellationToken,
        task: JoinHandle<T>,
    ) {
        leadership.cancel();
        // Watchers learn of the loss now, not when the work gets round to returning.
        self.state.send_if_modified(|state| {
            let was_leader = state.is_leader();
            if was_leader {
                *state = ElectionState::Follower { holder: None };
            }
            was_leader
        });
        metrics::gauge!("tenure_is_leader", "role" => role.to_owned()).set(0.0);
        if let Err(error) = work_outcome(task.await) {
            error!(role, owner = %self.options.owner_id, token = %token, %error,
                "leader work failed after leadership ended");
        }
    }

    /// Releases the term, giving up at the local deadline (the lease is gone by then).
    async fn release(&self, role: &str, token: FencingToken, deadline: Instant) {
        let owner = self.options.owner_id.as_str();
        match tokio::time::timeout_at(deadline, self.store.release(role, owner, token)).await {
            Ok(Ok(true)) => info!(role, owner, token = %token, "released"),
            Ok(Ok(false)) => {
                debug!(role, owner, token = %token, "release found the term already over")
            }
            Ok(Err(error)) => {
                warn!(role, owner, token = %token, %error, "release failed; the lease expires on its own")
            }
            Err(_) => {
                warn!(role, owner, token = %token, "release timed out; the lease expires on its own")
            }
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
