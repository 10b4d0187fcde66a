//! `tenure bench`: the CLI face of `tenure-bench`.
//!
//! The store must be named with `--store` (never taken from `TENURE_STORE`), so a
//! bench cannot land on a production store by accident.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tenure_bench::{BenchConfig, BenchError, HerdBench, ShardBench, StoreSpec};

use crate::parse::parse_duration;
use crate::{exit, UsageError};

/// `tenure bench` flags.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The store: memory:, sqlite:PATH, sqlite:throwaway, postgres://USER@HOST/DB,
    /// postgres:throwaway, etcd://HOST:PORT[/PREFIX], etcd:throwaway, kube:NAMESPACE or
    /// kube:throwaway (etcd needs a build with --features etcd; throwaway stores are
    /// created and removed by the run: kube:throwaway starts the kube-apiserver and etcd
    /// that scripts/build-servers builds and measures as a service account holding only
    /// the documented Role; kube:NAMESPACE writes Lease objects into that namespace of
    /// the cluster the kubeconfig reaches, best a namespace of their own).
    #[arg(long)]
    store: String,
    /// Client counts (tokio tasks in this process), comma-separated.
    #[arg(long, default_value = "1,16")]
    clients: String,
    /// Measuring time per operation and client count (store and raw together).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    duration: Duration,
    /// Distinct roles the renewing clients spread over (default: one per client).
    #[arg(long)]
    roles: Option<usize>,
    /// Failover trials of each kind (release, stall).
    #[arg(long, default_value_t = 100)]
    trials: usize,
    /// Failover lease TTL (default 300ms; on etcd and Kubernetes 1s, their smallest: they
    /// take whole seconds).
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Measure shard groups instead: N shards held by --members members beside N
    /// per-role electors over --window, then (64 shards) a cold start of 4 members, a
    /// 5th joining, a member killed, and one of 30 leaving. Goals: BENCHMARKS.md.
    #[arg(long)]
    shards: Option<u32>,
    /// Members holding the --shards shards.
    #[arg(long, requires = "shards", default_value_t = 1)]
    members: usize,
    /// How long to measure the settled hold.
    #[arg(long, requires = "shards", default_value = "60s", value_parser = parse_duration)]
    window: Duration,
    /// Renew interval of the hold (its TTL is three times this, which etcd and Kubernetes
    /// take in whole seconds: 1s, 2s...).
    #[arg(long, requires = "shards", default_value = "2s", value_parser = parse_duration)]
    renew_every: Duration,
    /// Skip the per-role electors beside the shard group.
    #[arg(long, requires = "shards")]
    no_baseline: bool,
    /// Skip the churn and leave scenarios.
    #[arg(long, requires = "shards")]
    no_churn: bool,
    /// Also run the group beside a wedged member (one that heartbeats into it but never
    /// runs its work or answers a handover) for this long, and report how much of the
    /// time each shard ran on a working member (goal: 99% over 10m).
    #[arg(long, requires = "shards", value_parser = parse_duration)]
    wedged: Option<Duration>,
    /// Measure the herd instead: for each contender count (comma-separated, e.g.
    /// 30,100), that many electors wait on one role and each leads once; reports one
    /// handover's requests and release -> successor latency, with the queue and without
    /// it, in alternating rounds.
    #[arg(long, value_name = "COUNTS", conflicts_with = "shards")]
    herd: Option<String>,
    /// Rounds per contender count and mode of --herd.
    #[arg(long, requires = "herd", default_value_t = 2)]
    herd_rounds: usize,
    /// How long each term's work runs in --herd.
    #[arg(long, requires = "herd", default_value = "5ms", value_parser = parse_duration)]
    herd_work: Duration,
    /// Also write into this directory (created if missing) latency-OP.svg per operation
    /// (store against raw latency percentiles at each client count) and report.json.
    #[arg(long, value_name = "DIR", conflicts_with = "shards")]
    report: Option<PathBuf>,
}

fn usage(error: BenchError) -> anyhow::Error {
    match error {
        BenchError::Usage(message) => UsageError(message).into(),
        other => other.into(),
    }
}

/// Runs `tenure bench`: the report on stdout, progress on stderr.
pub fn run(args: BenchArgs) -> anyhow::Result<u8> {
    let store = StoreSpec::parse(&args.store).map_err(usage)?;
    let config = BenchConfig {
        clients: tenure_bench::parse_clients(&args.clients).map_err(usage)?,
        duration: args.duration,
        roles: args.roles,
        trials: args.trials,
        ttl: args.ttl,
        ..BenchConfig::new(store)
    };
    config.validate().map_err(usage)?;
    if let Some(shards) = args.shards {
        return run_shards(&args, config, shards);
    }
    if let Some(counts) = &args.herd {
        return run_herd(&args, config, counts);
    }
    let report_dir = args
        .report
        .as_deref()
        .map(crate::report_dir::prepare)
        .transpose()?;
    eprintln!(
        "tenure bench: measuring {} at {:?} clients, {} per operation, {} failover trials",
        config.store.describe(),
        config.clients,
        crate::output::human(config.duration),
        config.trials
    );
    // Two workers, as the machines this is meant for have: the clients and the
    // store's own tasks share them, as they would in a service.
    let report = runtime()?
        .block_on(tenure_bench::run(config))
        .map_err(usage)?;
    crate::output::print_report(&report, args.json, || report.render())?;
    if let Some(dir) = report_dir {
        let files = report.write_dir(&dir)?;
        crate::report_dir::announce(&dir, &files);
    }
    Ok(exit::OK)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// `tenure bench --herd N,M`: the herd scenario only.
fn run_herd(args: &BenchArgs, config: BenchConfig, counts: &str) -> anyhow::Result<u8> {
    let contenders = tenure_bench::parse_clients(counts).map_err(|_| {
        UsageError(format!(
            "--herd: expected contender counts such as 30,100, got {counts:?}"
        ))
    })?;
    let bench = HerdBench {
        contenders,
        rounds: args.herd_rounds,
        work: args.herd_work,
    };
    bench.validate().map_err(usage)?;
    eprintln!(
        "tenure bench: the herd on {}: {:?} contenders, {} rounds each with and without the queue",
        config.store.describe(),
        bench.contenders,
        bench.rounds
    );
    let (machine, report) = runtime()?
        .block_on(tenure_bench::run_herd(config, bench))
        .map_err(usage)?;
    let value = serde_json::json!({ "machine": machine, "herd": report });
    print_then_fail(
        args,
        &value,
        || report.render(),
        &report.failed,
        "herd rounds",
    )
}

/// `tenure bench --shards N`: the shard scenarios only.
fn run_shards(args: &BenchArgs, config: BenchConfig, shards: u32) -> anyhow::Result<u8> {
    let bench = ShardBench {
        members: args.members,
        window: args.window,
        hold_ttl: args.renew_every * 3,
        renew_every: args.renew_every,
        churn_ttl: args.ttl.unwrap_or(ShardBench::new(shards).churn_ttl),
        baseline: !args.no_baseline,
        churn: !args.no_churn,
        wedged: args.wedged,
        ..ShardBench::new(shards)
    };
    bench.validate(&config.store).map_err(usage)?;
    eprintln!(
        "tenure bench: {} shards over {} member(s) on {}, {} window{}{}",
        shards,
        bench.members,
        config.store.describe(),
        crate::output::human(bench.window),
        if bench.baseline {
            ", beside per-role electors"
        } else {
            ""
        },
        if bench.churn {
            ", then churn and leave"
        } else {
            ""
        },
    );
    if let Some(length) = bench.wedged {
        eprintln!(
            "tenure bench: then the same group beside a wedged member, for {}",
            crate::output::human(length)
        );
    }
    let (machine, report) = runtime()?
        .block_on(tenure_bench::run_shards(config, bench))
        .map_err(usage)?;
    let value = serde_json::json!({ "machine": machine, "shards": report });
    print_then_fail(
        args,
        &value,
        || report.render(),
        &report.failed,
        "of the shard scenarios",
    )
}

/// Prints a scenario run's report (`value` as JSON, else `render`), then fails the run
/// if any of its parts (`failed`, each with why) did: the report comes first, so what
/// was measured is not lost to the failure.
fn print_then_fail(
    args: &BenchArgs,
    value: &serde_json::Value,
    render: impl FnOnce() -> String,
    failed: &[String],
    what: &str,
) -> anyhow::Result<u8> {
    crate::output::print_report(value, args.json, render)?;
    if !failed.is_empty() {
        anyhow::bail!(
            "{} {what} failed (the report above has what was measured): {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(exit::OK)
}
