//! The queue of candidates under faults, on the real store: calls whose answer is lost
//! after the store applied them, calls that reach the store late (after their caller
//! gave up on them and went on), and a candidate that dies in the queue just before a
//! release hands it the role. Generated per backend by
//! [`queue_fault_scenarios!`](crate::queue_fault_scenarios).
//!
//! The faults are [`Faults`] rules over
//! [`InterceptStore`](tenure::intercept::InterceptStore) above the backend's own store,
//! so they are deterministic. Each scenario then checks what a fault must never
//! break (section 9 of the contract, and the queue's promises in `docs/semantics.md`):
//!
//! - tokens strictly grow per change of holder, and a token names one holder only;
//! - one live holder at a time: the previous holder is refused once a term moved on;
//! - a late call never ends, hands over or steals a newer term;
//! - a candidate whose withdraw answered is never handed the role unless a queue call of
//!   its own reached the store after that withdraw;
//! - the role is never stuck: a live candidate or contender leads within the TTL rules.

use std::sync::Arc;
use std::time::Duration;

use tenure::{FencingToken, LeaseResult, LeaseStore};
use tokio::task::JoinHandle;

use crate::faults::{Caught, Faulted, Faults};
use crate::{LeaseBackend, PATIENCE};

const ROLE: &str = "faulted";

/// A fixture's store behind a fresh [`Faults`], and another instance (as another
/// process) that reads the role for the checks.
struct Setup {
    fx: Box<dyn crate::LeaseFixture>,
    faults: Arc<Faults>,
    store: Arc<dyn LeaseStore>,
    ttl: Duration,
    history: History,
}

impl Setup {
    async fn new(backend: &dyn LeaseBackend) -> Setup {
        let base = Faulted::new(backend).await;
        Setup {
            fx: base.fx,
            faults: base.faults,
            store: base.store,
            ttl: base.ttl,
            history: History {
                reader: base.reader,
                seen: Vec::new(),
            },
        }
    }

    /// `owner` asks with `try_acquire_or_queue`; returns whether it acquired and the
    /// token of the term after the call.
    async fn contend(&self, owner: &str, ttl: Duration) -> (bool, FencingToken) {
        let answer = bounded(self.store.try_acquire_or_queue(ROLE, owner, ttl, None))
            .await
            .unwrap_or_else(|error| panic!("{owner} contends: {error}"));
        (answer.acquired, answer.fencing_token)
    }

    /// `owner` acquires the free role.
    async fn acquire(&mut self, owner: &str) -> FencingToken {
        let (acquired, token) = self.contend(owner, self.ttl).await;
        assert!(acquired, "{owner} acquires the free role");
        self.history.expect(owner, token).await;
        token
    }

    /// `owner` asks `try_acquire_or_queue` in a task of its own, and the call is held
    /// once it reaches the store's door: the held call, to land when the test says, and
    /// the caller's task.
    async fn late_queue(
        &self,
        owner: &str,
    ) -> (Arc<Caught>, JoinHandle<tenure::Result<LeaseResult>>) {
        let late = self.faults.hold("try_acquire_or_queue", owner);
        let (store, ttl, owner) = (self.store.clone(), self.ttl, owner.to_owned());
        let call =
            tokio::spawn(async move { store.try_acquire_or_queue(ROLE, &owner, ttl, None).await });
        late.arrived().await;
        (late, call)
    }

    /// `owner` asks with `try_acquire_or_queue`, and the answer is lost after the store
    /// applied the call: the caller sees an error. Returns what the store answered.
    async fn queue_answer_lost(&self, owner: &str) -> LeaseResult {
        let lost = self.faults.lose_answer("try_acquire_or_queue", owner);
        assert!(self
            .store
            .try_acquire_or_queue(ROLE, owner, self.ttl, None)
            .await
            .is_err());
        lost.store_answer().await.into_lease().unwrap()
    }

    /// Queues `owner` behind the live holder.
    async fn queue(&self, owner: &str, ttl: Duration) {
        let (acquired, _) = self.contend(owner, ttl).await;
        assert!(!acquired, "{owner} queues behind the holder");
    }

    async fn release(&self, owner: &str, token: FencingToken) -> bool {
        bounded(self.store.release(ROLE, owner, token))
            .await
            .unwrap_or_else(|error| panic!("{owner} releases {token}: {error}"))
    }

    /// Waits (bounded) until the queue reads `expected`, oldest first. A store that
    /// judges the queue from a watch's copies (Kubernetes) may show a write a moment
    /// after it answered, even its own: `candidates` promises no more.
    async fn expect_candidates(&self, expected: &[&str], why: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = bounded(self.store.candidates(ROLE)).await.unwrap();
            if now == expected {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "candidates {now:?}, not {expected:?}: {why}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `owner` renews the term `token` it holds (or was handed): same token.
    async fn renews(&self, owner: &str, token: FencingToken) {
        let (acquired, renewed) = self.contend(owner, self.ttl).await;
        assert!(
            acquired && renewed == token,
            "{owner} renews its term {token}, got {renewed} (acquired: {acquired})"
        );
    }

    /// `owner`, a live contender that keeps asking, leads once the holder's term (or
    /// what was left of its candidacy) of one TTL lapses, as [`wait_to_lead`] waits
    /// for it, and renews the term it won.
    async fn leads_once_the_holder_lapses(&mut self, owner: &str) {
        let lapse = self.ttl;
        let token = wait_to_lead(self, owner, lapse).await;
        self.renews(owner, token).await;
    }

    /// `owner`, holding no live term, is refused by a plain acquire (which queues
    /// nobody): there is one live holder, and it is not `owner`.
    async fn refused(&self, owner: &str) {
        let answer = bounded(self.store.try_acquire_or_renew(ROLE, owner, self.ttl))
            .await
            .unwrap();
        assert!(
            !answer.acquired && answer.holder != owner,
            "{owner}'s term is over, another holds the role: {answer:?}"
        );
    }
}

/// The terms a scenario saw, read from another store instance: every change of holder
/// has a larger token, and a token names one holder.
struct History {
    reader: Arc<dyn LeaseStore>,
    seen: Vec<(String, FencingToken)>,
}

impl History {
    /// The live holder now, recorded and checked against every term seen before.
    async fn look(&mut self) -> Option<(String, FencingToken)> {
        let info = bounded(self.reader.get(ROLE)).await.unwrap()?;
        let token = info.fencing_token;
        let holder = info.live_holder()?.to_owned();
        if let Some((last_holder, last_token)) = self.seen.last() {
            assert!(
                token >= *last_token,
                "token {token} of {holder} after {last_token} of {last_holder}"
            );
            if token == *last_token {
                assert_eq!(holder, *last_holder, "token {token} handed to two holders");
                return Some((holder, token));
            }
        }
        assert!(
            !self.seen.iter().any(|(_, t)| *t == token),
            "token {token} handed out twice"
        );
        self.seen.push((holder.clone(), token));
        Some((holder, token))
    }

    /// Asserts `owner` holds the live term `token`.
    async fn expect(&mut self, owner: &str, token: FencingToken) {
        let seen = self.look().await;
        assert_eq!(
            seen,
            Some((owner.to_owned(), token)),
            "{owner} holds term {token}"
        );
    }

    /// Asserts `owner` holds a live term newer than every one seen before; returns it.
    async fn expect_new(&mut self, owner: &str) -> FencingToken {
        let before = self.seen.last().map(|(_, token)| *token);
        let (holder, token) = self.look().await.expect("a live term");
        assert_eq!(holder, owner, "{owner} holds the role");
        assert!(Some(token) > before, "a new term: {token} after {before:?}");
        token
    }
}

async fn bounded<T>(call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, call)
        .await
        .expect("a store call answered within the scenario's patience")
}

/// A release that handed the role to a candidate, whose answer was lost: the candidate
/// holds the next term; the releaser's retry (on its store, and on a fresh one as a
/// restarted process) answers `false` and ends nothing; the old holder is refused.
pub async fn scenario_fault_release_answer_lost(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let a = s.acquire("node-a").await;
    s.queue("node-b", s.ttl).await;
    let lost = s.faults.lose_answer("release", "node-a");
    assert!(
        s.store.release(ROLE, "node-a", a).await.is_err(),
        "the caller sees no answer"
    );
    assert!(
        lost.store_answer().await.into_released().unwrap(),
        "the store ended the term"
    );
    let b = s.history.expect_new("node-b").await;
    assert!(!s.release("node-a", a).await, "a retry ends nothing");
    let fresh = s.fx.reopen().await;
    assert!(
        !bounded(fresh.release(ROLE, "node-a", a)).await.unwrap(),
        "nor does one from a restarted process"
    );
    s.history.expect("node-b", b).await;
    s.refused("node-a").await;
    s.renews("node-b", b).await;
    s.history.expect("node-b", b).await;
}

/// A `hand_over` to a named candidate whose answer was lost: the candidate holds the
/// next term; retries (named, or the oldest) answer `false` and hand nothing on, and
/// the candidate passed over keeps its place.
pub async fn scenario_fault_hand_over_answer_lost(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let a = s.acquire("node-a").await;
    s.queue("node-b", s.ttl * 4).await;
    s.queue("node-c", s.ttl).await;
    let lost = s.faults.lose_answer("hand_over", "node-a");
    assert!(s
        .store
        .hand_over(ROLE, "node-a", a, Some("node-c"))
        .await
        .is_err());
    assert!(lost.store_answer().await.into_released().unwrap());
    let c = s.history.expect_new("node-c").await;
    for successor in [Some("node-c"), Some("node-b"), None] {
        assert!(
            !bounded(s.store.hand_over(ROLE, "node-a", a, successor))
                .await
                .unwrap(),
            "a retry to {successor:?} hands nothing on"
        );
    }
    s.history.expect("node-c", c).await;
    s.expect_candidates(&["node-b"], "node-b keeps its place")
        .await;
    s.refused("node-a").await;
    s.renews("node-c", c).await;
    assert!(s.release("node-c", c).await);
    s.history.expect_new("node-b").await;
}

/// `try_acquire_or_queue` answers lost: one that acquired the free role is retried and
/// renews the same term (no second token); one that queued is retried and keeps its
/// place ahead of a candidate that queued between the two.
pub async fn scenario_fault_queue_answer_lost(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let first = s.queue_answer_lost("node-a").await;
    assert!(first.acquired, "the lost call acquired: {first:?}");
    s.history.expect("node-a", first.fencing_token).await;
    s.renews("node-a", first.fencing_token).await;
    s.history.expect("node-a", first.fencing_token).await;

    assert!(!s.queue_answer_lost("node-b").await.acquired);
    s.queue("node-c", s.ttl).await;
    s.queue("node-b", s.ttl).await;
    s.expect_candidates(&["node-b", "node-c"], "the retry kept node-b's place")
        .await;
    assert!(s.release("node-a", first.fencing_token).await);
    s.history.expect_new("node-b").await;
}

/// A `withdraw` whose answer was lost: the candidate is out of the queue; the retry
/// answers `false`; no release hands the withdrawn candidate the role.
pub async fn scenario_fault_withdraw_answer_lost(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let a = s.acquire("node-a").await;
    s.queue("node-b", s.ttl).await;
    s.queue("node-c", s.ttl).await;
    let lost = s.faults.lose_answer("withdraw", "node-b");
    assert!(s.store.withdraw(ROLE, "node-b").await.is_err());
    assert!(lost.store_answer().await.into_released().unwrap());
    assert!(
        !bounded(s.store.withdraw(ROLE, "node-b")).await.unwrap(),
        "the retry finds node-b gone"
    );
    s.expect_candidates(&["node-c"], "node-b withdrew").await;
    assert!(s.release("node-a", a).await);
    let c = s.history.expect_new("node-c").await;
    assert!(s.release("node-c", c).await);
    assert_eq!(
        s.history.look().await,
        None,
        "node-b, withdrawn, is never handed the role"
    );
}

/// A queue refresh that reaches the store after its candidate withdrew (and went on):
/// until it lands, releases never hand the withdrawn candidate the role; once it lands
/// the candidate joins again at the back (its withdrawn place is gone), and when a
/// release then hands it a term it never renews, that term lapses within the
/// candidacy's TTL and a live contender leads under a larger token.
pub async fn scenario_fault_late_queue_after_withdraw(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let a = s.acquire("node-a").await;
    s.queue("node-b", s.ttl).await;
    let (late, refresh) = s.late_queue("node-b").await;
    assert!(
        bounded(s.store.withdraw(ROLE, "node-b")).await.unwrap(),
        "node-b withdraws its place"
    );
    s.queue("node-c", s.ttl * 4).await;
    assert!(s.release("node-a", a).await);
    let c = s.history.expect_new("node-c").await;

    late.land();
    let landed = late.store_answer().await.into_lease().unwrap();
    assert!(
        !landed.acquired && landed.holder == "node-c",
        "the late refresh queues behind node-c's term: {landed:?}"
    );
    assert!(bounded(refresh).await.unwrap().is_err());
    s.queue("node-d", s.ttl * 4).await;
    s.expect_candidates(
        &["node-b", "node-d"],
        "the late call queued node-b anew (node-c leads)",
    )
    .await;
    // node-b's late candidacy is a real one: a release hands it the role, and node-b,
    // which went on long ago, never renews. Its term lapses with its candidacy.
    assert!(s.release("node-c", c).await);
    s.history.expect_new("node-b").await;
    s.leads_once_the_holder_lapses("node-d").await;
}

/// A queue call that reaches the store late, after its candidate withdrew and the role
/// was released with nobody queued: it finds the role free and acquires it for a
/// caller that went on long ago and never renews. The term lapses within its TTL and a
/// live contender that keeps asking leads under a larger token.
pub async fn scenario_fault_late_queue_takes_a_free_role(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let a = s.acquire("node-a").await;
    s.queue("node-b", s.ttl).await;
    let (late, refresh) = s.late_queue("node-b").await;
    assert!(bounded(s.store.withdraw(ROLE, "node-b")).await.unwrap());
    assert!(s.release("node-a", a).await);
    assert_eq!(
        s.history.look().await,
        None,
        "node-b withdrew: the role is free"
    );

    late.land();
    let landed = late.store_answer().await.into_lease().unwrap();
    assert!(
        landed.acquired,
        "the late call took the free role: {landed:?}"
    );
    assert!(bounded(refresh).await.unwrap().is_err());
    s.history.expect("node-b", landed.fencing_token).await;
    s.leads_once_the_holder_lapses("node-c").await;
}

/// A planned `hand_over` to a named candidate that died in the queue just before (it
/// was still live): the handoff goes through, the dead candidate's term lapses no later
/// than its candidacy would have, and the live candidate behind it leads.
pub async fn scenario_fault_hand_over_to_a_candidate_that_died(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let a = s.acquire("node-a").await;
    s.queue("node-c", s.ttl * 4).await;
    s.queue("node-b", s.ttl).await;
    // node-b dies here: it never calls again.
    assert!(
        bounded(s.store.hand_over(ROLE, "node-a", a, Some("node-b")))
            .await
            .unwrap()
    );
    s.history.expect_new("node-b").await;
    s.leads_once_the_holder_lapses("node-c").await;
    s.refused("node-b").await;
}

/// A release that reaches the store late, after its caller released again, the role was
/// handed on and then taken again by the same owner: while the role is the candidate's,
/// and again once it is the owner's newer term, the late release answers `false` and
/// ends nothing.
pub async fn scenario_fault_late_release_after_role_taken_again(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let a1 = s.acquire("node-a").await;
    s.queue("node-b", s.ttl).await;
    let mut late = Vec::new();
    for _ in 0..2 {
        let caught = s.faults.hold("release", "node-a");
        let call = {
            let store = s.store.clone();
            tokio::spawn(async move { store.release(ROLE, "node-a", a1).await })
        };
        caught.arrived().await;
        late.push((caught, call));
    }
    assert!(s.release("node-a", a1).await, "the caller's own retry");
    let b = s.history.expect_new("node-b").await;

    lands_refused(&mut late, "a late release of an old term ends nothing").await;
    s.history.expect("node-b", b).await;
    s.renews("node-b", b).await;

    assert!(s.release("node-b", b).await);
    assert_eq!(s.history.look().await, None, "nobody queued");
    let a2 = s.acquire("node-a").await;
    assert!(a2 > b);
    lands_refused(
        &mut late,
        "a late release of node-a's old term leaves its new one",
    )
    .await;
    s.history.expect("node-a", a2).await;
    s.renews("node-a", a2).await;
}

/// `hand_over` calls that reach the store late, with the token of a term that ended
/// since: one lands while the candidate a release handed the role to leads, one once
/// the same owner leads again under a newer token, each with the candidate it named
/// queued. Both answer `false`, hand nothing on, and the named candidate keeps its place.
pub async fn scenario_fault_late_hand_over_with_old_token(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let long = s.ttl * 4;
    let a1 = s.acquire("node-a").await;
    s.queue("node-b", long).await;
    s.queue("node-c", long).await;
    let mut late = Vec::new();
    for successor in [Some("node-c"), None] {
        let caught = s.faults.hold("hand_over", "node-a");
        let call = {
            let store = s.store.clone();
            tokio::spawn(async move { store.hand_over(ROLE, "node-a", a1, successor).await })
        };
        caught.arrived().await;
        late.push((caught, call));
    }
    assert!(s.release("node-a", a1).await);
    let b = s.history.expect_new("node-b").await;

    lands_refused(&mut late, "a late hand_over of an ended term answers false").await;
    s.history.expect("node-b", b).await;
    s.expect_candidates(&["node-c"], "the late hand_over handed nothing on")
        .await;

    s.queue("node-a", long).await;
    assert!(s.release("node-b", b).await);
    let c = s.history.expect_new("node-c").await;
    s.renews("node-c", c).await;
    assert!(s.release("node-c", c).await);
    let a2 = s.history.expect_new("node-a").await;
    s.queue("node-c", long).await;
    s.expect_candidates(&["node-c"], "node-c queued behind node-a's term")
        .await;

    lands_refused(
        &mut late,
        "a late hand_over of node-a's old term leaves its new one",
    )
    .await;
    s.history.expect("node-a", a2).await;
    s.expect_candidates(&["node-c"], "node-c keeps its place")
        .await;
    s.renews("node-a", a2).await;
}

/// A candidate that dies in the queue (stops refreshing) just before a release hands it
/// the role: the release hands it the role (it was live), its term lapses no later than
/// its candidacy would have, and the live candidate behind it, which keeps asking,
/// leads under a larger token.
pub async fn scenario_fault_candidate_dies_before_release(backend: &dyn LeaseBackend) {
    let mut s = Setup::new(backend).await;
    let a = s.acquire("node-a").await;
    s.queue("node-b", s.ttl).await;
    s.queue("node-c", s.ttl * 4).await;
    // node-b dies here: it never calls again.
    assert!(s.release("node-a", a).await);
    s.history.expect_new("node-b").await;
    s.leads_once_the_holder_lapses("node-c").await;
    s.refused("node-b").await;
}

/// A release or `hand_over` held at the store's door, with its caller's task.
type LateEnd = (Arc<Caught>, JoinHandle<tenure::Result<bool>>);

/// Lands the oldest of `late`, each a release or `hand_over` of a term that has ended
/// since: it answers `false` (`why`: it ends nothing), and its caller, which gave up on
/// it long ago, got an error.
async fn lands_refused(late: &mut Vec<LateEnd>, why: &str) {
    let (caught, call) = late.remove(0);
    caught.land();
    assert!(
        !caught.store_answer().await.into_released().unwrap(),
        "{why}"
    );
    assert!(bounded(call).await.unwrap().is_err());
}

/// `owner`, a live contender that keeps asking (as the elector's retry timer does),
/// leads once the current holder's term lapses: within `lapse` (the holder's term, or
/// what was left of its candidacy) plus, on backends that judge expiry by observation,
/// one more TTL. Returns its token, checked larger than every one before.
async fn wait_to_lead(s: &mut Setup, owner: &str, lapse: Duration) -> FencingToken {
    let step = s.ttl / 4;
    let steps = (lapse + s.ttl * 2).as_millis() / step.as_millis() + 1;
    for _ in 0..steps {
        let (acquired, _) = s.contend(owner, s.ttl * 4).await;
        if acquired {
            return s.history.expect_new(owner).await;
        }
        s.history.look().await;
        s.fx.pass_time(step).await;
    }
    panic!("{owner} did not lead within {steps} steps of {step:?}: the role is stuck");
}
