//! The wedged scenario: a group whose members include one that heartbeats into it but
//! never runs a member (a wedged process: its membership lives, its work never starts,
//! it answers no handover). Its shards must not cycle between being handed to it,
//! orphaned and rescued: every shard should run on a working member nearly all the time.

use std::time::Duration;

use tenure::shard::GROUP_KEY;
use tenure::Metadata;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::counters::millis;
use super::group::{settle_limit, wait_for};
use super::hold::hold_scenario;
use super::{ShardBench, Wedged, MEMBER_POOL};
use crate::backend::Backend;
use crate::BenchError;

/// How often the scenario looks at which shards run.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Runs `bench.members` members and one wedged member on `bench.shards` shards (hold
/// TTL and renew interval) for `length`, sampling which shards run every
/// [`SAMPLE_EVERY`] from the first moment every shard ran.
pub(super) async fn wedged(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
    length: Duration,
) -> Result<Wedged, BenchError> {
    let scenario = hold_scenario(backend, bench, format!("{run_id}-wedged"));
    let wedged_node = format!("{}-wedged", scenario.group);
    let heartbeat_stop = CancellationToken::new();
    let _stop_heartbeat = heartbeat_stop.clone().drop_guard();
    let handles = backend.stores(MEMBER_POOL, bench.hold_ttl).await?;
    let mut metadata = Metadata::new();
    metadata.insert(GROUP_KEY.to_owned(), scenario.group.clone());
    let heartbeat = tenure::spawn_heartbeat(
        handles.registry,
        wedged_node.clone(),
        metadata,
        bench.hold_ttl / 3,
        heartbeat_stop.clone(),
    );
    tracing::info!(
        shards = bench.shards,
        members = bench.members,
        ?length,
        "a group with one wedged member"
    );
    let nodes: Vec<String> = (0..bench.members).map(|i| scenario.node(i)).collect();
    let members = scenario.start(&nodes).await?;
    let started = Instant::now();
    let limit = settle_limit(backend, bench.shards, bench.members + 1, bench.hold_ttl);
    let running = |members: &[super::group::RunningMember]| {
        let mut running = vec![false; bench.shards as usize];
        for shard in members.iter().flat_map(|m| m.owned()) {
            if let Some(slot) = running.get_mut(shard as usize) {
                *slot = true;
            }
        }
        running
    };
    let all_ran = wait_for(
        started,
        limit,
        || {
            running(&members)
                .iter()
                .all(|r| *r)
                .then(|| started.elapsed())
        },
        || format!("the {} shards never all ran within {limit:?}", bench.shards),
    )
    .await?;
    let mut ran = vec![0u64; bench.shards as usize];
    let (mut samples, mut targeted) = (0u64, 0u64);
    let from = Instant::now();
    while from.elapsed() < length {
        tokio::time::sleep(SAMPLE_EVERY).await;
        if heartbeat.is_finished() {
            return Err(BenchError::Setup(
                "the wedged member's heartbeat stopped".to_owned(),
            ));
        }
        samples += 1;
        for (count, running) in ran.iter_mut().zip(running(&members)) {
            *count += u64::from(running);
        }
        let aimed_at_wedged = members.iter().any(|m| m.targets_any(&wedged_node));
        targeted += u64::from(aimed_at_wedged);
    }
    for member in members {
        member.stop().await;
    }
    // Its leave, before the caller tears the store down.
    heartbeat_stop.cancel();
    let _ = tokio::time::timeout(bench.hold_ttl, heartbeat).await;
    let share = |n: u64| n as f64 / samples.max(1) as f64;
    let least = ran.iter().copied().min().unwrap_or(0);
    let total: u64 = ran.iter().sum();
    Ok(Wedged {
        members: bench.members,
        shards: bench.shards,
        all_ran_ms: millis(all_ran),
        measured_ms: millis(from.elapsed()),
        samples,
        least_running_share: share(least),
        mean_running_share: share(total) / f64::from(bench.shards.max(1)),
        shards_under_99_percent: ran.iter().filter(|n| share(**n) < 0.99).count(),
        targeted_at_wedged_share: share(targeted),
    })
}
