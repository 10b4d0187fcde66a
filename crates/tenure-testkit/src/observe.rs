//! Conformance scenarios for a term's advertised value and for observers: the value is
//! kept with the term that published it, and [`tenure::observe()`] sees each change of
//! leader by push, without contending. Part of
//! [`lease_scenarios!`](crate::lease_scenarios).

use std::sync::Arc;
use std::time::Duration;

use tenure::lease::MAX_VALUE_LEN;
use tenure::{observe, Leader, LeaderObserver, LeaseStore};
use tokio::sync::mpsc;

use crate::conformance::assert_invalid;
use crate::fixture::begin;
use crate::LeaseBackend;
use crate::MustAnswer;

const URL_A: &str = "http://10.0.0.7:8080";
const URL_C: &str = "grpc://[fd00::3]:7443/ünïcode";

async fn value_of(store: &dyn LeaseStore, role: &str) -> Option<String> {
    let info = store.get(role).await.unwrap();
    info.and_then(|info| info.value)
}

/// A term's value is kept with it: a renewal (even one offering another value) keeps
/// the value its term began with, a release drops it, and each new term brings its own
/// (or none). Another store instance and `list` read the same.
pub async fn scenario_value_kept_with_term(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = store
        .try_acquire_with_value("alpha", "node-a", ttl, Some(URL_A))
        .await;
    assert!(a.acquired, "{a:?}");
    assert_eq!(value_of(&*store, "alpha").await.as_deref(), Some(URL_A));
    let other = fx.reopen().await;
    assert_eq!(
        value_of(&*other, "alpha").await.as_deref(),
        Some(URL_A),
        "another instance reads the value"
    );

    let renewed = store
        .try_acquire_with_value("alpha", "node-a", ttl, Some("elsewhere"))
        .await;
    assert!(renewed.acquired && renewed.fencing_token == a.fencing_token);
    let plain = store.try_acquire("alpha", "node-a", ttl).await;
    assert!(plain.acquired && plain.fencing_token == a.fencing_token);
    assert_eq!(
        value_of(&*store, "alpha").await.as_deref(),
        Some(URL_A),
        "a renewal keeps the value its term began with"
    );

    assert!(store.release_term("alpha", "node-a", a.fencing_token).await);
    assert_eq!(
        value_of(&*store, "alpha").await,
        None,
        "a release drops the value"
    );

    let b = store.try_acquire("alpha", "node-b", ttl).await;
    assert!(b.acquired);
    assert_eq!(
        value_of(&*store, "alpha").await,
        None,
        "a term that advertised nothing shows nothing"
    );

    // node-b lapses; node-c takes over with a value of its own.
    fx.pass_time(ttl + ttl / 4).await;
    let c = store
        .try_acquire_with_value("alpha", "node-c", ttl, Some(URL_C))
        .await;
    assert!(c.acquired && c.fencing_token > b.fencing_token, "{c:?}");
    let listed = store.list().await.unwrap();
    let alpha = listed.iter().find(|info| info.role == "alpha").unwrap();
    assert_eq!(alpha.value.as_deref(), Some(URL_C), "list shows the value");
    assert_eq!(
        Leader::of(alpha),
        Some(Leader {
            owner: "node-c".into(),
            fencing_token: c.fencing_token,
            value: Some(URL_C.into()),
        })
    );

    // The longest value allowed round-trips whole.
    let longest = "v".repeat(MAX_VALUE_LEN);
    let d = store
        .try_acquire_with_value("beta", "node-d", ttl, Some(&longest))
        .await;
    assert!(d.acquired);
    assert_eq!(value_of(&*other, "beta").await, Some(longest));
}

/// A value over [`MAX_VALUE_LEN`] bytes or with a NUL byte is refused, naming `value`,
/// and nothing is written.
pub async fn scenario_value_bad_input(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    let too_long = "v".repeat(MAX_VALUE_LEN + 1);
    assert_invalid(
        store
            .try_acquire_or_renew_with_value("alpha", "node-a", ttl, Some(&too_long))
            .await,
        "value",
    );
    assert_invalid(
        store
            .try_acquire_or_renew_with_value("alpha", "node-a", ttl, Some("a\0b"))
            .await,
        "value",
    );
    assert_eq!(store.get("alpha").await.unwrap(), None, "nothing written");
}

/// Spawns a task that reports every change `observer` sees.
fn changes(mut observer: LeaderObserver) -> mpsc::UnboundedReceiver<Option<Leader>> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let change = match observer.changed().await {
                Ok(change) => change,
                Err(error) => {
                    tracing::debug!(%error, "observer read failed; reading again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.send(change).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next change, within `within`.
async fn next_change(
    rx: &mut mpsc::UnboundedReceiver<Option<Leader>>,
    within: Duration,
    what: &str,
) -> Option<Leader> {
    tokio::time::timeout(within, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("the observer saw no change within {within:?}: {what}"))
        .expect("the observer task ended")
}

/// An observer on another store instance, polling only once a minute, sees the role's
/// first term, its release and the next term by push, each within seconds; it sees no
/// change when the leader renews.
pub async fn scenario_observe_pushes_changes(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let watcher = observe(fx.reopen().await, "alpha")
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let mut rx = changes(watcher);
    let push = Duration::from_secs(5);
    assert_eq!(next_change(&mut rx, push, "the first look").await, None);
    // Let the observer start waiting before the term begins.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let a = store
        .try_acquire_with_value("alpha", "node-a", ttl, Some(URL_A))
        .await;
    let seen = next_change(&mut rx, push, "a first term").await;
    assert_eq!(
        seen,
        Some(Leader {
            owner: "node-a".into(),
            fencing_token: a.fencing_token,
            value: Some(URL_A.into()),
        })
    );
    store.try_acquire("alpha", "node-a", ttl).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err(),
        "a renewal is no change of leader"
    );

    assert!(store.release_term("alpha", "node-a", a.fencing_token).await);
    assert_eq!(next_change(&mut rx, push, "a release").await, None);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let b = store.try_acquire("alpha", "node-b", ttl).await;
    let seen = next_change(&mut rx, push, "the next term").await;
    assert_eq!(
        seen,
        Some(Leader {
            owner: "node-b".into(),
            fencing_token: b.fencing_token,
            value: None,
        })
    );
}

/// A term that lapses unreleased is seen to end once its expiry passes, and a
/// takeover after it is seen with its new token.
pub async fn scenario_observe_sees_expiry(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    let watcher = observe(fx.reopen().await, "alpha")
        .unwrap()
        .with_poll_interval(Duration::from_millis(200));
    let mut rx = changes(watcher);
    let within = Duration::from_secs(5);
    let seen = next_change(&mut rx, within, "the live term").await;
    assert_eq!(seen.map(|l| l.fencing_token), Some(a.fencing_token));

    fx.pass_time(ttl + ttl / 4).await;
    assert_eq!(
        next_change(&mut rx, within + ttl, "the lapse").await,
        None,
        "a lapsed term has no leader"
    );
    let b = store.try_acquire("alpha", "node-b", ttl).await;
    assert!(b.acquired && b.fencing_token > a.fencing_token);
    let seen = next_change(&mut rx, within, "the takeover").await;
    assert_eq!(
        seen.map(|l| (l.owner, l.fencing_token)),
        Some(("node-b".into(), b.fencing_token))
    );
}

/// An observer of a bad role name is refused, naming `role`.
pub async fn scenario_observe_bad_role(backend: &dyn LeaseBackend) {
    let fx = backend.create().await;
    let store: Arc<dyn LeaseStore> = fx.store();
    assert_invalid(observe(store.clone(), "").map(|_| ()), "role");
    assert_invalid(observe(store, "a\nb").map(|_| ()), "role");
}

/// A term started under a session advertises nothing, also when it takes over a lapsed
/// term that advertised a value; the holder's own later acquire (which makes it a plain
/// lease) keeps its term's value, none. node-a's term is held for `short`, node-b's
/// session for `long`; `lapse` lets node-a's term lapse on the store's clock.
pub async fn a_session_term_shows_no_value<F: std::future::Future<Output = ()>>(
    store: &dyn LeaseStore,
    short: Duration,
    long: Duration,
    lapse: impl FnOnce() -> F,
) {
    let a = store
        .try_acquire_with_value("r", "node-a", short, Some(URL_A))
        .await;
    assert!(a.acquired);
    assert_eq!(
        store.get("r").await.unwrap().unwrap().value.as_deref(),
        Some(URL_A)
    );
    lapse().await;
    let session = store.open_session("node-b", long).await.unwrap();
    let b = store.acquire_in_session("r", session.id).await.unwrap();
    assert!(
        b.acquired && b.fencing_token == a.fencing_token.next(),
        "{b:?}"
    );
    assert_eq!(store.get("r").await.unwrap().unwrap().value, None);
    let detached = store
        .try_acquire_with_value("r", "node-b", long, Some(URL_A))
        .await;
    assert!(detached.acquired && detached.fencing_token == b.fencing_token);
    assert_eq!(store.get("r").await.unwrap().unwrap().value, None);
}

/// An earlier tenure, whose statements know no values, takes over a lapsed term that
/// advertised one, or releases one: the value is shown for neither the term it started
/// nor the role it released. node-a holds `taken` and `released` for `short`, each with
/// a value; once `lapse` let both lapse, `take_over` runs the earlier acquire statement,
/// which gives `taken` to old-b with token 2, and after node-a took `released` again
/// (for `long`), `release` runs the earlier release statement on it.
pub async fn an_earlier_term_never_shows_its_predecessors_value<L, T, R>(
    store: &dyn LeaseStore,
    short: Duration,
    long: Duration,
    lapse: impl FnOnce() -> L,
    take_over: impl FnOnce() -> T,
    release: impl FnOnce() -> R,
) where
    L: std::future::Future<Output = ()>,
    T: std::future::Future<Output = ()>,
    R: std::future::Future<Output = ()>,
{
    for role in ["taken", "released"] {
        let lease = store
            .try_acquire_with_value(role, "node-a", short, Some(URL_A))
            .await;
        assert!(lease.acquired);
    }
    lapse().await;
    take_over().await;
    let info = store.get("taken").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("old-b"), "{info:?}");
    assert_eq!(info.value, None, "{info:?}");

    let lease = store
        .try_acquire_with_value("released", "node-a", long, Some(URL_A))
        .await;
    assert!(
        lease.acquired && lease.fencing_token.get() == 2,
        "{lease:?}"
    );
    release().await;
    let info = store.get("released").await.unwrap().unwrap();
    assert_eq!(info.value, None, "{info:?}");
}
