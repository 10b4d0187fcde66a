//! Shard-group members under faults of their batched acquires, on the real store: a
//! batch whose answer is lost after the store applied it, and a batch that reaches the
//! store late, after its member gave up on it and went on. Generated per backend by
//! [`shard_fault_scenarios!`](crate::shard_fault_scenarios).
//!
//! Why: a [`ShardElector`] contends with one `acquire_many_in_session` call per batch of
//! shards. When a batch fails, the store may have granted any of its shards (then, or
//! later: the request may still be on its way), and a shard held by a live session with
//! no work on it would be kept from every member for as long as that session lives. The
//! member answers with its `lost_acquires` (see `crates/tenure/src/shard/plan.rs`); the
//! in-memory shard simulation tests it, and these scenarios test it against every real
//! store, where answers are decided by a server, not by the test.
//!
//! The faults are [`Faults`] rules over
//! [`InterceptStore`](tenure::intercept::InterceptStore) above the backend's store, so
//! they are deterministic. Each member's work logs `(member, shard, token, start, end)`;
//! the store is read with `list_prefix` from another store instance. Every scenario
//! checks, within a bound of a few renew intervals:
//!
//! - every shard the store shows held is worked on by its holder, under the token the
//!   store shows, and by nobody else: no shard stays held by a live session with no work
//!   on it (it would be stuck there for the session's life);
//! - per shard, the work of one term ends before the next holder's begins, and tokens
//!   strictly grow per change of holder (a token names one holder);
//! - a late batch never ends or steals a newer term: a fence that admitted the newer
//!   term's token refuses any token the late batch was given.
//!
//! Members run on the tokio clock (renewals, looks) with short intervals derived from
//! the fixture's TTL; the group's registry is in memory, on the same clock. On real
//! servers time passes on the wall clock; on the in-memory backend the tests run on
//! paused tokio time and its store reads that clock; a store on a manual clock (SQLite's
//! fixture) is moved on with the fixture's `pass_time` as the scenario waits, in step
//! with the members' clock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::intercept::{FilteredRegistry, RegistryFilter, Reply};
use tenure::{
    Fence, FencingToken, InMemoryNodeRegistry, LeaseResult, LeaseStore, NodeRegistry, ShardElector,
    ShardOptions, TokioClock,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::faults::{Faulted, Faults};
use crate::PATIENCE;
use crate::{eventually, LeaseBackend, LeaseFixture};

const GROUP: &str = "sfault";
const SHARDS: u32 = 8;
const ACQUIRE_MANY: &str = "acquire_many_in_session";

/// One term's work as a member's work closure logged it.
#[derive(Clone, Debug)]
struct Work {
    member: String,
    shard: u32,
    token: FencingToken,
    start: Instant,
    /// `None` while the work runs.
    end: Option<Instant>,
}

type WorkLog = Arc<Mutex<Vec<Work>>>;

/// Marks a logged work ended when its future ends, however it ends.
struct EndOnDrop {
    log: WorkLog,
    at: usize,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Ok(mut log) = self.log.lock() {
            log[self.at].end = Some(Instant::now());
        }
    }
}

/// The shards the store shows held by a live holder: holder and token.
type Held = BTreeMap<u32, (String, FencingToken)>;

struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<tenure::Result<()>>,
}

/// A group of members over one fixture's store behind a [`Faults`].
struct Group {
    /// The fixture: its storage (and server connections) for the scenario's life, and
    /// its clock.
    fx: Box<dyn LeaseFixture>,
    faults: Arc<Faults>,
    store: Arc<dyn LeaseStore>,
    reader: Arc<dyn LeaseStore>,
    registry: Arc<dyn NodeRegistry>,
    ttl: Duration,
    log: WorkLog,
    members: BTreeMap<String, Running>,
    /// The members' `max_clock_drift`: how much earlier than the store a member gives
    /// up on a session it could not renew.
    drift: f64,
}

impl Group {
    async fn new(backend: &dyn LeaseBackend) -> Group {
        let base = Faulted::new(backend).await;
        let registry = InMemoryNodeRegistry::with_clock(base.ttl, TokioClock::new())
            .expect("an in-memory registry with the fixture's TTL");
        Group {
            fx: base.fx,
            faults: base.faults,
            store: base.store,
            reader: base.reader,
            registry: Arc::new(registry),
            ttl: base.ttl,
            log: Arc::default(),
            members: BTreeMap::new(),
            drift: ShardOptions::default().max_clock_drift,
        }
    }

    fn options(&self, node: &str) -> ShardOptions {
        ShardOptions {
            group: GROUP.to_owned(),
            shards: SHARDS,
            node_id: node.to_owned(),
            lease_ttl: self.ttl,
            renew_interval: self.renew(),
            retry_interval: (self.ttl / 8).min(Duration::from_millis(500)),
            max_clock_drift: self.drift,
            ..Default::default()
        }
    }

    fn renew(&self) -> Duration {
        self.ttl / 4
    }

    /// How long the group may take to settle after a fault reached its member: a few
    /// renew intervals and many looks.
    fn bound(&self) -> Duration {
        self.ttl * 2
    }

    /// Starts member `node`; its work logs each term and runs until cancelled.
    fn start(&mut self, node: &str) {
        self.start_on(node, self.registry.clone());
    }

    /// Starts member `node` with its registry calls going to `registry` (the group's,
    /// filtered).
    fn start_on(&mut self, node: &str, registry: Arc<dyn NodeRegistry>) {
        let elector = ShardElector::new(self.store.clone(), registry, self.options(node))
            .expect("valid shard options");
        let shutdown = CancellationToken::new();
        let (log, name, stop) = (self.log.clone(), node.to_owned(), shutdown.clone());
        let task = tokio::spawn(async move {
            let work = move |shard, token, leadership: CancellationToken| {
                let (log, member) = (log.clone(), name.clone());
                async move {
                    let at = {
                        let mut log = log.lock().expect("the work log");
                        log.push(Work {
                            member,
                            shard,
                            token,
                            start: Instant::now(),
                            end: None,
                        });
                        log.len() - 1
                    };
                    let _ended = EndOnDrop { log, at };
                    leadership.cancelled().await;
                }
            };
            elector.run(work, stop).await
        });
        self.members
            .insert(node.to_owned(), Running { shutdown, task });
    }

    /// Stops member `node` gracefully and waits (bounded) for it to end.
    async fn stop(&mut self, node: &str) {
        let running = self.members.remove(node).expect("a running member");
        running.shutdown.cancel();
        let mut task = running.task;
        match tokio::time::timeout(PATIENCE, &mut task).await {
            Ok(ended) => ended
                .expect("the member's task ended cleanly")
                .expect("the member's run ended without error"),
            Err(_) => {
                task.abort();
                panic!("{node} did not stop within {PATIENCE:?}");
            }
        }
    }

    async fn stop_all(&mut self) {
        let nodes: Vec<String> = self.members.keys().cloned().collect();
        for node in nodes {
            self.stop(&node).await;
        }
    }

    /// Waits (bounded) until the registry shows exactly `nodes` live.
    async fn wait_members(&self, nodes: &[&str]) {
        self.wait_members_within(nodes, PATIENCE, "members join")
            .await;
    }

    /// Waits until the registry shows exactly `nodes` live, for at most `within`.
    async fn wait_members_within(&self, nodes: &[&str], within: Duration, why: &str) {
        eventually(within, Duration::from_millis(10), || async {
            let live = self.registry.live_nodes().await.expect("live members");
            if live == nodes {
                Ok(())
            } else {
                Err(format!(
                    "members {live:?}, not {nodes:?} within {within:?} ({why})"
                ))
            }
        })
        .await;
    }

    /// The shards the store shows held now.
    async fn held(&self) -> Held {
        let prefix = format!("{GROUP}/");
        let leases = tokio::time::timeout(PATIENCE, self.reader.list_prefix(&prefix))
            .await
            .expect("the store answered a list within the scenario's patience")
            .expect("the group's shards");
        leases
            .into_iter()
            .filter_map(|lease| {
                let shard = lease.role.strip_prefix(&prefix)?.parse().ok()?;
                let holder = lease.live_holder()?.to_owned();
                Some((shard, (holder, lease.fencing_token)))
            })
            .collect()
    }

    /// The work running now, by shard.
    fn running(&self) -> BTreeMap<u32, Vec<(String, FencingToken)>> {
        let mut running: BTreeMap<u32, Vec<_>> = BTreeMap::new();
        for work in self.log.lock().expect("the work log").iter() {
            if work.end.is_none() {
                running
                    .entry(work.shard)
                    .or_default()
                    .push((work.member.clone(), work.token));
            }
        }
        running
    }

    /// Why the group is not settled, if it is not: every shard held, each worked on by
    /// its holder under the token the store shows, and by nobody else.
    async fn unsettled(&self) -> Option<String> {
        let held = self.held().await;
        let running = self.running();
        for shard in 0..SHARDS {
            let workers = running.get(&shard).cloned().unwrap_or_default();
            match held.get(&shard) {
                None => return Some(format!("shard {shard} is held by nobody")),
                Some(term) if workers != [term.clone()] => {
                    return Some(format!(
                        "shard {shard} is held by {term:?} but worked on by {workers:?}"
                    ))
                }
                Some(_) => {}
            }
        }
        None
    }

    /// Waits until the group is settled, for at most `within` (failing with `why` and
    /// what is wrong); returns the store's view then.
    async fn settle(&self, within: Duration, why: &str) -> Held {
        let deadline = Instant::now() + within;
        let step = self.ttl / 40;
        loop {
            let wrong = self.unsettled().await;
            let Some(wrong) = wrong else {
                return self.held().await;
            };
            assert!(
                Instant::now() < deadline,
                "not settled within {within:?} ({why}): {wrong}; store: {:?}",
                self.held().await
            );
            self.tick(step).await;
        }
    }

    /// Checks, for `about` (several looks), that the group stays settled on the terms
    /// `held` and that the work log's history holds.
    async fn stays(&self, held: &Held, about: Duration, why: &str) {
        let until = Instant::now() + about;
        while Instant::now() < until {
            if let Some(wrong) = self.unsettled().await {
                panic!("the group did not stay settled ({why}): {wrong}");
            }
            assert_eq!(self.held().await, *held, "the terms changed ({why})");
            self.tick(self.ttl / 20).await;
        }
        self.check_history();
    }

    /// Waits `by` on the members' clock, and lets the store's time pass as much: a
    /// fixture whose store reads a manual clock advances it (its `pass_time`) in step
    /// with the members' renewals, so sessions nobody renews lapse as on a server and
    /// the renewed ones do not.
    async fn tick(&self, by: Duration) {
        tokio::time::sleep(by).await;
        if self.fx.exact_clock() {
            self.fx.pass_time(by).await;
        }
    }

    /// Per shard: one term's work ends before another holder's begins, and tokens
    /// strictly grow per change of holder; a token names one holder.
    fn check_history(&self) {
        let mut log = self.log.lock().expect("the work log").clone();
        log.sort_by_key(|work| (work.shard, work.start));
        for pair in log.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            if before.shard != after.shard {
                continue;
            }
            if before.member == after.member {
                assert!(
                    after.token >= before.token,
                    "shard {}: {} worked under {} after {}",
                    after.shard,
                    after.member,
                    after.token,
                    before.token
                );
                continue;
            }
            assert!(
                after.token > before.token,
                "shard {}: {} worked under {} after {} worked under {}",
                after.shard,
                after.member,
                after.token,
                before.member,
                before.token
            );
            assert!(
                before.end.is_some_and(|end| end <= after.start),
                "shard {}: {} (token {}) started while {} (token {}) worked",
                after.shard,
                after.member,
                after.token,
                before.member,
                before.token
            );
        }
    }
}

/// The answers of an `acquire_many_in_session` the store gave, whoever saw them.
fn leases(reply: Reply) -> tenure::Result<Vec<LeaseResult>> {
    match reply {
        Reply::Leases(answer) => answer,
        other => panic!("not the answer of a batch of acquires: {other:?}"),
    }
}

/// Member A, alone, sends its first batch (every shard); the store grants all of them to
/// A's session, and A is told the batch failed only after member B joined. So when A
/// looks again, half the shards the store holds for A are targeted at B. Within the
/// bound A works on each of its targets under the token the store shows and releases
/// the others (held by its live session, they would be kept from B for good), B works
/// on those, and every shard has exactly one worker.
pub async fn scenario_shard_fault_batch_answer_lost(backend: &dyn LeaseBackend) {
    let mut g = Group::new(backend).await;
    let lost = g.faults.lose_answer_late(ACQUIRE_MANY, "node-a");
    g.start("node-a");
    let granted = leases(lost.store_answer().await).expect("the store applied A's batch");
    assert_eq!(
        granted.len(),
        SHARDS as usize,
        "A's first batch asks for every shard"
    );
    assert!(
        granted
            .iter()
            .all(|answer| answer.acquired && answer.holder == "node-a"),
        "the store granted A every shard: {granted:?}"
    );
    g.start("node-b");
    g.wait_members(&["node-a", "node-b"]).await;
    lost.land();
    let held = g
        .settle(
            g.bound(),
            "after A's lost batch granted every shard to A's session",
        )
        .await;
    let by_b = held
        .values()
        .filter(|(holder, _)| holder == "node-b")
        .count();
    assert!(by_b > 0, "B works on the shards targeted at it: {held:?}");
    g.stays(&held, g.renew() * 2, "after the lost batch").await;
    g.stop_all().await;
}

/// Member A's first batch (every shard) is held before the store. B joins and takes its
/// targets; A's session then ends (closed on the store, as a lapse would end it) while
/// A is asked to stop: A gives up on the batch, leaves, and B takes every shard within
/// the bound. Then A's batch lands, under the ended session: it takes nothing, ends
/// none of B's terms (B's work goes on under the same tokens), and a fence that admitted
/// B's tokens refuses any token the late batch was given.
pub async fn scenario_shard_fault_batch_lands_late(backend: &dyn LeaseBackend) {
    let mut g = Group::new(backend).await;
    let late = g.faults.hold(ACQUIRE_MANY, "node-a");
    g.start("node-a");
    late.arrived().await;
    g.start("node-b");
    g.wait_members(&["node-a", "node-b"]).await;
    // B takes its targets (the others are A's, which is stuck on its held batch).
    let deadline = Instant::now() + g.bound();
    while g.held().await.len() < (SHARDS / 2) as usize {
        assert!(
            Instant::now() < deadline,
            "B took no shard: {:?}",
            g.held().await
        );
        g.tick(g.ttl / 40).await;
    }
    let sessions = g.faults.sessions_of("node-a");
    assert_eq!(sessions.len(), 1, "A opened one session: {sessions:?}");
    let ended = tokio::time::timeout(PATIENCE, g.store.close_session(sessions[0]))
        .await
        .expect("close answered")
        .expect("A's session closed");
    assert!(ended, "A's session was live until now");
    g.members["node-a"].shutdown.cancel();
    // A learns its session ended at its next renewal, gives up on the batch and leaves
    // (a member stuck on the batch would stay in the group, heartbeating); B then takes
    // A's shards.
    g.wait_members_within(&["node-b"], g.ttl, "A gave up on its batch and left")
        .await;
    let held = g.settle(g.bound(), "A left: B takes every shard").await;
    assert!(
        held.values().all(|(holder, _)| holder == "node-b"),
        "B holds every shard: {held:?}"
    );
    g.stop("node-a").await;

    let fence = Fence::new();
    for (shard, (_, token)) in &held {
        fence
            .admit(&format!("{GROUP}/{shard}"), *token)
            .expect("the fence admits B's terms");
    }
    late.land();
    let landed = late.store_answer().await;
    if let Ok(answers) = leases(landed) {
        for (shard, answer) in (0..SHARDS).zip(&answers) {
            if answer.acquired {
                assert!(
                    fence
                        .admit(&format!("{GROUP}/{shard}"), answer.fencing_token)
                        .is_err(),
                    "a fence that admitted B's token admits the late batch's: {answer:?}"
                );
            }
            assert!(
                !answer.acquired,
                "the late batch, under an ended session, took shard {shard}: {answer:?}"
            );
        }
    }
    g.stays(&held, g.renew() * 2, "after A's late batch landed")
        .await;
    g.stop_all().await;
}

/// A registry connection that loses every leave on its way (heartbeats go through).
struct LeavesLost;

impl RegistryFilter for LeavesLost {
    fn before_leave(&self) -> tenure::Result<bool> {
        Ok(false)
    }
}

/// Member A, alone, sends its first batch (every shard), held before the store, and its
/// first session renewal, held too: A gives up on its session at its local deadline
/// (with a large `max_clock_drift`, well before the store would) and on the batch with
/// it, and its next `open_session` is held. Its heartbeats stop with the session, and
/// its leave is lost on the way (the registry is out of its reach too), so B keeps A in
/// the group until A's membership lapses. Now the late renewal lands and keeps the
/// abandoned session alive on the store for another TTL, and the late batch lands under
/// it and takes A's targets, which B left free: shards held by a live session that
/// nobody renews or works under. They must be worked on again within the TTL rules
/// (that session's TTL from the late renewal, and the bound), under new terms whose
/// tokens a fence prefers to the late batch's; no other term is touched.
pub async fn scenario_shard_fault_late_batch_under_an_abandoned_session(
    backend: &dyn LeaseBackend,
) {
    let mut g = Group::new(backend).await;
    g.drift = 0.4;
    let late_batch = g.faults.hold(ACQUIRE_MANY, "node-a");
    let late_renewal = g.faults.hold("keep_alive_session", "node-a");
    let leaves_lost = FilteredRegistry::new(g.registry.clone(), LeavesLost);
    g.start_on("node-a", Arc::new(leaves_lost));
    late_batch.arrived().await;
    let reopen = g.faults.hold("open_session", "node-a");
    g.start("node-b");
    g.wait_members(&["node-a", "node-b"]).await;
    late_renewal.arrived().await;
    // A gave up on the session (and the batch) at its local deadline: it is opening
    // another.
    reopen.arrived().await;
    let before = g.held().await;
    assert!(
        before.values().all(|(holder, _)| holder == "node-b"),
        "only B holds shards while A is stuck: {before:?}"
    );
    late_renewal.land();
    match late_renewal.store_answer().await {
        Reply::KeptAlive(Ok(Some(_))) => {}
        other => panic!("the late renewal kept A's abandoned session alive: {other:?}"),
    }
    late_batch.land();
    let answers = leases(late_batch.store_answer().await).expect("the late batch answered");
    let late: BTreeMap<u32, FencingToken> = (0..SHARDS)
        .zip(&answers)
        .filter(|(_, answer)| answer.acquired)
        .map(|(shard, answer)| (shard, answer.fencing_token))
        .collect();
    assert!(
        !late.is_empty() && late.keys().all(|shard| !before.contains_key(shard)),
        "the late batch took the free shards, and only those: {late:?}, before {before:?}"
    );
    reopen.land();
    let held = g
        .settle(
            g.ttl + g.bound(),
            "the shards a late batch took under an abandoned session",
        )
        .await;
    let fence = Fence::new();
    for (shard, late_token) in &late {
        let role = format!("{GROUP}/{shard}");
        let (holder, token) = &held[shard];
        assert!(
            token > late_token,
            "shard {shard}: a new term ({holder}, {token}) after the late batch's {late_token}"
        );
        fence
            .admit(&role, *token)
            .expect("the fence admits the new term");
        assert!(
            fence.admit(&role, *late_token).is_err(),
            "shard {shard}: the fence refuses the late batch's token {late_token}"
        );
    }
    for (shard, term) in &before {
        assert_eq!(
            held.get(shard),
            Some(term),
            "B's term of shard {shard} untouched"
        );
    }
    g.stays(&held, g.renew() * 2, "after the abandoned session lapsed")
        .await;
    g.stop_all().await;
}

/// Member A, alone, sends its first batch (every shard); the store grants them to A's
/// session and A is told the batch failed. A is then stopped: its session ends, and B,
/// which joined meanwhile, takes every shard within the TTL rules (a TTL and a few
/// looks) and works on each under the token the store shows.
pub async fn scenario_shard_fault_answer_lost_then_member_stops(backend: &dyn LeaseBackend) {
    let mut g = Group::new(backend).await;
    let lost = g.faults.lose_answer(ACQUIRE_MANY, "node-a");
    g.start("node-a");
    let granted = leases(lost.store_answer().await).expect("the store applied A's batch");
    assert!(
        granted.iter().all(|answer| answer.acquired),
        "the store granted A every shard: {granted:?}"
    );
    g.start("node-b");
    g.wait_members(&["node-a", "node-b"]).await;
    g.stop("node-a").await;
    let held = g
        .settle(
            g.ttl + g.bound(),
            "A stopped after its lost batch: B takes every shard",
        )
        .await;
    assert!(
        held.values().all(|(holder, _)| holder == "node-b"),
        "B holds every shard: {held:?}"
    );
    g.stays(&held, g.renew() * 2, "with A gone").await;
    g.stop_all().await;
}
