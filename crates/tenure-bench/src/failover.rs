//! Failover: how long until a successor's work runs, after a release and after a stall.
//!
//! - **Release.** Per trial, on a fresh role: a leader elector (store handle A) runs
//!   work that waits to be told to step down; a follower elector (handle B, retry
//!   interval 60 s, so only the store's push can wake it in time) is started and left
//!   to settle into waiting; then the leader's work returns, its elector releases, and
//!   the time to the follower's work starting is taken. Trials run one at a time.
//! - **Stall.** Per trial, on a fresh role: the leader acquires with the TTL through
//!   handle A and never renews; a follower elector on handle B (retry interval
//!   [`STALL_RETRY`]) starts at once. The excess of (acquire sent -> follower's work
//!   started) over the TTL is kept; a follower that started before the TTL ran out
//!   is counted as `early`, a violation. Up to [`STALL_PARALLEL`] trials overlap (each
//!   mostly waits out its TTL). On a store that judges expiry by observation
//!   (Kubernetes), handle B reads the role once right after the acquire, before the
//!   follower starts, and the time until that read returns is reported beside the
//!   excess. The TTL counts from the store's own first sighting of the term, which came
//!   no later (the read's answer, or a watch event before it) and may come a little
//!   earlier, so this is the floor of the excess give or take one read.

use std::sync::Arc;
use std::time::Duration;

use tenure::{LeaseLeaderElector, LeaseLeaderOptions, LeaseStore};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::config::BenchConfig;
use crate::report::{Failover, Floor, ReleaseFailover, StallFailover};
use crate::stats::summarize;
use crate::BenchError;

/// The follower's retry interval in stall trials: the bound is TTL + this.
pub(crate) const STALL_RETRY: Duration = Duration::from_secs(1);

/// Stall trials in flight at once.
const STALL_PARALLEL: usize = 10;

/// The longest wait for one step of a release trial on a loaded machine.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Failures kept for the report.
const KEEP_FAILURES: usize = 5;

pub(crate) async fn measure(
    backend: &dyn Backend,
    config: &BenchConfig,
    run_id: &str,
) -> Result<Failover, BenchError> {
    let (a, b) = backend.pair().await?;
    let floor = backend.release_floor(config.trials, run_id).await?;
    let mut samples = Vec::with_capacity(config.trials);
    let mut failures = Vec::new();
    for trial in 0..config.trials {
        let role = format!("{run_id}-release-{trial}");
        match release_trial(Arc::clone(&a), Arc::clone(&b), &role).await {
            Ok(latency) => samples.push(latency),
            Err(failure) => keep(&mut failures, format!("release trial {trial}: {failure}")),
        }
    }
    let release = ReleaseFailover {
        trials: config.trials,
        completed: samples.len(),
        latency: summarize(&samples),
        floor,
        goal_p99_ms: backend.release_goal_ms(),
        failures,
    };
    let stall = stall(
        &a,
        &b,
        config,
        run_id,
        backend.stall_goal(),
        backend.observes_expiry(),
    )
    .await;
    Ok(Failover { release, stall })
}

fn keep(failures: &mut Vec<String>, failure: String) {
    tracing::warn!(%failure, "failover trial failed");
    if failures.len() < KEEP_FAILURES {
        failures.push(failure);
    }
}

fn options(owner: String, ttl: Duration, retry: Duration) -> LeaseLeaderOptions {
    LeaseLeaderOptions {
        owner_id: owner,
        lease_ttl: ttl,
        renew_interval: ttl / 3,
        retry_interval: retry,
        ..Default::default()
    }
}

/// A pause of 20 to 40 ms, varied from trial to trial so a release never falls at one
/// fixed phase of a polling follower's cycle.
fn settle_pause() -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    Duration::from_micros(20_000 + u64::from(nanos) % 20_000)
}

/// An elector's task, and the instants its work started, one per term.
type Spawned = (
    tokio::task::JoinHandle<tenure::Result<()>>,
    mpsc::UnboundedReceiver<Instant>,
);

/// Runs `elector` on `role` with work that reports its start (on the returned receiver)
/// and then waits for `step_down` (or returns at once without one); the elector releases
/// when it returns.
fn spawn_elector(
    store: Arc<dyn LeaseStore>,
    options: LeaseLeaderOptions,
    role: String,
    step_down: Option<Arc<Notify>>,
    shutdown: CancellationToken,
) -> Result<Spawned, String> {
    let elector = LeaseLeaderElector::new(store, options).map_err(|e| e.to_string())?;
    let (started, starts) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        elector
            .run(
                &role,
                move |_token, leadership: CancellationToken| {
                    let started = started.clone();
                    let step_down = step_down.clone();
                    async move {
                        let _ = started.send(Instant::now());
                        if let Some(step_down) = step_down {
                            tokio::select! {
                                _ = step_down.notified() => {}
                                _ = leadership.cancelled() => {}
                            }
                        }
                    }
                },
                shutdown,
            )
            .await
    });
    Ok((task, starts))
}

/// The successor of a trial: an elector on `role` over store `b`, owner `ROLE-follower`,
/// whose work reports its start and returns at once.
fn spawn_follower(
    b: Arc<dyn LeaseStore>,
    role: &str,
    ttl: Duration,
    retry: Duration,
    shutdown: &CancellationToken,
) -> Result<Spawned, String> {
    let options = options(format!("{role}-follower"), ttl, retry);
    spawn_elector(b, options, role.to_owned(), None, shutdown.clone())
}

async fn release_trial(
    a: Arc<dyn LeaseStore>,
    b: Arc<dyn LeaseStore>,
    role: &str,
) -> Result<Duration, String> {
    let long = Duration::from_secs(30);
    let never = Duration::from_secs(60);
    let shutdown = CancellationToken::new();
    // Whatever happens below, no elector outlives the trial.
    let _stop = shutdown.clone().drop_guard();
    let step_down = Arc::new(Notify::new());
    let (leader_task, mut leader_rx) = spawn_elector(
        a,
        options(format!("{role}-leader"), long, never),
        role.to_owned(),
        Some(Arc::clone(&step_down)),
        shutdown.clone(),
    )?;
    timeout(STEP_TIMEOUT, leader_rx.recv())
        .await
        .map_err(|_| "the leader did not start".to_owned())?;
    let (follower_task, mut follower_rx) = spawn_follower(b, role, long, never, &shutdown)?;
    tokio::time::sleep(settle_pause()).await;
    let released = Instant::now();
    step_down.notify_one();
    let started = timeout(STEP_TIMEOUT, follower_rx.recv())
        .await
        .map_err(|_| "the follower did not start within 10 s of the release".to_owned())?
        .ok_or_else(|| "the follower stopped".to_owned())?;
    for task in [leader_task, follower_task] {
        match timeout(STEP_TIMEOUT, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => return Err(format!("an elector failed: {error}")),
            Ok(Err(panic)) => return Err(format!("an elector panicked: {panic}")),
            Err(_) => return Err("an elector did not finish".to_owned()),
        }
    }
    Ok(started.saturating_duration_since(released))
}

async fn stall(
    a: &Arc<dyn LeaseStore>,
    b: &Arc<dyn LeaseStore>,
    config: &BenchConfig,
    run_id: &str,
    goal: Duration,
    observed: bool,
) -> StallFailover {
    let ttl = config.ttl();
    let mut excess = Vec::with_capacity(config.trials);
    let mut sightings = Vec::new();
    let mut over_sighting = Vec::new();
    let mut early = 0;
    let mut failures = Vec::new();
    let mut set = JoinSet::new();
    let mut next = 0;
    // Trials overlap so that many fit in a short run, but their starts are spread over
    // the TTL: expiries falling together would measure successors queueing behind each
    // other's writes, not a stalled leader being replaced.
    let spacing = ttl / STALL_PARALLEL as u32;
    let mut next_start = Instant::now();
    while next < config.trials || !set.is_empty() {
        while next < config.trials && set.len() < STALL_PARALLEL {
            tokio::time::sleep_until(next_start).await;
            next_start = Instant::now() + spacing;
            let role = format!("{run_id}-stall-{next}");
            set.spawn(stall_trial(
                Arc::clone(a),
                Arc::clone(b),
                role,
                ttl,
                observed,
            ));
            next += 1;
        }
        match set.join_next().await {
            Some(Ok(Ok((elapsed, sighting)))) => {
                match elapsed.checked_sub(ttl) {
                    Some(over) => excess.push(over),
                    None => early += 1,
                }
                if let Some(seen) = sighting {
                    sightings.push(seen);
                    over_sighting.push(elapsed.saturating_sub(seen + ttl));
                }
            }
            Some(Ok(Err(failure))) => keep(&mut failures, failure),
            Some(Err(panic)) => keep(&mut failures, format!("a stall trial panicked: {panic}")),
            None => break,
        }
    }
    StallFailover {
        trials: config.trials,
        completed: excess.len() + early,
        early,
        ttl_ms: ms(ttl),
        retry_ms: ms(STALL_RETRY),
        excess_over_ttl: summarize(&excess),
        bound_ms: ms(ttl + STALL_RETRY),
        goal_excess_ms: ms(goal),
        first_sighting: observed.then(|| summarize(&sightings)),
        excess_over_sighting: observed.then(|| summarize(&over_sighting)),
        failures,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One stall trial: the time from the acquire being sent to the successor's work
/// starting, and (with `observed`) to handle B's first read of the term.
async fn stall_trial(
    a: Arc<dyn LeaseStore>,
    b: Arc<dyn LeaseStore>,
    role: String,
    ttl: Duration,
    observed: bool,
) -> Result<(Duration, Option<Duration>), String> {
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    // The term can end no sooner than TTL after this instant: the store decides it
    // after the request is sent.
    let sent = Instant::now();
    let lease = a
        .try_acquire_or_renew(&role, &format!("{role}-stalled"), ttl)
        .await
        .map_err(|e| format!("stall trial {role}: acquire failed: {e}"))?;
    if !lease.acquired {
        return Err(format!("stall trial {role}: the leader could not acquire"));
    }
    let sighting = if observed {
        // The follower's store counts the TTL from its first answer carrying the term,
        // which arrived no later than this read returned.
        b.get(&role)
            .await
            .map_err(|e| format!("stall trial {role}: the first read failed: {e}"))?;
        Some(sent.elapsed())
    } else {
        None
    };
    let (task, mut rx) = spawn_follower(b, &role, ttl, STALL_RETRY, &shutdown)?;
    let limit = ttl + STALL_RETRY + STEP_TIMEOUT;
    let started = timeout(limit, rx.recv())
        .await
        .map_err(|_| format!("stall trial {role}: no successor within {limit:?}"))?
        .ok_or_else(|| format!("stall trial {role}: the follower stopped"))?;
    match timeout(STEP_TIMEOUT, task).await {
        Ok(Ok(Ok(()))) => Ok((started - sent, sighting)),
        _ => Err(format!(
            "stall trial {role}: the follower did not finish cleanly"
        )),
    }
}

/// The floor of an in-process wake: a task parked on a `Notify` is woken and runs.
pub(crate) async fn notify_floor(trials: usize) -> Floor {
    let mut samples = Vec::with_capacity(trials);
    for _ in 0..trials {
        let notify = Arc::new(Notify::new());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let waiter = Arc::clone(&notify);
        let task = tokio::spawn(async move {
            waiter.notified().await;
            let _ = tx.send(Instant::now());
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let woken = Instant::now();
        notify.notify_one();
        if let Ok(Ok(ran)) = timeout(STEP_TIMEOUT, rx).await {
            samples.push(ran.saturating_duration_since(woken));
        }
        let _ = task.await;
    }
    Floor {
        label: "a tokio Notify waking a parked task".to_owned(),
        latency: Some(summarize(&samples)),
        bound_ms: None,
    }
}
