//! Conformance scenarios for the queue of candidates: a contender that waits with
//! [`LeaseStore::try_acquire_or_queue`] is handed the role by the release that ends the
//! term before it, in queue order, skipping candidates that lapsed or withdrew; a
//! planned [`LeaseStore::hand_over`] picks a named one; and
//! [`LeaseStore::wait_for_successor`] tells each waiter from the push alone who leads
//! next. Generated per backend by [`queue_scenarios!`](crate::queue_scenarios).

use std::time::Duration;

use tenure::lease::MAX_VALUE_LEN;
use tenure::{FencingToken, LeaseResult, LeaseStore, TermChange};
use tokio::time::Instant;

use crate::conformance::assert_invalid;
use crate::fixture::begin;
use crate::{LeaseBackend, MustAnswer};

const ROLE: &str = "queued";

/// The live holder of `role` and its token, as `get` shows them.
async fn holder(store: &dyn LeaseStore, role: &str) -> Option<(String, FencingToken)> {
    let info = store.get(role).await.unwrap()?;
    let token = info.fencing_token;
    info.live_holder().map(|holder| (holder.to_owned(), token))
}

/// node-a asks for the free role with `try_acquire_or_queue`, asserting it acquires.
async fn first(store: &dyn LeaseStore, ttl: Duration) -> LeaseResult {
    let a = store.acquire_or_queue(ROLE, "node-a", ttl).await;
    assert!(a.acquired, "the first contender acquires: {a:?}");
    a
}

/// Queues `owner`, asserting it does not acquire.
async fn queue(store: &dyn LeaseStore, owner: &str, ttl: Duration, value: Option<&str>) {
    let answer = store
        .try_acquire_or_queue(ROLE, owner, ttl, value)
        .await
        .unwrap();
    assert!(
        !answer.acquired,
        "{owner} queues behind {}: {answer:?}",
        answer.holder
    );
}

/// `hand_over` of the role from `owner`'s term `token` to `successor` (the oldest for
/// `None`): whether it handed.
async fn hand_off(
    store: &dyn LeaseStore,
    owner: &str,
    token: FencingToken,
    successor: Option<&str>,
) -> bool {
    store
        .hand_over(ROLE, owner, token, successor)
        .await
        .unwrap()
}

/// A release hands the role to the oldest live candidate in the same step: token + 1,
/// the candidate's value, a live term the candidate then renews under the same token;
/// the next release hands it to the next candidate; with nobody queued a release frees
/// the role.
pub async fn scenario_queue_release_hands_to_oldest(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = first(&*store, ttl).await;
    queue(&*store, "node-b", ttl, Some("http://b:80")).await;
    queue(&*store, "node-c", ttl, Some("http://c:80")).await;
    assert_eq!(
        store.candidates(ROLE).await.unwrap(),
        ["node-b", "node-c"],
        "candidates, oldest first"
    );
    assert_eq!(
        fx.reopen().await.candidates(ROLE).await.unwrap(),
        ["node-b", "node-c"],
        "another instance lists them too"
    );
    assert!(store.candidates("elsewhere").await.unwrap().is_empty());

    assert!(store.release_term(ROLE, "node-a", a.fencing_token).await);
    assert_eq!(
        store.candidates(ROLE).await.unwrap(),
        ["node-c"],
        "the successor left the queue"
    );
    let (b_holder, b_token) = holder(&*store, ROLE)
        .await
        .expect("the release handed the role to the oldest candidate");
    assert_eq!(b_holder, "node-b", "node-b queued first");
    assert!(b_token > a.fencing_token, "a handover is a new term");
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(
        info.value.as_deref(),
        Some("http://b:80"),
        "the candidate's value"
    );
    let other = fx.reopen().await;
    assert_eq!(
        holder(&*other, ROLE).await,
        Some(("node-b".to_owned(), b_token)),
        "another instance reads the handed term"
    );

    let renewed = store
        .try_acquire_or_queue(ROLE, "node-b", ttl, Some("http://b:80"))
        .await
        .unwrap();
    assert!(
        renewed.acquired && renewed.fencing_token == b_token,
        "the successor renews the term it was handed: {renewed:?}"
    );

    assert!(store.release_term(ROLE, "node-b", b_token).await);
    let (c_holder, c_token) = holder(&*store, ROLE).await.expect("handed to node-c");
    assert_eq!(c_holder, "node-c");
    assert!(c_token > b_token);

    assert!(store.release_term(ROLE, "node-c", c_token).await);
    assert_eq!(
        holder(&*store, ROLE).await,
        None,
        "with nobody queued a release frees the role"
    );
    let d = store.try_acquire(ROLE, "node-d", ttl).await;
    assert!(d.acquired && d.fencing_token > c_token, "{d:?}");
}

/// A candidate that stops refreshing lapses after its TTL and is skipped; a release
/// with only lapsed candidates frees the role. A candidate that refreshes keeps its
/// place. A plain `try_acquire_or_renew` never queues.
pub async fn scenario_queue_skips_lapsed_candidates(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let long = ttl * 4;
    let a = store.try_acquire(ROLE, "node-a", long).await;
    assert!(a.acquired);
    let plain = store.try_acquire(ROLE, "node-p", long).await;
    assert!(!plain.acquired);
    queue(&*store, "node-b", ttl, None).await;
    queue(&*store, "node-c", long, None).await;
    queue(&*store, "node-d", long, None).await;
    // node-c refreshes: it keeps its place ahead of node-d.
    queue(&*store, "node-c", long, None).await;
    fx.pass_time(ttl + ttl / 2).await;

    assert!(store.release_term(ROLE, "node-a", a.fencing_token).await);
    let (next, token) = holder(&*store, ROLE).await.expect("handed over");
    assert_eq!(
        next, "node-c",
        "node-b lapsed, node-p never queued, node-c kept its place"
    );
    assert!(store.release_term(ROLE, "node-c", token).await);
    let (next, token) = holder(&*store, ROLE).await.expect("handed over");
    assert_eq!(next, "node-d");

    // Only a lapsed candidate left: the release frees the role.
    queue(&*store, "node-e", ttl, None).await;
    fx.pass_time(ttl + ttl / 2).await;
    let renewed = store.try_acquire(ROLE, "node-d", long).await;
    assert!(renewed.acquired && renewed.fencing_token == token);
    assert!(store.release_term(ROLE, "node-d", token).await);
    assert_eq!(holder(&*store, ROLE).await, None, "node-e had lapsed");
}

/// A withdrawn candidate is never handed the role; withdrawing twice (or never having
/// queued) answers `false`. Acquiring removes the caller's candidacy: a contender that
/// acquired after a lapse and then released is not handed the role again.
pub async fn scenario_queue_withdraw_and_acquire_leave_it(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let long = ttl * 4;
    let a = first(&*store, ttl).await;
    queue(&*store, "node-b", long, None).await;
    queue(&*store, "node-c", long, None).await;
    assert!(
        store.withdraw(ROLE, "node-b").await.unwrap(),
        "node-b was queued"
    );
    assert!(
        !store.withdraw(ROLE, "node-b").await.unwrap(),
        "already gone"
    );
    assert!(
        !store.withdraw(ROLE, "node-x").await.unwrap(),
        "never queued"
    );
    assert!(!store.withdraw("elsewhere", "node-c").await.unwrap());

    // node-a's term lapses unreleased: node-c acquires it as any contender would.
    fx.pass_time(ttl + ttl / 2).await;
    let c = store.acquire_or_queue(ROLE, "node-c", long).await;
    assert!(
        c.acquired && c.fencing_token > a.fencing_token,
        "node-c takes the lapsed term: {c:?}"
    );
    assert!(store.release_term(ROLE, "node-c", c.fencing_token).await);
    assert_eq!(
        holder(&*store, ROLE).await,
        None,
        "node-b withdrew and node-c's candidacy ended when it acquired"
    );
}

/// Candidacies that lapsed are swept when a contender joins the queue and when a term
/// is handed over, so crashed contenders leave no rows; a refresh sweeps nothing and a
/// live candidacy is never swept. A term begun in a session ends its owner's
/// candidacy, as any acquire does. For the backends whose candidacies are rows:
/// `candidates` reads the rows of role `r` oldest first, lapsed ones included.
///
/// Candidacies of `short` are meant to lapse, those of `long` not; `lapse` lets enough
/// time pass on the store's clock for a candidacy of `short` to lapse (and one of
/// `long` not), and `end_term` makes node-d's term (begun by a release) lapse while
/// node-e's candidacy lives.
pub async fn lapsed_candidacies_are_swept<L, E, C>(
    store: &dyn LeaseStore,
    short: Duration,
    long: Duration,
    lapse: impl Fn() -> L,
    end_term: impl FnOnce() -> E,
    candidates: impl Fn() -> C,
) where
    L: std::future::Future<Output = ()>,
    E: std::future::Future<Output = ()>,
    C: std::future::Future<Output = Vec<String>>,
{
    let a = store.try_acquire("r", "node-a", long).await;
    for owner in ["node-b", "node-c"] {
        store.acquire_or_queue("r", owner, short).await;
    }
    let refresh_or_join = |owner: &'static str, ttl: Duration| async move {
        store.acquire_or_queue("r", owner, ttl).await;
    };
    refresh_or_join("node-d", long).await;
    lapse().await;
    refresh_or_join("node-d", long).await;
    assert_eq!(
        candidates().await,
        ["node-b", "node-c", "node-d"],
        "a refresh sweeps nothing"
    );
    refresh_or_join("node-e", long).await;
    assert_eq!(candidates().await, ["node-d", "node-e"], "node-e joined");

    refresh_or_join("node-f", short).await;
    lapse().await;
    assert!(store.release_term("r", "node-a", a.fencing_token).await);
    assert_eq!(
        store.get("r").await.unwrap().unwrap().live_holder(),
        Some("node-d")
    );
    assert_eq!(
        candidates().await,
        ["node-e"],
        "node-d's candidacy became its term, node-f's lapsed"
    );

    // node-d's term lapses; node-e takes the role in a session, ending its candidacy.
    end_term().await;
    let session = store.open_session("node-e", long).await.unwrap();
    let e = store.acquire_in_session("r", session.id).await.unwrap();
    assert!(
        e.acquired && e.fencing_token.get() == a.fencing_token.get() + 2,
        "{e:?}"
    );
    assert!(candidates().await.is_empty());
}

/// A planned handoff: `hand_over` ends the holder's term and begins the named
/// candidate's (or the oldest's for `None`) in one step; for a successor that is not a
/// live candidate, a stale term or an empty queue it changes nothing and answers
/// `false`, and the holder's term goes on.
pub async fn scenario_hand_over_to_a_chosen_candidate(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    let a = first(&*store, ttl).await;
    assert!(
        !hand_off(&*store, "node-a", a.fencing_token, None).await,
        "nobody queued: no handoff"
    );
    queue(&*store, "node-b", ttl, None).await;
    queue(&*store, "node-c", ttl, Some("c:7443")).await;
    assert!(
        !hand_off(&*store, "node-a", a.fencing_token, Some("node-x")).await,
        "node-x is not a candidate"
    );
    let stale = FencingToken::from(a.fencing_token.get() + 7);
    assert!(!hand_off(&*store, "node-a", stale, Some("node-c")).await);
    assert!(!hand_off(&*store, "node-b", a.fencing_token, Some("node-c")).await);
    assert_eq!(
        holder(&*store, ROLE).await,
        Some(("node-a".to_owned(), a.fencing_token)),
        "refused handoffs leave the term as it was"
    );

    assert!(hand_off(&*store, "node-a", a.fencing_token, Some("node-c")).await);
    let (next, c_token) = holder(&*store, ROLE).await.expect("handed to node-c");
    assert_eq!(next, "node-c", "the chosen candidate, not the oldest");
    assert!(c_token > a.fencing_token);
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.value.as_deref(), Some("c:7443"));
    assert!(
        !hand_off(&*store, "node-a", a.fencing_token, Some("node-b")).await,
        "the old term is over"
    );

    assert!(hand_off(&*store, "node-c", c_token, None).await);
    let (next, b_token) = holder(&*store, ROLE).await.expect("handed to node-b");
    assert_eq!(next, "node-b", "None hands to the oldest");
    assert!(b_token > c_token);
}

/// A waiter learns from the push who leads next: another store instance waiting on the
/// term sees `Began` naming the candidate a release handed the role to, and `Ended`
/// when a release freed it; both long before the deadline.
pub async fn scenario_wait_for_successor_names_the_next_holder(backend: &dyn LeaseBackend) {
    let fx = backend.create().await;
    let store = fx.store();
    let watcher = fx.reopen().await;
    let ttl = fx.ttl() * 4;
    let a = first(&*store, ttl).await;
    queue(&*store, "node-b", ttl, None).await;

    let patience = Duration::from_secs(20);
    let waited = Instant::now();
    let waiting = {
        let watcher = watcher.clone();
        let observed = a.fencing_token;
        tokio::spawn(async move {
            watcher
                .wait_for_successor(ROLE, observed, Instant::now() + patience)
                .await
        })
    };
    // Let the waiter register before the change (it must also cope if it does not).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(store.release_term(ROLE, "node-a", a.fencing_token).await);
    let (_, b_token) = holder(&*store, ROLE).await.expect("handed to node-b");
    let change = waiting.await.unwrap();
    assert_eq!(
        change,
        TermChange::Began {
            holder: "node-b".to_owned(),
            fencing_token: b_token,
            session: None,
        },
        "the push names the successor, and no session (a queued term is a lease of its own)"
    );
    assert!(
        waited.elapsed() < patience / 2,
        "woken by the push, not the deadline"
    );

    let waiting = {
        let watcher = watcher.clone();
        tokio::spawn(async move {
            watcher
                .wait_for_successor(ROLE, b_token, Instant::now() + patience)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waited = Instant::now();
    assert!(store.release_term(ROLE, "node-b", b_token).await);
    assert_eq!(
        waiting.await.unwrap(),
        TermChange::Ended,
        "freed, nobody queued"
    );
    assert!(
        waited.elapsed() < patience / 2,
        "woken by the push, not the deadline"
    );

    // A term already over is answered at once.
    let at_once = tokio::time::timeout(
        patience / 2,
        watcher.wait_for_successor(ROLE, a.fencing_token, Instant::now() + patience),
    )
    .await;
    assert!(
        matches!(at_once, Ok(TermChange::Ended)),
        "stale wait answers at once: {at_once:?}"
    );
}

/// Bad input to the queue's calls is refused naming the field, before anything is
/// written.
pub async fn scenario_queue_bad_input(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    let long_name = "x".repeat(256);
    let long_value = "v".repeat(MAX_VALUE_LEN + 1);
    assert_invalid(
        store.try_acquire_or_queue("", "node-a", ttl, None).await,
        "role",
    );
    assert_invalid(
        store.try_acquire_or_queue(ROLE, "", ttl, None).await,
        "owner",
    );
    assert_invalid(
        store
            .try_acquire_or_queue(ROLE, &long_name, ttl, None)
            .await,
        "owner",
    );
    assert_invalid(
        store
            .try_acquire_or_queue(ROLE, "node-a", Duration::ZERO, None)
            .await,
        "ttl",
    );
    assert_invalid(
        store
            .try_acquire_or_queue(ROLE, "node-a", ttl, Some(&long_value))
            .await,
        "value",
    );
    assert_invalid(store.candidates("").await, "role");
    assert_invalid(store.withdraw("", "node-a").await, "role");
    assert_invalid(store.withdraw(ROLE, "bad\0owner").await, "owner");
    let a = first(&*store, ttl).await;
    assert_invalid(
        store
            .hand_over(ROLE, "node-a", a.fencing_token, Some(""))
            .await,
        "successor",
    );
    assert_invalid(
        store
            .hand_over(ROLE, "node-a", a.fencing_token, Some(&long_name))
            .await,
        "successor",
    );
    assert_invalid(
        store.hand_over("", "node-a", a.fencing_token, None).await,
        "role",
    );
    assert_eq!(
        holder(&*store, ROLE).await,
        Some(("node-a".to_owned(), a.fencing_token)),
        "nothing was written"
    );
}

/// Generates one `#[tokio::test]` per queue scenario, as
/// [`lease_scenarios!`](crate::lease_scenarios) does for the lease rules.
#[macro_export]
macro_rules! queue_scenarios {
    ($backend:expr $(, $key:ident = $value:tt)*) => {
        $crate::scenario_tests!(queue; $backend; [$($key = $value),*];
            scenario_queue_release_hands_to_oldest,
            scenario_queue_skips_lapsed_candidates,
            scenario_queue_withdraw_and_acquire_leave_it,
            scenario_hand_over_to_a_chosen_candidate,
            scenario_wait_for_successor_names_the_next_holder,
            scenario_queue_bad_input);
    };
}
