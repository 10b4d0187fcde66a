//! The herd: what one handover costs when many contenders wait on one role.
//!
//! Per contender count N and round, on a fresh role: N electors (one store handle with
//! a pool of N connections, TTL [`HERD_TTL`], retry interval 60 s, so only a push or the
//! renew-interval refresh of a waiter's place wakes it) join one at a time; the first
//! leads, and once all N wait, each term's work runs for `work` and returns, so each
//! contender leads once and leaves. Taken per round: every handover's latency (the
//! predecessor's work returning -> the successor's work starting, the release
//! included) and the server's request count from the moment all N wait to the end of
//! the round, as the backend counts them (PostgreSQL statements, etcd gRPC calls,
//! Kubernetes API requests): what joining costs differs by store (on etcd a lease grant
//! beside the queueing transaction, on Kubernetes a candidacy object), and is not a
//! handover's.
//!
//! Beside it, in alternating rounds of the same run, the **baseline without the queue**:
//! the same electors through an interceptor that turns `try_acquire_or_queue` into
//! `try_acquire_or_renew` and answers `wait_for_successor` with `Unknown`, so every
//! release frees the role and every waiter woken by it contends (tenure before the
//! queue).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::Serialize;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::{LeaseLeaderElector, LeaseLeaderOptions, LeaseStore, TermChange};
use tokio::sync::watch;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Counter, REGISTRY_TTL};
use crate::stats::{summarize, Latency};
use crate::BenchError;

/// The contenders' lease TTL: whole seconds, for etcd and Kubernetes.
pub const HERD_TTL: Duration = Duration::from_secs(10);

/// The longest a round may take before it is reported as failed.
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);

/// What `tenure bench --herd` measures.
#[derive(Clone, Debug)]
pub struct HerdBench {
    /// Contender counts, each measured in its own rounds.
    pub contenders: Vec<usize>,
    /// Rounds per count and mode (queue, baseline), alternating.
    pub rounds: usize,
    /// How long each term's work runs before it returns.
    pub work: Duration,
}

impl HerdBench {
    /// 30 and 100 contenders, 2 rounds, 5 ms of work.
    pub fn new() -> Self {
        HerdBench {
            contenders: vec![30, 100],
            rounds: 2,
            work: Duration::from_millis(5),
        }
    }

    /// Checks the settings; the message names the flag.
    pub fn validate(&self) -> Result<(), BenchError> {
        if self.contenders.is_empty() || self.contenders.iter().any(|&n| !(2..=1000).contains(&n)) {
            return Err(BenchError::Usage(format!(
                "--herd: contender counts must be between 2 and 1000, got {:?}",
                self.contenders
            )));
        }
        if self.rounds == 0 || self.rounds > 100 {
            return Err(BenchError::Usage(format!(
                "--herd-rounds: must be between 1 and 100, got {}",
                self.rounds
            )));
        }
        Ok(())
    }
}

impl Default for HerdBench {
    fn default() -> Self {
        Self::new()
    }
}

/// One contender count and mode, over all its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct HerdRow {
    /// Contenders waiting on the role.
    pub contenders: usize,
    /// `queue` (tenure) or `no queue` (the baseline).
    pub mode: &'static str,
    /// Handovers measured (N - 1 per round).
    pub handovers: usize,
    /// Release -> successor's work running.
    pub latency: Latency,
    /// The slowest handovers (at most 5), each as `(round, handover, milliseconds)`:
    /// handover 0 is a round's first. Whether the tail is one kind of handover (the
    /// first on a fresh store, say) or spread over the round.
    pub slowest: Vec<(usize, usize, f64)>,
    /// Server requests per handover: the rounds' requests once every contender waited,
    /// over the handovers. `None` when the store cannot count them.
    pub requests_per_handover: Option<f64>,
    /// The rounds' requests in all, from when every contender waited.
    pub requests: Option<u64>,
    /// Store calls the electors made per handover (waits aside), counted on the client
    /// over the same span as the requests.
    pub calls_per_handover: Option<f64>,
}

/// What `tenure bench --herd` found.
#[derive(Clone, Debug, Serialize)]
pub struct HerdReport {
    /// The store measured.
    pub store: String,
    /// What the request counter counts.
    pub requests_label: &'static str,
    /// Why requests were not counted, when they were not.
    pub requests_not_measured: Option<String>,
    /// Work per term, in milliseconds.
    pub work_ms: f64,
    /// One row per contender count and mode.
    pub rows: Vec<HerdRow>,
    /// Rounds that failed, with why.
    pub failed: Vec<String>,
}

impl HerdReport {
    /// The report as Markdown.
    pub fn render(&self) -> String {
        let mut out = format!(
            "## Herd: one role, N contenders each leading once ({})\n\n\
             Work per term {:.0} ms, TTL {} s, retry interval 60 s. Requests: {}{}.\n\n\
             | contenders | mode | handovers | release -> successor p50 | p99 | max | store calls / handover | requests / handover |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|\n",
            self.store,
            self.work_ms,
            HERD_TTL.as_secs(),
            self.requests_label,
            self.requests_not_measured
                .as_deref()
                .map(|why| format!(" (not measured: {why})"))
                .unwrap_or_default(),
        );
        for row in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                row.contenders,
                row.mode,
                row.handovers,
                ms(row.latency.p50_us),
                ms(row.latency.p99_us),
                ms(row.latency.max_us),
                row.calls_per_handover
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
                row.requests_per_handover
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
            ));
        }
        out.push_str(
            "\nSlowest handovers (round.handover: time; handover 0 is a round's first):\n",
        );
        for row in &self.rows {
            let slowest: Vec<String> = row
                .slowest
                .iter()
                .map(|(round, at, ms)| format!("{round}.{at}: {ms:.2} ms"))
                .collect();
            out.push_str(&format!(
                "- {} contenders, {}: {}\n",
                row.contenders,
                row.mode,
                slowest.join(", ")
            ));
        }
        for failure in &self.failed {
            out.push_str(&format!("\nfailed: {failure}\n"));
        }
        out
    }
}

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1e3)
}

/// The two ways of waiting compared.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Queue,
    NoQueue,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Queue => "queue",
            Mode::NoQueue => "no queue",
        }
    }
}

/// Turns the queue off: waiters contend as before the queue existed.
struct NoQueue;

#[async_trait]
impl Interceptor for NoQueue {
    async fn intercept(&self, mut call: Call, next: Next) -> Reply {
        if let Call::TryAcquireOrRenew { queue, .. } = &mut call {
            *queue = false;
        }
        match call {
            Call::WaitForSuccessor {
                role,
                observed,
                deadline,
            } => {
                next.run(Call::WaitForChange {
                    role,
                    observed,
                    deadline,
                })
                .await;
                Reply::Succession(TermChange::Unknown)
            }
            call => next.run(call).await,
        }
    }
}

/// Counts the store calls the electors make, waits aside: the client's side of the
/// requests, the same on every backend (SQLite and the in-memory store have no server
/// to count them).
#[derive(Default)]
struct Calls(AtomicU64);

#[async_trait]
impl Interceptor for Calls {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        if !matches!(
            call,
            Call::WaitForChange { .. } | Call::WaitForSuccessor { .. } | Call::WaitForTerm { .. }
        ) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        next.run(call).await
    }
}

/// What one round measured.
struct Round {
    latencies: Vec<Duration>,
    requests: Option<u64>,
    calls: u64,
}

pub(crate) async fn measure(
    backend: &dyn Backend,
    bench: &HerdBench,
    store: &str,
    run_id: &str,
) -> Result<HerdReport, BenchError> {
    let mut report = HerdReport {
        store: store.to_owned(),
        requests_label: backend.requests_label(),
        requests_not_measured: None,
        work_ms: bench.work.as_secs_f64() * 1e3,
        rows: Vec::new(),
        failed: Vec::new(),
    };
    for &count in &bench.contenders {
        let handles = backend.stores(count, REGISTRY_TTL).await?;
        let mut rounds: Vec<(Mode, Round)> = Vec::new();
        for round in 0..bench.rounds {
            for mode in [Mode::Queue, Mode::NoQueue] {
                let role = format!(
                    "{run_id}-herd-{count}-{}-{round}",
                    mode.label().replace(' ', "-")
                );
                let calls = Arc::new(Calls::default());
                let counted = InterceptStore::new(handles.leases.clone()).with(calls.clone());
                let store: Arc<dyn LeaseStore> = match mode {
                    Mode::Queue => Arc::new(counted),
                    Mode::NoQueue => Arc::new(counted.with(Arc::new(NoQueue))),
                };
                tracing::info!(contenders = count, mode = mode.label(), round, "herd round");
                match timeout(
                    ROUND_TIMEOUT,
                    herd_round(backend, store, &calls, &role, count, bench.work),
                )
                .await
                {
                    Ok(Ok(measured)) => rounds.push((mode, measured)),
                    Ok(Err(error)) => report.failed.push(format!(
                        "{count} contenders, {}, round {round}: {error}",
                        mode.label()
                    )),
                    Err(_) => report.failed.push(format!(
                        "{count} contenders, {}, round {round}: not done in {ROUND_TIMEOUT:?}",
                        mode.label()
                    )),
                }
            }
        }
        for mode in [Mode::Queue, Mode::NoQueue] {
            let of_mode: Vec<&Round> = rounds
                .iter()
                .filter(|(m, _)| *m == mode)
                .map(|(_, r)| r)
                .collect();
            let latencies: Vec<Duration> = of_mode
                .iter()
                .flat_map(|r| r.latencies.iter().copied())
                .collect();
            let mut slowest: Vec<(usize, usize, f64)> = of_mode
                .iter()
                .enumerate()
                .flat_map(|(round, r)| {
                    r.latencies
                        .iter()
                        .enumerate()
                        .map(move |(at, l)| (round, at, l.as_secs_f64() * 1e3))
                })
                .collect();
            slowest.sort_by(|a, b| b.2.total_cmp(&a.2));
            slowest.truncate(5);
            let requests = of_mode.iter().map(|r| r.requests).sum::<Option<u64>>();
            let handovers = latencies.len();
            let calls: u64 = of_mode.iter().map(|r| r.calls).sum();
            report.rows.push(HerdRow {
                contenders: count,
                mode: mode.label(),
                handovers,
                latency: summarize(&latencies),
                slowest,
                requests_per_handover: requests
                    .filter(|_| handovers > 0)
                    .map(|r| r as f64 / handovers as f64),
                requests,
                calls_per_handover: (handovers > 0).then(|| calls as f64 / handovers as f64),
            });
        }
    }
    if let Counter::NotMeasured(why) = backend.requests().await? {
        report.requests_not_measured = Some(why);
    }
    Ok(report)
}

/// One round: `count` electors on `role`, each leading once.
async fn herd_round(
    backend: &dyn Backend,
    store: Arc<dyn LeaseStore>,
    calls: &Calls,
    role: &str,
    count: usize,
    work: Duration,
) -> Result<Round, String> {
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    // Work ends and starts, in order of the terms.
    let marks: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    // The first term waits until every contender waits.
    let (all_joined, joined) = watch::channel(false);
    let mut tasks = Vec::with_capacity(count);
    for index in 0..count {
        let options = LeaseLeaderOptions {
            owner_id: format!("{role}-c{index:03}"),
            lease_ttl: HERD_TTL,
            renew_interval: HERD_TTL / 3,
            retry_interval: Duration::from_secs(60),
            ..Default::default()
        };
        let elector = LeaseLeaderElector::new(store.clone(), options).map_err(|e| e.to_string())?;
        let mut state = elector.watch();
        let (marks, joined, role, shutdown) = (
            marks.clone(),
            joined.clone(),
            role.to_owned(),
            shutdown.clone(),
        );
        tasks.push(tokio::spawn(async move {
            elector
                .run(
                    &role,
                    move |_token, leadership: CancellationToken| {
                        let (marks, mut joined) = (marks.clone(), joined.clone());
                        async move {
                            let started = Instant::now();
                            let _ = joined.wait_for(|all| *all).await;
                            tokio::select! {
                                _ = tokio::time::sleep(work) => {}
                                _ = leadership.cancelled() => {}
                            }
                            marks.lock().push((started, Instant::now()));
                        }
                    },
                    shutdown,
                )
                .await
        }));
        // Joined once it leads or knows who does: one at a time keeps the queue in order.
        let waiting = |s: &tenure::ElectionState| {
            s.is_leader() || matches!(s, tenure::ElectionState::Follower { holder: Some(_) })
        };
        timeout(Duration::from_secs(10), state.wait_for(waiting))
            .await
            .map_err(|_| format!("contender {index} did not join within 10 s"))?
            .map_err(|_| format!("contender {index} stopped"))?;
    }
    // Joining is not handing over: count from here (the first term's work waits).
    tokio::time::sleep(backend.counter_lag()).await;
    let before = backend.requests().await.map_err(|e| e.to_string())?;
    let calls_before = calls.0.load(Ordering::Relaxed);
    let _ = all_joined.send(true);
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(format!("an elector failed: {error}")),
            Err(panic) => return Err(format!("an elector panicked: {panic}")),
        }
    }
    tokio::time::sleep(backend.counter_lag()).await;
    let after = backend.requests().await.map_err(|e| e.to_string())?;
    let requests = match (before, after) {
        (Counter::Count(before), Counter::Count(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let mut marks = marks.lock().clone();
    marks.sort_by_key(|(started, _)| *started);
    if marks.len() != count {
        return Err(format!("{} of {count} contenders led", marks.len()));
    }
    let latencies = marks
        .windows(2)
        .map(|pair| pair[1].0.saturating_duration_since(pair[0].1))
        .collect();
    Ok(Round {
        latencies,
        requests,
        calls: calls.0.load(Ordering::Relaxed) - calls_before,
    })
}
