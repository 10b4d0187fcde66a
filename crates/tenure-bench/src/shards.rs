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
//! - **wedged** (when asked for a length): the hold's members and one more that
//!   heartbeats into the group but never runs (its work never starts, it answers no
//!   handover), on the hold's shards and TTL; how much of the time each shard ran.
//!
//! Every wait is bounded: a group that does not settle is an error, not a hang.
//!
//! [`LeaseLeaderElector`]: tenure::LeaseLeaderElector
//! [`InterceptStore`]: tenure::intercept::InterceptStore

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::backend::Backend;
use crate::stats::Latency;
use crate::BenchError;

mod churn;
mod counters;
mod group;
mod hold;
mod text;
mod wedged;

use churn::{churn, leave};
use counters::millis;
use hold::{hold_electors, hold_group, quiet_window};

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
    /// Also run the wedged scenario for this long.
    pub wedged: Option<Duration>,
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
            wedged: None,
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
        if let Some(length) = self.wedged.filter(|l| *l < self.renew_every) {
            return usage(format!(
                "--wedged {length:?} must be at least one renew interval (--renew-every {:?})",
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
    /// A group with a wedged member, when run.
    pub wedged: Option<Wedged>,
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
    /// The group's cold settle once more, its members acquiring one shard per call (16
    /// at a time) instead of in batches: the same run's baseline for `settle_ms`.
    /// `None` for the per-role electors.
    pub per_role_settle_ms: Option<f64>,
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
    /// For a group of two members or more: after the window, the member with the most
    /// shards killed, and how soon the others ran its shards (hold TTL). `None` for
    /// one member and for the per-role electors.
    pub kill: Option<Kill>,
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
    /// Of those, the handovers whose old owner's work ended before the newcomer worked
    /// on any shard: probes (see `tenure::shard`), which wait for the newcomer to be
    /// ready (its first look, its waiters), not only for the handover.
    pub handover_before_working: Latency,
    /// The rest: handovers to a newcomer already working on a shard.
    pub handover_to_working: Latency,
    /// The member with the most shards killed.
    pub kill: Kill,
    /// The lease (and member) TTL.
    pub ttl_ms: f64,
}

/// A member killed (as with SIGKILL: no release, no session close, no leave) and its
/// shards taken over by the others.
#[derive(Clone, Debug, Serialize)]
pub struct Kill {
    /// Shards the killed member owned.
    pub shards: usize,
    /// From the kill until every one of them ran on another member.
    pub reowned_ms: f64,
    /// From the kill until the killed member's session deadline (as it last knew it):
    /// the part of `reowned_ms` spent waiting for the session to lapse, which depends
    /// on when in its renew interval the member died. `reowned_ms - lapse_ms` is what
    /// the survivors took.
    pub lapse_ms: f64,
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

/// The wedged scenario's findings: `members` working members and one wedged one.
#[derive(Clone, Debug, Serialize)]
pub struct Wedged {
    /// Working members.
    pub members: usize,
    /// Shards.
    pub shards: u32,
    /// From the members' start until every shard had run at once.
    pub all_ran_ms: f64,
    /// How long it was sampled after that.
    pub measured_ms: f64,
    /// Samples taken (one every 100 ms).
    pub samples: u64,
    /// The share of the samples in which the least-run shard ran.
    pub least_running_share: f64,
    /// The mean over the shards of that share.
    pub mean_running_share: f64,
    /// Shards that ran in under 99% of the samples.
    pub shards_under_99_percent: usize,
    /// The share of the samples in which some working member's plan targeted a shard at
    /// the wedged member.
    pub targeted_at_wedged_share: f64,
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
    let mut stuck = None;
    if let Some(length) = bench.wedged {
        match wedged::wedged(backend, bench, run_id, length).await {
            Ok(found) => stuck = Some(found),
            Err(error) => failed.push(format!("wedged: {error}")),
        }
    }
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
        wedged: stuck,
        statements_counted: backend.requests_label().to_owned(),
        rows_counted: backend.rows_label().to_owned(),
        quiet,
        failed,
    })
}
