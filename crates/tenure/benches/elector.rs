//! The elector's cost per term on the in-memory store, beside the store calls a term is
//! made of, measured in the same run.
//!
//! - `term/store_calls`: `try_acquire_or_renew` then `release` through `dyn LeaseStore`:
//!   what a term costs the store;
//! - `term/elector_run`: `LeaseLeaderElector::run` with work that returns at once: acquire,
//!   spawn the work as its own task, await it, release; the difference is the elector's
//!   own cost (task spawn, timers, cancellation tokens, state updates);
//! - `handover/push`: release -> the waiting successor's work running, two electors on
//!   one store, the successor woken only by the store's push (retry interval 60 s).
//!
//! Run: `cargo bench -p tenure --bench elector`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tenure::{InMemoryLeaseStore, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(30);

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn options(owner: &str) -> LeaseLeaderOptions {
    LeaseLeaderOptions {
        owner_id: owner.to_owned(),
        lease_ttl: TTL,
        renew_interval: Duration::from_secs(10),
        retry_interval: Duration::from_secs(60),
        ..LeaseLeaderOptions::default()
    }
}

fn term(c: &mut Criterion) {
    let rt = runtime();
    let store: Arc<dyn LeaseStore> = Arc::new(InMemoryLeaseStore::new());
    let mut group = c.benchmark_group("term");
    group.bench_function("store_calls", |b| {
        b.iter(|| {
            rt.block_on(async {
                let lease = store.try_acquire_or_renew("r", "a", TTL).await.unwrap();
                assert!(lease.acquired);
                assert!(store.release("r", "a", lease.fencing_token).await.unwrap());
            })
        })
    });
    let elector = LeaseLeaderElector::new(Arc::clone(&store), options("a")).unwrap();
    group.bench_function("elector_run", |b| {
        b.iter(|| {
            rt.block_on(elector.run(
                "r",
                |_token, _leadership| async {},
                CancellationToken::new(),
            ))
            .unwrap()
        })
    });
    group.finish();
}

/// Two electors hand one role back and forth: each leader's work returns as soon as it
/// starts (so its elector releases) and the other, parked on the store's push, takes
/// over. An elector whose term ended waits until the other has started before it
/// contends again, so every term is a handover rather than the same owner re-acquiring.
fn handover(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("handover");
    group.bench_function("push", |b| {
        b.iter_custom(|iters| rt.block_on(handovers(iters)))
    });
    group.finish();
}

/// Runs `iters` handovers on a fresh store and returns the time from the first term's
/// start to the last one's.
async fn handovers(iters: u64) -> Duration {
    let store: Arc<dyn LeaseStore> = Arc::new(InMemoryLeaseStore::new());
    let (started_tx, mut started_rx) = mpsc::unbounded_channel::<Instant>();
    let (leader_tx, leader_rx) = watch::channel("");
    let leader_tx = Arc::new(leader_tx);
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for owner in ["a", "b"] {
        let elector = LeaseLeaderElector::new(Arc::clone(&store), options(owner)).unwrap();
        let started = started_tx.clone();
        let leader_tx = Arc::clone(&leader_tx);
        let mut leader_rx = leader_rx.clone();
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            while !shutdown.is_cancelled() {
                let started = started.clone();
                let leader_tx = Arc::clone(&leader_tx);
                let work = move |_token, _leadership| {
                    let _ = started.send(Instant::now());
                    leader_tx.send_replace(owner);
                    async {}
                };
                if elector
                    .run("handover", work, shutdown.clone())
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = leader_rx.wait_for(|leader| *leader != owner) => {}
                }
            }
        }));
    }
    let first = started_rx.recv().await.unwrap();
    let mut last = first;
    for _ in 0..iters {
        last = started_rx.recv().await.unwrap();
    }
    shutdown.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    last - first
}

criterion_group!(benches, term, handover);
criterion_main!(benches);
