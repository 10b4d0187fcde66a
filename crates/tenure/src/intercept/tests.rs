//! The interceptor stack's own tests: order, rewriting, hanging and failing calls.

use std::time::SystemTime;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::{Error, InMemoryLeaseStore, TokioClock};

const ROLE: &str = "reports";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + secs(1_800_000_000)
}

fn memory() -> Arc<InMemoryLeaseStore> {
    Arc::new(InMemoryLeaseStore::with_clock(TokioClock::starting_at(
        start(),
    )))
}

/// A boxed reply future, so test hooks can be closures.
type Boxed = std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>;

/// An interceptor from a closure over the call and the rest of the stack.
struct Hook<F>(F);

#[async_trait]
impl<F: Fn(Call, Next) -> Boxed + Send + Sync + 'static> Interceptor for Hook<F> {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        (self.0)(call, next).await
    }
}

fn hook(f: impl Fn(Call, Next) -> Boxed + Send + Sync + 'static) -> Arc<dyn Interceptor> {
    Arc::new(Hook(f))
}

/// Setup: a store behind one hook that sleeps 2 s before every acquire. The answer
/// is decided 2 s of store time after the call, and the call took 2 s.
#[tokio::test(start_paused = true)]
async fn a_hook_delays_a_call_on_tokio_time() {
    let store = InterceptStore::new(memory()).with(hook(|call, next| {
        Box::pin(async move {
            if let Call::TryAcquireOrRenew { .. } = call {
                tokio::time::sleep(secs(2)).await;
            }
            next.run(call).await
        })
    }));
    let sent = Instant::now();
    let answer = store
        .try_acquire_or_renew(ROLE, "node-a", secs(10))
        .await
        .unwrap();
    assert_eq!(sent.elapsed(), secs(2));
    assert_eq!(answer.now, start() + secs(2));
    assert!(
        store.get(ROLE).await.unwrap().is_some(),
        "get is not delayed"
    );
    assert_eq!(sent.elapsed(), secs(2));
}

/// Setup: a hook that holds every call until a token is cancelled. An acquire made
/// while it is held does not answer for a minute, then reaches the store and answers
/// as soon as the token is cancelled.
#[tokio::test(start_paused = true)]
async fn a_hung_call_goes_on_when_its_token_is_cancelled() {
    let inner = memory();
    let held = CancellationToken::new();
    let release = held.clone();
    let store = Arc::new(
        InterceptStore::new(inner.clone()).with(hook(move |call, next| {
            let held = held.clone();
            Box::pin(async move {
                held.cancelled().await;
                next.run(call).await
            })
        })),
    );
    let call = tokio::spawn({
        let store = store.clone();
        async move { store.try_acquire_or_renew(ROLE, "node-a", secs(10)).await }
    });
    tokio::time::sleep(secs(60)).await;
    assert!(
        !call.is_finished(),
        "the call hangs while the token is live"
    );
    assert_eq!(
        inner.get(ROLE).await.unwrap(),
        None,
        "nothing reached the store"
    );
    release.cancel();
    let answer = call.await.unwrap().unwrap();
    assert!(answer.acquired);
    assert_eq!(answer.now, start() + secs(60));
}

/// Setup: a hook that fails every acquire and release with a store error. Both
/// calls return that error and the store below never sees them; reads pass.
#[tokio::test(start_paused = true)]
async fn a_hook_fails_a_call_without_the_store() {
    let inner = memory();
    let store = InterceptStore::new(inner.clone()).with(hook(|call, next| {
        Box::pin(async move {
            match call {
                Call::TryAcquireOrRenew { .. } | Call::Release { .. } => {
                    Reply::error(&call, Error::store_msg("memory", "injected failure"))
                }
                call => next.run(call).await,
            }
        })
    }));
    let error = store
        .try_acquire_or_renew(ROLE, "node-a", secs(10))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "memory store: injected failure");
    assert!(error.is_transient());
    let error = store
        .release(ROLE, "node-a", FencingToken::from(1))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "memory store: injected failure");
    assert_eq!(store.get(ROLE).await.unwrap(), None);
    assert_eq!(store.list().await.unwrap(), Vec::new());
    assert_eq!(inner.get(ROLE).await.unwrap(), None);
}

/// Setup: a hook that asks the store for half the TTL and then reports a token one
/// higher than the store gave. The store really keeps the lease for 5 s; the caller
/// sees the halved expiry and the twisted token.
#[tokio::test(start_paused = true)]
async fn a_hook_rewrites_the_arguments_and_the_answer() {
    let inner = memory();
    let store = InterceptStore::new(inner.clone()).with(hook(|call, next| {
        Box::pin(async move {
            let mut call = call;
            let Call::TryAcquireOrRenew { ttl, .. } = &mut call else {
                return next.run(call).await;
            };
            *ttl /= 2;
            let mut reply = next.run(call).await;
            if let Reply::Lease(Ok(answer)) = &mut reply {
                answer.fencing_token = FencingToken::from(answer.fencing_token.get() + 1);
            }
            reply
        })
    }));
    let answer = store
        .try_acquire_or_renew(ROLE, "node-a", secs(10))
        .await
        .unwrap();
    assert_eq!(answer.remaining(), secs(5));
    assert_eq!(answer.fencing_token, FencingToken::from(2));
    let kept = inner.get(ROLE).await.unwrap().unwrap();
    assert_eq!(kept.remaining(), secs(5));
    assert_eq!(kept.fencing_token, FencingToken::from(1));
}

/// Setup: two logging hooks, `outer` added first. Each call passes `outer` then
/// `inner` on the way in and the reverse on the way out; the minimum TTL is folded
/// from the store outwards.
#[tokio::test(start_paused = true)]
async fn hooks_compose_first_added_outermost() {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    struct Logging {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
        min_ttl: Duration,
    }
    #[async_trait]
    impl Interceptor for Logging {
        async fn intercept(&self, call: Call, next: Next) -> Reply {
            let method = call.method();
            self.log.lock().push(format!("{} {method} in", self.name));
            let reply = next.run(call).await;
            self.log.lock().push(format!("{} {method} out", self.name));
            reply
        }
        fn min_ttl(&self, below: Duration) -> Duration {
            self.log
                .lock()
                .push(format!("{} min_ttl {below:?}", self.name));
            below.max(self.min_ttl)
        }
    }
    let logging = |name, min_ttl| -> Arc<dyn Interceptor> {
        Arc::new(Logging {
            name,
            log: log.clone(),
            min_ttl,
        })
    };
    let store = InterceptStore::new(memory())
        .with(logging("outer", Duration::from_millis(500)))
        .with(logging("inner", secs(1)));
    let answer = store
        .try_acquire_or_renew(ROLE, "node-a", secs(10))
        .await
        .unwrap();
    let deadline = Instant::now() + secs(1);
    store
        .wait_for_change(ROLE, answer.fencing_token, deadline)
        .await;
    assert_eq!(Instant::now(), deadline, "the wait reached the store");
    assert!(store
        .release(ROLE, "node-a", answer.fencing_token)
        .await
        .unwrap());
    assert_eq!(store.min_ttl(), secs(1));
    assert_eq!(
        *log.lock(),
        [
            "outer try_acquire_or_renew in",
            "inner try_acquire_or_renew in",
            "inner try_acquire_or_renew out",
            "outer try_acquire_or_renew out",
            "outer wait_for_change in",
            "inner wait_for_change in",
            "inner wait_for_change out",
            "outer wait_for_change out",
            "outer release in",
            "inner release in",
            "inner release out",
            "outer release out",
            "inner min_ttl 1ms",
            "outer min_ttl 1s",
        ]
    );
}

/// Setup: a hook that answers every call with the reply to `list`. The store calls
/// of other methods fail with an error naming both methods instead of panicking.
#[tokio::test(start_paused = true)]
async fn a_reply_of_the_wrong_kind_is_an_error() {
    let store = InterceptStore::new(memory()).with(hook(|_call, _next| {
        Box::pin(async { Reply::List(Ok(Vec::new())) })
    }));
    let error = store
        .try_acquire_or_renew(ROLE, "node-a", secs(10))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "intercept store: an interceptor answered try_acquire_or_renew with the reply to list"
    );
    assert!(store.get(ROLE).await.is_err());
    assert!(store
        .release(ROLE, "node-a", FencingToken::from(1))
        .await
        .is_err());
    assert_eq!(store.list().await.unwrap(), Vec::new());
}
