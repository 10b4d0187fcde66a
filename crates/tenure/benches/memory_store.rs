//! In-memory store hot paths, each beside a baseline measured in the same run.
//!
//! - `renew/trait`: renewing a hot role through `dyn LeaseStore` (boxed future, owned
//!   holder), the path the elector takes;
//! - `baseline/clock`: one `SystemTime::now()`, the floor of any renewal on wall time;
//! - `baseline/map`: a bare `FxHashMap` lookup and update under a mutex, what a renewal
//!   is without the contract's checks;
//! - `two_threads`: acquire/renew on distinct roles from 2 threads at once.
//!
//! Run: `cargo bench -p tenure --bench memory_store`.

use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tenure::{InMemoryLeaseStore, LeaseStore};

const TTL: Duration = Duration::from_secs(30);

/// Polls a future that the in-memory store completes without waiting.
fn ready<F: std::future::Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("in-memory store futures complete at once"),
    }
}

fn renew(c: &mut Criterion) {
    let mut group = c.benchmark_group("renew");
    group.throughput(Throughput::Elements(1));
    let dyn_store: Arc<dyn LeaseStore> = Arc::new(InMemoryLeaseStore::new());
    ready(dyn_store.try_acquire_or_renew("hot", "node-a", TTL)).unwrap();
    group.bench_function("trait", |b| {
        b.iter(|| {
            black_box(
                ready(dyn_store.try_acquire_or_renew(black_box("hot"), black_box("node-a"), TTL))
                    .unwrap(),
            )
        })
    });
    group.finish();

    let mut group = c.benchmark_group("baseline");
    group.throughput(Throughput::Elements(1));
    group.bench_function("clock", |b| b.iter(|| black_box(SystemTime::now())));
    let map: Mutex<FxHashMap<String, (u64, SystemTime)>> = Mutex::new(FxHashMap::default());
    map.lock().insert("hot".to_owned(), (1, SystemTime::now()));
    group.bench_function("map", |b| {
        b.iter(|| {
            let mut map = map.lock();
            let slot = map.get_mut(black_box("hot")).unwrap();
            slot.1 = SystemTime::now() + TTL;
            black_box(slot.0)
        })
    });
    group.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_threads");
    group.throughput(Throughput::Elements(2));
    let store = Arc::new(InMemoryLeaseStore::new());
    group.bench_function("distinct_roles", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|scope| {
                for thread in 0..2 {
                    let store = &store;
                    scope.spawn(move || {
                        let role = format!("role-{thread}");
                        let owner = format!("node-{thread}");
                        for _ in 0..iters {
                            black_box(
                                ready(store.try_acquire_or_renew(&role, &owner, TTL)).unwrap(),
                            );
                        }
                    });
                }
            });
            start.elapsed()
        })
    });
    group.finish();
}

criterion_group!(benches, renew, two_threads);
criterion_main!(benches);
