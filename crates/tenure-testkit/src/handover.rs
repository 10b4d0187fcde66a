//! The conformance scenarios of [`LeaseStore::hand_to_session`]: a term ended and the
//! next begun under the newest live session of a named owner, in one step. Backends that
//! take it in one step run [`session_handover_scenarios!`](crate::session_handover_scenarios);
//! those that release instead (etcd, Kubernetes) run
//! [`session_handover_release_scenarios!`](crate::session_handover_release_scenarios),
//! which holds them to that.

use std::sync::Arc;
use std::time::Duration;

use tenure::{FencingToken, LeaseResult, LeaseStore, SessionId, TermChange};
use tokio::time::Instant;

use crate::conformance::assert_invalid;
use crate::fixture::begin;
use crate::{in_time, LeaseBackend, MustAnswer};

const ROLE: &str = "g/7";

/// Waits (at most a minute) for term `observed` of `role` to change, and says what the
/// store told.
fn spawn_successor_waiter(
    store: &Arc<dyn LeaseStore>,
    observed: tenure::FencingToken,
) -> tokio::task::JoinHandle<TermChange> {
    let store = Arc::clone(store);
    tokio::spawn(async move {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            match store.wait_for_successor(ROLE, observed, until).await {
                TermChange::Unknown if Instant::now() < until => continue,
                change => return change,
            }
        }
    })
}

/// `hand_to_session` of the role from node-a's term `token` to `to`: whether the term
/// ended.
async fn hand_to(store: &dyn LeaseStore, token: FencingToken, to: &str) -> bool {
    store
        .hand_to_session(ROLE, "node-a", token, to)
        .await
        .unwrap()
}

/// node-a takes the role under its `session` and hands that term to `to`; the term it
/// took.
async fn take_and_hand(store: &dyn LeaseStore, session: SessionId, to: &str) -> LeaseResult {
    let held = store.acquire_in_session(ROLE, session).await.unwrap();
    assert!(held.acquired);
    assert!(hand_to(store, held.fencing_token, to).await);
    held
}

/// The term goes to the newest live session of `to` in one step: token + 1, holder
/// `to`, live as long as that session (an acquire under it finds it held, one under
/// the older session is refused), and a waiter learns the session from the store.
/// The session counts it (`terms_handed`, told by its keep-alives: 0 when opened, 1
/// after; the older session's stays 0, and a handover that hands nothing counts
/// nothing). Closing the session frees the role. A stale token hands nothing; an owner
/// with no live session gets nothing (the role is released); a bad `to` is refused.
pub async fn scenario_session_handed_a_term(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    let a = store.open_session("node-a", ttl).await.unwrap();
    let older = store.open_session("node-b", ttl).await.unwrap();
    let newest = store.open_session("node-b", ttl).await.unwrap();
    assert_eq!(
        newest.terms_handed,
        Some(0),
        "a new session was handed nothing"
    );
    let held = store.acquire_in_session(ROLE, a.id).await.unwrap();
    assert!(held.acquired);
    let token = held.fencing_token;
    let handed = |grant: Option<tenure::SessionGrant>| grant.expect("live").terms_handed;

    let waiter = spawn_successor_waiter(&store, token);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(hand_to(&*store, token, "node-b").await);
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-b"), "{info:?}");
    assert_eq!(info.fencing_token, token.next(), "a new term: token + 1");
    assert_eq!(info.value, None);
    let told = in_time(
        Duration::from_secs(30),
        waiter,
        "the waiter learns of the handover",
    )
    .await;
    assert_eq!(
        told,
        TermChange::Began {
            holder: "node-b".to_owned(),
            fencing_token: token.next(),
            session: Some(newest.id),
        },
        "the waiter is told the session the term was handed to"
    );
    let mine = store.acquire_in_session(ROLE, newest.id).await.unwrap();
    assert!(
        mine.acquired && mine.fencing_token == token.next(),
        "held under the newest session: {mine:?}"
    );
    let other = store.acquire_in_session(ROLE, older.id).await.unwrap();
    assert!(!other.acquired, "not under the older one: {other:?}");
    assert!(
        !hand_to(&*store, token, "node-c").await,
        "a term that ended hands nothing"
    );
    let kept = store.keep_alive_session(newest.id, ttl).await.unwrap();
    assert_eq!(
        handed(kept),
        Some(1),
        "the session counts the term handed to it"
    );
    let kept = store.keep_alive_session(older.id, ttl).await.unwrap();
    assert_eq!(
        handed(kept),
        Some(0),
        "the older session was handed nothing"
    );

    assert!(store.close_session(newest.id).await.unwrap());
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.live_holder(), None, "ends with its session: {info:?}");

    let again = take_and_hand(&*store, a.id, "node-c").await;
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(
        (info.live_holder(), info.fencing_token),
        (None, again.fencing_token),
        "no session of node-c: released, the token kept"
    );

    let plain = store.try_acquire(ROLE, "node-a", ttl).await;
    assert!(plain.acquired);
    assert_invalid(
        store
            .hand_to_session(ROLE, "node-a", plain.fencing_token, "")
            .await,
        "to",
    );
    assert_invalid(
        store
            .hand_to_session(ROLE, "node-a", plain.fencing_token, "a\u{1f}b")
            .await,
        "to",
    );
    assert_eq!(
        store.get(ROLE).await.unwrap().unwrap().live_holder(),
        Some("node-a"),
        "a refused call changes nothing"
    );
    // A plain lease is handed as well.
    assert!(hand_to(&*store, plain.fencing_token, "node-b").await);
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-b"));
    let kept = store.acquire_in_session(ROLE, older.id).await.unwrap();
    assert!(
        kept.acquired && kept.fencing_token == plain.fencing_token.next(),
        "the older session is the newest live one now: {kept:?}"
    );
}

/// A backend that releases instead of handing: the call ends the term and frees the
/// role (token kept), and the named owner acquires it as after any release. Its
/// sessions count no handed terms (`terms_handed` is `None`).
pub async fn scenario_session_handover_releases(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    let a = store.open_session("node-a", ttl).await.unwrap();
    let b = store.open_session("node-b", ttl).await.unwrap();
    let held = take_and_hand(&*store, a.id, "node-b").await;
    let info = store.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.live_holder(), None, "released: {info:?}");
    let taken = store.acquire_in_session(ROLE, b.id).await.unwrap();
    assert!(taken.acquired && taken.fencing_token > held.fencing_token);
    let kept = store.keep_alive_session(b.id, ttl).await.unwrap();
    assert_eq!(kept.expect("live").terms_handed, None, "nothing is counted");
    assert_invalid(
        store
            .hand_to_session(ROLE, "node-b", taken.fencing_token, "")
            .await,
        "to",
    );
}

/// Runs [`scenario_session_handed_a_term`] against one backend as a `#[tokio::test]`.
#[macro_export]
macro_rules! session_handover_scenarios {
    ($backend:expr $(, $key:ident = $value:tt)*) => {
        $crate::scenario_tests!(handover; $backend; [$($key = $value),*];
            scenario_session_handed_a_term);
    };
}

/// Runs [`scenario_session_handover_releases`] against one backend as a `#[tokio::test]`.
#[macro_export]
macro_rules! session_handover_release_scenarios {
    ($backend:expr $(, $key:ident = $value:tt)*) => {
        $crate::scenario_tests!(handover; $backend; [$($key = $value),*];
            scenario_session_handover_releases);
    };
}
