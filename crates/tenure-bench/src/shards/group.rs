//! Running shard-group members for a scenario: starting them on connections of their own,
//! waiting for them to settle, and reading who owns what.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure::intercept::{FilteredRegistry, InterceptStore, RegistryFilter};
use tenure::{FencingToken, LeaseStore, ShardElector, ShardOptions, ShardState};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::counters::{millis, CallCounts, PerRoleAcquires, TermLog};
use super::{Kill, LOOK_EVERY, MEMBER_POOL};
use crate::backend::Backend;
use crate::BenchError;

/// How many unowned shards an unsettled group's error names.
const UNOWNED_SHOWN: usize = 50;

/// One running shard-group member.
pub(super) struct RunningMember {
    pub(super) node: String,
    state: watch::Receiver<ShardState>,
    /// The member's session deadline, as it last knew it.
    deadline: watch::Receiver<Option<Instant>>,
    shutdown: CancellationToken,
    pub(super) task: JoinHandle<tenure::Result<()>>,
    /// Set when the member is killed: its registry then drops every write.
    dead: Arc<AtomicBool>,
    /// A member dropped without [`stop`](RunningMember::stop) (a scenario that failed
    /// part-way) shuts down anyway, so it does not load the store for the next one.
    _stop_on_drop: DropGuard,
}

impl RunningMember {
    pub(super) fn owned(&self) -> BTreeSet<u32> {
        self.state.borrow().owned.keys().copied().collect()
    }

    /// Whether this member's plan names `node` as the target of any shard.
    pub(super) fn targets_any(&self, node: &str) -> bool {
        self.state.borrow().target.values().any(|t| t == node)
    }

    /// Kills the member as SIGKILL would: its task stops where it is, and nothing it
    /// leaves behind writes again (its heartbeat task, cancelled by the drop, would
    /// otherwise leave the registry).
    pub(super) fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.task.abort();
    }

    /// Shuts down gracefully: work cancelled, session closed, registry left.
    pub(super) async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// What every member of one scenario shares.
pub(super) struct Scenario<'a> {
    pub(super) backend: &'a dyn Backend,
    pub(super) counts: Arc<CallCounts>,
    pub(super) log: Arc<TermLog>,
    pub(super) group: String,
    pub(super) shards: u32,
    pub(super) ttl: Duration,
    /// Members acquire one role per call, as before batches (the settle baseline).
    pub(super) per_role_acquires: bool,
    pub(super) renew: Duration,
    pub(super) retry: Duration,
}

impl Scenario<'_> {
    pub(super) fn options(&self, node: &str) -> ShardOptions {
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

    pub(super) fn counted(&self, store: Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore> {
        let counted = InterceptStore::new(store).with(self.counts.clone());
        if self.per_role_acquires {
            Arc::new(counted.with(Arc::new(PerRoleAcquires)))
        } else {
            Arc::new(counted)
        }
    }

    /// Starts members `nodes` on connections of their own, all at once (connected first,
    /// then started together, as after a deploy); membership lasts the lease TTL.
    pub(super) async fn start(&self, nodes: &[String]) -> Result<Vec<RunningMember>, BenchError> {
        let mut electors = Vec::with_capacity(nodes.len());
        for node in nodes {
            let handles = self.backend.stores(MEMBER_POOL, self.ttl).await?;
            let leases = self.counted(handles.leases);
            let dead = Arc::new(AtomicBool::new(false));
            let registry = Arc::new(FilteredRegistry::new(
                handles.registry,
                Mortal(dead.clone()),
            ));
            let elector = ShardElector::new(leases, registry, self.options(node))?;
            electors.push((node.clone(), Arc::new(elector), dead));
        }
        Ok(electors
            .into_iter()
            .map(|(node, elector, dead)| {
                let (state, deadline) = (elector.watch(), elector.deadline());
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
                    deadline,
                    dead,
                    _stop_on_drop: shutdown.clone().drop_guard(),
                    shutdown,
                    task,
                }
            })
            .collect())
    }

    /// Member `i`'s node id: `<group>-m<i>`.
    pub(super) fn node(&self, i: usize) -> String {
        format!("{}-m{i}", self.group)
    }

    /// Starts `count` members at once and waits until they settle; returns how long
    /// that took.
    pub(super) async fn start_settled(
        &self,
        count: usize,
        limit: Duration,
    ) -> Result<(Vec<RunningMember>, Duration), BenchError> {
        let nodes: Vec<String> = (0..count).map(|i| self.node(i)).collect();
        let members = self.start(&nodes).await?;
        // From the members' start, not from connecting their stores one by one before.
        let start = Instant::now();
        let settle = self.settle(&members, start, limit).await?;
        Ok((members, settle))
    }

    /// Waits until every shard runs on exactly one of `members` and each owns
    /// `floor(N/M)` or `ceil(N/M)`; returns how long it took from `since`.
    pub(super) async fn settle(
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
            // The first few: a large group left unsettled may have a million.
            let shown = &unowned[..unowned.len().min(UNOWNED_SHOWN)];
            format!(
                "{} shards over {m} members did not settle within {limit:?}: per member \
                 owned/targeted here/members seen: {}; {} unowned shards, the first: {shown:?}",
                self.shards,
                views.join(" "),
                unowned.len()
            )
        };
        wait_for(since, limit, settled, unsettled).await
    }

    /// Kills the member owning the most shards (its task aborted: no release, no session
    /// close, no leave, as with SIGKILL) and waits until each of its shards runs on
    /// another member.
    pub(super) async fn kill_busiest(
        &self,
        members: &mut Vec<RunningMember>,
        limit: Duration,
    ) -> Result<Kill, BenchError> {
        let victim = take_busiest(members);
        let shards = victim.owned();
        let killed = Instant::now();
        victim.kill();
        // The session's end as the member last knew it: a little before the store's
        // expiry (it counts from when the keep-alive was sent, less the drift margin).
        let lapse = victim.deadline.borrow().map_or(Duration::ZERO, |deadline| {
            deadline.saturating_duration_since(killed)
        });
        let all_owned_again = || {
            let last = self.log.all_started(&shards, killed, &victim.node)?;
            Some(last.duration_since(killed))
        };
        let some_not = || {
            format!(
                "the killed member's {} shards were not all owned again within {limit:?}",
                shards.len()
            )
        };
        let reowned = wait_for(killed, limit, all_owned_again, some_not).await?;
        Ok(Kill {
            shards: shards.len(),
            reowned_ms: millis(reowned),
            lapse_ms: millis(lapse),
        })
    }
}

/// Polls `done` every [`LOOK_EVERY`] until it answers, or fails with `failure()` once
/// `limit` has passed since `since`.
pub(super) async fn wait_for<T>(
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
pub(super) fn take_busiest(members: &mut Vec<RunningMember>) -> RunningMember {
    let busiest = (0..members.len())
        .max_by_key(|&i| members[i].owned().len())
        .unwrap_or(0);
    members.remove(busiest)
}

/// The shards whose owner differs between two views (`owners` of the members).
pub(super) fn moved(before: &BTreeMap<u32, String>, after: &BTreeMap<u32, String>) -> Vec<u32> {
    after
        .iter()
        .filter(|(shard, owner)| before.get(shard) != Some(owner))
        .map(|(shard, _)| *shard)
        .collect()
}

/// How long a group of `shards` over `members` may take to settle: generous, as every
/// member contends for its shares one by one on a loaded machine; more so where creating
/// a shard's object contends with every other creation ([`Backend::creates_contend`]).
/// Each member adds a join the others replan for, and members started at once open
/// their sessions together: on 2 loaded cores 30 members with a 1 s TTL were seen to
/// lapse all their sessions in that herd and settle only after opening them again.
pub(super) fn settle_limit(
    backend: &dyn Backend,
    shards: u32,
    members: usize,
    ttl: Duration,
) -> Duration {
    let per_shard = if backend.creates_contend() {
        Duration::from_millis(300)
    } else {
        Duration::from_millis(5)
    };
    let per_member = (ttl / 4).max(Duration::from_millis(250));
    let members = u32::try_from(members).unwrap_or(u32::MAX);
    ttl * 4 + per_shard * shards + per_member.saturating_mul(members) + Duration::from_secs(10)
}

/// Each shard's owner in the members' views.
pub(super) fn owners(members: &[RunningMember]) -> BTreeMap<u32, String> {
    members
        .iter()
        .flat_map(|m| m.owned().into_iter().map(|s| (s, m.node.clone())))
        .collect()
}

/// Drops a member's registry writes once it is dead, as for a process killed with
/// SIGKILL: no more heartbeats, and no leave.
struct Mortal(Arc<AtomicBool>);

impl RegistryFilter for Mortal {
    fn before_write(&self) -> tenure::Result<bool> {
        Ok(!self.0.load(Ordering::SeqCst))
    }
}
