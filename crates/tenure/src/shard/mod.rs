//! Shard groups: `N` fenced shards spread evenly across the live members of a group.
//!
//! Shard `k` of group `G` is the role `G/k`: an ordinary lease with its own fencing token,
//! so fences, `tenure status` and every rule of a single role apply per shard. A
//! [`ShardElector`] is one member. It heartbeats its `node_id` into a [`NodeRegistry`]
//! (metadata `group = G`), computes the target owner of every shard from the live
//! members with [`place`](crate::placement::place), contends only for the shards
//! targeted at it, and hands the others over gracefully (cancel the work, await it,
//! release, so the target takes the shard on the store's push). It holds all its shards
//! under one session ([`crate::session`]), so keeping them alive costs one call per
//! renew interval however many it holds.
//!
//! **Guarantees.** Each shard has at most one live owner at any store time (it is a
//! lease). A member cancels every shard's `leadership` no later than
//! `sent + granted * (1 - max_clock_drift) - work_grace` of its last successful session
//! renewal, even if the store hangs. After membership settles every shard is owned and
//! each live member owns `floor(N/M)` or `ceil(N/M)` of them.
//!
//! **Non-guarantees.** As for the single-role elector: a paused process can still act
//! after its shards moved; only fences stop it. Membership views may differ for a
//! moment; the per-shard leases keep that safe, and a shard nobody owns for longer than
//! the TTL (its target is wedged, or views disagree) is rescued by any member and then
//! handed to its target.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod assignment;
mod contend;
mod drain;
mod member;
mod membership;
mod plan;
mod probe;
mod session;

pub use drain::{cancel_drain, drain_role, request_drain, DrainOutcome, DRAIN_ROLE_PREFIX};
use member::Member;
use membership::Membership;

use crate::elector::{check_min_ttl, work_outcome, WorkOutcome};
use crate::lease::validate_name;
use crate::{
    ChangeMark, Error, FencingToken, LeaseLeaderOptions, LeaseStore, NodeRegistry, Result,
    SessionGrant, SessionId,
};

/// The most shards one group may have.
pub const MAX_SHARDS: u32 = 100_000;

/// The metadata key naming a member's group in the registry.
pub const GROUP_KEY: &str = "group";

/// Options of a [`ShardElector`]; checked by [`ShardOptions::validate`].
#[derive(Clone, Debug)]
pub struct ShardOptions {
    /// The group's name; shard `k` is the role `group/k`.
    pub group: String,
    /// How many shards the group has, `1..=MAX_SHARDS`.
    pub shards: u32,
    /// This member's id in the registry and the owner of its shards. A restarted member
    /// with the same id keeps its targets.
    pub node_id: String,
    /// The session TTL: how long the member's shards outlive its last renewal. Default
    /// 30 s. The registry's liveness TTL may not exceed it (see [`ShardElector::new`]).
    pub lease_ttl: Duration,
    /// How often the session is renewed. Default 10 s.
    pub renew_interval: Duration,
    /// How often the member looks again without a push (orphans, expired leases,
    /// errors); once a look found nothing to do, every `lease_ttl`. Default 2 s.
    pub retry_interval: Duration,
    /// At most this many of the member's shards hand over at once. Default 4.
    pub max_moves_in_flight: usize,
    /// A member that vanished from membership keeps its targets this long (a restart).
    /// Default zero.
    pub rebalance_delay: Duration,
    /// The largest clock-rate difference tolerated, as for the elector. Default 1%.
    pub max_clock_drift: f64,
    /// How long before the local deadline `leadership` is cancelled. Default zero.
    pub work_grace: Duration,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            group: String::new(),
            shards: 0,
            node_id: String::new(),
            lease_ttl: Duration::from_secs(30),
            renew_interval: Duration::from_secs(10),
            retry_interval: Duration::from_secs(2),
            max_moves_in_flight: 4,
            rebalance_delay: Duration::ZERO,
            max_clock_drift: 0.01,
            work_grace: Duration::ZERO,
        }
    }
}

impl ShardOptions {
    /// Checks the options; the error names the option and the rule it breaks. The
    /// timing rules are the elector's.
    pub fn validate(&self) -> Result<()> {
        validate_name("group", &self.group)?;
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(Error::invalid(
                "shards",
                format!("{} must be in 1..={MAX_SHARDS}", self.shards),
            ));
        }
        // The longest shard role must still be a valid role name.
        validate_name("group", &role(&self.group, self.shards - 1))?;
        if self.max_moves_in_flight == 0 {
            return Err(Error::invalid(
                "max_moves_in_flight",
                "must be greater than zero",
            ));
        }
        self.timing().validate()
    }

    fn timing(&self) -> LeaseLeaderOptions {
        LeaseLeaderOptions {
            owner_id: self.node_id.clone(),
            lease_ttl: self.lease_ttl,
            renew_interval: self.renew_interval,
            retry_interval: self.retry_interval,
            max_clock_drift: self.max_clock_drift,
            work_grace: self.work_grace,
            ..Default::default()
        }
    }
}

/// The role of shard `shard` of `group`: `group/shard`.
pub fn role(group: &str, shard: u32) -> String {
    format!("{group}/{shard}")
}

/// What a member sees, published through [`ShardElector::watch`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardState {
    /// The live members of the group, sorted.
    pub members: Vec<String>,
    /// The shards this member runs work for, with their terms' tokens.
    pub owned: BTreeMap<u32, FencingToken>,
    /// The target owner of every shard, from this member's view.
    pub target: BTreeMap<u32, String>,
}

/// One member of a shard group.
pub struct ShardElector {
    store: Arc<dyn LeaseStore>,
    registry: Arc<dyn NodeRegistry>,
    options: ShardOptions,
    state: watch::Sender<ShardState>,
    /// The session's local deadline, `None` while there is no session.
    deadline: watch::Sender<Option<Instant>>,
    /// The store's latest lease change, as the member's last keep-alive that told said
    /// ([`SessionGrant::latest_change`]); `None` until one did.
    latest_change: watch::Sender<Option<ChangeMark>>,
    /// Drained in process ([`ShardElector::set_draining`]).
    draining: watch::Sender<bool>,
}

impl std::fmt::Debug for ShardElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardElector")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// How long after a term or membership is due to lapse the member reads: store and
/// local clocks tick at about the same rate, and a look a moment early finds nothing.
const LAPSE_NUDGE: Duration = Duration::from_millis(5);

/// A settled member (its last look found nothing to do) looks again this many TTLs
/// later, unless something wakes it first. Nothing it must act on goes unannounced
/// then: joins and leaves are pushed, a crash is a membership lapse (read when due),
/// and its own shards end with its session; the look is a safety net, and each one
/// reads every shard of the group.
const SETTLED_LOOK_TTLS: u32 = 10;

/// [`SETTLED_LOOK_TTLS`] on a store whose keep-alives tell the latest change
/// ([`SessionGrant::latest_change`]): there a settled member looks as soon as a
/// keep-alive tells of a change of a lease that its last read did not see, and a
/// session's lapse, which changes no lease, takes the member's membership with it (see
/// `Membership::join`). The timer is left what the stores get wrong (an acquire
/// answered with an error and applied long after). Three times longer than without: a
/// settled group's reads fall to one per member per 30 TTLs.
const SETTLED_LOOK_TTLS_TOLD: u32 = 30;

/// How many TTLs after an acquire was lost (answered with an error, or with a wrong
/// count) the member expects it may still land: it is not settled until then. One that
/// lands later leaves its shard held here with no work until the next settled look.
const LOST_ACQUIRE_LANDS_TTLS: u32 = 2;

/// The shortest wait between two looks at the group (or reads of its members), so a
/// lapse already due cannot make the member spin.
const MIN_LOOK: Duration = Duration::from_millis(1);

/// A member that a look leaves short of its share looks again after the retry interval
/// divided by this, then after twice that, and so on up to the retry interval: see
/// [`Member::short_looks`](member::Member).
const SHORT_LOOK_DIVISOR: u32 = 16;

/// A member of a cold group (no shard held by a live member) makes its first look once
/// no member joined for this fraction of the retry interval, and no later than the
/// retry interval after it joined: members started together (within a quiet spell of
/// each other) plan with each other, and a lone member waits only the quiet spell.
const GATHER_QUIET_DIVISOR: u32 = 8;

/// At most this many acquire calls of one member are in flight at once.
const BATCHES_IN_FLIGHT: usize = 2;

/// At most this many shards held elsewhere are waited on at once (see `contend`).
const MAX_WAITERS: usize = 32;

/// How many TTLs a rescued shard stays with its rescuer when its target owns nothing.
const RESCUE_HOLD: u32 = 4;

impl ShardElector {
    /// A member over `store` and `registry`; fails with [`Error::InvalidArgument`] on bad
    /// options, and (field `registry_ttl`) when the registry's liveness TTL exceeds
    /// `lease_ttl`: a crashed member's shards must move when its session ends.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        registry: Arc<dyn NodeRegistry>,
        options: ShardOptions,
    ) -> Result<Self> {
        options.validate()?;
        check_min_ttl(options.lease_ttl, store.as_ref())?;
        // Targets follow membership, the shards' leases follow the session. A membership
        // that outlives the session keeps a crashed member's shards targeted at it after
        // they are free, so they wait unowned for the orphan rescue (a TTL later) or for
        // the membership to lapse: two to three TTLs instead of one.
        let registry_ttl = registry.ttl();
        if registry_ttl > options.lease_ttl {
            return Err(Error::invalid(
                "registry_ttl",
                format!(
                    "the registry's liveness TTL ({registry_ttl:?}) exceeds lease_ttl ({:?}): \
                     a crashed member would stay the target of its shards after its session \
                     ended; use a registry TTL of at most lease_ttl",
                    options.lease_ttl
                ),
            ));
        }
        Ok(ShardElector {
            store,
            registry,
            options,
            state: watch::Sender::new(ShardState::default()),
            deadline: watch::Sender::new(None),
            latest_change: watch::Sender::new(None),
            draining: watch::Sender::new(false),
        })
    }

    /// The options in force.
    pub fn options(&self) -> &ShardOptions {
        &self.options
    }

    /// A receiver of the member's view: members, owned shards, targets.
    pub fn watch(&self) -> watch::Receiver<ShardState> {
        self.state.subscribe()
    }

    /// Drains this member (`true`) or ends its drain (`false`), as a drain request in
    /// the store does (see [`request_drain`]): while drained it is out of the
    /// group's membership, contends for nothing and hands every shard over. Watch
    /// [`watch`](Self::watch)'s `owned` to see it drained.
    pub fn set_draining(&self, draining: bool) {
        self.draining.send_replace(draining);
    }

    /// A receiver of the session's local deadline: the monotonic instant at which every
    /// shard's `leadership` is cancelled unless a session renewal moves it (`None` while
    /// there is no session). As [`crate::LeaseLeaderElector::deadline`], for a second
    /// enforcer outside the work.
    pub fn deadline(&self) -> watch::Receiver<Option<Instant>> {
        self.deadline.subscribe()
    }

    /// Runs the member until `shutdown` fires, calling `work(shard, token, leadership)`
    /// once per shard term held here. `leadership` is cancelled when the term ends (the
    /// shard moves, the session is lost, shutdown) and the work is awaited before the
    /// shard is released, so work must return promptly once it is cancelled. Work that
    /// returns on its own ends its term (the shard is released and taken again after
    /// `retry_interval`). A member is in the registry only while it holds a session: it
    /// joins once its session is open, and its heartbeats stop (with a leave) when the
    /// session is lost, until a new one is open. On shutdown every shard's work is
    /// cancelled and awaited, the member leaves the registry, and then its session is
    /// closed (releasing every shard at once). Store errors are logged and retried,
    /// never returned.
    pub async fn run<W, Fut>(&self, mut work: W, shutdown: CancellationToken) -> Result<()>
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let drain = drain_role(&self.options.group, &self.options.node_id).ok();
        let (store_drain_tx, store_drain) = watch::channel(false);
        let watching = CancellationToken::new();
        let _stop_watching_on_drop = watching.clone().drop_guard();
        if let Some(drain) = drain {
            let (store, stop) = (self.store.clone(), watching.clone());
            let told = self.latest_change.subscribe();
            tokio::spawn(async move {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => {}
                    _ = drain::watch_requests(store, drain, store_drain_tx, told) => {}
                }
            });
        }
        let mut member = Member {
            elector: self,
            session: None,
            membership: Membership::new(
                self.registry.clone(),
                &self.options.group,
                &self.options.node_id,
            ),
            draining: false,
            drains: [self.draining.subscribe(), store_drain],
            working: BTreeSet::new(),
            owners: Default::default(),
            target: Default::default(),
            probes: Default::default(),
            terms: BTreeMap::new(),
            cooling: HashMap::new(),
            orphaned_since: HashMap::new(),
            last_seen: HashMap::new(),
            waiting: BTreeSet::new(),
            next_look: None,
            next_lapse: None,
            pending_releases: BTreeMap::new(),
            latest_terms: BTreeMap::new(),
            lost_acquires: BTreeSet::new(),
            owned_changes: BTreeSet::new(),
            lost_acquire_at: None,
            settled: false,
            short_looks: 0,
            look_put_off: None,
            view: Default::default(),
            planned: Vec::new(),
            targeted_here: Vec::new(),
        };
        let (wake_tx, mut wake_rx) = mpsc::unbounded_channel();
        // The session is open before the member joins: others hand shards over as soon as
        // they see the join, and a newcomer still opening its session would leave them
        // unowned meanwhile. (It contends only after joining: members starting together
        // then see each other instead of each contending for every shard. Before, it
        // only reads, and waits on what the others will hand it.)
        member.open_session(&shutdown).await;
        let joining = if member.drains.iter().any(|drain| *drain.borrow()) {
            plan::Joining::Unprepared
        } else {
            member.prepare_to_join(&wake_tx).await
        };
        member.follow_drains().await;
        let outcome = member
            .run(&mut work, &shutdown, &wake_tx, &mut wake_rx, joining)
            .await;
        // Leave first, then release: the others retarget on the leave and are waiting
        // on these shards when the session closes, so each moves in one push.
        member.membership.leave().await;
        member.close_session().await;
        self.state.send_replace(ShardState::default());
        outcome
    }
}
