//! `tenure bench`: the CLI face of `tenure-bench`.
//!
//! The store must be named with `--store` (never taken from `TENURE_STORE`), so a
//! bench cannot land on a production store by accident.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tenure_bench::{BenchConfig, BenchError, StoreSpec};

use crate::{exit, parse_duration, UsageError};

/// `tenure bench` flags.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The store: memory:, sqlite:PATH, sqlite:throwaway, postgres://USER@HOST/DB,
    /// postgres:throwaway, etcd://HOST:PORT[/PREFIX] or etcd:throwaway (etcd needs a build
    /// with --features etcd; throwaway stores are created and removed by the run).
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
    /// Failover lease TTL (default 300ms; on etcd 1s, its smallest).
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also write into this directory (created if missing) latency-OP.svg per operation
    /// (store against raw latency percentiles at each client count) and report.json.
    #[arg(long, value_name = "DIR")]
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(tenure_bench::run(config)).map_err(usage)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    if let Some(dir) = report_dir {
        let files = report.write_dir(&dir)?;
        crate::report_dir::announce(&dir, &files);
    }
    Ok(exit::OK)
}
