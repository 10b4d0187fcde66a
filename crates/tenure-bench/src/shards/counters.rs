//! What the scenarios count: lease-store calls by method and role, the terms that ran, and
//! the server's and this process's counters read at one moment.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::lease::ACQUIRE_MANY_IN_FLIGHT;
use tenure::{LeaseLeaderElector, LeaseLeaderOptions, LeaseStore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Counter};
use crate::BenchError;

/// The key under which [`CallCounts`] counts the roles named by batched acquires (beside
/// the batches themselves, under `acquire_many_in_session`).
pub(super) const BATCHED_ROLES: &str = "acquire_many_in_session.roles";

/// Counts the lease-store calls of every member or elector, by method and by role.
#[derive(Default)]
pub(super) struct CallCounts {
    by_method: Mutex<BTreeMap<&'static str, u64>>,
    by_role: Mutex<HashMap<String, u64>>,
}

#[async_trait]
impl Interceptor for CallCounts {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        {
            let mut by_method = self.by_method.lock();
            *by_method.entry(call.method()).or_default() += 1;
            if let Call::AcquireManyInSession { roles, .. } = &call {
                *by_method.entry(BATCHED_ROLES).or_default() += roles.len() as u64;
            }
        }
        let roles = match &call {
            Call::TryAcquireOrRenew { role, .. }
            | Call::Release { role, .. }
            | Call::Get { role }
            | Call::WaitForChange { role, .. }
            | Call::AcquireInSession { role, .. } => std::slice::from_ref(role),
            // A batch names each of its roles once.
            Call::AcquireManyInSession { roles, .. } => roles.as_slice(),
            _ => &[],
        };
        {
            let mut by_role = self.by_role.lock();
            for role in roles {
                *by_role.entry(role.clone()).or_default() += 1;
            }
        }
        next.run(call).await
    }
}

impl CallCounts {
    pub(super) fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.by_method.lock().clone()
    }

    /// Calls naming any of `roles` so far.
    pub(super) fn on_roles(&self, roles: &[String]) -> u64 {
        let by_role = self.by_role.lock();
        roles.iter().filter_map(|r| by_role.get(r)).sum()
    }
}

/// Passes each batched acquire on as one `acquire_in_session` call per role,
/// [`ACQUIRE_MANY_IN_FLIGHT`] at a time (what a store without batches does): the
/// baseline a batched settle is measured against. Counted calls are the batches (it
/// sits after [`CallCounts`]).
pub(super) struct PerRoleAcquires;

#[async_trait]
impl Interceptor for PerRoleAcquires {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        let Call::AcquireManyInSession { roles, session } = call else {
            return next.run(call).await;
        };
        let mut answers = Vec::with_capacity(roles.len());
        for wave in roles.chunks(ACQUIRE_MANY_IN_FLIGHT) {
            let calls = wave.iter().map(|role| {
                let call = Call::AcquireInSession {
                    role: role.clone(),
                    session,
                };
                next.clone().run(call)
            });
            for reply in futures_util::future::join_all(calls).await {
                match reply.into_lease() {
                    Ok(answer) => answers.push(answer),
                    Err(error) => return Reply::Leases(Err(error)),
                }
            }
        }
        Reply::Leases(Ok(answers))
    }
}

/// One term of work: which role (shard), who ran it, when it started and ended.
pub(super) struct TermRecord {
    shard: u32,
    pub(super) member: String,
    start: Instant,
    pub(super) end: Option<Instant>,
}

/// The lease store of a fresh set of `backend`'s handles (`clients` connections,
/// registry TTL `ttl`), its calls counted in `counts`.
pub(super) async fn counted_store(
    backend: &dyn Backend,
    clients: usize,
    ttl: Duration,
    counts: &Arc<CallCounts>,
) -> Result<Arc<dyn LeaseStore>, BenchError> {
    let handles = backend.stores(clients, ttl).await?;
    Ok(Arc::new(
        InterceptStore::new(handles.leases).with(counts.clone()),
    ))
}

/// Runs a per-role elector on `role` whose work logs each of its terms in `log` as
/// shard `shard`'s `member` (the per-role baselines beside the shard group), until `stop`.
pub(super) fn spawn_logged_elector(
    store: Arc<dyn LeaseStore>,
    options: LeaseLeaderOptions,
    role: String,
    log: &Arc<TermLog>,
    shard: u32,
    member: String,
    stop: CancellationToken,
) -> Result<JoinHandle<tenure::Result<()>>, BenchError> {
    let elector = LeaseLeaderElector::new(store, options)?;
    let log = Arc::clone(log);
    Ok(tokio::spawn(async move {
        let work = |_token, leadership| log.term(shard, &member, leadership);
        elector.run(&role, work, stop).await
    }))
}

/// Every term that ran in a scenario.
#[derive(Default)]
pub(super) struct TermLog {
    pub(super) terms: Mutex<Vec<TermRecord>>,
    started: AtomicU64,
}

pub(super) type WorkFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

impl TermLog {
    /// Records a term from its start until `leadership` is cancelled.
    pub(super) fn term(
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

    pub(super) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// The first term of `shard` started at or after `since` by someone other than
    /// `not_by`.
    pub(super) fn first_start(
        &self,
        shard: u32,
        since: Instant,
        not_by: Option<&str>,
    ) -> Option<Instant> {
        self.terms
            .lock()
            .iter()
            .filter(|t| t.shard == shard && t.start >= since && Some(t.member.as_str()) != not_by)
            .map(|t| t.start)
            .min()
    }

    /// When the last of `shards` first started again at or after `since` by someone other
    /// than `not_by`; `None` while one has not. Reads only the terms started since (the
    /// log is in order of start), so a wait can poll it however many shards there are.
    pub(super) fn all_started(
        &self,
        shards: &BTreeSet<u32>,
        since: Instant,
        not_by: &str,
    ) -> Option<Instant> {
        let terms = self.terms.lock();
        let mut first: BTreeMap<u32, Instant> = BTreeMap::new();
        for term in terms.iter().rev().take_while(|t| t.start >= since) {
            if term.member != not_by && shards.contains(&term.shard) {
                first.insert(term.shard, term.start);
            }
        }
        (first.len() == shards.len()).then(|| first.into_values().max().unwrap_or(since))
    }

    /// When `member`'s term of `shard` that was running at `at` ended.
    pub(super) fn end_of(&self, shard: u32, member: &str, at: Instant) -> Option<Instant> {
        self.terms
            .lock()
            .iter()
            .filter(|t| t.shard == shard && t.member == member && t.start <= at)
            .filter_map(|t| t.end.filter(|end| *end >= at))
            .min()
    }
}

/// The counters read at one moment.
pub(super) struct Snapshot {
    pub(super) at: Instant,
    /// Calls naming the roles the scenario watches.
    pub(super) role_calls: u64,
    calls: BTreeMap<&'static str, u64>,
    statements: Option<u64>,
    pub(super) rows: Option<u64>,
    pub(super) cpu: Duration,
    pub(super) terms: u64,
}

pub(super) async fn snapshot(
    backend: &dyn Backend,
    counts: &CallCounts,
    log: &TermLog,
) -> Result<Snapshot, BenchError> {
    snapshot_watching(backend, counts, log, &[]).await
}

pub(super) async fn snapshot_watching(
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
    pub(super) fn calls_since(&self, earlier: &Snapshot) -> BTreeMap<String, u64> {
        self.calls
            .iter()
            .map(|(method, n)| {
                let before = earlier.calls.get(method).copied().unwrap_or(0);
                ((*method).to_owned(), n.saturating_sub(before))
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    pub(super) fn statements_since(&self, earlier: &Snapshot) -> Option<u64> {
        Some(self.statements?.saturating_sub(earlier.statements?))
    }
}

/// This process's CPU time (user + system, every thread), from `/proc/self/stat`.
pub(super) fn process_cpu() -> Duration {
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

pub(super) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
