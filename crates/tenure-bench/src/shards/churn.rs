//! The churn and leave scenarios: members joining, killed and leaving a settled group, and
//! one role's handover among as many electors.

use std::sync::Arc;
use std::time::Duration;

use tenure::LeaseLeaderOptions;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::counters::{
    counted_store, millis, snapshot_watching, spawn_logged_elector, CallCounts, TermLog,
    BATCHED_ROLES,
};
use super::group::{moved, owners, settle_limit, take_busiest, wait_for, Scenario};
use super::{
    Churn, ElectorLeave, Leave, ShardBench, CHURN_MEMBERS, CHURN_SHARDS, LEAVE_MEMBERS, MEMBER_POOL,
};
use crate::backend::Backend;
use crate::stats::summarize;
use crate::BenchError;

/// The churn and leave timings: renew at a quarter of the TTL, look again at a tenth.
pub(super) fn churn_scenario<'a>(
    backend: &'a dyn Backend,
    bench: &ShardBench,
    group: String,
) -> Scenario<'a> {
    Scenario {
        per_role_acquires: false,
        backend,
        counts: Arc::default(),
        log: Arc::default(),
        group,
        shards: CHURN_SHARDS,
        ttl: bench.churn_ttl,
        renew: bench.churn_ttl / 4,
        retry: bench.churn_ttl / 10,
    }
}

pub(super) async fn churn(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<Churn, BenchError> {
    let scenario = churn_scenario(backend, bench, format!("{run_id}-churn"));
    let limit = settle_limit(backend, CHURN_SHARDS, CHURN_MEMBERS + 1, scenario.ttl);
    tracing::info!("churn: a cold start of {CHURN_MEMBERS} members");
    let (mut members, cold) = scenario.start_settled(CHURN_MEMBERS, limit).await?;
    let cold_shares = members.iter().map(|m| m.owned().len()).collect();

    tracing::info!("churn: a member joins");
    let owners_before = owners(&members);
    let joined = Instant::now();
    let newcomer = scenario.node(CHURN_MEMBERS);
    members.extend(scenario.start(std::slice::from_ref(&newcomer)).await?);
    let join_settle = scenario.settle(&members, joined, limit).await?;
    let owners_after = owners(&members);
    let moved = moved(&owners_before, &owners_after);
    let to_newcomer = moved
        .iter()
        .filter(|s| owners_after.get(s) == Some(&newcomer))
        .count();
    let mut marks = Vec::new();
    for shard in &moved {
        let Some(from) = owners_before.get(shard) else {
            continue;
        };
        let ended = scenario.log.end_of(*shard, from, joined);
        let started = scenario.log.first_start(*shard, joined, Some(from));
        if let (Some(ended), Some(started)) = (ended, started) {
            let to_newcomer = owners_after.get(shard) == Some(&newcomer);
            marks.push((ended, started, to_newcomer));
        }
    }
    let latency = |marks: Vec<&(Instant, Instant, bool)>| {
        let spans: Vec<Duration> = marks
            .iter()
            .map(|(ended, started, _)| started.saturating_duration_since(*ended))
            .collect();
        summarize(&spans)
    };
    // The newcomer works from its first start of a shard it ends with on (a shard moved
    // between old members says nothing of it): a handover that ended before then was
    // handed to a member not yet working.
    let working_from = marks
        .iter()
        .filter(|(_, _, to_newcomer)| *to_newcomer)
        .map(|(_, started, _)| *started)
        .min();
    let (before_working, to_working): (Vec<_>, Vec<_>) = marks
        .iter()
        .partition(|(ended, _, _)| working_from.is_some_and(|from| *ended < from));

    tracing::info!("churn: the member with the most shards is killed");
    let kill = scenario.kill_busiest(&mut members, limit).await?;
    for member in members {
        member.stop().await;
    }
    Ok(Churn {
        shards: CHURN_SHARDS,
        cold_settle_ms: millis(cold),
        cold_settle_intervals: cold.as_secs_f64() / scenario.renew.as_secs_f64(),
        cold_shares,
        join_moved: moved.len(),
        join_moved_to_newcomer: to_newcomer,
        join_settle_ms: millis(join_settle),
        handover: latency(marks.iter().collect()),
        handover_before_working: latency(before_working),
        handover_to_working: latency(to_working),
        kill,
        ttl_ms: millis(scenario.ttl),
    })
}

pub(super) async fn leave(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<Leave, BenchError> {
    let scenario = churn_scenario(backend, bench, format!("{run_id}-leave"));
    let limit = settle_limit(backend, CHURN_SHARDS, LEAVE_MEMBERS, scenario.ttl);
    tracing::info!("leave: {LEAVE_MEMBERS} members settle {CHURN_SHARDS} shards");
    let (mut members, _) = scenario.start_settled(LEAVE_MEMBERS, limit).await?;
    tokio::time::sleep(scenario.renew).await;

    tracing::info!("leave: one member shuts down");
    let owners_before = owners(&members);
    let leaver = take_busiest(&mut members);
    let leaver_node = leaver.node.clone();
    let leaver_shards = leaver.owned();
    let watched: Vec<String> = leaver_shards
        .iter()
        .map(|&k| tenure::shard::role(&scenario.group, k))
        .collect();
    let look = |at: &'static str| {
        tracing::debug!(at, "leave: reading the counters");
        snapshot_watching(backend, &scenario.counts, &scenario.log, &watched)
    };
    let before = look("before").await?;
    let left = Instant::now();
    leaver.stop().await;
    scenario.settle(&members, left, limit).await?;
    let after = look("settled").await?;
    tokio::time::sleep(after.at.duration_since(before.at)).await;
    let quiet = look("quiet").await?;

    let moved = moved(&owners_before, &owners(&members));
    let handovers: Vec<Duration> = leaver_shards
        .iter()
        .filter_map(|shard| {
            let ended = scenario.log.end_of(*shard, &leaver_node, left)?;
            let started = scenario.log.first_start(*shard, left, Some(&leaver_node))?;
            Some(started.saturating_duration_since(ended))
        })
        .collect();
    let per_moved = |n: u64| n as f64 / moved.len().max(1) as f64;
    let calls = after.calls_since(&before);
    let acquires = ["acquire_in_session", BATCHED_ROLES]
        .iter()
        .filter_map(|method| calls.get(*method))
        .sum::<u64>();
    for member in members {
        member.stop().await;
    }
    let electors = elector_leave(backend, bench, run_id).await?;
    Ok(Leave {
        members: LEAVE_MEMBERS,
        shards: CHURN_SHARDS,
        moved: moved.len(),
        leaver_shards: leaver_shards.len(),
        acquires_per_moved: per_moved(acquires),
        role_calls_per_moved: per_moved(after.role_calls - before.role_calls),
        statements: after.statements_since(&before).map(|n| n as f64),
        background_statements: quiet.statements_since(&after).map(|n| n as f64),
        handover: summarize(&handovers),
        electors,
    })
}

/// `LEAVE_MEMBERS` electors on one role, each on connections of its own as separate
/// processes would be; the leader shuts down.
pub(super) async fn elector_leave(
    backend: &dyn Backend,
    bench: &ShardBench,
    run_id: &str,
) -> Result<ElectorLeave, BenchError> {
    let counts = Arc::new(CallCounts::default());
    let log = Arc::new(TermLog::default());
    let role = format!("{run_id}-one-role");
    let ttl = bench.churn_ttl;
    let mut electors = Vec::new();
    // However this ends, no elector outlives it.
    let all = CancellationToken::new();
    let _stop_all = all.clone().drop_guard();
    for i in 0..LEAVE_MEMBERS {
        let store = counted_store(backend, MEMBER_POOL, ttl, &counts).await?;
        let options = LeaseLeaderOptions {
            owner_id: format!("{run_id}-one-role-{i}"),
            lease_ttl: ttl,
            renew_interval: ttl / 4,
            retry_interval: ttl / 10,
            ..Default::default()
        };
        let shutdown = all.child_token();
        let task = spawn_logged_elector(
            store,
            options,
            role.clone(),
            &log,
            0,
            format!("e{i}"),
            shutdown.clone(),
        )?;
        electors.push((format!("e{i}"), shutdown, task));
    }
    let limit = settle_limit(backend, 1, LEAVE_MEMBERS, ttl);
    let start = Instant::now();
    let running = || {
        let terms = log.terms.lock();
        terms
            .iter()
            .find(|t| t.end.is_none())
            .map(|t| t.member.clone())
    };
    let none = || format!("no elector led the role within {limit:?}");
    let leader = wait_for(start, limit, running, none).await?;
    tokio::time::sleep(ttl / 4).await;
    let watched = [role.clone()];
    let before = snapshot_watching(backend, &counts, &log, &watched).await?;
    let left = Instant::now();
    let at = electors.iter().position(|(name, _, _)| *name == leader);
    if let Some(at) = at {
        let (_, shutdown, task) = electors.remove(at);
        shutdown.cancel();
        let _ = task.await;
    }
    let taken_over = || log.first_start(0, left, Some(&leader));
    let none = || format!("no elector took the role over within {limit:?}");
    let started = wait_for(left, limit, taken_over, none).await?;
    let after = snapshot_watching(backend, &counts, &log, &watched).await?;
    tokio::time::sleep(after.at.duration_since(before.at)).await;
    let quiet = snapshot_watching(backend, &counts, &log, &watched).await?;
    let ended = log.end_of(0, &leader, left).unwrap_or(left);
    for (_, shutdown, _) in &electors {
        shutdown.cancel();
    }
    for (_, _, task) in electors {
        let _ = task.await;
    }
    Ok(ElectorLeave {
        electors: LEAVE_MEMBERS,
        role_calls: (after.role_calls - before.role_calls) as f64
            - (quiet.role_calls - after.role_calls) as f64,
        statements: after.statements_since(&before).map(|n| n as f64),
        background_statements: quiet.statements_since(&after).map(|n| n as f64),
        handover_ms: millis(started.saturating_duration_since(ended)),
    })
}
