//! A seeded simulation of shard groups under faults, checking invariant 7 of
//! `docs/semantics.md` throughout: 3-8 members of one group over the in-memory store and
//! registry (paused tokio time), with store latency, graceful leaves, crashes, restarts
//! with the same node id, members whose store calls stall for up to two TTLs, work that
//! returns on its own, and calls that reach the store after their caller gave up
//! (releases, acquires and keep-alives sent, then answered with an error or never, and
//! applied up to two TTLs later, as a request already on the wire is), and pushes heard
//! up to four TTLs late (a slow listener: what such a push says of a shard's term may be
//! long out of date, as a term handed to a member that ended it since). No shard may ever
//! have two members working on it at once; after a quiet phase every shard is worked on
//! by exactly one live member and each owns `floor(N/M)` or `ceil(N/M)`.
//!
//! A third of the schedules also have a wedged member: it heartbeats into the group from
//! start to end, and keeps a session alive, but never runs an elector, so the others plan
//! shards for it that it never takes (and must not hand to its session). They try it with one probe shard at a time and take each probe back when it
//! stays free, which puts releases and takes-back of the same shard under the faults
//! above. There, after the quiet phase, every shard must be worked on (the working
//! members cannot share evenly a plan that counts the wedged one).
//!
//! Half the schedules run on a registry whose waits for a change of the members also end
//! early at random, more often than members look (as a backend's watch wakes on changes
//! that are no join or leave): such wakes must not put a member's periodic look off
//! (with the look timed from the last wake, not the last look, seed 13 of 200 did not
//! settle). A quarter run on stores that push no shard change at all.
//!
//! The negative controls must be caught working on one shard at once: every member's
//! store lying about its sessions (keeping each for half the TTL asked and answering
//! that it kept it for all of it, which is what a member computing its deadline from the
//! TTL it asked for would act on), and a store that acknowledges a release before
//! applying it (what a member that starts work under a token whose release may still
//! land would act on), and a store that answers a batch of acquires out of order (what a
//! member pairing a batch's answers with the wrong shards would act on), and pushes
//! that name a member's current session for terms handed to its earlier one (what a
//! member working on any term handed to its node id would act on).
//!
//! Three schedules in eight have a node of another group heartbeating into the same
//! registry: no change of the group, and no reason to read it (members once waited for
//! the registry's whole live set to match their group's, and read in a loop). Every
//! schedule counts the members' reads of the membership and fails past a cap.
//!
//! Even seeds run on a registry made by the store, whose session keep-alives tell when
//! the other members lapse, so members put their reads of the membership off on that
//! account; there a crash kills the member's process (its leave never reaches the
//! registry, and its membership lapses on its own), and one last crash ends the faults.
//! Where such a schedule's store also pushes no shard change, it says its waits poll,
//! so members read their drain roles once a second instead of waiting on them.
//! Odd seeds crash only the member's task in a process that lives on, whose dropped
//! heartbeat still leaves the group. Seeds 2 (mod 4) also lose calls: any call but a wait
//! fails now and then without ever reaching the store. A third negative control must be
//! caught leaving a crashed member's shards idle: keep-alives telling that the other
//! members lapse ten TTLs later than they do.
//!
//! After the quiet phase every worked-on shard must be worked on under the term the store
//! shows live for its member, under that term's token. Seeds 3 (mod 5) without a wedged
//! member then have one shard released from outside the group (an operator, a release
//! landing late), which pushes nothing to anyone: the members hear of it only through the
//! latest change their keep-alives tell, and within four renew intervals the shard must
//! be worked on again under a new term. A fourth negative control must be caught there:
//! keep-alives telling a latest change that never moves.
//!
//! Seeds 4 (mod 7) hang every store call of one member for good as the quiet phase
//! begins (a connection that stopped answering), while its heartbeats would go on: it
//! loses its session at its deadline and must leave the group with it, so the others
//! share every shard by the end of the quiet phase. A fifth negative control must be
//! caught there: the hung member's node heartbeating on.
//!
//! Even seeds, and seeds 5 (mod 18), also fault the members' registry calls while faults last: heartbeats and
//! leaves that fail before reaching the registry, that it applies but whose answer is
//! lost, or that reach it up to two TTLs late, after their caller was answered with an
//! error or while it is never answered; and reads that fail. A graceful shutdown must
//! end (within six TTLs) whatever the registry does: waiting on a heartbeat that never
//! answered, a member stayed out of the group, idle, or never shut down.
//!
//! `TENURE_SHARD_SIM_SCHEDULES=N` runs N schedules (default 40), from seed
//! `TENURE_SHARD_SIM_FROM` (default 0); `TENURE_SHARD_SIM_SEED=S` runs schedule S alone.
//! A schedule replays the same alone as in a run of many: every `select!` on its path is
//! `biased` (tokio's random choice of branch cannot be seeded on stable Rust), time is
//! paused, and each schedule has its own runtime and random sources.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::intercept::{FilteredRegistry, RegistryFilter};
use tenure::{
    ChangeMark, FencingToken, InMemoryLeaseStore, InMemoryNodeRegistry, LeaseStore, Metadata,
    NodeRegistry, SessionId, ShardElector, ShardOptions, TermChange, TokioClock,
};
use tenure_testkit::faults::Late;
use tenure_testkit::registry::counting_reads;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(600);
const RETRY: Duration = Duration::from_millis(300);
const GROUP: &str = "sim";

/// What a schedule's stores do wrong on purpose.
#[derive(Clone, Copy, Debug, Default)]
struct Broken {
    /// Sessions kept for half the TTL asked, answered as kept for all of it.
    lying_sessions: bool,
    /// A release that reaches the store late is acknowledged at once.
    early_release_acks: bool,
    /// A keep-alive tells that the other members lapse ten TTLs later than they do.
    late_peers_lapse: bool,
    /// A batch of acquires is answered out of order: each role gets the answer of the
    /// role after it (the last the first's).
    misordered_batches: bool,
    /// A read of what changed since a mark leaves out the leases released since (what a
    /// store that stamps new terms but not releases would answer).
    missed_releases: bool,
    /// A push of a term begun for this member names the member's current session,
    /// whichever session the term was handed to (what a member that took any term
    /// handed to its node id for its own would act on).
    misattributed_pushes: bool,
    /// A member whose store calls hang stays in the group: its node goes on
    /// heartbeating (what a member whose heartbeats outlive its session would do).
    membership_outlives_session: bool,
    /// Keep-alives and opens tell a latest lease change that never moves (what a store
    /// whose count is read from a stale replica, or never advanced, would answer).
    stale_latest_change: bool,
}

/// One member's view of the store: latency, stalls, calls applied after their caller
/// gave up, and (negative controls) lies.
struct MemberFaults {
    rng: Mutex<SmallRng>,
    /// Decides which calls fail before reaching the store, in schedules that lose
    /// calls: a random source of its own, so that the draws of `rng` stay the same.
    loses: Option<Mutex<SmallRng>>,
    latency: Duration,
    stalled_until: Mutex<Instant>,
    /// Calls are applied late only until then (the quiet phase has none).
    late_until: Instant,
    broken: Broken,
    /// The store pushes no change of a shard: each wait runs to its deadline, as on a
    /// store whose pushes were lost, and members act on what their looks read.
    no_pushes: bool,
    /// The store also says its waits poll ([`LeaseStore::change_poll`], as SQLite's
    /// do), so members read their drain roles on a cadence of their own.
    polls: bool,
    /// The member's latest session as opened (for `misattributed_pushes`).
    opened: Mutex<Option<(String, SessionId)>>,
}

impl MemberFaults {
    async fn wait_out_stall(&self) {
        loop {
            let until = *self.stalled_until.lock();
            if Instant::now() >= until {
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    }

    fn delay(&self) -> Duration {
        self.latency.mul_f64(self.rng.lock().random_range(0.0..1.0))
    }

    /// Whether `call` fails without ever reaching the store (a connection reset before
    /// the request was sent): any call but a wait.
    fn lost(&self, call: &Call) -> bool {
        let waits = matches!(
            call,
            Call::WaitForChange { .. } | Call::WaitForSuccessor { .. } | Call::WaitForTerm { .. }
        );
        let Some(loses) = self.loses.as_ref().filter(|_| !waits) else {
            return false;
        };
        let lost = Instant::now() < self.late_until && loses.lock().random_bool(0.04);
        LOST.fetch_add(usize::from(lost), Ordering::Relaxed);
        lost
    }

    /// How late a push is heard this time, if it is: up to two TTLs, now and then.
    fn late_push(&self) -> Option<Duration> {
        if Instant::now() >= self.late_until {
            return None;
        }
        let mut rng = self.rng.lock();
        rng.random_bool(0.25)
            .then(|| TTL.mul_f64(rng.random_range(0.0..4.0)))
    }

    /// What a broken store makes of a push.
    fn lie_about(&self, reply: Reply) -> Reply {
        match reply {
            Reply::Succession(TermChange::Began {
                holder,
                fencing_token,
                session: Some(session),
            }) if self.broken.misattributed_pushes => {
                let session = match &*self.opened.lock() {
                    Some((owner, current)) if *owner == holder => *current,
                    _ => session,
                };
                Reply::Succession(TermChange::Began {
                    holder,
                    fencing_token,
                    session: Some(session),
                })
            }
            other => other,
        }
    }

    /// Whether `call` reaches the store late this time, and how its caller is answered.
    fn late(&self, call: &Call) -> Option<Late> {
        if Instant::now() >= self.late_until {
            return None;
        }
        let odds = match call {
            Call::Release { .. } | Call::HandToSession { .. } => 0.25,
            Call::AcquireInSession { .. } | Call::AcquireManyInSession { .. } => 0.05,
            Call::KeepAliveSession { .. } => 0.02,
            _ => return None,
        };
        let mut rng = self.rng.lock();
        if !rng.random_bool(odds) {
            return None;
        }
        let release = matches!(call, Call::Release { .. } | Call::HandToSession { .. });
        Some(match rng.random_bool(0.5) {
            _ if release && self.broken.early_release_acks => Late::Acknowledged,
            // An acquire waits for its answer as long as its session lives.
            true if !matches!(
                call,
                Call::AcquireInSession { .. } | Call::AcquireManyInSession { .. }
            ) =>
            {
                Late::Unanswered
            }
            _ => Late::Failed,
        })
    }
}

#[async_trait::async_trait]
impl Interceptor for MemberFaults {
    fn change_poll(&self, below: Option<Duration>) -> Option<Duration> {
        if self.polls {
            Some(RETRY)
        } else {
            below
        }
    }

    async fn intercept(&self, call: Call, next: Next) -> Reply {
        if let Call::WaitForChange { deadline, .. } = call {
            if self.no_pushes {
                tokio::time::sleep_until(deadline).await;
                return Reply::Changed;
            }
            return next.run(call).await;
        }
        if let Call::WaitForSuccessor { deadline, .. } = call {
            if self.no_pushes {
                tokio::time::sleep_until(deadline).await;
                return Reply::Succession(TermChange::Unknown);
            }
            let reply = next.run(call).await;
            // A push heard late (a slow listener): what it says may be long out of date.
            if let Some(late) = self.late_push() {
                tokio::time::sleep(late).await;
            }
            return self.lie_about(reply);
        }
        self.wait_out_stall().await;
        tokio::time::sleep(self.delay()).await;
        // The lie: the store keeps the session for half the TTL asked, and says it kept
        // it for all of it.
        let lie = self.broken.lying_sessions;
        let call = match call {
            Call::KeepAliveSession { session, ttl } if lie => Call::KeepAliveSession {
                session,
                ttl: ttl / 2,
            },
            Call::OpenSession { owner, ttl } if lie => Call::OpenSession {
                owner,
                ttl: ttl / 2,
            },
            other => other,
        };
        if self.lost(&call) {
            let reset = "connection reset before the request was sent";
            return Reply::error(&call, tenure::Error::store_msg("memory", reset));
        }
        if let Some(late) = self.late(&call) {
            // The request is on the wire: it reaches the store whatever its caller does.
            let after = TTL.mul_f64(self.rng.lock().random_range(0.0..2.0));
            let answer = late.answer(&call);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = next.run(call).await;
            });
            return match answer {
                Some(answer) => answer,
                None => std::future::pending().await,
            };
        }
        let batch = matches!(call, Call::AcquireManyInSession { .. });
        let reply = next.run(call).await;
        tokio::time::sleep(self.delay()).await;
        self.wait_out_stall().await;
        match reply {
            Reply::Leases(Ok(mut answers)) if batch && self.broken.misordered_batches => {
                answers.rotate_left(1);
                Reply::Leases(Ok(answers))
            }
            Reply::Changes(Ok(mut changes)) if self.broken.missed_releases && !changes.complete => {
                changes.leases.retain(|lease| lease.info.holder.is_some());
                Reply::Changes(Ok(changes))
            }
            Reply::KeptAlive(Ok(Some(mut grant))) if self.broken.late_peers_lapse => {
                if let Some(told) = grant.peers_lapse.as_mut() {
                    told.after += 10 * TTL;
                }
                Reply::KeptAlive(Ok(Some(grant)))
            }
            Reply::KeptAlive(Ok(Some(mut grant))) if self.broken.stale_latest_change => {
                grant.latest_change = grant.latest_change.map(|_| ChangeMark::new(0));
                Reply::KeptAlive(Ok(Some(grant)))
            }
            Reply::Session(Ok(mut grant)) if self.broken.stale_latest_change => {
                grant.latest_change = grant.latest_change.map(|_| ChangeMark::new(0));
                Reply::Session(Ok(grant))
            }
            Reply::KeptAlive(Ok(Some(mut grant))) if lie => {
                grant.expires_at = grant.now + TTL;
                Reply::KeptAlive(Ok(Some(grant)))
            }
            Reply::Session(Ok(mut grant)) if lie => {
                grant.expires_at = grant.now + TTL;
                Reply::Session(Ok(grant))
            }
            Reply::Session(Ok(grant)) if self.broken.misattributed_pushes => {
                *self.opened.lock() = Some((grant.owner.clone(), grant.id));
                Reply::Session(Ok(grant))
            }
            other => other,
        }
    }
}

/// A registry whose waits for a change of the members end early at random, more often
/// than a member looks (Kubernetes' members watch wakes on every session object that
/// appears or goes, for one): each wake finds the members unchanged.
struct SpuriousWakes(Mutex<SmallRng>);

#[async_trait::async_trait]
impl RegistryFilter for SpuriousWakes {
    fn wait_until(&self, deadline: Instant) -> Option<Instant> {
        let early = Instant::now() + RETRY.mul_f64(self.0.lock().random_range(0.05..0.9));
        Some(deadline.min(early))
    }
}

/// More membership reads than any schedule's members make without a read loop (a few
/// thousand at most): the outermost registry of every schedule holds back reads past it.
const READ_CAP: usize = 100_000;

/// Who works on which shard now, and what went wrong.
#[derive(Default)]
struct Checker {
    now: HashMap<u32, (String, FencingToken)>,
    overlaps: Vec<String>,
    /// Every term's start, in order: when (since the schedule began), who, which shard,
    /// under which token.
    trace: Vec<String>,
}

/// What one schedule showed.
struct Outcome {
    /// Two members working on one shard at once, each time it happened.
    overlaps: Vec<String>,
    /// What is wrong with the placement after the quiet phase, if anything.
    problem: Option<String>,
    /// [`Checker::trace`].
    trace: Vec<String>,
}

struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<tenure::Result<()>>,
    faults: Arc<MemberFaults>,
    /// Set when the member's process is killed: nothing it sends after reaches the
    /// registry (see [`Killed`]).
    killed: Arc<AtomicBool>,
}

/// A member's way to the registry. It is cut when the member's process is killed: the
/// writes its dropped heartbeat task still sends (a leave) are lost with the process, so
/// its membership lapses on its own. In schedules with registry faults, while faults
/// last, some writes (heartbeats, leaves) fail before reaching the registry, some are
/// applied but their answer is lost, some are answered as done but never applied (a
/// commit lost in a failover to a replica that had not received it), and some reach it late, up to two TTLs after their
/// caller was answered with an error or while it is never answered (a request on the
/// wire of a connection that stopped answering); some reads fail.
struct RegistryFaults {
    inner: Arc<dyn NodeRegistry>,
    killed: Arc<AtomicBool>,
    /// The faults' random source, in schedules with registry faults.
    rng: Option<Mutex<SmallRng>>,
    faults_until: Instant,
}

/// What becomes of one registry write.
enum WriteFate {
    Applied,
    /// Failed before it was sent.
    Lost,
    /// Applied, answered with an error.
    AnswerLost,
    /// Answered as done, never applied.
    Unapplied,
    /// Applied `after` its caller was answered with an error (`answered`) or while it
    /// waits for good.
    Late {
        after: Duration,
        answered: bool,
    },
}

impl RegistryFaults {
    fn faulty(&self) -> Option<parking_lot::MutexGuard<'_, SmallRng>> {
        let rng = self.rng.as_ref()?;
        (Instant::now() < self.faults_until).then(|| rng.lock())
    }

    fn fate(&self) -> WriteFate {
        let Some(mut rng) = self.faulty() else {
            return WriteFate::Applied;
        };
        match rng.random_range(0..100) {
            0..4 => WriteFate::Lost,
            4..7 => WriteFate::AnswerLost,
            7..10 => WriteFate::Late {
                after: TTL.mul_f64(rng.random_range(0.0..2.0)),
                answered: rng.random_bool(0.5),
            },
            10..12 => WriteFate::Unapplied,
            _ => WriteFate::Applied,
        }
    }

    /// `write`, or what became of it; `done` is its answer when it is answered as done
    /// without being applied.
    async fn write<T: Send + 'static>(
        &self,
        done: T,
        write: impl std::future::Future<Output = tenure::Result<T>> + Send + 'static,
    ) -> tenure::Result<T> {
        let error = |what: &str| Err(tenure::Error::store_msg("memory", what));
        match self.fate() {
            WriteFate::Applied => write.await,
            WriteFate::Lost => error("connection reset before the request was sent"),
            WriteFate::Unapplied => Ok(done),
            WriteFate::AnswerLost => {
                let _ = write.await;
                error("connection reset before the answer came")
            }
            WriteFate::Late { after, answered } => {
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = write.await;
                });
                if !answered {
                    std::future::pending::<()>().await;
                }
                error("timed out waiting for the answer")
            }
        }
    }

    fn read(&self) -> tenure::Result<()> {
        let fails = self.faulty().is_some_and(|mut rng| rng.random_bool(0.04));
        if fails {
            let reset = "connection reset before the request was sent";
            return Err(tenure::Error::store_msg("memory", reset));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl NodeRegistry for RegistryFaults {
    async fn record_heartbeat(
        &self,
        node_id: &str,
        metadata: Option<&Metadata>,
    ) -> tenure::Result<()> {
        if self.killed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (inner, node, metadata) = (self.inner.clone(), node_id.to_owned(), metadata.cloned());
        self.write((), async move {
            inner.record_heartbeat(&node, metadata.as_ref()).await
        })
        .await
    }
    async fn live_nodes(&self) -> tenure::Result<Vec<String>> {
        self.read()?;
        self.inner.live_nodes().await
    }
    async fn members(&self) -> tenure::Result<Vec<tenure::NodeInfo>> {
        self.read()?;
        self.inner.members().await
    }
    async fn leave(&self, node_id: &str) -> tenure::Result<bool> {
        if self.killed.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let (inner, node) = (self.inner.clone(), node_id.to_owned());
        // A leave answered as done says the node was live (it was, until then).
        self.write(true, async move { inner.leave(&node).await })
            .await
    }
    fn ttl(&self) -> Duration {
        self.inner.ttl()
    }
    async fn wait_for_members_change(&self, observed: &[String], deadline: Instant) {
        self.inner.wait_for_members_change(observed, deadline).await
    }
}

struct Sim {
    store: Arc<dyn LeaseStore>,
    registry: Arc<dyn NodeRegistry>,
    checker: Arc<Mutex<Checker>>,
    shards: u32,
    broken: Broken,
    /// No member's store pushes shard changes (see [`MemberFaults::no_pushes`]).
    no_pushes: bool,
    /// Some calls of every member fail without reaching the store ([`MemberFaults::lost`]).
    loses_calls: bool,
    /// Members' registry calls fail, lose their answers or land late ([`RegistryFaults`]).
    registry_faults: bool,
    /// A crash kills the member's process, rather than only its task ([`Sim::crash`]).
    kills: bool,
    /// Faults (and work returning on its own) stop then; the quiet phase follows.
    faults_until: Instant,
    /// Decides how long each term's work runs, in the order terms start.
    work_rng: Arc<Mutex<SmallRng>>,
    running: BTreeMap<String, Running>,
    stopped: Vec<String>,
    /// Members whose every store call hangs, for good (see [`Sim::hang`]).
    hung: Vec<Running>,
    /// Members that did not shut down when asked ([`Sim::shut_down`]).
    stuck: Vec<String>,
    /// A member heartbeats into the group throughout and never works (see the module doc).
    wedged: bool,
    /// When the schedule began.
    began: Instant,
}

/// Calls that every schedule so far failed without their reaching the store.
static LOST: AtomicUsize = AtomicUsize::new(0);

/// Drains asked by every schedule so far, and those that ended with the member drained.
static DRAINS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

impl Sim {
    fn start(&mut self, node: &str, rng: &mut SmallRng) {
        let seed: u64 = rng.random();
        let faults = Arc::new(MemberFaults {
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            loses: (self.loses_calls).then(|| Mutex::new(SmallRng::seed_from_u64(!seed))),
            latency: Duration::from_millis(rng.random_range(0..60)),
            stalled_until: Mutex::new(Instant::now()),
            late_until: self.faults_until,
            broken: self.broken,
            no_pushes: self.no_pushes,
            polls: self.no_pushes && self.kills,
            opened: Mutex::new(None),
        });
        let store = InterceptStore::new(self.store.clone()).with(faults.clone());
        let killed = Arc::new(AtomicBool::new(false));
        let registry = RegistryFaults {
            inner: self.registry.clone(),
            killed: killed.clone(),
            rng: (self.registry_faults).then(|| Mutex::new(SmallRng::seed_from_u64(seed ^ 0x5eed))),
            faults_until: self.faults_until,
        };
        let elector = ShardElector::new(
            Arc::new(store),
            Arc::new(registry),
            ShardOptions {
                group: GROUP.to_owned(),
                shards: self.shards,
                node_id: node.to_owned(),
                lease_ttl: TTL,
                renew_interval: RENEW,
                retry_interval: RETRY,
                max_moves_in_flight: rng.random_range(1..=4),
                ..Default::default()
            },
        )
        .unwrap();
        let shutdown = CancellationToken::new();
        let checker = self.checker.clone();
        let name = node.to_owned();
        let stop = shutdown.clone();
        let (work_rng, faults_until, began) =
            (self.work_rng.clone(), self.faults_until, self.began);
        let task = tokio::spawn(async move {
            elector
                .run(
                    move |shard, token, leadership: CancellationToken| {
                        let checker = checker.clone();
                        let name = name.clone();
                        // While faults last, some work returns on its own (its shard is
                        // released, and taken again a retry interval later).
                        let returns_after = (Instant::now() < faults_until)
                            .then(|| {
                                let mut rng = work_rng.lock();
                                rng.random_bool(0.3)
                                    .then(|| TTL.mul_f64(rng.random_range(0.0..1.5)))
                            })
                            .flatten();
                        async move {
                            {
                                let mut c = checker.lock();
                                let at = began.elapsed();
                                c.trace.push(format!("{at:?} {name} {shard} {token}"));
                                if let Some((other, other_token)) = c.now.get(&shard).cloned() {
                                    c.overlaps.push(format!(
                                        "shard {shard}: {name} (token {token}) started while \
                                         {other} (token {other_token}) works"
                                    ));
                                }
                                c.now.insert(shard, (name.clone(), token));
                            }
                            match returns_after {
                                Some(after) => {
                                    tokio::select! {
                                        biased;
                                        _ = leadership.cancelled() => {}
                                        _ = tokio::time::sleep(after) => {}
                                    }
                                }
                                None => leadership.cancelled().await,
                            }
                            let mut c = checker.lock();
                            if c.now
                                .get(&shard)
                                .is_some_and(|(n, t)| *n == name && *t == token)
                            {
                                c.now.remove(&shard);
                            }
                        }
                    },
                    stop,
                )
                .await
        });
        self.running.insert(
            node.to_owned(),
            Running {
                shutdown,
                task,
                faults,
                killed,
            },
        );
    }

    /// The overlaps seen so far, and what is wrong with the placement now (if anything).
    fn verdict(&self) -> (Vec<String>, Option<String>) {
        let checker = self.checker.lock();
        if self.wedged {
            let (worked, n) = (checker.now.len(), self.shards as usize);
            let problem = (worked != n)
                .then(|| format!("{worked} of {n} shards worked on beside a wedged member"));
            return (checker.overlaps.clone(), problem);
        }
        let mut per_member: BTreeMap<&str, usize> = BTreeMap::new();
        for (node, _) in checker.now.values() {
            *per_member.entry(node.as_str()).or_default() += 1;
        }
        let (n, m) = (self.shards as usize, self.running.len());
        let unbalanced = self
            .running
            .keys()
            .map(|node| (node, per_member.get(node.as_str()).copied().unwrap_or(0)))
            .find(|(_, count)| *count != n / m && *count != n.div_ceil(m));
        let problem = if checker.now.len() != n {
            Some(format!(
                "{} of {n} shards worked on: {per_member:?}",
                checker.now.len()
            ))
        } else {
            unbalanced.map(|(node, count)| {
                format!("{node} works on {count} of {n} shards over {m} members: {per_member:?}")
            })
        };
        (checker.overlaps.clone(), problem)
    }

    /// Each shard worked on now, in shard order (a schedule replays the same from its
    /// seed): who works on it, under which token.
    fn worked(&self) -> Vec<(u32, String, FencingToken)> {
        let checker = self.checker.lock();
        let now = checker.now.iter();
        let mut worked: Vec<_> = now
            .map(|(shard, (node, token))| (*shard, node.clone(), *token))
            .collect();
        worked.sort_unstable_by_key(|(shard, ..)| *shard);
        worked
    }

    /// A shard worked on under a term that the store does not show live for that member
    /// under that token (its work outlived its term), if any.
    async fn stale_work(&self) -> Option<String> {
        let worked = self.worked();
        for (shard, node, token) in worked {
            let lease = self.store.get(&format!("{GROUP}/{shard}")).await;
            let lease = lease.ok().flatten();
            let live = lease
                .as_ref()
                .and_then(|l| Some((l.live_holder()?, l.fencing_token)));
            if live != Some((node.as_str(), token)) {
                return Some(format!(
                    "shard {shard}: {node} works under token {token}, the store shows {lease:?}"
                ));
            }
        }
        None
    }

    /// Releases one worked-on shard in the store from outside the group (an operator, a
    /// release landing late): no push tells the members, who hear of it only through
    /// the latest change their keep-alives tell.
    async fn release_from_outside(&self, rng: &mut SmallRng) {
        let worked = self.worked();
        if worked.is_empty() {
            return;
        }
        let (shard, node, token) = &worked[rng.random_range(0..worked.len())];
        let role = format!("{GROUP}/{shard}");
        let _ = self.store.release(&role, node, *token).await;
    }

    /// Hangs every store call of one member at random, for good, if another is left (a
    /// connection that stopped answering, with no timeout to notice): its heartbeats,
    /// through the registry, would go on, but it loses its session at its deadline and
    /// must leave the group with it. Under `membership_outlives_session` its node goes
    /// on heartbeating. It no longer counts among the members the verdict shares by.
    fn hang(&mut self, rng: &mut SmallRng, ghost: &CancellationToken) {
        let live: Vec<String> = self.running.keys().cloned().collect();
        if live.len() < 2 {
            return;
        }
        let node = &live[rng.random_range(0..live.len())];
        let member = self.running.remove(node).unwrap();
        *member.faults.stalled_until.lock() = Instant::now() + 10_000 * TTL;
        if self.broken.membership_outlives_session {
            heartbeat_into(&self.registry, node, GROUP, ghost);
        }
        self.hung.push(member);
    }

    /// Crashes one member at random, if another is left: its task is aborted, and its
    /// session lapses on its own. In a process that lives on, its dropped heartbeat
    /// task still leaves the group; where processes are killed, its membership lapses
    /// on its own too.
    async fn crash(&mut self, rng: &mut SmallRng) {
        let live: Vec<String> = self.running.keys().cloned().collect();
        if live.len() < 2 {
            return;
        }
        let node = &live[rng.random_range(0..live.len())];
        let member = self.running.remove(node).unwrap();
        member.killed.store(self.kills, Ordering::SeqCst);
        member.task.abort();
        let _ = member.task.await;
        self.stopped.push(node.clone());
    }

    /// Shuts a member down gracefully: it finishes a look in progress, hands its shards
    /// over and leaves. That may wait out a stall (up to two TTLs) and calls that end
    /// with the session's deadline or are given up after a TTL, but nothing waits for
    /// good: a member still running after six TTLs is aborted, and the schedule fails
    /// (the longest of seeds 0-3,999 took 3.5 TTLs).
    async fn shut_down(&mut self, node: String, member: Running) {
        member.shutdown.cancel();
        let abort = member.task.abort_handle();
        if tokio::time::timeout(6 * TTL, member.task).await.is_err() {
            abort.abort();
            let at = self.began.elapsed();
            self.stuck.push(format!(
                "{node} did not shut down within six TTLs (asked at {at:?})"
            ));
        }
    }

    async fn step(&mut self, rng: &mut SmallRng) {
        let live: Vec<String> = self.running.keys().cloned().collect();
        match rng.random_range(0..5) {
            0 if live.len() > 1 => {
                let node = live[rng.random_range(0..live.len())].clone();
                let member = self.running.remove(&node).unwrap();
                self.shut_down(node.clone(), member).await;
                self.stopped.push(node);
            }
            1 if live.len() > 1 => self.crash(rng).await,
            2 if !self.stopped.is_empty() => {
                let node = self.stopped.remove(rng.random_range(0..self.stopped.len()));
                self.start(&node, rng);
            }
            // A drain asked through the store, in force for up to two TTLs: the member
            // hands every shard over, then joins again.
            3 if live.len() > 1 => {
                let node = live[rng.random_range(0..live.len())].clone();
                let hold = TTL.mul_f64(rng.random_range(0.5..2.0));
                let store = self.store.clone();
                DRAINS[0].fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let outcome =
                        tenure::shard::request_drain(store, GROUP, &node, "ops", hold, hold).await;
                    if matches!(outcome, Ok(tenure::DrainOutcome::Drained { .. })) {
                        DRAINS[1].fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            _ => {
                let node = &live[rng.random_range(0..live.len())];
                let stall = TTL.mul_f64(rng.random_range(0.3..2.0));
                *self.running[node].faults.stalled_until.lock() = Instant::now() + stall;
            }
        }
    }
}

/// Heartbeats `node` into `group`'s membership, every third of the TTL, until `stop`;
/// no elector behind it.
fn heartbeat_into(
    registry: &Arc<dyn NodeRegistry>,
    node: &str,
    group: &str,
    stop: &CancellationToken,
) {
    let mut metadata = Metadata::new();
    metadata.insert(tenure::shard::GROUP_KEY.to_owned(), group.to_owned());
    tenure::spawn_heartbeat(registry.clone(), node, metadata, TTL / 3, stop.clone());
}

/// Runs one schedule.
async fn schedule(seed: u64, broken: Broken) -> Outcome {
    let mut rng = SmallRng::seed_from_u64(seed);
    // Not drawn from `rng`: the schedules without one stay what they were. The seeds
    // pinned below are odd: they keep the registry that tells nothing and lose no
    // calls, and so replay the events they were pinned for.
    let wedged = seed % 3 == 2;
    let released_from_outside = seed % 5 == 3 && !wedged;
    let hangs = seed % 7 == 4;
    let outsider = seed % 4 == 1 || seed % 8 == 6;
    let peers_told = seed % 2 == 0;
    let loses_calls = seed % 4 == 2;
    // Odd ones too, on the registry of its own, none of the pinned seeds among them.
    let registry_faults = seed % 2 == 0 || seed % 18 == 5;
    let clock = TokioClock::new();
    let members = rng.random_range(3..=8);
    let store = InMemoryLeaseStore::with_clock(clock.clone());
    let mut registry: Arc<dyn NodeRegistry> = if peers_told {
        Arc::new(store.registry(TTL).unwrap())
    } else {
        Arc::new(InMemoryNodeRegistry::with_clock(TTL, clock.clone()).unwrap())
    };
    if rng.random_bool(0.5) {
        let wakes = SpuriousWakes(Mutex::new(SmallRng::seed_from_u64(rng.random())));
        registry = Arc::new(FilteredRegistry::new(registry, wakes));
    }
    let counted = Arc::new(counting_reads(registry, READ_CAP));
    let registry: Arc<dyn NodeRegistry> = counted.clone();
    let mut sim = Sim {
        store: Arc::new(store),
        registry,
        checker: Arc::default(),
        shards: rng.random_range(4..=40),
        broken,
        no_pushes: rng.random_bool(0.25),
        loses_calls,
        registry_faults,
        kills: peers_told,
        // Members start over up to 3.2 s, then 20 s of faults.
        faults_until: Instant::now() + Duration::from_millis(23_200),
        work_rng: Arc::new(Mutex::new(SmallRng::seed_from_u64(rng.random()))),
        running: BTreeMap::new(),
        stopped: Vec::new(),
        hung: Vec::new(),
        stuck: Vec::new(),
        wedged,
        began: Instant::now(),
    };
    let stop_wedged = CancellationToken::new();
    if wedged {
        heartbeat_into(&sim.registry, "wedged", GROUP, &stop_wedged);
        // Its session is kept alive too (a member whose loop is stuck while its
        // keep-alive task runs): a term handed to that session would be held, and never
        // worked on, for as long as the keep-alives go on.
        let (store, stop) = (sim.store.clone(), stop_wedged.clone());
        tokio::spawn(async move {
            let Ok(session) = store.open_session("wedged", TTL).await else {
                return;
            };
            while !stop.is_cancelled() {
                tokio::time::sleep(RENEW).await;
                if !matches!(store.keep_alive_session(session.id, TTL).await, Ok(Some(_))) {
                    return;
                }
            }
        });
    }
    if outsider {
        heartbeat_into(&sim.registry, "outsider", "reports", &stop_wedged);
    }
    for i in 0..members {
        sim.start(&format!("m{i}"), &mut rng);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await;
    }
    let faults_until = sim.faults_until;
    while Instant::now() < faults_until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
        sim.step(&mut rng).await;
    }
    if peers_told {
        // The others learn of it only when its membership lapses, which the accounts
        // of their keep-alives must tell.
        sim.crash(&mut rng).await;
    }
    if hangs {
        sim.hang(&mut rng, &stop_wedged);
    }
    // Quiet: no new faults; stalls (up to 2 TTLs) and late calls run out, expired
    // sessions lapse, a rescued shard waits out its hold (4 TTLs), members settle.
    tokio::time::sleep(8 * TTL).await;
    let mut verdict = sim.verdict();
    // A probe to the wedged member leaves one shard free for up to a few retry
    // intervals, and members keep probing it (less and less often): every shard must be
    // worked on at some moment of the next TTL.
    let until = Instant::now() + TTL;
    while verdict.1.is_some() && sim.wedged && Instant::now() < until {
        tokio::time::sleep(RETRY / 3).await;
        verdict = sim.verdict();
    }
    if released_from_outside && verdict.1.is_none() {
        // Settled (each member's looks a timer's 30 TTLs apart): one shard released from
        // outside must be worked on again under a new term within a few renewals.
        sim.release_from_outside(&mut rng).await;
        tokio::time::sleep(4 * RENEW).await;
        verdict = sim.verdict();
    }
    if verdict.1.is_none() {
        verdict.1 = sim.stale_work().await;
    }
    stop_wedged.cancel();
    for (node, member) in std::mem::take(&mut sim.running) {
        sim.shut_down(node, member).await;
    }
    if let Some(problem) = sim.stuck.first() {
        let problem = problem.clone();
        verdict.1 = Some(
            verdict
                .1
                .map_or(problem.clone(), |p| format!("{problem}; {p}")),
        );
    }
    // Stuck in a call that never returns: a shutdown would wait on it for good.
    for member in std::mem::take(&mut sim.hung) {
        member.task.abort();
        let _ = member.task.await;
    }
    if counted.filter().capped() {
        let reads = counted.filter().reads();
        let problem = format!("the members read the membership {reads} times: a read loop");
        verdict.1 = Some(
            verdict
                .1
                .map_or(problem.clone(), |p| format!("{problem}; {p}")),
        );
    }
    let (overlaps, problem) = verdict;
    let trace = std::mem::take(&mut sim.checker.lock().trace);
    Outcome {
        overlaps,
        problem,
        trace,
    }
}

/// The seeds to run: `TENURE_SHARD_SIM_SEED` alone, or `TENURE_SHARD_SIM_SCHEDULES`
/// (default 40) from `TENURE_SHARD_SIM_FROM` (default 0).
fn seeds() -> std::ops::Range<u64> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    match var("TENURE_SHARD_SIM_SEED") {
        Some(seed) => seed..seed + 1,
        None => {
            let from = var("TENURE_SHARD_SIM_FROM").unwrap_or(0);
            from..from + var("TENURE_SHARD_SIM_SCHEDULES").unwrap_or(40)
        }
    }
}

/// Setup: seeded schedules of 3-8 members, 4-40 shards, 20 s of faults (leaves, crashes,
/// restarts, drains asked through the store for up to two TTLs, stalls of up to two
/// TTLs, store latency up to 60 ms, half with spurious wakes of the members' waits, a
/// quarter with no pushes of shard changes, a third beside a wedged member, three in
/// eight beside a node of another group, half with keep-alives that tell when the
/// members lapse and crashes that kill the process, a quarter losing calls, over half with
/// registry calls that fail, lose their answer or land late), then 8
/// TTLs of quiet (in a seventh, one member's store calls hang for good from its start;
/// in a fifth of those without a wedged member, then one shard released from outside
/// and four renew intervals more).
/// No shard ever had two members working on it, and every member asked to shut down did
/// so within six TTLs; afterwards every shard is worked on, each
/// under the term the store shows live for its member, and, without a wedged member, the
/// live members share them evenly.
#[test]
fn seeded_shard_schedules_keep_invariant_7() {
    for seed in seeds() {
        assert_keeps_invariant_7(seed);
    }
    let [asked, drained] = DRAINS.each_ref().map(|n| n.load(Ordering::Relaxed));
    let lost = LOST.load(Ordering::Relaxed);
    eprintln!("drains asked {asked}, of which ended drained {drained}; calls lost {lost}");
    if seeds().count() >= 20 {
        assert!(asked > 0 && drained > 0, "asked {asked}, drained {drained}");
        assert!(lost > 0, "no call was lost");
    }
}

/// Seeds that once caught a shard left idle after the quiet phase, each by an event that
/// freed it with no push while every member counted itself settled (and so looked again
/// only 10 TTLs later): 637 and 1785, a shard of the member's own with no term on it
/// (cooling, or freed by the look's stray release); 819, an acquire answered with an error
/// and granted later; 3061, a handover that ended after its shard was targeted back here;
/// 7 (once members of a cold group gathered before their first look), a handover that
/// failed and landed later on a member that had restarted and settled with a plan that
/// targeted the shard back at the giver (caught both by the session's count of handed
/// terms and by the giver's look handing the shard on rather than releasing it).
/// Run whatever `TENURE_SHARD_SIM_SCHEDULES` is (CI runs the first 1,000 seeds).
#[test]
fn seeds_that_once_left_a_shard_idle_keep_invariant_7() {
    for seed in [7, 637, 819, 1785, 3061] {
        assert_keeps_invariant_7(seed);
    }
}

/// Runs schedule `seed` and asserts invariant 7: no overlap, and after the quiet phase
/// every shard worked on (evenly without a wedged member).
fn assert_keeps_invariant_7(seed: u64) {
    let Outcome {
        overlaps, problem, ..
    } = run_schedule(seed, Broken::default());
    assert!(overlaps.is_empty(), "seed {seed}: {overlaps:?}");
    assert_eq!(problem, None, "seed {seed}: after the quiet phase");
}

/// Runs schedule `seed` under `broken` on a runtime of its own.
fn run_schedule(seed: u64, broken: Broken) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(schedule(seed, broken))
}

/// Setup: two runs of the same seed, then one of another seed, for seed 819 and for 823
/// (which releases a shard from outside after the quiet phase). A schedule is a function
/// of its seed, term by term (so a printed seed replays a failure: with tokio's random
/// choice among ready `select!` branches, seed 819 once failed in 29 of 60 runs alone);
/// different seeds give different schedules.
#[test]
fn schedules_are_reproducible_from_their_seed() {
    for seed in [819, 823] {
        let first = run_schedule(seed, Broken::default());
        let second = run_schedule(seed, Broken::default());
        assert!(first.trace.len() > 50, "{} terms", first.trace.len());
        if let Some(at) = first
            .trace
            .iter()
            .zip(&second.trace)
            .position(|(a, b)| a != b)
        {
            panic!(
                "two runs of seed {seed} diverge at term {at}: {} against {}",
                first.trace[at], second.trace[at]
            );
        }
        assert_eq!(first.trace.len(), second.trace.len());
        assert_eq!(first.problem, second.problem);
        let other = run_schedule(seed + 1, Broken::default());
        assert_ne!(first.trace, other.trace);
    }
}

/// Asserts that one of the first 1,000 schedules under `broken` has two members working on one
/// shard, and prints the first; `what` names the fault in the failure.
fn assert_overlap_caught(broken: Broken, what: &str) {
    let caught = (0..1000).find_map(|seed| {
        let overlaps = run_schedule(seed, broken).overlaps;
        (!overlaps.is_empty()).then_some((seed, overlaps))
    });
    println!("caught: {caught:?}");
    assert!(caught.is_some(), "no schedule caught {what}");
}

/// The negative control: members that believe their session lasts a TTL longer than the
/// store keeps it (as a member ignoring its deadline would) must be caught working on
/// one shard at once.
#[test]
fn negative_control_lying_renewals_overlap() {
    let broken = Broken {
        lying_sessions: true,
        ..Broken::default()
    };
    assert_overlap_caught(broken, "the lying renewals");
}

/// The negative control of late releases: a store that says a release is done while it
/// is still on its way (as a member that takes a shard back under the token of a
/// release that may still land would believe) must be caught: the late release frees
/// the shard under the work started again, and another member takes it.
#[test]
fn negative_control_releases_acknowledged_before_they_land_overlap() {
    let broken = Broken {
        early_release_acks: true,
        ..Broken::default()
    };
    assert_overlap_caught(broken, "the early acknowledgements");
}

/// The negative control of batched acquires: a store answering a batch out of order
/// (as a member pairing answers with the wrong roles would read it) must be caught: a
/// member starts work on a shard another member holds.
#[test]
fn negative_control_misordered_batch_answers_overlap() {
    let broken = Broken {
        misordered_batches: true,
        ..Broken::default()
    };
    assert_overlap_caught(broken, "the misordered batches");
}

/// The negative control of the keep-alive's account of the other members: a store
/// telling that they lapse ten TTLs later than they do (so each member puts its read of
/// the members off past the quiet phase) must be caught leaving the shards of a member
/// that crashed idle, in a schedule whose store tells at all (an even seed).
#[test]
fn negative_control_peers_lapse_told_late_leaves_shards_idle() {
    let broken = Broken {
        late_peers_lapse: true,
        ..Broken::default()
    };
    assert_idle_caught(broken, (0..1200).step_by(2), "the late accounts");
}

/// The negative control of reads of what changed: a store leaving the releases out of
/// them (so members' copies show a released shard held by its last holder while that
/// holder's session lives) must be caught leaving a shard idle: a probe to a wedged
/// member is taken back only once it shows free.
#[test]
fn negative_control_reads_missing_releases_leave_shards_idle() {
    let broken = Broken {
        missed_releases: true,
        ..Broken::default()
    };
    assert_idle_caught(broken, 0..80, "the releases left out of reads");
}

/// The negative control: a member that works on any term handed to its node id, not
/// only on one handed to its current session (a push reaching a stalled member after the
/// session it was handed to ended, when another member may hold the shard), must be
/// caught working on one shard at once with that other member.
#[test]
fn negative_control_pushes_of_earlier_sessions_taken_overlap() {
    let broken = Broken {
        misattributed_pushes: true,
        ..Broken::default()
    };
    assert_overlap_caught(
        broken,
        "terms handed to an earlier session taken as this one's",
    );
}

/// The negative control of the latest change a keep-alive tells: a store whose number
/// never moves (so a settled member hears of a change only at its timer's look, every
/// 30 TTLs, long past the quiet phase) must be caught leaving a shard idle.
#[test]
fn negative_control_stale_latest_change_leaves_shards_idle() {
    let broken = Broken {
        stale_latest_change: true,
        ..Broken::default()
    };
    assert_idle_caught(broken, 0..2000, "the stale latest change");
}

/// The negative control of a member that lost its session leaving the group: a member
/// whose store calls hang, and whose node goes on heartbeating, must be caught leaving
/// its shards idle (the others, settled, look on their 30-TTL timer).
#[test]
fn negative_control_membership_outliving_the_session_leaves_shards_idle() {
    let broken = Broken {
        membership_outlives_session: true,
        ..Broken::default()
    };
    let hanging = (0..2000).filter(|seed| seed % 7 == 4);
    assert_idle_caught(broken, hanging, "the membership outliving its session");
}

/// Runs `seeds` under `broken` until one leaves a shard idle after the quiet phase
/// (never two members on one shard); fails if none does.
fn assert_idle_caught(broken: Broken, seeds: impl Iterator<Item = u64>, what: &str) {
    let caught = seeds.into_iter().find_map(|seed| {
        let outcome = run_schedule(seed, broken);
        assert!(
            outcome.overlaps.is_empty(),
            "seed {seed}: {:?}",
            outcome.overlaps
        );
        outcome.problem.map(|problem| (seed, problem))
    });
    println!("caught: {caught:?}");
    assert!(caught.is_some(), "no schedule caught {what}");
}
