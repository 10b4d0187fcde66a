//! The fenced elector, deterministically: paused tokio time, the in-memory store on a
//! [`TokioClock`] (so store expiry and the elector's timers move together), and one
//! interceptor whose switches hang, stall, fail, hold, lapse, steal or shorten calls.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::{
    Clock, ElectionState, Error, Fence, FencingToken, InMemoryLeaseStore, LeaseLeaderElector,
    LeaseLeaderOptions, LeaseResult, LeaseStore, Result, TokioClock,
};
use tenure_testkit::MustAnswer;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const ROLE: &str = "reports";
const LEDGER: &str = "ledger";

fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// The paused-time clock a test starts at, and the in-memory store on it (so store
/// expiry and the elector's timers move together).
fn clock_and_store() -> (TokioClock, Arc<InMemoryLeaseStore>) {
    let clock = TokioClock::starting_at(start());
    let store = Arc::new(InMemoryLeaseStore::with_clock(clock.clone()));
    (clock, store)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn options(owner: &str, ttl: Duration, renew: Duration, retry: Duration) -> LeaseLeaderOptions {
    LeaseLeaderOptions {
        owner_id: owner.to_owned(),
        lease_ttl: ttl,
        renew_interval: renew,
        retry_interval: retry,
        ..Default::default()
    }
}

/// ttl 10 s, renew 3 s, retry 1 s: the shape most tests use.
fn standard(owner: &str) -> LeaseLeaderOptions {
    options(owner, secs(10), secs(3), secs(1))
}

fn elector(store: Arc<dyn LeaseStore>, options: LeaseLeaderOptions) -> Arc<LeaseLeaderElector> {
    Arc::new(LeaseLeaderElector::new(store, options).unwrap())
}

/// Waits (in virtual time, bounded) until the elector's state satisfies `pred`.
async fn wait_state(
    rx: &mut watch::Receiver<ElectionState>,
    what: &str,
    pred: impl FnMut(&ElectionState) -> bool,
) -> ElectionState {
    match tokio::time::timeout(secs(600), rx.wait_for(pred)).await {
        Ok(Ok(state)) => state.clone(),
        Ok(Err(_)) => panic!("elector dropped while waiting for {what}"),
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

async fn wait_leader(rx: &mut watch::Receiver<ElectionState>, what: &str) -> FencingToken {
    match wait_state(rx, what, ElectionState::is_leader).await {
        ElectionState::Leader { fencing_token } => fencing_token,
        other => unreachable!("{other:?}"),
    }
}

/// Waits (as [`wait_state`]) until the elector follows, and returns that state.
async fn wait_follower(rx: &mut watch::Receiver<ElectionState>, what: &str) -> ElectionState {
    wait_state(rx, what, |s| matches!(s, ElectionState::Follower { .. })).await
}

async fn join<T>(handle: JoinHandle<T>, what: &str) -> T {
    match tokio::time::timeout(secs(600), handle).await {
        Ok(Ok(value)) => value,
        Ok(Err(error)) => panic!("{what} task failed: {error}"),
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Work that admits its token to the fence, then waits for the end of its term and
/// reports the store time at which `leadership` was cancelled.
fn fenced_work(
    clock: TokioClock,
    fence: Arc<Fence>,
    cancelled_at: Arc<Mutex<Vec<(FencingToken, SystemTime)>>>,
) -> impl FnMut(FencingToken, CancellationToken) -> BoxedWork + Send + 'static {
    move |token, leadership| {
        let clock = clock.clone();
        let fence = fence.clone();
        let cancelled_at = cancelled_at.clone();
        Box::pin(async move {
            fence.admit(LEDGER, token).unwrap();
            loop {
                tokio::select! {
                    biased;
                    _ = leadership.cancelled() => {
                        cancelled_at.lock().push((token, clock.now()));
                        return;
                    }
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {
                        fence.admit(LEDGER, token).unwrap();
                    }
                }
            }
        })
    }
}

/// Fires `shutdown` and waits until each of `runs` (a handle and what it is called in a
/// panic) has returned Ok.
async fn shut_down<const N: usize>(
    shutdown: &CancellationToken,
    runs: [(JoinHandle<Result<()>>, &str); N],
) {
    shutdown.cancel();
    for (run, what) in runs {
        join(run, what).await.unwrap();
    }
}

/// A fence shared by a test's terms, and the record [`fenced_work`] keeps of them.
struct Fenced {
    fence: Arc<Fence>,
    /// The token of each term whose `leadership` was cancelled, and the store time then.
    cancelled_at: Arc<Mutex<Vec<(FencingToken, SystemTime)>>>,
}

impl Fenced {
    fn new() -> Self {
        Fenced {
            fence: Arc::new(Fence::new()),
            cancelled_at: Arc::default(),
        }
    }

    /// [`fenced_work`] on this fence, recording here.
    fn work(
        &self,
        clock: &TokioClock,
    ) -> impl FnMut(FencingToken, CancellationToken) -> BoxedWork + Send + 'static {
        fenced_work(clock.clone(), self.fence.clone(), self.cancelled_at.clone())
    }

    /// The terms cancelled so far.
    fn cancelled(&self) -> Vec<(FencingToken, SystemTime)> {
        self.cancelled_at.lock().clone()
    }
}

/// Work that does nothing until its term ends.
async fn idle(_token: FencingToken, leadership: CancellationToken) {
    leadership.cancelled().await
}

/// Runs node-a (standard options) alone on `store` with `work`, never shut down, and
/// returns what `run` returns once the work has ended by itself.
async fn run_alone<W, Fut>(store: &Arc<InMemoryLeaseStore>, work: W) -> Result<()>
where
    W: FnMut(FencingToken, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: tenure::WorkOutcome,
{
    let a = elector(store.clone(), standard("node-a"));
    join(spawn_run(&a, work, &CancellationToken::new()), "run").await
}

/// Work that returns Ok after `after`.
async fn ok_after(after: Duration) -> std::io::Result<()> {
    tokio::time::sleep(after).await;
    Ok(())
}

/// A boxed unit future, so work closures can be named in helper signatures.
type BoxedWork = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

fn spawn_run<W, Fut>(
    elector: &Arc<LeaseLeaderElector>,
    work: W,
    shutdown: &CancellationToken,
) -> JoinHandle<Result<()>>
where
    W: FnMut(FencingToken, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: tenure::WorkOutcome,
{
    let elector = elector.clone();
    let shutdown = shutdown.clone();
    tokio::spawn(async move { elector.run(ROLE, work, shutdown).await })
}

/// What [`Switches`] do to the next `try_acquire_or_renew` when armed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Twist {
    None,
    /// End the caller's live term and start a new one for the same owner before
    /// answering, so the renewal comes back with a new token.
    Lapse,
    /// End the caller's live term and give the lease to `intruder`, so the renewal
    /// answers "not acquired".
    Steal,
}

/// Switches a test flips on the in-memory store, applied to `try_acquire_or_renew` in
/// this order: `hang` (never answer: a wedged connection), `stalled_until` (wait: a
/// wedged connection that recovers), `fail_next` (fail with [`Error::Store`]),
/// `on_the_wire` (the call reaches the store only when the gate opens, whether or not
/// the caller still waits: a request already sent; `releases_on_the_wire` does the same
/// to releases), `next` (a one-shot [`Twist`]) and
/// `grant` (the store grants, and really keeps, only this fraction of the asked TTL).
/// Every granted answer is recorded with the instant it was decided.
struct Switches {
    inner: Arc<InMemoryLeaseStore>,
    clock: TokioClock,
    hang: AtomicBool,
    stalled_until: Mutex<Instant>,
    fail_next: AtomicUsize,
    failed: AtomicUsize,
    on_the_wire: Mutex<Option<watch::Receiver<bool>>>,
    /// Like `on_the_wire`, for releases.
    releases_on_the_wire: Mutex<Option<watch::Receiver<bool>>>,
    next: Mutex<Twist>,
    grant: Mutex<f64>,
    /// Store time and answer of the twisted call.
    twisted: Mutex<Option<(SystemTime, LeaseResult)>>,
    granted: Mutex<Vec<(Instant, LeaseResult)>>,
    /// Every release: its token and whether it ended the term.
    released: Mutex<Vec<(FencingToken, bool)>>,
}

impl Switches {
    /// All switches off: a plain pass-through.
    fn new(inner: Arc<InMemoryLeaseStore>, clock: &TokioClock) -> Arc<Self> {
        Arc::new(Switches {
            inner,
            clock: clock.clone(),
            hang: AtomicBool::new(false),
            stalled_until: Mutex::new(Instant::now()),
            fail_next: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            on_the_wire: Mutex::new(None),
            releases_on_the_wire: Mutex::new(None),
            next: Mutex::new(Twist::None),
            grant: Mutex::new(1.0),
            twisted: Mutex::new(None),
            granted: Mutex::new(Vec::new()),
            released: Mutex::new(Vec::new()),
        })
    }

    /// The store as seen through these switches.
    fn store(self: &Arc<Self>) -> Arc<dyn LeaseStore> {
        Arc::new(InterceptStore::new(self.inner.clone()).with(self.clone()))
    }

    fn last_granted(&self) -> LeaseResult {
        let granted = self.granted.lock();
        granted.last().expect("a granted answer").1.clone()
    }

    /// Holds the calls made from now on until the returned sender sends `true`.
    fn hold_on_the_wire(&self) -> watch::Sender<bool> {
        let (open, gate) = watch::channel(false);
        *self.on_the_wire.lock() = Some(gate);
        open
    }

    /// Holds the releases made from now on until the returned sender sends `true`.
    fn hold_releases_on_the_wire(&self) -> watch::Sender<bool> {
        let (open, gate) = watch::channel(false);
        *self.releases_on_the_wire.lock() = Some(gate);
        open
    }

    fn take_failure(&self) -> bool {
        let failing = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            self.failed.fetch_add(1, Ordering::SeqCst);
        }
        failing
    }

    /// Twists the live term of `owner` as armed, before the call reaches the store.
    async fn twist(
        inner: &InMemoryLeaseStore,
        twist: Twist,
        role: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<()> {
        if twist == Twist::None {
            return Ok(());
        }
        let info = inner.get(role).await?.expect("a lease to twist");
        assert_eq!(info.live_holder(), Some(owner), "twist only a live term");
        assert!(inner.release(role, owner, info.fencing_token).await?);
        if twist == Twist::Steal {
            let stolen = inner.try_acquire_or_renew(role, "intruder", ttl).await?;
            assert!(stolen.acquired);
        }
        Ok(())
    }

    /// Passes on `call`, a `TryAcquireOrRenew`, through the switches that are on.
    async fn acquire(&self, mut call: Call, next: Next) -> Result<LeaseResult> {
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let until = *self.stalled_until.lock();
        tokio::time::sleep_until(until).await;
        if self.take_failure() {
            return Err(Error::store_msg("memory", "injected failure"));
        }
        let twist = std::mem::replace(&mut *self.next.lock(), Twist::None);
        let Call::TryAcquireOrRenew {
            role, owner, ttl, ..
        } = &mut call
        else {
            unreachable!("only acquires and renewals are passed here")
        };
        *ttl = ttl.mul_f64(*self.grant.lock());
        let (role, owner, ttl) = (role.clone(), owner.clone(), *ttl);
        let gate = self.on_the_wire.lock().clone();
        let detached = gate.is_some();
        let inner = self.inner.clone();
        let decide = async move {
            if let Some(mut gate) = gate {
                let _ = gate.wait_for(|open| *open).await;
            }
            Self::twist(&inner, twist, &role, &owner, ttl).await?;
            next.run(call).await.into_lease()
        };
        let result = if detached {
            tokio::spawn(decide).await.expect("the call on the wire")?
        } else {
            decide.await?
        };
        if twist != Twist::None {
            *self.twisted.lock() = Some((self.clock.now(), result.clone()));
        }
        if result.acquired {
            self.granted.lock().push((Instant::now(), result.clone()));
        }
        Ok(result)
    }
}

#[async_trait]
impl Interceptor for Switches {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        match call {
            call @ Call::TryAcquireOrRenew { .. } => Reply::Lease(self.acquire(call, next).await),
            Call::Release { token, .. } => {
                let gate = self.releases_on_the_wire.lock().clone();
                let reply = match gate {
                    Some(mut gate) => {
                        let on_the_wire = tokio::spawn(async move {
                            let _ = gate.wait_for(|open| *open).await;
                            next.run(call).await
                        });
                        on_the_wire.await.expect("the release on the wire")
                    }
                    None => next.run(call).await,
                };
                if let Reply::Released(Ok(released)) = reply {
                    self.released.lock().push((token, released));
                }
                reply
            }
            call => next.run(call).await,
        }
    }
}

/// [`clock_and_store`], with all-off [`Switches`] in front of the store.
fn clock_store_and_switches() -> (TokioClock, Arc<InMemoryLeaseStore>, Arc<Switches>) {
    let (clock, store) = clock_and_store();
    let switches = Switches::new(store.clone(), &clock);
    (clock, store, switches)
}

/// Starts an elector with `options` on the store seen through `switches`, running
/// `work` until the returned shutdown fires: its watch (taken before it starts), that
/// shutdown and its run.
fn run_through<W, Fut>(
    switches: &Arc<Switches>,
    options: LeaseLeaderOptions,
    work: W,
) -> (
    watch::Receiver<ElectionState>,
    CancellationToken,
    JoinHandle<Result<()>>,
)
where
    W: FnMut(FencingToken, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: tenure::WorkOutcome,
{
    let elector = elector(switches.store(), options);
    let state = elector.watch();
    let shutdown = CancellationToken::new();
    let run = spawn_run(&elector, work, &shutdown);
    (state, shutdown, run)
}

async fn live_holder(store: &InMemoryLeaseStore) -> Option<(String, FencingToken)> {
    let info = store.get(ROLE).await.unwrap()?;
    info.live_holder()
        .map(|holder| (holder.to_owned(), info.fencing_token))
}

/// Setup: one in-memory store on a TokioClock; node-a alone, then node-b contending.
/// node-a's work gets token 1 and its watch shows Idle -> Leader(1); node-b's watch shows
/// Follower(holder node-a, 1); after node-a shuts down, node-b leads with token 2 and
/// node-a's watch is back to Idle.
#[tokio::test(start_paused = true)]
async fn work_runs_with_the_term_token_and_watch_shows_transitions() {
    let (_, store) = clock_and_store();
    let a = elector(store.clone(), standard("node-a"));
    let b = elector(store.clone(), standard("node-b"));
    let mut a_state = a.watch();
    let mut b_state = b.watch();
    assert_eq!(*a_state.borrow(), ElectionState::Idle);
    assert_eq!(*b_state.borrow(), ElectionState::Idle);

    tracing::info!("--- node-a is elected");
    let seen = Arc::new(Mutex::new(Vec::new()));
    // Work that records which node it runs on and under which token, then holds.
    let recording = |node: &'static str| {
        let seen = seen.clone();
        move |token, leadership: CancellationToken| {
            seen.lock().push((node, token));
            async move { leadership.cancelled().await }
        }
    };
    let shutdown_a = CancellationToken::new();
    let run_a = spawn_run(&a, recording("node-a"), &shutdown_a);
    assert_eq!(wait_leader(&mut a_state, "node-a leads").await.get(), 1);
    assert_eq!(*seen.lock(), vec![("node-a", FencingToken::from(1))]);
    assert_eq!(
        live_holder(&store).await,
        Some(("node-a".to_owned(), FencingToken::from(1)))
    );

    tracing::info!("--- node-b follows node-a");
    let shutdown_b = CancellationToken::new();
    let run_b = spawn_run(&b, recording("node-b"), &shutdown_b);
    let follower = wait_follower(&mut b_state, "node-b follows").await;
    assert_eq!(
        follower,
        ElectionState::Follower {
            holder: Some(("node-a".to_owned(), FencingToken::from(1)))
        }
    );
    // Many renewals later node-a still leads the same term and node-b still follows.
    tokio::time::sleep(secs(60)).await;
    assert_eq!(
        *a_state.borrow(),
        ElectionState::Leader {
            fencing_token: FencingToken::from(1)
        }
    );
    assert!(!b_state.borrow().is_leader());
    assert_eq!(seen.lock().len(), 1);

    tracing::info!("--- node-a shuts down, node-b takes over");
    shut_down(&shutdown_a, [(run_a, "node-a run")]).await;
    assert_eq!(*a_state.borrow(), ElectionState::Idle);
    assert_eq!(wait_leader(&mut b_state, "node-b leads").await.get(), 2);
    assert_eq!(
        *seen.lock(),
        vec![
            ("node-a", FencingToken::from(1)),
            ("node-b", FencingToken::from(2))
        ]
    );
    shut_down(&shutdown_b, [(run_b, "node-b run")]).await;
    assert_eq!(*b_state.borrow(), ElectionState::Idle);
}

/// One running incarnation of an elector in [`electors_never_run_work_concurrently`].
struct Incarnation {
    owner: String,
    shutdown: CancellationToken,
    switches: Arc<Switches>,
}

/// Setup: three electors (ttl 900 ms, renew 300 ms, retry 200 ms) on one store and
/// role, each in a loop that restarts it as a new owner when `run` returns. Work lasts a
/// token-dependent number of steps and then returns (releasing), or runs until
/// leadership is cancelled. Every 2.5 s the test either shuts the current leader down or
/// stalls its store for 2 s (so it loses at its local deadline and a contender takes over
/// after the store expiry). A shared counter of running works must never exceed one over
/// 60 terms, and the tokens of successive terms must strictly increase.
#[tokio::test(start_paused = true)]
async fn electors_never_run_work_concurrently() {
    let (clock, store) = clock_and_store();
    let running = Arc::new(AtomicUsize::new(0));
    let max_running = Arc::new(AtomicUsize::new(0));
    let terms: Arc<Mutex<Vec<(String, FencingToken)>>> = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let incarnations: Arc<Mutex<Vec<Incarnation>>> = Arc::default();

    let mut loops = Vec::new();
    for (index, node) in ["node-a", "node-b", "node-c"].into_iter().enumerate() {
        let (store, clock) = (store.clone(), clock.clone());
        let (running, max_running, terms, stop, incarnations) = (
            running.clone(),
            max_running.clone(),
            terms.clone(),
            stop.clone(),
            incarnations.clone(),
        );
        loops.push(tokio::spawn(async move {
            let mut incarnation = 0;
            while !stop.is_cancelled() {
                incarnation += 1;
                // A restarted process is a new owner.
                let owner = format!("{node}-{incarnation}");
                let stall = Switches::new(store.clone(), &clock);
                let elector = elector(
                    stall.store(),
                    options(
                        &owner,
                        Duration::from_millis(900),
                        Duration::from_millis(300),
                        Duration::from_millis(200),
                    ),
                );
                let shutdown = stop.child_token();
                incarnations.lock().push(Incarnation {
                    owner: owner.clone(),
                    shutdown: shutdown.clone(),
                    switches: stall,
                });
                let (running, max_running, terms) =
                    (running.clone(), max_running.clone(), terms.clone());
                let work_owner = owner.clone();
                let outcome = elector
                    .run(
                        ROLE,
                        move |token: FencingToken, leadership: CancellationToken| {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            max_running.fetch_max(now, Ordering::SeqCst);
                            terms.lock().push((work_owner.clone(), token));
                            let running = running.clone();
                            // Every third term runs until it loses; others return.
                            let steps = if token.get() % 3 == 0 {
                                u64::MAX
                            } else {
                                token.get() % 7 + 1
                            };
                            async move {
                                let mut step = 0;
                                while step < steps {
                                    tokio::select! {
                                        biased;
                                        _ = leadership.cancelled() => break,
                                        _ = tokio::time::sleep(Duration::from_millis(130)) => step += 1,
                                    }
                                }
                                running.fetch_sub(1, Ordering::SeqCst);
                            }
                        },
                        shutdown,
                    )
                    .await;
                assert!(outcome.is_ok(), "{owner}: {outcome:?}");
                // A restart takes a moment, so the waiting contenders get their turn.
                tokio::time::sleep(Duration::from_millis(40 + 90 * index as u64)).await;
            }
        }));
    }

    tracing::info!("--- many terms: work returns, the leader shuts down or stalls");
    let (mut round, mut stalls, mut shutdowns) = (0, 0, 0);
    while terms.lock().len() < 60 {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        round += 1;
        let Some((owner, _)) = live_holder(&store).await else {
            continue;
        };
        let incarnations = incarnations.lock();
        let Some(leader) = incarnations.iter().find(|i| i.owner == owner) else {
            continue;
        };
        if round % 2 == 0 {
            leader.shutdown.cancel();
            shutdowns += 1;
        } else {
            *leader.switches.stalled_until.lock() = Instant::now() + secs(2);
            stalls += 1;
        }
    }
    stop.cancel();
    for handle in loops {
        join(handle, "elector loop").await;
    }

    assert_eq!(max_running.load(Ordering::SeqCst), 1);
    assert_eq!(running.load(Ordering::SeqCst), 0);
    let terms = terms.lock();
    for pair in terms.windows(2) {
        assert!(
            pair[0].1 < pair[1].1,
            "tokens of successive terms must increase: {pair:?}"
        );
    }
    let nodes: std::collections::BTreeSet<&str> = terms.iter().map(|(o, _)| &o[..6]).collect();
    assert_eq!(nodes.len(), 3, "every node led at some point: {terms:?}");
    assert!(
        stalls > 3 && shutdowns > 3,
        "{stalls} stalls, {shutdowns} shutdowns"
    );
}

/// Setup: ttl 10 s, renew 3 s, max drift 1 % (local window 9.9 s). node-a leads through
/// Switches; node-b contends on the plain store. After two renewals node-a's
/// store hangs. node-a's `leadership` must be cancelled at its last successful request
/// + 9.9 s, before the store expiry of that answer; node-b then takes over with token
/// 2; node-a's late write with token 1 is rejected by the fence.
#[tokio::test(start_paused = true)]
async fn hung_renewals_cancel_leadership_before_store_expiry() {
    let (clock, store, hanging) = clock_store_and_switches();
    let fenced = Fenced::new();
    let a = elector(hanging.store(), standard("node-a"));
    let b = elector(store.clone(), standard("node-b"));
    let (mut a_state, mut b_state) = (a.watch(), b.watch());
    let shutdown = CancellationToken::new();

    tracing::info!("--- node-a leads, node-b follows");
    let run_a = spawn_run(&a, fenced.work(&clock), &shutdown);
    let token_a = wait_leader(&mut a_state, "node-a leads").await;
    assert_eq!(token_a.get(), 1);
    let run_b = spawn_run(&b, fenced.work(&clock), &shutdown);
    wait_follower(&mut b_state, "node-b follows").await;
    tokio::time::sleep(Duration::from_millis(7_500)).await;

    tracing::info!("--- node-a's store hangs");
    hanging.hang.store(true, Ordering::SeqCst);
    let last = hanging.last_granted();
    assert_eq!(last.fencing_token, token_a);
    assert!(
        last.now >= start() + secs(6),
        "node-a renewed at least twice"
    );
    let token_b = wait_leader(&mut b_state, "node-b takes over").await;
    let took_over = clock.now();
    assert_eq!(token_b.get(), 2);

    let cancelled = fenced.cancelled();
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    let (token, at) = cancelled[0];
    assert_eq!(token, token_a);
    // The last successful request was sent (and, with no latency, decided) at `last.now`.
    assert_eq!(at, last.now + Duration::from_millis(9_900));
    assert!(at < last.expires_at, "{at:?} vs {:?}", last.expires_at);
    assert!(took_over >= last.expires_at);
    assert!(!a_state.borrow().is_leader());

    tracing::info!("--- node-a's late write is fenced");
    assert_eq!(fenced.fence.highest(LEDGER), Some(token_b));
    match fenced.fence.admit(LEDGER, token_a) {
        Err(Error::Fenced { presented, highest }) => {
            assert_eq!(presented, token_a);
            assert_eq!(highest, token_b);
        }
        other => panic!("late write must be fenced, got {other:?}"),
    }

    shut_down(&shutdown, [(run_a, "node-a run"), (run_b, "node-b run")]).await;
}

/// Waits until the elector leads its first term (token 1), lets it renew for 4 s, then
/// makes its next renewal through `twist` come back with a new token.
async fn first_term_then_lapse(state: &mut watch::Receiver<ElectionState>, twist: &Switches) {
    assert_eq!(wait_leader(state, "first term").await.get(), 1);
    tokio::time::sleep(secs(4)).await;
    tracing::info!("--- the next renewal sees a new token");
    *twist.next.lock() = Twist::Lapse;
}

/// Setup: node-a leads through Switches (ttl 10 s, renew 3 s). The store makes one
/// renewal come back acquired with a new token (the term lapsed and a new one began).
/// The old work takes 2 s to wind down after cancellation; the elector must await it
/// before calling work with the new token.
#[tokio::test(start_paused = true)]
async fn renewal_with_a_new_token_awaits_the_old_work_first() {
    let (clock, store, twist) = clock_store_and_switches();
    let log: Arc<Mutex<Vec<(String, SystemTime)>>> = Arc::default();
    let (work_log, work_clock) = (log.clone(), clock.clone());
    let (mut state, shutdown, run) = run_through(
        &twist,
        standard("node-a"),
        move |token: FencingToken, leadership: CancellationToken| {
            let (log, clock) = (work_log.clone(), work_clock.clone());
            log.lock().push((format!("start {token}"), clock.now()));
            async move {
                leadership.cancelled().await;
                log.lock().push((format!("cancelled {token}"), clock.now()));
                tokio::time::sleep(secs(2)).await;
                log.lock().push((format!("end {token}"), clock.now()));
            }
        },
    );
    first_term_then_lapse(&mut state, &twist).await;
    let second = wait_state(
        &mut state,
        "second term",
        |s| matches!(s, ElectionState::Leader { fencing_token } if fencing_token.get() == 2),
    )
    .await;
    assert_eq!(
        second,
        ElectionState::Leader {
            fencing_token: FencingToken::from(2)
        }
    );
    tokio::time::sleep(Duration::from_millis(1)).await;

    let (twisted_at, answer) = twist.twisted.lock().clone().expect("twisted renewal");
    assert!(answer.acquired);
    assert_eq!(answer.fencing_token.get(), 2);
    let log = log.lock().clone();
    let names: Vec<&str> = log.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["start 1", "cancelled 1", "end 1", "start 2"]);
    assert_eq!(
        log[1].1, twisted_at,
        "old leadership cancelled at the answer"
    );
    assert!(log[2].1 <= log[3].1, "old work finished before the new one");
    assert_eq!(log[3].1, twisted_at + secs(2));

    shut_down(&shutdown, [(run, "run")]).await;
    assert_eq!(live_holder(&store).await, None);
}

/// Setup: node-a leads through Switches (ttl 10 s, renew 3 s). The store hands the
/// lease to `intruder` just before one renewal, which therefore answers "not acquired".
/// `leadership` must be cancelled at that instant (not at the local deadline); node-a
/// then follows the intruder and takes over with token 3 once its lease expires.
#[tokio::test(start_paused = true)]
async fn renewal_not_acquired_cancels_leadership_at_once() {
    let (clock, _, twist) = clock_store_and_switches();
    let fenced = Fenced::new();
    let (mut state, shutdown, run) = run_through(&twist, standard("node-a"), fenced.work(&clock));
    assert_eq!(wait_leader(&mut state, "first term").await.get(), 1);
    tokio::time::sleep(Duration::from_millis(4_500)).await;

    tracing::info!("--- an intruder takes the lease before node-a's renewal");
    *twist.next.lock() = Twist::Steal;
    let follower = wait_state(&mut state, "node-a follows the intruder", |s| {
        matches!(s, ElectionState::Follower { holder: Some(_) })
    })
    .await;
    assert_eq!(
        follower,
        ElectionState::Follower {
            holder: Some(("intruder".to_owned(), FencingToken::from(2)))
        }
    );
    let (twisted_at, answer) = twist.twisted.lock().clone().expect("twisted renewal");
    assert!(!answer.acquired);
    assert_eq!(answer.holder, "intruder");
    assert_eq!(
        fenced.cancelled(),
        vec![(FencingToken::from(1), twisted_at)],
        "cancelled at the answer, not at the local deadline"
    );

    tracing::info!("--- the intruder never renews; node-a takes over at its expiry");
    assert_eq!(wait_leader(&mut state, "node-a again").await.get(), 3);
    let retaken = clock.now();
    assert!(retaken >= answer.expires_at);
    assert!(retaken <= answer.expires_at + Duration::from_millis(50));

    shut_down(&shutdown, [(run, "run")]).await;
}

/// Waits until the elector leads, and checks that it took over with `token` at once
/// (within 10 ms of `released`): through the store's push, not a retry or the TTL.
async fn takes_over_at_once(
    state: &mut watch::Receiver<ElectionState>,
    what: &str,
    released: Instant,
    token: u64,
) {
    let led = wait_leader(state, what).await;
    let handover = released.elapsed();
    assert_eq!(led.get(), token);
    assert!(
        handover < Duration::from_millis(10),
        "push takeover took {handover:?}"
    );
}

/// Setup: retry_interval 60 s, ttl 30 s. node-a leads, node-b waits as follower; node-a's
/// work returns, releasing the lease. Then node-c follows node-b and node-b shuts down.
/// Each time the waiting contender must take over at once through the store's push, in
/// far less than the retry interval or the remaining TTL.
#[tokio::test(start_paused = true)]
async fn released_lease_is_taken_over_at_once() {
    let (_, store) = clock_and_store();
    let slow = |owner: &str| options(owner, secs(30), secs(10), secs(60));
    let a = elector(store.clone(), slow("node-a"));
    let b = elector(store.clone(), slow("node-b"));
    let c = elector(store.clone(), slow("node-c"));
    let (mut a_state, mut b_state, mut c_state) = (a.watch(), b.watch(), c.watch());

    tracing::info!("--- node-a leads, node-b follows");
    let shutdown_a = CancellationToken::new();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let mut finish_rx = Some(finish_rx);
    let run_a = spawn_run(
        &a,
        move |_token, _leadership| {
            let finish = finish_rx.take().expect("one term");
            async move {
                let _ = finish.await;
            }
        },
        &shutdown_a,
    );
    assert_eq!(wait_leader(&mut a_state, "node-a leads").await.get(), 1);
    let shutdown_b = CancellationToken::new();
    let run_b = spawn_run(&b, idle, &shutdown_b);
    wait_follower(&mut b_state, "node-b follows").await;
    // node-b is now in a long wait: the lease has ~30 s left, the retry is ~60 s.
    tokio::time::sleep(secs(5)).await;

    tracing::info!("--- node-a's work returns: the lease is released");
    let released = Instant::now();
    finish_tx.send(()).unwrap();
    takes_over_at_once(&mut b_state, "node-b leads", released, 2).await;
    join(run_a, "node-a run").await.unwrap();

    tracing::info!("--- node-c follows node-b; node-b shuts down");
    let shutdown_c = CancellationToken::new();
    let run_c = spawn_run(&c, idle, &shutdown_c);
    wait_follower(&mut c_state, "node-c follows").await;
    tokio::time::sleep(secs(12)).await;
    let released = Instant::now();
    shutdown_b.cancel();
    takes_over_at_once(&mut c_state, "node-c leads", released, 3).await;
    join(run_b, "node-b run").await.unwrap();
    shut_down(&shutdown_c, [(run_c, "node-c run")]).await;
}

/// Setup: retry_interval 60 s, ttl 10 s, renew 3 s. node-a leads through Switches,
/// node-b follows on the plain store. node-a's renewals start hanging; node-b must take
/// over within ttl + a small margin of node-a's last successful renewal (it wakes at the
/// holder's expiry), not ttl + the 60 s retry interval.
#[tokio::test(start_paused = true)]
async fn stalled_leader_is_replaced_within_the_ttl() {
    let (clock, store, hanging) = clock_store_and_switches();
    let a = elector(
        hanging.store(),
        options("node-a", secs(10), secs(3), secs(60)),
    );
    let b = elector(
        store.clone(),
        options("node-b", secs(10), secs(3), secs(60)),
    );
    let (mut a_state, mut b_state) = (a.watch(), b.watch());
    let shutdown = CancellationToken::new();
    let run_a = spawn_run(&a, idle, &shutdown);
    wait_leader(&mut a_state, "node-a leads").await;
    let run_b = spawn_run(&b, idle, &shutdown);
    tokio::time::sleep(Duration::from_millis(13_500)).await;
    assert!(!b_state.borrow().is_leader());

    tracing::info!("--- node-a stalls");
    hanging.hang.store(true, Ordering::SeqCst);
    let last = hanging.last_granted();
    assert!(
        last.now > start() + secs(10),
        "node-a renewed several times"
    );
    assert_eq!(
        wait_leader(&mut b_state, "node-b takes over").await.get(),
        2
    );
    let took_over = clock.now();
    let after = took_over.duration_since(last.now).unwrap();
    assert!(after >= secs(10), "{after:?}");
    assert!(
        after <= secs(10) + Duration::from_millis(50),
        "takeover {after:?} after the last renewal"
    );

    shut_down(&shutdown, [(run_a, "node-a run"), (run_b, "node-b run")]).await;
}

/// Setup: one elector leading alone; `shutdown` fires while it leads. `run` returns Ok
/// after the work saw `leadership` cancelled, and the store shows no live holder (the
/// token counter stays).
#[tokio::test(start_paused = true)]
async fn shutdown_releases_the_lease() {
    let (clock, store) = clock_and_store();
    let a = elector(store.clone(), standard("node-a"));
    let mut state = a.watch();
    let stopped = Arc::new(AtomicBool::new(false));
    let work_stopped = stopped.clone();
    let shutdown = CancellationToken::new();
    let run = spawn_run(
        &a,
        move |_token, leadership: CancellationToken| {
            let stopped = work_stopped.clone();
            async move {
                leadership.cancelled().await;
                stopped.store(true, Ordering::SeqCst);
            }
        },
        &shutdown,
    );
    wait_leader(&mut state, "leads").await;
    tokio::time::sleep(secs(20)).await;
    let at = clock.now();
    shut_down(&shutdown, [(run, "run")]).await;
    assert_eq!(clock.now(), at, "shutdown releases without waiting");
    assert!(stopped.load(Ordering::SeqCst));
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.live_holder(), None);
    assert_eq!(info.fencing_token.get(), 1);
    assert_eq!(*state.borrow(), ElectionState::Idle);
}

/// Setup: one elector whose work returns Ok after 15 s (several renewals). `run` returns
/// Ok and the lease is released.
#[tokio::test(start_paused = true)]
async fn work_returning_ok_releases_and_run_returns_ok() {
    let (clock, store) = clock_and_store();
    run_alone(&store, |_, _| ok_after(secs(15))).await.unwrap();
    assert_eq!(clock.now(), start() + secs(15));
    assert_eq!(live_holder(&store).await, None);
}

/// Setup: an elector advertising a URL leads while an observer watches. Each term it
/// starts carries the URL (the store shows it, the observer sees the leader with it);
/// after the work returns and the lease is released, the observer sees no leader.
#[tokio::test(start_paused = true)]
async fn an_elector_advertises_its_value_with_each_term() {
    let (_, store) = clock_and_store();
    let url = "http://10.0.0.7:8080";
    let a = elector(
        store.clone(),
        LeaseLeaderOptions {
            advertise: Some(url.to_owned()),
            ..standard("node-a")
        },
    );
    let mut observer = tenure::observe(store.clone(), ROLE).unwrap();
    assert_eq!(observer.changed().await.unwrap(), None);
    let run = spawn_run(&a, |_, _| ok_after(secs(15)), &CancellationToken::new());
    let leader = observer.changed().await.unwrap().expect("a leader");
    assert_eq!(
        (leader.owner.as_str(), leader.value.as_deref()),
        ("node-a", Some(url))
    );
    assert_eq!(
        store.get(ROLE).await.unwrap().unwrap().value.as_deref(),
        Some(url)
    );
    join(run, "run").await.unwrap();
    assert_eq!(observer.changed().await.unwrap(), None, "released");
}

/// Setup: one elector whose work returns an error. `run` returns `Error::Work` carrying
/// the work's error, and the lease is released so a successor gets in at once.
#[tokio::test(start_paused = true)]
async fn work_returning_err_is_error_work_and_releases() {
    let (_, store) = clock_and_store();
    let outcome = run_alone(&store, |_token, _leadership| async move {
        tokio::time::sleep(secs(1)).await;
        Err(std::io::Error::other("disk full"))
    })
    .await;
    match outcome {
        Err(Error::Work(source)) => assert_eq!(source.to_string(), "disk full"),
        other => panic!("expected Error::Work, got {other:?}"),
    }
    assert_eq!(live_holder(&store).await, None);
    let next = store.try_acquire(ROLE, "node-b", secs(10)).await;
    assert!(next.acquired);
    assert_eq!(next.fencing_token.get(), 2);
}

/// Setup: one elector whose work panics. `run` returns `Error::WorkPanicked` with the
/// panic message (the caller does not crash) and the lease is released.
#[tokio::test(start_paused = true)]
async fn work_panicking_is_an_error_not_a_crash() {
    let (_, store) = clock_and_store();
    let outcome = run_alone(&store, |token: FencingToken, _leadership| async move {
        tokio::time::sleep(secs(1)).await;
        if token.get() > 0 {
            panic!("work blew up with token {token}");
        }
    })
    .await;
    match outcome {
        Err(Error::WorkPanicked(message)) => {
            assert_eq!(message, "work blew up with token 1")
        }
        other => panic!("expected Error::WorkPanicked, got {other:?}"),
    }
    assert_eq!(live_holder(&store).await, None);
}

/// Setup: an elector through failing Switches (ttl 10 s, renew 3 s, retry 1 s). Phase 1: the
/// first five acquires fail; it keeps retrying and leads. Phase 2: two renewals in a row
/// fail (less than the local window); the term survives. Phase 3: every call fails for
/// 30 s; the term is lost at the local deadline, `run` keeps going and leads again with a
/// new token once the store answers again.
#[tokio::test(start_paused = true)]
async fn transient_store_errors_never_end_run() {
    let (clock, store, flaky) = clock_store_and_switches();
    flaky.fail_next.store(5, Ordering::SeqCst);
    let terms = Arc::new(Mutex::new(Vec::new()));
    let work_terms = terms.clone();
    let (mut state, shutdown, run) = run_through(
        &flaky,
        standard("node-a"),
        move |token, leadership: CancellationToken| {
            work_terms.lock().push(token);
            async move { leadership.cancelled().await }
        },
    );

    tracing::info!("--- acquires fail five times");
    assert_eq!(wait_leader(&mut state, "leads after errors").await.get(), 1);
    assert_eq!(flaky.failed.load(Ordering::SeqCst), 5);
    assert!(
        clock.now() >= start() + secs(3),
        "it waited between retries"
    );

    tracing::info!("--- two renewals fail; the term survives");
    tokio::time::sleep(Duration::from_millis(500)).await;
    flaky.fail_next.store(2, Ordering::SeqCst);
    tokio::time::sleep(secs(20)).await;
    assert_eq!(flaky.failed.load(Ordering::SeqCst), 7);
    assert_eq!(*terms.lock(), vec![FencingToken::from(1)]);
    assert_eq!(
        *state.borrow(),
        ElectionState::Leader {
            fencing_token: FencingToken::from(1)
        }
    );

    tracing::info!("--- the store fails for 30 s; the term is lost, run goes on");
    flaky.fail_next.store(usize::MAX, Ordering::SeqCst);
    wait_state(&mut state, "term lost", |s| !s.is_leader()).await;
    tokio::time::sleep(secs(30)).await;
    assert!(!run.is_finished());
    assert_eq!(live_holder(&store).await, None, "the old term lapsed");
    flaky.fail_next.store(0, Ordering::SeqCst);
    assert_eq!(wait_leader(&mut state, "leads again").await.get(), 2);
    assert_eq!(
        *terms.lock(),
        vec![FencingToken::from(1), FencingToken::from(2)]
    );

    shut_down(&shutdown, [(run, "run")]).await;
    assert_eq!(live_holder(&store).await, None);
}

/// Setup: ttl 10 s, renew 3 s, retry 1 s. node-b leads on the plain store; node-a
/// follows through Switches whose calls made while `hang` is set never answer.
/// One of node-a's acquire attempts is swallowed that way; then the store heals and
/// node-b shuts down, handing the role to node-a, queued before the hang. node-a must
/// give up on the lost call (its answer could no longer start a usable term after the
/// local window) and lead, not wait forever.
#[tokio::test(start_paused = true)]
async fn a_hung_acquire_does_not_block_the_contender_forever() {
    let (_, store, hanging) = clock_store_and_switches();
    let a = elector(hanging.store(), standard("node-a"));
    let b = elector(store.clone(), standard("node-b"));
    let (mut a_state, mut b_state) = (a.watch(), b.watch());
    let (shutdown_a, shutdown_b) = (CancellationToken::new(), CancellationToken::new());
    let run_b = spawn_run(&b, idle, &shutdown_b);
    wait_leader(&mut b_state, "node-b leads").await;
    let run_a = spawn_run(&a, idle, &shutdown_a);
    wait_follower(&mut a_state, "node-a follows").await;

    tracing::info!("--- node-a's next attempt is swallowed");
    hanging.hang.store(true, Ordering::SeqCst);
    tokio::time::sleep(secs(2)).await;
    hanging.hang.store(false, Ordering::SeqCst);

    tracing::info!("--- the store heals, node-b leaves");
    let left = Instant::now();
    shut_down(&shutdown_b, [(run_b, "node-b run")]).await;
    // node-b's release handed term 2 to node-a, queued from before the hang; it lapsed
    // unrenewed while node-a's call hung, so node-a leads under a new term.
    assert_eq!(wait_leader(&mut a_state, "node-a leads").await.get(), 3);
    assert!(
        left.elapsed() <= secs(10),
        "took over {:?} after node-b left",
        left.elapsed()
    );
    shut_down(&shutdown_a, [(run_a, "node-a run")]).await;
}

/// Setup: ttl 10 s, renew 3 s, drift 1 %, `work_grace` 2 s (leadership window 7.9 s).
/// node-a's renewals hang after it leads; its `leadership` must be cancelled at its last
/// successful request + 7.9 s: `work_grace` earlier than without it, so work has 2 s to
/// stop while the lease (store expiry at + 10 s) is still surely its own.
#[tokio::test(start_paused = true)]
async fn work_grace_cancels_leadership_that_much_earlier() {
    let (clock, _, hanging) = clock_store_and_switches();
    let fenced = Fenced::new();
    let options = LeaseLeaderOptions {
        work_grace: secs(2),
        ..standard("node-a")
    };
    let (mut state, shutdown, run) = run_through(&hanging, options, fenced.work(&clock));
    wait_leader(&mut state, "node-a leads").await;
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    hanging.hang.store(true, Ordering::SeqCst);
    let last = hanging.last_granted();
    wait_state(&mut state, "node-a gives up", |s| !s.is_leader()).await;
    let cancelled = fenced.cancelled();
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert_eq!(cancelled[0].1, last.now + Duration::from_millis(7_900));
    assert!(cancelled[0].1 + secs(2) < last.expires_at);
    shut_down(&shutdown, [(run, "node-a run")]).await;
}

/// Setup: ttl 10 s, renew 3 s, drift 1 %. node-a's store grants half the TTL asked for
/// (it answers, and really expires the lease, at now + 5 s), as etcd does when it
/// reuses a spare lease with half its TTL left. After a few renewals the store hangs.
/// `leadership` must be cancelled at the last successful request + 5 s * 0.99 = 4.95 s,
/// before that answer's store expiry, not at + 9.9 s as if the full TTL were granted.
#[tokio::test(start_paused = true)]
async fn deadline_follows_the_granted_ttl_not_the_asked_one() {
    let (clock, _, halving) = clock_store_and_switches();
    *halving.grant.lock() = 0.5;
    let fenced = Fenced::new();
    let (mut state, shutdown, run) = run_through(&halving, standard("node-a"), fenced.work(&clock));
    wait_leader(&mut state, "node-a leads").await;
    tokio::time::sleep(secs(4)).await;
    assert!(
        state.borrow().is_leader(),
        "half-TTL renewals keep the term"
    );

    tracing::info!("--- node-a's store hangs");
    halving.hang.store(true, Ordering::SeqCst);
    let last = halving.last_granted();
    assert_eq!(last.remaining(), secs(5), "the store granted half");
    assert!(last.now > start(), "node-a renewed");
    wait_state(&mut state, "node-a gives up", |s| !s.is_leader()).await;
    let cancelled = fenced.cancelled();
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert!(
        cancelled[0].1 < last.expires_at,
        "leadership cancelled at {:?}, the store expired the lease at {:?}",
        cancelled[0].1,
        last.expires_at
    );
    assert_eq!(cancelled[0].1, last.now + Duration::from_millis(4_950));
    shut_down(&shutdown, [(run, "node-a run")]).await;
}

/// Setup: node-a leads through Switches (ttl 10 s, renew 3 s, drift 1 %). One
/// renewal comes back with a new token (the term lapsed and a new one began); the old
/// work takes 15 s, longer than the TTL, to wind down after cancellation, so the new
/// term's local deadline (its answer + 9.9 s) passes meanwhile. Work must never be called
/// for a term whose deadline has passed: the elector contends again instead and calls
/// work for token 3 (term 2 has expired on the store too by then).
#[tokio::test(start_paused = true)]
async fn work_is_never_called_for_a_term_past_its_deadline() {
    let (_, _, twist) = clock_store_and_switches();
    let calls: Arc<Mutex<Vec<(FencingToken, Instant)>>> = Arc::default();
    let work_calls = calls.clone();
    let (mut state, shutdown, run) = run_through(
        &twist,
        standard("node-a"),
        move |token: FencingToken, leadership: CancellationToken| {
            work_calls.lock().push((token, Instant::now()));
            async move {
                leadership.cancelled().await;
                tokio::time::sleep(secs(15)).await;
            }
        },
    );
    first_term_then_lapse(&mut state, &twist).await;
    // The old work is slow to stop.
    let next = wait_state(
        &mut state,
        "a later term",
        |s| matches!(s, ElectionState::Leader { fencing_token } if fencing_token.get() > 1),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1)).await;

    // Each call happened before the local deadline of the latest grant of its token.
    let window = Duration::from_millis(9_900);
    let granted = twist.granted.lock().clone();
    for (token, called) in calls.lock().iter() {
        let (decided, _) = granted
            .iter()
            .rfind(|(at, answer)| answer.fencing_token == *token && at <= called)
            .unwrap_or_else(|| panic!("work called for token {token} that was never granted"));
        assert!(
            *called < *decided + window,
            "work called for token {token} {:?} after its grant, past the {window:?} deadline",
            *called - *decided
        );
    }
    let tokens: Vec<u64> = calls.lock().iter().map(|(token, _)| token.get()).collect();
    assert_eq!(tokens, [1, 3]);
    assert_eq!(
        next,
        ElectionState::Leader {
            fencing_token: FencingToken::from(3)
        }
    );

    shut_down(&shutdown, [(run, "run")]).await;
}

/// Setup: node-a leads alone (ttl 10 s, renew 3 s). Its next renewal is held on the wire:
/// it reaches the store only when the test lets it through, whether or not node-a still
/// waits for it. Shutdown fires while it is held; 1 s later it goes through. node-a must
/// let the renewal answer before it releases, so the release ends the term and nobody
/// holds the lease afterwards. Released first, the late renewal would start a new term
/// for node-a (token 2) that nobody leads, and a successor would wait out the TTL.
#[tokio::test(start_paused = true)]
async fn shutdown_lets_an_in_flight_renewal_answer_before_releasing() {
    let (_, store, wire) = clock_store_and_switches();
    let (mut state, shutdown, run) = run_through(&wire, standard("node-a"), idle);
    assert_eq!(wait_leader(&mut state, "leads").await.get(), 1);
    tokio::time::sleep(Duration::from_millis(3_500)).await;

    tracing::info!("--- a renewal is on the wire when shutdown fires");
    let open = wire.hold_on_the_wire();
    tokio::time::sleep(secs(3)).await;
    assert_eq!(
        wire.granted.lock().len(),
        2,
        "one renewal answered, one held"
    );
    shutdown.cancel();
    tokio::time::sleep(secs(1)).await;
    open.send_replace(true);
    join(run, "run").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;

    assert_eq!(live_holder(&store).await, None, "nobody holds the lease");
    assert_eq!(*wire.released.lock(), [(FencingToken::from(1), true)]);
    let next = store.try_acquire(ROLE, "node-b", secs(10)).await;
    assert!(next.acquired, "a successor gets in at once: {next:?}");
}

/// Setup: node-a leads; the future of its `run` is dropped (the caller's `select!` took
/// another branch, or its task was aborted). The work, which runs on its own task, must
/// see `leadership` cancelled: nothing renews the lease any more, so it must not go on
/// believing it leads.
#[tokio::test(start_paused = true)]
async fn dropping_run_cancels_leadership() {
    let (_, store) = clock_and_store();
    let a = elector(store.clone(), standard("node-a"));
    let (started_tx, started) = oneshot::channel();
    let (ended_tx, ended) = oneshot::channel();
    let work = {
        let mut started_tx = Some(started_tx);
        let mut ended_tx = Some(ended_tx);
        move |_token, leadership: CancellationToken| {
            let started = started_tx.take();
            let ended = ended_tx.take();
            async move {
                if let Some(started) = started {
                    let _ = started.send(());
                }
                leadership.cancelled().await;
                if let Some(ended) = ended {
                    let _ = ended.send(());
                }
            }
        }
    };
    let run = a.run(ROLE, work, CancellationToken::new());
    tokio::select! {
        _ = run => panic!("run returned"),
        _ = started => {}
    }
    // `run` is dropped here, mid-term.
    tokio::time::timeout(Duration::from_secs(1), ended)
        .await
        .expect("leadership must be cancelled when run is dropped")
        .unwrap();
}

/// Setup: ttl 10 s, renew 10/3 s, `work_grace` 3 s, drift 1 %; node-a's store grants
/// 40 % of the TTL asked (4 s). The leadership window of such a grant is
/// 4 s * 0.99 - 3 s = 0.96 s, shorter than the renew interval scaled to the grant
/// (1.33 s): the renewal must still fall inside the window, so node-a leads one
/// unbroken term for a minute and its work is called once.
#[tokio::test(start_paused = true)]
async fn a_short_grant_with_work_grace_is_renewed_inside_its_window() {
    let (clock, _, short) = clock_store_and_switches();
    *short.grant.lock() = 0.4;
    let fenced = Fenced::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let options = LeaseLeaderOptions {
        work_grace: secs(3),
        ..options("node-a", secs(10), Duration::from_millis(3_333), secs(1))
    };
    let mut inner = fenced.work(&clock);
    let counted = calls.clone();
    let (mut state, shutdown, run) = run_through(&short, options, move |token, leadership| {
        counted.fetch_add(1, Ordering::SeqCst);
        inner(token, leadership)
    });
    wait_leader(&mut state, "node-a leads").await;
    tokio::time::sleep(secs(60)).await;
    assert_eq!(short.last_granted().remaining(), secs(4), "a 40 % grant");
    assert!(
        fenced.cancelled().is_empty(),
        "leadership was cancelled while the store kept granting: {:?}",
        fenced.cancelled()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "work called once");
    assert!(short.granted.lock().len() > 40, "renewed all along");
    shut_down(&shutdown, [(run, "node-a run")]).await;
}

/// Setup: node-a leads with token 1 (ttl 10 s) and its work returns after 1 s; its
/// release is held on the wire past the term's deadline (node-a gives up waiting), and
/// reaches the store only later. `run` is called again on the same elector meanwhile:
/// it must not work under token 1, whose release may still land, but release it again
/// and lead with token 2; the late release then ends nothing and node-a stays the live
/// holder under its running work.
#[tokio::test(start_paused = true)]
async fn run_again_never_works_under_a_token_whose_release_may_still_land() {
    let (_, store, wire) = clock_store_and_switches();
    let a = elector(wire.store(), standard("node-a"));
    let shutdown = CancellationToken::new();
    let gate = wire.hold_releases_on_the_wire();
    let first = a.run(
        ROLE,
        |_token, _leadership| tokio::time::sleep(secs(1)),
        shutdown.clone(),
    );
    tokio::time::timeout(secs(60), first)
        .await
        .expect("the first run returns once its release timed out")
        .unwrap();
    assert!(
        wire.released.lock().is_empty(),
        "the release is still on the wire"
    );
    *wire.releases_on_the_wire.lock() = None;

    let mut a_state = a.watch();
    let run_a = spawn_run(
        &a,
        |_token, leadership: CancellationToken| async move { leadership.cancelled().await },
        &shutdown,
    );
    let token = wait_leader(&mut a_state, "node-a leads again").await;
    assert_eq!(
        token,
        FencingToken::from(2),
        "a new term, not the one whose release is on the wire"
    );
    gate.send_replace(true);
    tokio::time::sleep(secs(1)).await;
    assert!(a_state.borrow().is_leader());
    assert_eq!(
        live_holder(&store).await,
        Some(("node-a".to_owned(), FencingToken::from(2))),
        "the late release ended nothing"
    );
    shut_down(&shutdown, [(run_a, "node-a run")]).await;
}
