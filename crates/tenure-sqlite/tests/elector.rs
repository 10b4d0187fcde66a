//! The elector over a real SQLite file where the store's own locking matters: a renewal
//! still in flight holds this process's writer slot and the file's write lock, so the
//! elector must let it finish before it releases.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::{ElectionState, FencingToken, LeaseLeaderElector, LeaseLeaderOptions};
use tenure_sqlite::SqliteDatabase;
use tenure_testkit::{in_time, MustAnswer};
use tokio::sync::{watch, Notify};
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

const ROLE: &str = "reports";
const TTL: Duration = Duration::from_secs(4);

/// Renewals that can be held in flight: once `hold` is called, the next
/// `try_acquire_or_renew` is polled once (so it takes the writer slot and starts
/// `BEGIN IMMEDIATE`), announces itself through `in_flight`, and goes on only once the
/// gate opens and its caller polls it again, like a slow disk under a renewal.
#[derive(Default)]
struct HeldRenewals {
    gate: Mutex<Option<watch::Receiver<bool>>>,
    in_flight: Notify,
    released: Mutex<Vec<(FencingToken, bool)>>,
}

impl HeldRenewals {
    fn hold(&self) -> watch::Sender<bool> {
        let (open, gate) = watch::channel(false);
        *self.gate.lock() = Some(gate);
        open
    }

    async fn renew(&self, call: Call, next: Next) -> Reply {
        let Some(mut gate) = self.gate.lock().take() else {
            return next.run(call).await;
        };
        let mut call = std::pin::pin!(next.run(call));
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        self.in_flight.notify_one();
        if let Poll::Ready(answer) = first {
            return answer;
        }
        let _ = gate.wait_for(|open| *open).await;
        call.await
    }
}

#[async_trait]
impl Interceptor for HeldRenewals {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        match call {
            Call::TryAcquireOrRenew { .. } => self.renew(call, next).await,
            Call::Release { token, .. } => {
                let reply = next.run(call).await;
                if let Reply::Released(Ok(released)) = reply {
                    self.released.lock().push((token, released));
                }
                reply
            }
            call => next.run(call).await,
        }
    }
}

/// Setup: node-a leads on a SQLite file (ttl 4 s, renew 1 s) through [`HeldRenewals`];
/// a second database handle on the same file stands for another process. One renewal is
/// held in flight (writer slot taken, `BEGIN IMMEDIATE` under way) when shutdown fires,
/// and let go at once. `run` must return promptly with the lease released (the release
/// ran after the renewal finished, not queued behind it until the local deadline), and
/// the other process must acquire at once, well before the TTL.
#[tokio::test]
async fn shutdown_during_a_renewal_releases_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("elector.db");
    let held = Arc::new(HeldRenewals::default());
    let node_a = Arc::new(SqliteDatabase::open(&path).await.unwrap().lease_store());
    let node_a = InterceptStore::new(node_a).with(held.clone());
    let other = SqliteDatabase::open(&path).await.unwrap().lease_store();
    let elector = Arc::new(
        LeaseLeaderElector::new(
            Arc::new(node_a),
            LeaseLeaderOptions {
                owner_id: "node-a".to_owned(),
                lease_ttl: TTL,
                renew_interval: Duration::from_secs(1),
                retry_interval: Duration::from_millis(500),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let mut state = elector.watch();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move {
            elector
                .run(
                    ROLE,
                    |_token, leadership: CancellationToken| async move {
                        leadership.cancelled().await
                    },
                    shutdown,
                )
                .await
        }
    });
    in_time(
        TTL,
        state.wait_for(ElectionState::is_leader),
        "node-a leads within a TTL",
    )
    .await;

    tracing::info!("--- a renewal is in flight when shutdown fires");
    let open = held.hold();
    timeout(TTL, held.in_flight.notified())
        .await
        .expect("a renewal within a TTL");
    let stopped = Instant::now();
    shutdown.cancel();
    open.send_replace(true);
    in_time(TTL * 2, run, "run returns").await.unwrap();
    let stop_took = stopped.elapsed();
    assert!(
        stop_took < Duration::from_secs(1),
        "shutdown took {stop_took:?}: the release waited behind the renewal"
    );
    assert_eq!(*held.released.lock(), [(FencingToken::from(1), true)]);

    tracing::info!("--- the other process takes over at once");
    let next = other.try_acquire(ROLE, "node-b", TTL).await;
    assert!(next.acquired, "the successor acquires: {next:?}");
    assert_eq!(next.fencing_token.get(), 2);
    let handover = stopped.elapsed();
    assert!(
        handover < Duration::from_secs(2),
        "handover took {handover:?} of a {TTL:?} TTL"
    );
}
