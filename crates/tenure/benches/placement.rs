//! Placement at a million shards, beside the floor of its answer's shape.
//!
//! - `place/cold`: no shard owned yet (a cold start: every shard goes by weight);
//! - `place/settled`: every shard owned by its target (a settled group's look);
//! - `baseline/map`: building a `BTreeMap<u32, String>` of the same size from a list of
//!   owners already known, the least any placement answering in that type costs.
//!
//! Run: `cargo bench -p tenure --bench placement`.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tenure::placement::place;

const SHARDS: u32 = 1_000_000;

fn members(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("member-{i:03}")).collect()
}

fn placement(c: &mut Criterion) {
    let mut group = c.benchmark_group("place");
    group.sample_size(10);
    for count in [10, 100] {
        let members = members(count);
        let cold = BTreeMap::new();
        group.bench_function(format!("cold/{count}"), |b| {
            b.iter(|| black_box(place("jobs", SHARDS, black_box(&members), &cold)))
        });
        let settled = place("jobs", SHARDS, &members, &cold);
        group.bench_function(format!("settled/{count}"), |b| {
            b.iter(|| black_box(place("jobs", SHARDS, black_box(&members), &settled)))
        });
        let owners: Vec<&String> = settled.values().collect();
        group.bench_function(format!("baseline_map/{count}"), |b| {
            b.iter_batched(
                || owners.clone(),
                |owners| {
                    let map: BTreeMap<u32, String> = owners
                        .into_iter()
                        .enumerate()
                        .map(|(k, owner)| (k as u32, owner.clone()))
                        .collect();
                    black_box(map)
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, placement);
criterion_main!(benches);
