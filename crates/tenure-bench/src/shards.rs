//! `tenure bench --shards N`: what a shard group costs the store and how it moves shards,
//! each beside per-role electors doing the same job in the same run.
//!
//! - **hold**: `members` members hold `N` shards under their sessions for a window of
//!   renew intervals, beside `N` per-role [`LeaseLeaderElector`]s (one role each, the same
//!   TTL and renew interval, one store handle as one process holding many roles would
//!   have). Per renew interval: the lease-store calls by method (counted on the client
//!   side by an [`InterceptStore`]), the server's statements (PostgreSQL:
//!   `pg_stat_statements`) and row versions written (`pg_stat_user_tables`), this
//!   process's CPU, and the terms restarted while everything should have stayed put.
//! - **churn** (64 shards): 4 members settle from a cold start; a 5th joins (shards
//!   moved, to whom, and each handover: the old owner's work ending to the new owner's
//!   starting); then the member with the most shards is killed (its task aborted: no
//!   release, no session close, no leave, as with SIGKILL) and the time until all its
//!   shards run elsewhere is taken against the TTL.
//! - **leave** (30 members, 64 shards): one member shuts down gracefully; the store calls
//!   and statements each moved shard cost, beside 30 electors contending for one role
//!   whose leader shuts down. Background traffic (renewals, heartbeats) is measured over
//!   an equally long quiet window right after and subtracted.
//! - **quiet** (servers with traffic of their own: a Kubernetes API server renews its
//!   identity lease, which its request counters count with the bench's): the same
//!   counters over a window as long as the hold's with nothing of the bench's running,
//!   right after the group's hold, reported beside the hold rows.
//!
//! Every wait is bounded: a group that does not settle is an error, not a hang.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::Serialize;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::{
    FencingToken, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore, ShardElector, ShardOptions,
    ShardState,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backend::{Backend, Counter};
use crate::stats::{summarize, Latency};
use crate::BenchError;

/// The shards of the churn and leave scenarios (a queue's partitions).
const CHURN_SHARDS: u32 = 64;
/// Members at the start of the churn scenario.
const CHURN_MEMBERS: usize = 4;
/// Members of the leave scenario.
const LEAVE_MEMBERS: usize = 30;
/// How often a settle wait looks at the members' views.
const LOOK_EVERY: Duration = Duration::from_millis(2);
/// Connections per member: on PostgreSQL the lease and membership listeners hold one
/// each, which leaves two for renewals, contending and releases.
const MEMBER_POOL: usize = 4;

/// Settings of `tenure bench --shards`.
#[derive(Clone, Debug)]
pub struct ShardBench {
    /// Shards held in the hold scenario.
    pub shards: u32,
    /// Members holding them.
    pub members: usize,
    /// How long the hold scenario measures, once settled.
    pub window: Duration,
    /// Lease (session) TTL of the hold scenario.
    pub hold_ttl: Duration,
    /// Renew interval of the hold scenario.
    pub renew_every: Duration,
    /// Lease TTL of the churn and leave scenarios (member TTL = lease TTL).
    pub churn_ttl: Duration,
    /// Also run `shards` per-role electors over the same window.
    pub baseline: bool,
    /// Also run the churn and leave scenarios.
    pub churn: bool,
}

impl ShardBench {
    /// Defaults for `shards` shards: one member, renew every 2 s (TTL 6 s), a one-minute
    /// window, the churn and leave scenarios at a 1 s TTL, and the per-role baseline.
    pub fn new(shards: u32) -> ShardBench {
        ShardBench {
            shards,
            members: 1,
            window: Duration::from_secs(60),
            hold_ttl: Duration::from_secs(6),
            renew_every: Duration::from_secs(2),
            churn_ttl: Duration::from_secs(1),
            baseline: true,
            churn: true,
        }
    }

    /// Checks the settings against each other and the store; errors name the flag.
    pub fn validate(&self, store: &crate::StoreSpec) -> Result<(), BenchError> {
        let usage = |m: String| Err(BenchError::Usage(m));
        if self.shards == 0 || self.shards > tenure::shard::MAX_SHARDS {
            return usage(format!(
                "--shards {} must be 1 to {}",
                self.shards,
                tenure::shard::MAX_SHARDS
            ));
        }
        if self.members == 0 || self.members > self.shards as usize {
            return usage(format!(
                "--members {} must be 1 to --shards ({})",
                self.members, self.shards
            ));
        }
        if self.renew_every < Duration::from_millis(10) {
            return usage(format!(
                "--renew-every {:?} is too short: at least 10ms",
                self.renew_every
            ));
        }
        if self.window < self.renew_every {
            return usage(format!(
                "--window {:?} must be at least one renew interval (--renew-every {:?})",
                self.window, self.renew_every
            ));
        }
        let (min, whole_seconds) = store.min_ttl();
        for (flag, ttl) in [
            ("--renew-every (x3)", self.hold_ttl),
            ("--ttl", self.churn_ttl),
        ] {
            if ttl < min || (whole_seconds && ttl.subsec_nanos() != 0) {
                let whole = if whole_seconds { ", whole seconds" } else { "" };
                return usage(format!(
                    "{flag} gives a TTL of {ttl:?}; this store takes at least {min:?}{whole}"
                ));
            }
        }
        Ok(())
    }
}

/// What `tenure bench --shards` measured.
#[derive(Clone, Debug, Serialize)]
pub struct ShardReport {
    /// The settings in effect.
    pub settings: ShardSettings,
    /// The shard group, then (with the baseline) the per-role electors.
    pub hold: Vec<HoldRow>,
    /// Joins and a kill, when run.
    pub churn: Option<Churn>,
    /// A graceful leave among 30, when run.
    pub leave: Option<Leave>,
    /// What `statements_per_interval` counts on this store.
    pub statements_counted: String,
    /// What `rows_written_per_interval` counts on this store.
    pub rows_counted: String,
    /// On a server with requests of its own in its counters: the counters over an
    /// equally long window with nothing of the bench's running (absent elsewhere).
    pub quiet: Option<QuietWindow>,
    /// The scenarios that failed (churn, leave), each with why; their sections are
    /// absent. The run as a whole then fails too, after the report.
    pub failed: Vec<String>,
}

/// The server's own traffic, per hold renew interval, with nothing of the bench's
/// running.
#[derive(Clone, Debug, Serialize)]
pub struct QuietWindow {
    /// How long it was measured.
    pub window_ms: f64,
    /// Requests per renew interval (`None`: not countable on this store).
    pub statements_per_interval: Option<f64>,
    /// Writes per renew interval (`None`: not countable on this store).
    pub rows_written_per_interval: Option<f64>,
}

/// The settings of a shard run, in milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct ShardSettings {
    /// Shards held.
    pub shards: u32,
    /// Members holding them.
    pub members: usize,
    /// Measuring window once settled.
    pub window_ms: f64,
    /// Hold TTL.
    pub hold_ttl_ms: f64,
    /// Hold renew interval.
    pub renew_ms: f64,
    /// Churn and leave TTL.
    pub churn_ttl_ms: f64,
}

/// One way of holding `roles` roles for a window.
#[derive(Clone, Debug, Serialize)]
pub struct HoldRow {
    /// `shard group` or `per-role electors`.
    pub holder: String,
    /// Roles (shards) held.
    pub roles: u32,
    /// Members (shard group) or electors.
    pub contenders: usize,
    /// From the start until every role ran (and, for a group, the shares were even).
    pub settle_ms: f64,
    /// Where creating objects contends (`Backend::creates_contend`: Kubernetes), the
    /// group's settle once more, started again after the window with its objects in
    /// place (as after a deploy); `None` elsewhere. The per-role electors' objects are
    /// created one by one before they start there, so their `settle_ms` has no creates.
    pub restart_settle_ms: Option<f64>,
    /// Renew intervals in the window.
    pub intervals: f64,
    /// Lease-store calls per renew interval, by method.
    pub calls_per_interval: BTreeMap<String, f64>,
    /// Server statements per renew interval (`None`: not countable on this store).
    pub statements_per_interval: Option<f64>,
    /// Row versions written per renew interval (`None`: not countable on this store).
    pub rows_written_per_interval: Option<f64>,
    /// This process's CPU over the window, percent of one core.
    pub cpu_percent: f64,
    /// Terms started during the window (all roles should have stayed put: 0).
    pub terms_restarted: u64,
}

/// The churn scenario's findings.
#[derive(Clone, Debug, Serialize)]
pub struct Churn {
    /// Shards.
    pub shards: u32,
    /// Cold start of 4 members until every shard ran and the shares were even.
    pub cold_settle_ms: f64,
    /// The same in renew intervals.
    pub cold_settle_intervals: f64,
    /// Shards each member owned after the cold start.
    pub cold_shares: Vec<usize>,
    /// Shards that changed owner when the 5th member joined.
    pub join_moved: usize,
    /// Of those, the ones that went to the newcomer.
    pub join_moved_to_newcomer: usize,
    /// From the join until the 5 shares were even.
    pub join_settle_ms: f64,
    /// Each moved shard: the old owner's work ending to the new owner's work starting.
    pub handover: Latency,
    /// Shards the killed member owned.
    pub killed_shards: usize,
    /// From the kill until every one of them ran on another member.
    pub kill_reowned_ms: f64,
    /// The lease (and member) TTL.
    pub ttl_ms: f64,
}

/// The leave scenario's findings, beside electors on one role.
#[derive(Clone, Debug, Serialize)]
pub struct Leave {
    /// Members.
    pub members: usize,
    /// Shards.
    pub shards: u32,
    /// Shards that changed owner.
    pub moved: usize,
    /// Of those, the leaver's.
    pub leaver_shards: usize,
    /// `acquire_in_session` calls per moved shard, over all members.
    pub acquires_per_moved: f64,
    /// Lease-store calls naming a moved shard, per moved shard, over all members.
    pub role_calls_per_moved: f64,
    /// Server statements from the leave until the group settled, all members (`None`:
    /// not countable on this store).
    pub statements: Option<f64>,
    /// The same over an equally long quiet window right after: renewals and heartbeats.
    pub background_statements: Option<f64>,
    /// Each moved shard's handover.
    pub handover: Latency,
    /// The same handover of one role among as many electors.
    pub electors: ElectorLeave,
}

/// One role, as many electors: the leader shuts down and another takes over.
#[derive(Clone, Debug, Serialize)]
pub struct ElectorLeave {
    /// Electors.
    pub electors: usize,
    /// Lease-store calls naming the role, from the leader's shutdown until another's
    /// work started, less the quiet window's (the new leader's renewals).
    pub role_calls: f64,
    /// Server statements over the same time.
    pub statements: Option<f64>,
    /// The same over an equally long quiet window right after.
    pub background_statements: Option<f64>,
    /// The leader's work ending to the successor's starting.
    pub handover_ms: f64,
}

/// Counts the lease-store calls of every member or elector, by method and by role.
#[derive(Default)]
struct CallCounts {
    by_method: Mutex<BTreeMap<&'static str, u64>>,
    by_role: Mutex<HashMap<String, u64>>,
}

#[async_trait]
impl Interceptor for CallCounts {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        *self.by_method.lock().entry(call.method()).or_default() += 1;
        let role = match &call {
            Call::TryAcquireOrRenew { role, .. }
            | Call::Release { role, .. }
            | Call::Get { role }
            | Call::WaitForChange { role, .. }
            | Call::AcquireInSession { role, .. } => Some(role),
            _ => None,
        };
        if let Some(role) = role {
            *self.by_role.lock().entry(role.clone()).or_default() += 1;
        }
        next.run(call).await
    }
}

impl CallCounts {
    fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.by_method.lock().clone()
    }

    /// Calls naming any of `roles` so far.
    fn on_roles(&self, roles: &[String]) -> u64 {
        let by_role = self.by_role.lock();
        roles.iter().filter_map(|r| by_role.get(r)).sum()
    }
}

/// One term of work: which role (shard), who ran it, when it started and ended.
struct TermRecord {
    shard: u32,
    member: String,
    start: Instant,
    end: Option<Instant>,
}

/// Every term that ran in a scenario.
#[derive(Default)]
struct TermLog {
    terms: Mutex<Vec<TermRecord>>,
    started: AtomicU64,
}

type WorkFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

impl TermLog {
    /// Records a term from its start until `leadership` is cancelled.
    fn term(
        self: &Arc<Self>,
        shard: u32,
        member: &str,
        leadership: CancellationToken,
    ) -> WorkFuture {
        let at = {
            let mut terms = self.terms.lock();
            terms.push(TermRecord {
                shard,
                member: member.to_owned(),
                start: Instant::now(),
                end: None,
            });
            terms.len() - 1
        };
        self.started.fetch_add(1, Ordering::Relaxed);
        let log = Arc::clone(self);
        Box::pin(async move {
            leadership.cancelled().await;
            if let Some(term) = log.terms.lock().get_mut(at) {
                term.end = Some(Instant::now());
            }
        })
    }

    fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// The first term of `shard` started at or after `since` by someone other than
    /// `not_by`.
    fn first_start(&self, shard: u32, since: Instant, not_by: Option<&str>) -> Option<Instant> {
        self.terms
            .lock()
            .iter()
            .filter(|t| t.shard == shard && t.start >= since && Some(t.member.as_str()) != not_by)
            .map(|t| t.start)
            .min()
    }

    /// When `member`'s term of `shard` that was running at `at` ended.
    fn end_of(&self, shard: u32, member: &str, at: Instant) -> Option<Instant> {
        self.terms
            .lock()
            .iter()
            .filter(|t| t.shard == shard && t.member == member && t.start <= at)
            .filter_map(|t| t.end.filter(|end| *end >= at))
            .min()
    }
}

/// The counters read at one moment.
struct Snapshot {
    at: Instant,
    /// Calls naming the roles the scenario watches.
    role_calls: u64,
    calls: BTreeMap<&'static str, u64>,
    statements: Option<u64>,
    rows: Option<u64>,
    cpu: Duration,
    terms: u64,
}

async fn snapshot(
    backend: &dyn Backend,
    counts: &CallCounts,
    log: &TermLog,
) -> Result<Snapshot, BenchError> {
    snapshot_watching(backend, counts, log, &[]).await
}

async fn snapshot_watching(
    backend: &dyn Backend,
    counts: &CallCounts,
    log: &TermLog,
    roles: &[String],
) -> Result<Snapshot, BenchError> {
    let count = |counter: Counter| match counter {
        Counter::Count(n) => Some(n),
        Counter::NotMeasured(_) => None,
    };
    let statements = count(backend.requests().await?);
    let rows = count(backend.rows_written().await?);
    Ok(Snapshot {
        at: Instant::now(),
        role_calls: counts.on_roles(roles),
        calls: counts.snapshot(),
        statements,
        rows,
        cpu: process_cpu(),
        terms: log.started(),
    })
}

impl Snapshot {
    fn calls_since(&self, earlier: &Snapshot) -> BTreeMap<String, u64> {
        self.calls
            .iter()
            .map(|(method, n)| {
                let before = earlier.calls.get(method).copied().unwrap_or(0);
                ((*method).to_owned(), n.saturating_sub(before))
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    fn statements_since(&self, earlier: &Snapshot) -> Option<u64> {
        Some(self.statements?.saturating_sub(earlier.statements?))
    }
}

/// This process's CPU time (user + system, every thread), from `/proc/self/stat`.
fn process_cpu() -> Duration {
    // /proc reports clock ticks in USER_HZ, which the kernel ABI fixes at 100 per second.
    const USER_HZ: u64 = 100;
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // The command name (field 2) may hold spaces; the fields after its ')' are plain.
    let Some(after) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 1000 / USER_HZ)
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One running shard-group member.
struct RunningMember {
    node: String,
    state: watch::Receiver<ShardState>,
    shutdown: CancellationToken,
    task: JoinHandle<tenure::Result<()>>,
    /// A member dropped without [`stop`](RunningMember::stop) (a scenario that failed
    /// part-way) shuts down anyway, so it does not load the store for the next one.
    _stop_on_drop: DropGuard,
}

impl RunningMember {
    fn owned(&self) -> BTreeSet<u32> {
        self.state.borrow().owned.keys().copied().collect()
    }

    /// Shuts down gracefully: work cancelled, session closed, registry left.
    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// What every member of one scenario shares.
struct Scenario<'a> {
    backend: &'a dyn Backend,
    counts: Arc<CallCounts>,
    log: Arc<TermLog>,
    group: String,
    shards: u32,
    ttl: Duration,
    renew: Duration,
    retry: Duration,
}

impl Scenario<'_> {
    fn options(&self, node: &str) -> ShardOptions {
        ShardOptions {
            group: self.group.clone(),
            shards: self.shards,
            node_id: node.to_owned(),
            lease_ttl: self.ttl,
            renew_interval: self.renew,
            retry_interval: self.retry,
            ..Default::default()
        }
    }

    fn counted(&self, store: Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore> {
        Arc::new(InterceptStore::new(store).with(self.counts.clone()))
    }

    /// Starts members `nodes` on connections of their own, all at once (connected first,
    /// then started together, as after a deploy); membership lasts the lease TTL.
    async fn start(&self, nodes: &[String]) -> Result<Vec<RunningMember>, BenchError> {
        let mut electors = Vec::with_capacity(nodes.len());
        for node in nodes {
            let handles = self.backend.stores(MEMBER_POOL, self.ttl).await?;
            let leases = self.counted(handles.leases);
            let elector = ShardElector::new(leases, handles.registry, self.options(node))?;
            electors.push((node.clone(), Arc::new(elector)));
        }
        Ok(electors
            .into_iter()
            .map(|(node, elector)| {
                let state = elector.watch();
                let shutdown = CancellationToken::new();
                let (log, member) = (Arc::clone(&self.log), node.clone());
                let work = move |shard, _token: FencingToken, leadership| {
                    log.term(shard, &member, leadership)
                };
                let stop = shutdown.clone();
                let task = tokio::spawn(async move { elector.run(work, stop).await });
                RunningMember {
                    node,
                    state,
                    _stop_on_drop: shutdown.clone().drop_guard(),
                    shutdown,
                    task,
                }
            })
            .collect())
    }

    /// Member `i`'s node id: `<group>-m<i>`.
    fn node(&self, i: usize) -> String {
        format!("{}-m{i}", self.group)
    }

    /// Starts `count` members at once and waits until they settle; returns how long
    /// that took.
    async fn start_settled(
        &self,
        count: usize,
        limit: Duration,
    ) -> Result<(Vec<RunningMember>, Duration), BenchError> {
        let nodes: Vec<String> = (0..count).map(|i| self.node(i)).collect();
        let start = Instant::now();
        let members = self.start(&nodes).await?;
        let settle = self.settle(&members, start, limit).await?;
        Ok((members, settle))
    }

    /// Waits until every shard runs on exactly one of `members` and each owns
    /// `floor(N/M)` or `ceil(N/M)`; returns how long it took from `since`.
    async fn settle(
        &self,
        members: &[RunningMember],
        since: Instant,
        limit: Duration,
    ) -> Result<Duration, BenchError> {
        let m = members.len() as u32;
        let (floor, ceil) = (self.shards / m, self.shards.div_ceil(m));
        let settled = || {
            let shares: Vec<usize> = members
                .iter()
                .map(|mm| mm.state.borrow().owned.len())
                .collect();
            let even = shares.iter().all(|&n| (floor..=ceil).contains(&(n as u32)));
            let mut all = BTreeSet::new();
            (even
                && shares.iter().sum::<usize>() == self.shards as usize
                && members
                    .iter()
                    .all(|mm| mm.owned().into_iter().all(|s| all.insert(s))))
            .then(|| since.elapsed())
        };
        let unsettled = || {
            // Each member's own view: what it owns, what it targets at itself, and how
            // many members it sees.
            let views: Vec<String> = members
                .iter()
                .map(|mm| {
                    let state = mm.state.borrow();
                    let mine = state.target.values().filter(|t| **t == mm.node).count();
                    format!("{}/{}/{}", state.owned.len(), mine, state.members.len())
                })
                .collect();
            let owned: BTreeSet<u32> = members.iter().flat_map(|mm| mm.owned()).collect();
            let unowned: Vec<u32> = (0..self.shards).filter(|k| !owned.contains(k)).collect();
            format!(
                "{} shards over {m} members did not settle within {limit:?}: per member \
                 owned/targeted here/members seen: {}; unowned shards: {unowned:?}",
                self.shards,
                views.join(" ")
            )
        };
        wait_for(since, limit, settled, unsettled).await
    }
}

/// Polls `done` every [`LOOK_EVERY`] until it answers, or fails with `failure()` once
/// `limit` has passed since `since`.
async fn wait_for<T>(
    since: Instant,
    limit: Duration,
    mut done: impl FnMut() -> Option<T>,
    failure: impl FnOnce() -> String,
) -> Result<T, BenchError> {
    loop {
        if let Some(answer) = done() {
            return Ok(answer);
        }
        if since.elapsed() > limit {
            return Err(BenchError::Setup(failure()));
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// Removes and returns the member owning the most shards.
fn take_busiest(members: &mut Vec<RunningMember>) -> RunningMember {
    let busiest = (0..members.len())
        .max_by_key(|&i| members[i].owned().len())
        .unwrap_or(0);
    members.remove(busiest)
}

/// The shards whose owner differs between two views (`owners` of the members).
fn moved(before: &BTreeMap<u32, String>, after: &BTreeMap<u32, String>) -> Vec<u32> {
    after
        .iter()
        .filter(|(shard, owner)| before.get(shard) != Some(owner))
        .map(|(shard, _)| *shard)
        .collect()
}

/// Lets the last contending calls pass and the server's counters catch up, then reads
/// the counters around a window of `bench.window`.
async fn hold_window(
    backend: &dyn Backend,
    counts: &CallCounts,
    log: &TermLog,
    bench: &ShardBench,
) -> Result<(Snapshot, Snapshot), BenchError> {
    tokio::time::sleep(bench.renew_every.max(backend.counter_lag())).await;
    let before = snapshot(backend, counts, log).await?;
    tokio::time::sleep(bench.window).await;
    let after = snapshot(backend, counts, log).await?;
    Ok((before, after))
}

/// How long a group of `shards` may take to settle: generous, as every member contends
/// for its shares one by one on a loaded machine; more so where creating a shard's
/// object contends with every other creation ([`Backend::creates_contend`]).
fn settle_limit(backend: &dyn Backend, shards: u32, ttl: Duration) -> Duration {
    let per_shard = if backend.creates_contend() {
        Duration::from_millis(300)
    } else {
        Duration::from_millis(5)
    };
    ttl * 4 + per_shard * shards + Duration::from_secs(10)
}

/// Runs the shard scenarios.
pub(crate) async fn measure(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<ShardReport, BenchError> {
    let mut hold = vec![hold_group(backend, bench, run_id).await?];
    let quiet = if backend.counts_own_traffic() {
        Some(quiet_window(backend, bench).await?)
    } else {
        None
    };
    if bench.baseline {
        hold.push(hold_electors(backend, bench, run_id).await?);
    }
    let mut failed = Vec::new();
    let (mut churned, mut left) = (None, None);
    if bench.churn {
        // A scenario that fails is reported as failed; the figures before it stand.
        match churn(backend, bench, run_id).await {
            Ok(found) => churned = Some(found),
            Err(error) => failed.push(format!("churn: {error}")),
        }
        match leave(backend, bench, run_id).await {
            Ok(found) => left = Some(found),
            Err(error) => failed.push(format!("leave: {error}")),
        }
    }
    Ok(ShardReport {
        settings: ShardSettings {
            shards: bench.shards,
            members: bench.members,
            window_ms: millis(bench.window),
            hold_ttl_ms: millis(bench.hold_ttl),
            renew_ms: millis(bench.renew_every),
            churn_ttl_ms: millis(bench.churn_ttl),
        },
        hold,
        churn: churned,
        leave: left,
        statements_counted: backend.requests_label().to_owned(),
        rows_counted: backend.rows_label().to_owned(),
        quiet,
        failed,
    })
}

/// The server's counters over `bench.window` with nothing of the bench's running.
async fn quiet_window(
    backend: &dyn Backend,
    bench: &ShardBench,
) -> Result<QuietWindow, BenchError> {
    tracing::info!(window = ?bench.window, "measuring the server's own traffic");
    tokio::time::sleep(backend.counter_lag()).await;
    let log = TermLog::default();
    let counts = CallCounts::default();
    let before = snapshot(backend, &counts, &log).await?;
    tokio::time::sleep(bench.window).await;
    let after = snapshot(backend, &counts, &log).await?;
    let row = hold_row(
        "quiet",
        0,
        0,
        Duration::ZERO,
        bench.renew_every,
        &before,
        &after,
    );
    Ok(QuietWindow {
        window_ms: millis(after.at.duration_since(before.at)),
        statements_per_interval: row.statements_per_interval,
        rows_written_per_interval: row.rows_written_per_interval,
    })
}

/// Measures the window between two snapshots as a [`HoldRow`].
fn hold_row(
    holder: &str,
    roles: u32,
    contenders: usize,
    settle: Duration,
    renew: Duration,
    before: &Snapshot,
    after: &Snapshot,
) -> HoldRow {
    let window = after.at.duration_since(before.at);
    let intervals = window.as_secs_f64() / renew.as_secs_f64();
    let per = |n: u64| n as f64 / intervals;
    HoldRow {
        holder: holder.to_owned(),
        roles,
        contenders,
        settle_ms: millis(settle),
        restart_settle_ms: None,
        intervals,
        calls_per_interval: after
            .calls_since(before)
            .into_iter()
            .map(|(method, n)| (method, per(n)))
            .collect(),
        statements_per_interval: after.statements_since(before).map(per),
        rows_written_per_interval: after
            .rows
            .zip(before.rows)
            .map(|(a, b)| per(a.saturating_sub(b))),
        cpu_percent: 100.0 * after.cpu.saturating_sub(before.cpu).as_secs_f64()
            / window.as_secs_f64(),
        terms_restarted: after.terms - before.terms,
    }
}

async fn hold_group(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<HoldRow, BenchError> {
    let scenario = Scenario {
        backend,
        counts: Arc::default(),
        log: Arc::default(),
        group: format!("{run_id}-hold"),
        shards: bench.shards,
        ttl: bench.hold_ttl,
        renew: bench.renew_every,
        retry: bench.renew_every,
    };
    tracing::info!(
        shards = bench.shards,
        members = bench.members,
        "settling the shard group"
    );
    let limit = settle_limit(backend, bench.shards / bench.members as u32, bench.hold_ttl);
    let (members, settle) = scenario.start_settled(bench.members, limit).await?;
    tracing::info!(window = ?bench.window, "measuring the shard group's hold");
    let (before, after) = hold_window(backend, &scenario.counts, &scenario.log, bench).await?;
    for member in members {
        member.stop().await;
    }
    let restart_settle = if backend.creates_contend() {
        tracing::info!("starting the shard group again, its objects in place");
        let (members, settle) = scenario.start_settled(bench.members, limit).await?;
        for member in members {
            member.stop().await;
        }
        Some(millis(settle))
    } else {
        None
    };
    Ok(HoldRow {
        restart_settle_ms: restart_settle,
        ..hold_row(
            "shard group",
            bench.shards,
            bench.members,
            settle,
            bench.renew_every,
            &before,
            &after,
        )
    })
}

async fn hold_electors(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<HoldRow, BenchError> {
    let counts = Arc::new(CallCounts::default());
    let log = Arc::new(TermLog::default());
    let handles = backend.stores(10, bench.hold_ttl).await?;
    let store: Arc<dyn LeaseStore> =
        Arc::new(InterceptStore::new(handles.leases).with(counts.clone()));
    let role = |k: u32| format!("{run_id}-roles/{k}");
    if backend.creates_contend() {
        tracing::info!(
            roles = bench.shards,
            "creating the per-role electors' objects"
        );
        let owner = format!("{run_id}-elector-prep");
        for k in 0..bench.shards {
            let lease = store
                .try_acquire_or_renew(&role(k), &owner, bench.hold_ttl)
                .await?;
            store.release(&role(k), &owner, lease.fencing_token).await?;
        }
    }
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(bench.shards as usize);
    tracing::info!(electors = bench.shards, "starting per-role electors");
    for k in 0..bench.shards {
        let options = LeaseLeaderOptions {
            owner_id: format!("{run_id}-elector-{k}"),
            lease_ttl: bench.hold_ttl,
            renew_interval: bench.renew_every,
            retry_interval: bench.renew_every,
            ..Default::default()
        };
        let elector = LeaseLeaderElector::new(store.clone(), options)?;
        let (log, stop, role) = (Arc::clone(&log), shutdown.clone(), role(k));
        tasks.push(tokio::spawn(async move {
            let work = |_token, leadership| log.term(k, "elector", leadership);
            elector.run(&role, work, stop).await
        }));
    }
    let limit = settle_limit(backend, bench.shards, bench.hold_ttl);
    let all_lead = || (log.started() >= u64::from(bench.shards)).then(|| start.elapsed());
    let some_wait = || {
        format!(
            "{} per-role electors did not all lead within {limit:?} ({} did)",
            bench.shards,
            log.started()
        )
    };
    let settle = wait_for(start, limit, all_lead, some_wait)
        .await
        .inspect_err(|_| shutdown.cancel())?;
    tracing::info!(window = ?bench.window, "measuring the per-role electors' hold");
    let (before, after) = hold_window(backend, &counts, &log, bench).await?;
    shutdown.cancel();
    for task in tasks {
        let _ = task.await;
    }
    Ok(hold_row(
        "per-role electors",
        bench.shards,
        bench.shards as usize,
        settle,
        bench.renew_every,
        &before,
        &after,
    ))
}

/// The churn and leave timings: renew at a quarter of the TTL, look again at a tenth.
fn churn_scenario<'a>(backend: &'a dyn Backend, bench: &ShardBench, group: String) -> Scenario<'a> {
    Scenario {
        backend,
        counts: Arc::default(),
        log: Arc::default(),
        group,
        shards: CHURN_SHARDS,
        ttl: bench.churn_ttl,
        renew: bench.churn_ttl / 4,
        retry: bench.churn_ttl / 10,
    }
}

async fn churn(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<Churn, BenchError> {
    let scenario = churn_scenario(backend, bench, format!("{run_id}-churn"));
    let limit = settle_limit(backend, CHURN_SHARDS, scenario.ttl);
    tracing::info!("churn: a cold start of {CHURN_MEMBERS} members");
    let (mut members, cold) = scenario.start_settled(CHURN_MEMBERS, limit).await?;
    let cold_shares = members.iter().map(|m| m.owned().len()).collect();

    tracing::info!("churn: a member joins");
    let owners_before = owners(&members);
    let joined = Instant::now();
    let newcomer = scenario.node(CHURN_MEMBERS);
    members.extend(scenario.start(std::slice::from_ref(&newcomer)).await?);
    let join_settle = scenario.settle(&members, joined, limit).await?;
    let owners_after = owners(&members);
    let moved = moved(&owners_before, &owners_after);
    let to_newcomer = moved
        .iter()
        .filter(|s| owners_after.get(s) == Some(&newcomer))
        .count();
    let mut handovers = Vec::new();
    for shard in &moved {
        let Some(from) = owners_before.get(shard) else {
            continue;
        };
        let ended = scenario.log.end_of(*shard, from, joined);
        let started = scenario.log.first_start(*shard, joined, Some(from));
        if let (Some(ended), Some(started)) = (ended, started) {
            handovers.push(started.saturating_duration_since(ended));
        }
    }

    tracing::info!("churn: the member with the most shards is killed");
    let victim = take_busiest(&mut members);
    let victim_shards = victim.owned();
    let killed = Instant::now();
    victim.task.abort();
    let all_owned_again = || {
        let starts: Option<Vec<Instant>> = victim_shards
            .iter()
            .map(|s| scenario.log.first_start(*s, killed, Some(&victim.node)))
            .collect();
        Some(
            starts?
                .into_iter()
                .max()
                .unwrap_or(killed)
                .duration_since(killed),
        )
    };
    let some_not = || {
        format!(
            "the killed member's {} shards were not all owned again within {limit:?}",
            victim_shards.len()
        )
    };
    let reowned = wait_for(killed, limit, all_owned_again, some_not).await?;
    for member in members {
        member.stop().await;
    }
    Ok(Churn {
        shards: CHURN_SHARDS,
        cold_settle_ms: millis(cold),
        cold_settle_intervals: cold.as_secs_f64() / scenario.renew.as_secs_f64(),
        cold_shares,
        join_moved: moved.len(),
        join_moved_to_newcomer: to_newcomer,
        join_settle_ms: millis(join_settle),
        handover: summarize(&handovers),
        killed_shards: victim_shards.len(),
        kill_reowned_ms: millis(reowned),
        ttl_ms: millis(scenario.ttl),
    })
}

/// Each shard's owner in the members' views.
fn owners(members: &[RunningMember]) -> BTreeMap<u32, String> {
    members
        .iter()
        .flat_map(|m| m.owned().into_iter().map(|s| (s, m.node.clone())))
        .collect()
}

async fn leave(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<Leave, BenchError> {
    let scenario = churn_scenario(backend, bench, format!("{run_id}-leave"));
    let limit = settle_limit(backend, CHURN_SHARDS, scenario.ttl);
    tracing::info!("leave: {LEAVE_MEMBERS} members settle {CHURN_SHARDS} shards");
    let (mut members, _) = scenario.start_settled(LEAVE_MEMBERS, limit).await?;
    tokio::time::sleep(scenario.renew).await;

    tracing::info!("leave: one member shuts down");
    let owners_before = owners(&members);
    let leaver = take_busiest(&mut members);
    let leaver_node = leaver.node.clone();
    let leaver_shards = leaver.owned();
    let watched: Vec<String> = leaver_shards
        .iter()
        .map(|&k| tenure::shard::role(&scenario.group, k))
        .collect();
    let look = |at: &'static str| {
        tracing::debug!(at, "leave: reading the counters");
        snapshot_watching(backend, &scenario.counts, &scenario.log, &watched)
    };
    let before = look("before").await?;
    let left = Instant::now();
    leaver.stop().await;
    scenario.settle(&members, left, limit).await?;
    let after = look("settled").await?;
    tokio::time::sleep(after.at.duration_since(before.at)).await;
    let quiet = look("quiet").await?;

    let moved = moved(&owners_before, &owners(&members));
    let handovers: Vec<Duration> = leaver_shards
        .iter()
        .filter_map(|shard| {
            let ended = scenario.log.end_of(*shard, &leaver_node, left)?;
            let started = scenario.log.first_start(*shard, left, Some(&leaver_node))?;
            Some(started.saturating_duration_since(ended))
        })
        .collect();
    let per_moved = |n: u64| n as f64 / moved.len().max(1) as f64;
    let acquires = after
        .calls_since(&before)
        .get("acquire_in_session")
        .copied()
        .unwrap_or(0);
    for member in members {
        member.stop().await;
    }
    let electors = elector_leave(backend, bench, run_id).await?;
    Ok(Leave {
        members: LEAVE_MEMBERS,
        shards: CHURN_SHARDS,
        moved: moved.len(),
        leaver_shards: leaver_shards.len(),
        acquires_per_moved: per_moved(acquires),
        role_calls_per_moved: per_moved(after.role_calls - before.role_calls),
        statements: after.statements_since(&before).map(|n| n as f64),
        background_statements: quiet.statements_since(&after).map(|n| n as f64),
        handover: summarize(&handovers),
        electors,
    })
}

/// `LEAVE_MEMBERS` electors on one role, each on connections of its own as separate
/// processes would be; the leader shuts down.
async fn elector_leave(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<ElectorLeave, BenchError> {
    let counts = Arc::new(CallCounts::default());
    let log = Arc::new(TermLog::default());
    let role = format!("{run_id}-one-role");
    let ttl = bench.churn_ttl;
    let mut electors = Vec::new();
    // However this ends, no elector outlives it.
    let all = CancellationToken::new();
    let _stop_all = all.clone().drop_guard();
    for i in 0..LEAVE_MEMBERS {
        let handles = backend.stores(MEMBER_POOL, ttl).await?;
        let store: Arc<dyn LeaseStore> =
            Arc::new(InterceptStore::new(handles.leases).with(counts.clone()));
        let options = LeaseLeaderOptions {
            owner_id: format!("{run_id}-one-role-{i}"),
            lease_ttl: ttl,
            renew_interval: ttl / 4,
            retry_interval: ttl / 10,
            ..Default::default()
        };
        let elector = Arc::new(LeaseLeaderElector::new(store, options)?);
        let shutdown = all.child_token();
        let (log, stop, role, name) = (
            Arc::clone(&log),
            shutdown.clone(),
            role.clone(),
            format!("e{i}"),
        );
        let task = tokio::spawn(async move {
            let work = |_token, leadership| log.term(0, &name, leadership);
            elector.run(&role, work, stop).await
        });
        electors.push((format!("e{i}"), shutdown, task));
    }
    let limit = settle_limit(backend, 1, ttl);
    let start = Instant::now();
    let running = || {
        let terms = log.terms.lock();
        terms
            .iter()
            .find(|t| t.end.is_none())
            .map(|t| t.member.clone())
    };
    let none = || format!("no elector led the role within {limit:?}");
    let leader = wait_for(start, limit, running, none).await?;
    tokio::time::sleep(ttl / 4).await;
    let watched = [role.clone()];
    let before = snapshot_watching(backend, &counts, &log, &watched).await?;
    let left = Instant::now();
    let at = electors.iter().position(|(name, _, _)| *name == leader);
    if let Some(at) = at {
        let (_, shutdown, task) = electors.remove(at);
        shutdown.cancel();
        let _ = task.await;
    }
    let taken_over = || log.first_start(0, left, Some(&leader));
    let none = || format!("no elector took the role over within {limit:?}");
    let started = wait_for(left, limit, taken_over, none).await?;
    let after = snapshot_watching(backend, &counts, &log, &watched).await?;
    tokio::time::sleep(after.at.duration_since(before.at)).await;
    let quiet = snapshot_watching(backend, &counts, &log, &watched).await?;
    let ended = log.end_of(0, &leader, left).unwrap_or(left);
    for (_, shutdown, _) in &electors {
        shutdown.cancel();
    }
    for (_, _, task) in electors {
        let _ = task.await;
    }
    Ok(ElectorLeave {
        electors: LEAVE_MEMBERS,
        role_calls: (after.role_calls - before.role_calls) as f64
            - (quiet.role_calls - after.role_calls) as f64,
        statements: after.statements_since(&before).map(|n| n as f64),
        background_statements: quiet.statements_since(&after).map(|n| n as f64),
        handover_ms: millis(started.saturating_duration_since(ended)),
    })
}

impl ShardReport {
    /// The human report: one table per scenario.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "holding {} roles, renew every {:.0}ms, ttl {:.0}ms, measured over {:.1}s",
            s.shards,
            s.renew_ms,
            s.hold_ttl_ms,
            s.window_ms / 1e3
        );
        let _ = writeln!(
            out,
            "  {:<18} {:>8} {:>9} {:>12} {:>12} {:>8} {:>9}  store calls per interval",
            "holder", "settle", "restarted", "stmts/intvl", "rows/intvl", "cpu", "intervals"
        );
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        for row in &self.hold {
            let calls: Vec<String> = row
                .calls_per_interval
                .iter()
                .map(|(method, n)| format!("{method} {n:.1}"))
                .collect();
            let _ = writeln!(
                out,
                "  {:<18} {:>6.0}ms {:>9} {:>12} {:>12} {:>7.1}% {:>9.1}  {}",
                format!("{} ({})", row.holder, row.contenders),
                row.settle_ms,
                row.terms_restarted,
                opt(row.statements_per_interval),
                opt(row.rows_written_per_interval),
                row.cpu_percent,
                row.intervals,
                calls.join(", ")
            );
            if let Some(again) = row.restart_settle_ms {
                let _ = writeln!(
                    out,
                    "  ({} started again, its objects in place: settled in {again:.0}ms)",
                    row.holder
                );
            }
        }
        let _ = writeln!(out, "  stmts: {}", self.statements_counted);
        let _ = writeln!(out, "  rows: {}", self.rows_counted);
        if let Some(q) = &self.quiet {
            let _ = writeln!(
                out,
                "  quiet window ({:.1}s, nothing of the bench running): stmts/intvl {}, \
                 rows/intvl {} (the server's own, counted in the rows above too)",
                q.window_ms / 1e3,
                opt(q.statements_per_interval),
                opt(q.rows_written_per_interval),
            );
        }
        if let Some(c) = &self.churn {
            let _ = writeln!(out, "churn: {} shards, ttl {:.0}ms", c.shards, c.ttl_ms);
            let _ = writeln!(
                out,
                "  4 members, cold start: settled in {:.0}ms ({:.1} renew intervals), shares {:?}",
                c.cold_settle_ms, c.cold_settle_intervals, c.cold_shares
            );
            let _ = writeln!(
                out,
                "  a 5th joins: {} shards moved, {} of them to the newcomer; settled in {:.0}ms; \
                 handover p50 {:.2}ms p99 {:.2}ms max {:.2}ms",
                c.join_moved,
                c.join_moved_to_newcomer,
                c.join_settle_ms,
                c.handover.p50_us / 1e3,
                c.handover.p99_us / 1e3,
                c.handover.max_us / 1e3
            );
            let _ = writeln!(
                out,
                "  a member with {} shards killed: all owned again after {:.0}ms (ttl {:.0}ms)",
                c.killed_shards, c.kill_reowned_ms, c.ttl_ms
            );
        }
        if let Some(l) = &self.leave {
            let e = &l.electors;
            let _ = writeln!(
                out,
                "leave: {} members, {} shards; one with {} shards leaves: {} moved; per moved \
                 shard {:.1} acquires, {:.1} calls on its role; handover p50 {:.2}ms p99 {:.2}ms; \
                 statements {} (quiet window of the same length: {})",
                l.members,
                l.shards,
                l.leaver_shards,
                l.moved,
                l.acquires_per_moved,
                l.role_calls_per_moved,
                l.handover.p50_us / 1e3,
                l.handover.p99_us / 1e3,
                opt(l.statements),
                opt(l.background_statements),
            );
            let _ = writeln!(
                out,
                "  beside {} electors on one role, the leader leaves: {:.1} calls on the role, \
                 handover {:.2}ms; statements {} (quiet: {})",
                e.electors,
                e.role_calls,
                e.handover_ms,
                opt(e.statements),
                opt(e.background_statements),
            );
        }
        for failure in &self.failed {
            let _ = writeln!(out, "failed: {failure}");
        }
        out
    }
}
