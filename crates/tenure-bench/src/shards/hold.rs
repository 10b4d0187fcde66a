//! The hold scenario: a shard group, then per-role electors, holding every role over a
//! window, and the quiet window of a server that counts its own traffic.

use std::sync::Arc;
use std::time::Duration;

use tenure::LeaseLeaderOptions;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::counters::{
    counted_store, millis, snapshot, spawn_logged_elector, CallCounts, Snapshot, TermLog,
};
use super::group::{settle_limit, wait_for, Scenario};
use super::{HoldRow, QuietWindow, ShardBench};
use crate::backend::Backend;
use crate::BenchError;

/// The per-shard baseline's settle limit, in multiples of the batched settle's.
const PER_ROLE_SETTLE_LIMITS: u32 = 4;

/// The hold timings, shared by the hold and wedged scenarios: `bench.shards` shards on
/// the hold TTL, renewing and looking again every `bench.renew_every`.
pub(super) fn hold_scenario<'a>(
    backend: &'a dyn Backend,
    bench: &ShardBench,
    group: String,
) -> Scenario<'a> {
    Scenario {
        backend,
        counts: Arc::default(),
        log: Arc::default(),
        group,
        shards: bench.shards,
        ttl: bench.hold_ttl,
        renew: bench.renew_every,
        retry: bench.renew_every,
        per_role_acquires: false,
    }
}

/// Lets the last contending calls pass and the server's counters catch up, then reads
/// the counters around a window of `bench.window`.
pub(super) async fn hold_window(
    backend: &dyn Backend,
    counts: &CallCounts,
    log: &TermLog,
    bench: &ShardBench,
) -> Result<(Snapshot, Snapshot), BenchError> {
    tokio::time::sleep(bench.renew_every.max(backend.counter_lag())).await;
    let before = snapshot(backend, counts, log).await?;
    tokio::time::sleep(bench.window).await;
    let after = snapshot(backend, counts, log).await?;
    Ok((before, after))
}

/// The server's counters over `bench.window` with nothing of the bench's running.
pub(super) async fn quiet_window(
    backend: &dyn Backend,
    bench: &ShardBench,
) -> Result<QuietWindow, BenchError> {
    tracing::info!(window = ?bench.window, "measuring the server's own traffic");
    tokio::time::sleep(backend.counter_lag()).await;
    let log = TermLog::default();
    let counts = CallCounts::default();
    let before = snapshot(backend, &counts, &log).await?;
    tokio::time::sleep(bench.window).await;
    let after = snapshot(backend, &counts, &log).await?;
    let row = hold_row(
        "quiet",
        0,
        0,
        Duration::ZERO,
        bench.renew_every,
        &before,
        &after,
    );
    Ok(QuietWindow {
        window_ms: millis(after.at.duration_since(before.at)),
        statements_per_interval: row.statements_per_interval,
        rows_written_per_interval: row.rows_written_per_interval,
    })
}

/// Measures the window between two snapshots as a [`HoldRow`].
pub(super) fn hold_row(
    holder: &str,
    roles: u32,
    contenders: usize,
    settle: Duration,
    renew: Duration,
    before: &Snapshot,
    after: &Snapshot,
) -> HoldRow {
    let window = after.at.duration_since(before.at);
    let intervals = window.as_secs_f64() / renew.as_secs_f64();
    let per = |n: u64| n as f64 / intervals;
    HoldRow {
        holder: holder.to_owned(),
        roles,
        contenders,
        settle_ms: millis(settle),
        restart_settle_ms: None,
        per_role_settle_ms: None,
        intervals,
        calls_per_interval: after
            .calls_since(before)
            .into_iter()
            .map(|(method, n)| (method, per(n)))
            .collect(),
        statements_per_interval: after.statements_since(before).map(per),
        rows_written_per_interval: after
            .rows
            .zip(before.rows)
            .map(|(a, b)| per(a.saturating_sub(b))),
        cpu_percent: 100.0 * after.cpu.saturating_sub(before.cpu).as_secs_f64()
            / window.as_secs_f64(),
        terms_restarted: after.terms - before.terms,
        kill: None,
    }
}

pub(super) async fn hold_group(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<HoldRow, BenchError> {
    let scenario = hold_scenario(backend, bench, format!("{run_id}-hold"));
    tracing::info!(
        shards = bench.shards,
        members = bench.members,
        "settling the shard group"
    );
    let limit = settle_limit(
        backend,
        bench.shards / bench.members as u32,
        bench.members,
        bench.hold_ttl,
    );
    let (mut members, settle) = scenario.start_settled(bench.members, limit).await?;
    tracing::info!(window = ?bench.window, "measuring the shard group's hold");
    let (before, after) = hold_window(backend, &scenario.counts, &scenario.log, bench).await?;
    let kill = if members.len() >= 2 {
        tracing::info!("the member with the most shards is killed");
        Some(scenario.kill_busiest(&mut members, limit).await?)
    } else {
        None
    };
    for member in members {
        member.stop().await;
    }
    let restart_settle = if backend.creates_contend() {
        tracing::info!("starting the shard group again, its objects in place");
        let (members, settle) = scenario.start_settled(bench.members, limit).await?;
        for member in members {
            member.stop().await;
        }
        Some(millis(settle))
    } else {
        None
    };
    // The baseline: the same cold start into a group of its own, one acquire per role.
    tracing::info!("settling a second group with one acquire call per shard");
    let per_role = Scenario {
        group: format!("{run_id}-hold-per-role"),
        per_role_acquires: true,
        counts: Arc::default(),
        log: Arc::default(),
        ..scenario
    };
    // One round trip per shard, 16 at once: 5-8x the batched settle's time measured
    // (40,000 shards over 4 members on PostgreSQL: 41-71 s against a 75 s limit), so a
    // limit of its own rather than a failed bench whenever the machine is loaded.
    let per_role_limit = limit * PER_ROLE_SETTLE_LIMITS;
    let (members, per_role_settle) = per_role
        .start_settled(bench.members, per_role_limit)
        .await?;
    for member in members {
        member.stop().await;
    }
    Ok(HoldRow {
        restart_settle_ms: restart_settle,
        per_role_settle_ms: Some(millis(per_role_settle)),
        kill,
        ..hold_row(
            "shard group",
            bench.shards,
            bench.members,
            settle,
            bench.renew_every,
            &before,
            &after,
        )
    })
}

pub(super) async fn hold_electors(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<HoldRow, BenchError> {
    let counts = Arc::new(CallCounts::default());
    let log = Arc::new(TermLog::default());
    let store = counted_store(backend, 10, bench.hold_ttl, &counts).await?;
    let role = |k: u32| format!("{run_id}-roles/{k}");
    if backend.creates_contend() {
        tracing::info!(
            roles = bench.shards,
            "creating the per-role electors' objects"
        );
        let owner = format!("{run_id}-elector-prep");
        for k in 0..bench.shards {
            let lease = store
                .try_acquire_or_renew(&role(k), &owner, bench.hold_ttl)
                .await?;
            store.release(&role(k), &owner, lease.fencing_token).await?;
        }
    }
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(bench.shards as usize);
    tracing::info!(electors = bench.shards, "starting per-role electors");
    for k in 0..bench.shards {
        let options = LeaseLeaderOptions {
            owner_id: format!("{run_id}-elector-{k}"),
            lease_ttl: bench.hold_ttl,
            renew_interval: bench.renew_every,
            retry_interval: bench.renew_every,
            ..Default::default()
        };
        tasks.push(spawn_logged_elector(
            store.clone(),
            options,
            role(k),
            &log,
            k,
            "elector".to_owned(),
            shutdown.clone(),
        )?);
    }
    let limit = settle_limit(backend, bench.shards, 1, bench.hold_ttl);
    let all_lead = || (log.started() >= u64::from(bench.shards)).then(|| start.elapsed());
    let some_wait = || {
        format!(
            "{} per-role electors did not all lead within {limit:?} ({} did)",
            bench.shards,
            log.started()
        )
    };
    let settle = wait_for(start, limit, all_lead, some_wait)
        .await
        .inspect_err(|_| shutdown.cancel())?;
    tracing::info!(window = ?bench.window, "measuring the per-role electors' hold");
    let (before, after) = hold_window(backend, &counts, &log, bench).await?;
    shutdown.cancel();
    for task in tasks {
        let _ = task.await;
    }
    Ok(hold_row(
        "per-role electors",
        bench.shards,
        bench.shards as usize,
        settle,
        bench.renew_every,
        &before,
        &after,
    ))
}
