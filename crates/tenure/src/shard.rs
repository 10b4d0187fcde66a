//! Shard groups: `N` fenced shards spread evenly across the live members of a group.
//!
//! Shard `k` of group `G` is the role `G/k`: an ordinary lease with its own fencing token,
//! so fences, `tenure status` and every rule of a single role apply per shard. A
//! [`ShardElector`] is one member. It heartbeats its `node_id` into a [`NodeRegistry`]
//! (metadata `group = G`), computes the target owner of every shard from the live
//! members with [`place`], contends only for the shards targeted at it, and hands the
//! others over gracefully (cancel the work, await it, release, so the target takes the
//! shard on the store's push). It holds all its shards under one session
//! ([`crate::session`]), so keeping them alive costs one call per renew interval however
//! many it holds.
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
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::elector::{check_min_ttl, work_outcome, WorkOutcome};
use crate::lease::validate_name;
use crate::{
    place, spawn_heartbeat, Error, FencingToken, LeaseLeaderOptions, LeaseStore, Metadata,
    NodeRegistry, Result, SessionGrant, SessionId,
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
}

impl std::fmt::Debug for ShardElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardElector")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// One shard term running here.
struct Term {
    token: FencingToken,
    leadership: CancellationToken,
    task: JoinHandle<Result<()>>,
    /// Being handed over (its work was cancelled; it is released when the work ends).
    handing_over: bool,
    /// Taken while targeted at another member (an orphan): handed to that member once it
    /// owns some shard, or after [`RESCUE_HOLD`] TTLs, so a member that heartbeats but
    /// never works cannot strand shards by having them handed to it, and a healthy one
    /// that owns nothing yet still gets its targets.
    rescued: bool,
    /// When the term began here.
    started: Instant,
}

/// How long after a term or membership is due to lapse the member looks: store and
/// local clocks tick at about the same rate, and a look a moment early finds nothing.
const LAPSE_NUDGE: Duration = Duration::from_millis(5);

/// The shortest wait between two looks at the group, so a lapse already due cannot
/// make the member spin.
const MIN_LOOK: Duration = Duration::from_millis(1);

/// At most this many acquire calls of one member are in flight at once.
const CONTEND_AT_ONCE: usize = 16;

/// At most this many shards held elsewhere are waited on at once (see `contend`).
const MAX_WAITERS: usize = 32;

/// How many TTLs a rescued shard stays with its rescuer when its target owns nothing.
const RESCUE_HOLD: u32 = 4;

/// The member's session, kept alive by a task of its own so that renewals never wait
/// for the member's loop (contending for many shards, a shard's work winding down).
struct Session {
    id: SessionId,
    /// The local deadline of the last successful renewal (or the opening).
    deadline: watch::Receiver<Instant>,
    /// Cancelled when the session is over locally: at the deadline without a renewal,
    /// when the store says it ended, or when the member drops it. Every shard's
    /// `leadership` is a child of it.
    alive: CancellationToken,
}

impl Session {
    /// Starts keeping session `grant` (opened by a request sent at `sent`) alive.
    /// Each renewal's deadline is also sent on `published` (the member's
    /// [`ShardElector::deadline`]).
    fn start(
        store: Arc<dyn LeaseStore>,
        timing: LeaseLeaderOptions,
        sent: Instant,
        grant: &SessionGrant,
        published: watch::Sender<Option<Instant>>,
    ) -> Session {
        let alive = CancellationToken::new();
        let (mut deadline, mut next_renew) = lifetime(&timing, sent, grant);
        let (deadline_tx, deadline_rx) = watch::channel(deadline);
        published.send_replace(Some(deadline));
        let (id, watched) = (grant.id, alive.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = watched.cancelled() => return,
                    _ = tokio::time::sleep_until(deadline) => {
                        warn!(session = %id, "local deadline passed without a session renewal: every shard is lost");
                        break;
                    }
                    _ = tokio::time::sleep_until(next_renew) => {}
                }
                let sent = Instant::now();
                let answer = tokio::time::timeout_at(
                    deadline,
                    store.keep_alive_session(id, timing.lease_ttl),
                )
                .await;
                match answer {
                    Ok(Ok(Some(grant))) => {
                        (deadline, next_renew) = lifetime(&timing, sent, &grant);
                        deadline_tx.send_replace(deadline);
                        if !watched.is_cancelled() {
                            published.send_replace(Some(deadline));
                        }
                        debug!(session = %id, "session renewed");
                    }
                    Ok(Ok(None)) => {
                        warn!(session = %id, "the session ended on the store: every shard is lost");
                        break;
                    }
                    Ok(Err(error)) => {
                        let retry = timing.retry_interval.min(timing.renew_interval);
                        warn!(session = %id, %error, retry_in = ?retry, "session renewal failed; retrying");
                        next_renew = Instant::now() + retry;
                    }
                    // The deadline passed during the call: the select above says so.
                    Err(_) => {}
                }
            }
            watched.cancel();
        });
        Session {
            id,
            deadline: deadline_rx,
            alive,
        }
    }

    fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.alive.cancel();
    }
}

/// The local deadline and next renewal a grant answered to a request sent at `sent`
/// allows: `sent + granted * (1 - max_clock_drift) - work_grace`, renewing at the same
/// fraction of what was granted as of the full TTL.
fn lifetime(
    timing: &LeaseLeaderOptions,
    sent: Instant,
    grant: &SessionGrant,
) -> (Instant, Instant) {
    let granted = grant.remaining();
    (
        sent + timing.leadership_window_for(granted),
        sent + timing.renew_after(granted),
    )
}

/// One acquire call's answer, with what it was for.
struct Contended {
    shard: u32,
    /// Taken as a rescue (targeted at another member).
    rescued: bool,
    role: String,
    /// The store's answer, or `None` when the session ended first.
    answer: Option<Result<crate::LeaseResult>>,
}

/// What woke the member's loop.
enum Wake {
    /// The work of a shard's term ended (returned, or wound down after a cancel); the
    /// token tells a late wake of an earlier term from one of the current term.
    WorkEnded(u32, FencingToken),
    /// The store pushed a change of a shard held elsewhere that this member waits for.
    ShardChanged(u32),
}

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
    /// `retry_interval`). A member joins the registry only once its session is open. On shutdown every shard's work is cancelled and awaited,
    /// the member leaves the registry, and then its session is closed (releasing every
    /// shard at once). Store errors are logged and retried, never returned.
    pub async fn run<W, Fut>(&self, mut work: W, shutdown: CancellationToken) -> Result<()>
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let mut member = Member {
            elector: self,
            session: None,
            terms: BTreeMap::new(),
            cooling: HashMap::new(),
            orphaned_since: HashMap::new(),
            last_seen: HashMap::new(),
            waiting: BTreeSet::new(),
            next_look: None,
            pending_releases: BTreeMap::new(),
            lost_acquires: BTreeSet::new(),
            settled: false,
        };
        let (wake_tx, mut wake_rx) = mpsc::unbounded_channel();
        // The session is open before the member joins: others hand shards over as soon as
        // they see the join, and a newcomer still opening its session would leave them
        // unowned meanwhile. (It reads the group only after joining: members starting
        // together then see each other instead of each contending for every shard.)
        member.open_session(&shutdown).await;
        let mut metadata = Metadata::new();
        metadata.insert(GROUP_KEY.to_owned(), self.options.group.clone());
        let heartbeat_stop = CancellationToken::new();
        // Dropping `run` (the task aborted, the process dying) stops the heartbeat too, so
        // a member that is gone drops out of the group.
        let _stop_heartbeat_on_drop = heartbeat_stop.clone().drop_guard();
        let beat_every = (self.registry.ttl() / 3).max(Duration::from_millis(1));
        self.registry
            .heartbeat_with(&self.options.node_id, &metadata)
            .await
            .unwrap_or_else(|error| warn!(%error, "first heartbeat failed; retrying"));
        let heartbeat = spawn_heartbeat(
            self.registry.clone(),
            self.options.node_id.clone(),
            metadata,
            beat_every,
            heartbeat_stop.clone(),
        );
        let outcome = member
            .run(&mut work, &shutdown, &wake_tx, &mut wake_rx)
            .await;
        // Leave first, then release: the others retarget on the leave and are waiting
        // on these shards when the session closes, so each moves in one push.
        heartbeat_stop.cancel();
        let _ = heartbeat.await;
        if let Err(error) = self.registry.leave(&self.options.node_id).await {
            warn!(%error, "could not leave the registry; membership lapses on its own");
        }
        member.close_session().await;
        self.state.send_replace(ShardState::default());
        outcome
    }
}

/// The mutable side of one running member.
struct Member<'a> {
    elector: &'a ShardElector,
    session: Option<Session>,
    terms: BTreeMap<u32, Term>,
    /// Shards whose work returned on its own: not taken again before then.
    cooling: HashMap<u32, Instant>,
    /// When this member first saw each shard with no live owner.
    orphaned_since: HashMap<u32, Instant>,
    /// When each member was last seen live (for `rebalance_delay`).
    last_seen: HashMap<String, Instant>,
    /// Shards held elsewhere whose store push one waiter task is waiting for (one per
    /// shard: a waiter per reconcile would multiply with every wake).
    waiting: BTreeSet<u32>,
    /// When the last read of the group showed the first change due (a member's
    /// membership or a term targeted here lapsing), if any.
    next_look: Option<Instant>,
    /// Releases that failed or timed out, by shard: the store may still apply each
    /// one, so no work starts under its token (a late release would end that term under
    /// it); each look releases the shard again until one answers.
    pending_releases: BTreeMap<u32, FencingToken>,
    /// Shards whose acquire under the current session got an error: the store may have
    /// granted it, then or later, with no term here. A live session would keep such a
    /// shard from its target for good, so each look takes it (targeted here) or releases
    /// it (targeted elsewhere) whenever the store shows it held by this member with no
    /// term here. Kept for the session's life: the request may still be on its way.
    lost_acquires: BTreeSet<u32>,
    /// The last look found nothing to do: every shard owned, none to take, hand over,
    /// wait for or release here. Looks are then a TTL apart (each reads every shard of
    /// the group); joins and leaves are pushed, and a lapse has its own look.
    settled: bool,
}

impl Drop for Member<'_> {
    /// Shard work runs on tasks of its own: if `run` is dropped mid-term (the caller's
    /// select! moved on, its task was aborted), nothing renews the session any more, so
    /// every shard's work must be told it no longer leads.
    fn drop(&mut self) {
        for term in self.terms.values() {
            term.leadership.cancel();
        }
    }
}

impl Member<'_> {
    fn options(&self) -> &ShardOptions {
        &self.elector.options
    }

    async fn run<W, Fut>(
        &mut self,
        work: &mut W,
        shutdown: &CancellationToken,
        wake_tx: &mpsc::UnboundedSender<Wake>,
        wake_rx: &mut mpsc::UnboundedReceiver<Wake>,
    ) -> Result<()>
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let mut observed: Vec<String> = Vec::new();
        let mut look = true;
        loop {
            if self.session.is_none() {
                self.open_session(shutdown).await;
                if shutdown.is_cancelled() {
                    break;
                }
                look = true;
            }
            if look {
                observed = match self.reconcile(work, wake_tx).await {
                    Ok(members) => members,
                    Err(error) => {
                        warn!(group = %self.options().group, %error, "could not read the group; retrying");
                        observed
                    }
                };
            }
            look = true;
            let Some(alive) = self.session.as_ref().map(|s| s.alive.clone()) else {
                continue;
            };
            // Look again after the retry interval (a TTL once settled), or sooner when
            // the last read showed something about to lapse (see `reconcile`).
            let now = Instant::now();
            let every = if self.settled {
                self.options().retry_interval.max(self.options().lease_ttl)
            } else {
                self.options().retry_interval
            };
            let look_again = (now + every)
                .min(self.next_look.unwrap_or(now + every))
                .max(now + MIN_LOOK);
            let registry = self.elector.registry.clone();
            let members_changed = registry.wait_for_members_change(&observed, look_again);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = alive.cancelled() => self.lose_everything().await,
                Some(wake) = wake_rx.recv() => {
                    // Wakes come in bursts (a member handing several shards over): act
                    // on all that are queued at once.
                    let mut wakes = vec![wake];
                    while let Ok(wake) = wake_rx.try_recv() {
                        wakes.push(wake);
                    }
                    look = self.woken(wakes, work, wake_tx).await;
                }
                _ = members_changed => {}
            }
        }
        self.stop_work().await;
        Ok(())
    }

    /// Opens a session, retrying on store errors until shutdown.
    async fn open_session(&mut self, shutdown: &CancellationToken) {
        let options = self.options().clone();
        loop {
            let sent = Instant::now();
            let attempt = tokio::select! {
                _ = shutdown.cancelled() => return,
                attempt = self.elector.store.open_session(&options.node_id, options.lease_ttl) => attempt,
            };
            match attempt {
                Ok(grant) => {
                    info!(group = %options.group, node = %options.node_id, session = %grant.id,
                        "session opened");
                    let (store, timing) = (self.elector.store.clone(), options.timing());
                    let published = self.elector.deadline.clone();
                    self.session = Some(Session::start(store, timing, sent, &grant, published));
                    return;
                }
                Err(error) if !error.is_transient() => {
                    warn!(%error, "cannot open a session; retrying");
                }
                Err(error) => warn!(%error, "opening a session failed; retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(options.retry_interval) => {}
            }
        }
    }

    /// The session is gone: stop every shard's work, forget the session.
    async fn lose_everything(&mut self) {
        self.stop_work().await;
        // Whatever the session held frees as it ends, and a release still on its way
        // cannot end a later term: those take new tokens.
        self.pending_releases.clear();
        self.lost_acquires.clear();
        self.session = None;
        self.elector.deadline.send_replace(None);
    }

    /// Cancels and awaits every shard's work (the session, if any, still holds them).
    async fn stop_work(&mut self) {
        let terms = std::mem::take(&mut self.terms);
        for term in terms.values() {
            term.leadership.cancel();
        }
        for (shard, term) in terms {
            if let Err(error) = work_outcome_of(term.task).await {
                warn!(shard, %error, "shard work failed after its term ended");
            }
        }
        self.publish_owned();
    }

    /// Acts on wakes; returns whether the group must be read again. Shards pushed free
    /// while targeted here are contended for at once, without reading the whole group
    /// first (that read grows with the group; this is one call per shard, all at once).
    async fn woken<W, Fut>(
        &mut self,
        wakes: Vec<Wake>,
        work: &mut W,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> bool
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let mut look = false;
        let mut pushed = Vec::new();
        for wake in wakes {
            match wake {
                Wake::ShardChanged(shard) => {
                    debug!(shard, "the store pushed a change of a shard held elsewhere");
                    self.waiting.remove(&shard);
                    let now = Instant::now();
                    let cooled = self.cooling.get(&shard).is_none_or(|until| now >= *until);
                    if self.targeted_here(shard) && cooled && !self.terms.contains_key(&shard) {
                        pushed.push((shard, false));
                    } else {
                        look = true;
                    }
                }
                Wake::WorkEnded(shard, token) => look |= self.work_ended(shard, token).await,
            }
        }
        if !pushed.is_empty() {
            self.contend(pushed, work, wake_tx).await;
        }
        look
    }

    /// Whether the last look targeted `shard` at this member.
    fn targeted_here(&self, shard: u32) -> bool {
        self.elector.state.borrow().target.get(&shard) == Some(&self.options().node_id)
    }

    /// A term's work ended: release the shard. Returns whether the group must be read
    /// again: not after a handover when no other shard waits to be handed over.
    async fn work_ended(&mut self, shard: u32, token: FencingToken) -> bool {
        if self
            .terms
            .get(&shard)
            .is_none_or(|term| term.token != token)
        {
            return false;
        }
        let Some(term) = self.terms.remove(&shard) else {
            return false;
        };
        let returned_on_its_own = !term.leadership.is_cancelled();
        term.leadership.cancel();
        if let Err(error) = work_outcome_of(term.task).await {
            warn!(shard, %error, "shard work failed");
        }
        if returned_on_its_own {
            self.cooling
                .insert(shard, Instant::now() + self.options().retry_interval);
        }
        self.release(shard, term.token).await;
        if term.handing_over {
            // The next few, on the last look's targets: a look per wave would read the
            // whole group once per `max_moves_in_flight` shards moved.
            let state = self.elector.state.borrow();
            let options = &self.elector.options;
            start_handovers(
                &mut self.terms,
                options,
                &state.target,
                None,
                Instant::now(),
            );
        }
        self.publish_owned();
        !term.handing_over
    }

    async fn release(&mut self, shard: u32, token: FencingToken) {
        let role = role(&self.options().group, shard);
        let node = &self.options().node_id;
        let deadline = self
            .session
            .as_ref()
            .map_or_else(Instant::now, Session::deadline);
        match tokio::time::timeout_at(deadline, self.elector.store.release(&role, node, token))
            .await
        {
            Ok(Ok(_)) => {
                debug!(shard, token = %token, "shard released");
                self.pending_releases.remove(&shard);
            }
            Ok(Err(error)) => {
                warn!(shard, token = %token, %error,
                    "release failed and may still land; no work under this token, releasing again at the next look");
                self.pending_releases.insert(shard, token);
            }
            Err(_) => {
                warn!(shard, token = %token,
                    "release timed out and may still land; no work under this token, releasing again at the next look");
                self.pending_releases.insert(shard, token);
            }
        }
    }

    /// Reads the group and acts on it: contend for the shards targeted here, hand over
    /// the ones targeted elsewhere, rescue orphans. Returns the live members seen.
    async fn reconcile<W, Fut>(
        &mut self,
        work: &mut W,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> Result<Vec<String>>
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let options = self.options().clone();
        let now = Instant::now();
        let (live, lapse) = self.group_members().await?;
        for member in &live {
            self.last_seen.insert(member.clone(), now);
        }
        self.last_seen
            .retain(|_, seen| now.duration_since(*seen) < options.rebalance_delay);
        let mut planned: BTreeSet<String> = live.iter().cloned().collect();
        planned.extend(self.last_seen.keys().cloned());
        planned.insert(options.node_id.clone());
        let planned: Vec<String> = planned.into_iter().collect();

        let held = self.live_owners().await?;
        let owners: BTreeMap<u32, String> = held
            .iter()
            .map(|(shard, (holder, _, _))| (*shard, holder.clone()))
            .collect();
        let target = place(&options.group, options.shards, &planned, &owners);
        // A crashed member's shards free when its session ends and its targets move when
        // its membership lapses; neither is pushed, so look again right after the first
        // of them rather than up to a retry interval later.
        let expiry = held
            .iter()
            .filter(|(shard, (holder, _, _))| {
                *holder != options.node_id && target.get(shard) == Some(&options.node_id)
            })
            .map(|(_, (_, left, _))| *left)
            .min();
        self.check_terms(&held);
        self.release_strays(&held, &target).await;
        self.next_look = lapse
            .into_iter()
            .chain(expiry)
            .min()
            .map(|soonest| now + soonest + LAPSE_NUDGE);

        // Hand over what is targeted at another member, a few at a time.
        let working: BTreeSet<&String> = owners.values().collect();
        start_handovers(&mut self.terms, &options, &target, Some(&working), now);

        // Contend for what is targeted here, and rescue long orphans.
        let mut wanted = Vec::new();
        for shard in 0..options.shards {
            if self.terms.contains_key(&shard) {
                continue;
            }
            let owner = owners.get(&shard);
            let orphan_for = match owner {
                Some(_) => {
                    self.orphaned_since.remove(&shard);
                    Duration::ZERO
                }
                None => now.duration_since(*self.orphaned_since.entry(shard).or_insert(now)),
            };
            let mine = target.get(&shard) == Some(&options.node_id);
            let rescue = owner.is_none() && orphan_for > options.lease_ttl;
            let cooled = self.cooling.get(&shard).is_none_or(|until| now >= *until);
            if (mine || rescue) && cooled {
                wanted.push((shard, !mine));
            }
        }
        self.settled = wanted.is_empty()
            && owners.len() == options.shards as usize
            && self.waiting.is_empty()
            && self.pending_releases.is_empty()
            && self
                .terms
                .keys()
                .all(|k| target.get(k) == Some(&options.node_id));
        self.contend(wanted, work, wake_tx).await;
        self.publish(live.clone(), target);
        Ok(live)
    }

    /// Cancels every term the store no longer shows as this member's under its token
    /// (`held`, read after each of them began): a release or takeover this member did not
    /// see (applied late, or answered with an error) ended it, and its work must not go on
    /// while another member may take the shard.
    fn check_terms(&mut self, held: &BTreeMap<u32, (String, Duration, FencingToken)>) {
        let node = &self.elector.options.node_id;
        for (shard, term) in &self.terms {
            let shown = held
                .get(shard)
                .is_some_and(|(holder, _, token)| holder == node && *token == term.token);
            if !shown && !term.leadership.is_cancelled() {
                warn!(shard, token = %term.token, store = ?held.get(shard),
                    "the store no longer shows this term: cancelling its work");
                term.leadership.cancel();
            }
        }
    }

    /// Acts on the shards the store may hold for this member with no work on them
    /// (`held` and `target` from this look): a pending release is sent again, whatever
    /// the target, so the next term takes a new token; a lost acquire that the store
    /// granted is released when the shard is targeted elsewhere (targeted here, it is
    /// taken like any other shard).
    async fn release_strays(
        &mut self,
        held: &BTreeMap<u32, (String, Duration, FencingToken)>,
        target: &BTreeMap<u32, String>,
    ) {
        let node = self.elector.options.node_id.clone();
        let held_here = |shard: &u32| {
            held.get(shard)
                .filter(|(holder, _, _)| *holder == node)
                .map(|(_, _, token)| *token)
        };
        for (shard, token) in std::mem::take(&mut self.pending_releases) {
            // Shown under another token (or not at all), that term is over: a late
            // release of it is a no-op.
            if held_here(&shard) == Some(token) && !self.terms.contains_key(&shard) {
                self.release(shard, token).await;
            }
        }
        let stranded: Vec<(u32, FencingToken)> = self
            .lost_acquires
            .iter()
            .filter(|shard| !self.terms.contains_key(shard) && target.get(shard) != Some(&node))
            .filter_map(|shard| Some((*shard, held_here(shard)?)))
            .collect();
        for (shard, token) in stranded {
            info!(shard, token = %token, "releasing a shard an acquire took with no term here");
            self.release(shard, token).await;
        }
    }

    /// Contends for `wanted` (shard, taken as a rescue), up to [`CONTEND_AT_ONCE`] calls
    /// in flight: a member winning many shards at once (a join, a cold start) waits one
    /// round trip for them, not one per shard. Answers are acted on as they come.
    async fn contend<W, Fut>(
        &mut self,
        wanted: Vec<(u32, bool)>,
        work: &mut W,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let Some(session) = &self.session else { return };
        let (id, alive) = (session.id, session.alive.clone());
        let (store, group) = (self.elector.store.clone(), self.options().group.clone());
        let mut queue = wanted.into_iter();
        let mut calls = JoinSet::new();
        let send = |calls: &mut JoinSet<_>, (shard, rescued): (u32, bool)| {
            let (store, role, alive) = (store.clone(), role(&group, shard), alive.clone());
            calls.spawn(async move {
                // Waits as long as the session lives, not to the deadline in force when
                // the call was sent: a renewal may have moved it, and giving up on an
                // answer that then grants the shard would leave it held by a live session
                // with no work on it.
                let answer = tokio::select! {
                    answer = store.acquire_in_session(&role, id) => Some(answer),
                    _ = alive.cancelled() => None,
                };
                Contended {
                    shard,
                    rescued,
                    role,
                    answer,
                }
            });
        };
        for next in queue.by_ref().take(CONTEND_AT_ONCE) {
            send(&mut calls, next);
        }
        while let Some(joined) = calls.join_next().await {
            if let Some(next) = queue.next() {
                send(&mut calls, next);
            }
            if let Ok(contended) = joined {
                self.answered(contended, &alive, work, wake_tx).await;
            }
        }
    }

    /// Acts on the answer to contending for a shard: start its term, wait for it, or
    /// give up for now. `alive` is that of the session the call was sent under.
    async fn answered<W, Fut>(
        &mut self,
        contended: Contended,
        alive: &CancellationToken,
        work: &mut W,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let Contended {
            shard,
            rescued,
            role,
            answer,
        } = contended;
        match answer {
            Some(Ok(result)) if result.acquired => {
                // Never start work for a term whose deadline has passed.
                let deadline = self.session.as_ref().map(Session::deadline);
                if alive.is_cancelled() || deadline.is_none_or(|d| Instant::now() >= d) {
                    return;
                }
                let token = result.fencing_token;
                match self.pending_releases.get(&shard) {
                    // The session still holds the term whose release may yet land and end
                    // it: released again at the next look, then taken under a new token.
                    Some(pending) if *pending == token => {
                        debug!(shard, token = %token,
                            "not working under a token whose release may still land");
                        return;
                    }
                    // A newer term: the late release of an older one cannot end it.
                    Some(_) => {
                        self.pending_releases.remove(&shard);
                    }
                    None => {}
                }
                let leadership = alive.child_token();
                let future = work(shard, token, leadership.clone());
                let wake = wake_tx.clone();
                let task = tokio::spawn(async move {
                    let outcome = work_outcome(tokio::spawn(future).await);
                    let _ = wake.send(Wake::WorkEnded(shard, token));
                    outcome
                });
                info!(shard, token = %result.fencing_token, "shard term started");
                self.orphaned_since.remove(&shard);
                self.terms.insert(
                    shard,
                    Term {
                        token: result.fencing_token,
                        leadership,
                        task,
                        handing_over: false,
                        rescued,
                        started: Instant::now(),
                    },
                );
                self.publish_owned();
            }
            Some(Ok(result)) => {
                // Held elsewhere (a handover in progress): wake on the store's push. A
                // bounded number of waiters: each costs the store a read before it
                // waits, and thousands at once (a member joining a large group) would
                // starve the session's own renewals; the rest wait for the next look.
                if self.waiting.len() < MAX_WAITERS && self.waiting.insert(shard) {
                    let store = self.elector.store.clone();
                    let wake = wake_tx.clone();
                    let until = Instant::now() + self.options().lease_ttl;
                    let observed = result.fencing_token;
                    tokio::spawn(async move {
                        store.wait_for_change(&role, observed, until).await;
                        let _ = wake.send(Wake::ShardChanged(shard));
                    });
                }
            }
            Some(Err(Error::SessionEnded(_))) => {
                if self.session.is_some() {
                    warn!(shard, "the session ended while contending");
                    self.lose_everything().await;
                }
            }
            Some(Err(error)) => {
                warn!(shard, %error, "could not contend for the shard; retrying");
                // It may have been granted all the same, now or later (the request may
                // still be on its way).
                self.lost_acquires.insert(shard);
            }
            None => debug!(shard, "the session ended while contending"),
        }
    }

    /// The live members of this group, sorted, and how soon the first other member's
    /// membership lapses unless it heartbeats (on store time).
    async fn group_members(&self) -> Result<(Vec<String>, Option<Duration>)> {
        let options = self.options();
        let ttl = self.elector.registry.ttl();
        let members = self.elector.registry.members().await?;
        let mine: Vec<_> = members
            .into_iter()
            .filter(|m| m.metadata.get(GROUP_KEY) == Some(&options.group))
            .collect();
        let lapse = mine
            .iter()
            .filter(|m| m.node_id != options.node_id)
            .map(|m| ttl.saturating_sub(m.heartbeat_age()))
            .min();
        Ok((mine.into_iter().map(|m| m.node_id).collect(), lapse))
    }

    /// The live owner of each shard, from the store, how long its term has left unless
    /// renewed (on store time), and its token.
    async fn live_owners(&self) -> Result<BTreeMap<u32, (String, Duration, FencingToken)>> {
        let prefix = format!("{}/", self.options().group);
        let leases = self.elector.store.list_prefix(&prefix).await?;
        Ok(leases
            .into_iter()
            .filter_map(|lease| {
                let shard: u32 = lease.role.strip_prefix(&prefix)?.parse().ok()?;
                let holder = lease.live_holder()?.to_owned();
                let left = lease
                    .expires_at
                    .duration_since(lease.now)
                    .unwrap_or_default();
                let held = (holder, left, lease.fencing_token);
                (shard < self.options().shards).then_some((shard, held))
            })
            .collect())
    }

    fn publish(&self, members: Vec<String>, target: BTreeMap<u32, String>) {
        let owned = self.owned();
        self.elector.state.send_if_modified(|state| {
            let next = ShardState {
                members,
                owned,
                target,
            };
            let changed = *state != next;
            *state = next;
            changed
        });
    }

    fn publish_owned(&self) {
        let owned = self.owned();
        let group = &self.elector.options.group;
        metrics::gauge!("tenure_shards_owned", "group" => group.clone()).set(owned.len() as f64);
        self.elector.state.send_if_modified(|state| {
            let changed = state.owned != owned;
            if changed {
                // Per shard only on a change, so a large group costs nothing per pass.
                for shard in state.owned.keys().filter(|k| !owned.contains_key(k)) {
                    metrics::gauge!("tenure_is_leader", "role" => role(group, *shard)).set(0.0);
                }
                for (shard, token) in owned.iter().filter(|(k, t)| state.owned.get(k) != Some(t)) {
                    let role = role(group, *shard);
                    metrics::gauge!("tenure_is_leader", "role" => role.clone()).set(1.0);
                    metrics::gauge!("tenure_fencing_token", "role" => role).set(token.get() as f64);
                }
            }
            state.owned = owned;
            changed
        });
    }

    fn owned(&self) -> BTreeMap<u32, FencingToken> {
        self.terms
            .iter()
            .filter(|(_, t)| !t.handing_over)
            .map(|(k, t)| (*k, t.token))
            .collect()
    }

    /// Shutdown, after the member left the group: close the session, releasing every
    /// shard at once (the others, having seen the leave, wait on them by now).
    async fn close_session(&mut self) {
        if let Some(session) = self.session.take() {
            self.elector.deadline.send_replace(None);
            let close = self.elector.store.close_session(session.id);
            match tokio::time::timeout_at(session.deadline(), close).await {
                Ok(Ok(_)) => info!(session = %session.id, "session closed; every shard released"),
                Ok(Err(error)) => {
                    warn!(%error, "closing the session failed; it expires on its own")
                }
                Err(_) => warn!("closing the session timed out; it expires on its own"),
            }
        }
    }
}

/// Starts handing over shards targeted at other members, as many as
/// `max_moves_in_flight` leaves room for. A rescued shard goes only once its target
/// works on some shard (`working`, when known) or after [`RESCUE_HOLD`] TTLs.
fn start_handovers(
    terms: &mut BTreeMap<u32, Term>,
    options: &ShardOptions,
    target: &BTreeMap<u32, String>,
    working: Option<&BTreeSet<&String>>,
    now: Instant,
) {
    let moving = terms.values().filter(|t| t.handing_over).count();
    let mut room = options.max_moves_in_flight.saturating_sub(moving);
    for (shard, term) in terms.iter_mut() {
        if room == 0 {
            break;
        }
        let Some(to) = target.get(shard).filter(|t| **t != options.node_id) else {
            continue;
        };
        let to_is_working = working.is_some_and(|working| working.contains(to));
        let held_long = now.duration_since(term.started) >= options.lease_ttl * RESCUE_HOLD;
        if !term.handing_over && (!term.rescued || to_is_working || held_long) {
            info!(shard, to = %to, "handing the shard over");
            term.handing_over = true;
            term.leadership.cancel();
            room -= 1;
        }
    }
}

async fn work_outcome_of(task: JoinHandle<Result<()>>) -> Result<()> {
    match task.await {
        Ok(outcome) => outcome,
        Err(join) => Err(Error::WorkPanicked(join.to_string())),
    }
}
