//! `tenure chaos` and its hidden worker mode: the CLI face of `tenure-chaos`.
//!
//! `tenure chaos` re-executes this binary as `tenure chaos-worker` for every worker
//! process, with the store URL in `TENURE_STORE` (never on a command line) and, for a
//! throwaway Kubernetes API server, the tenant's kubeconfig in `KUBECONFIG`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tenure_chaos::{ChaosConfig, ChaosError, StoreSpec};

use crate::parse::parse_duration;
use crate::{exit, UsageError};

/// `tenure chaos` flags.
#[derive(Args, Debug)]
pub struct ChaosArgs {
    /// The store. Owned by the run, so `restart` works: sqlite:throwaway,
    /// postgres:throwaway, etcd:throwaway, kube:throwaway (a kube-apiserver and its etcd;
    /// the workers run as a service account allowed leases only, in a fresh namespace).
    /// Not owned: sqlite:PATH, postgres://USER@HOST/DB, etcd://HOST:PORT[/PREFIX],
    /// kube:NAMESPACE (the cluster of your kubeconfig, found as kubectl finds it). etcd
    /// needs a build with `--features etcd`; TTLs are whole seconds on etcd and
    /// Kubernetes.
    #[arg(long, env = "TENURE_STORE", hide_env_values = true)]
    store: String,
    /// Worker processes contending for the role (with --shards: members of the group).
    #[arg(long, default_value_t = 5)]
    workers: usize,
    /// Shard mode: the workers are members of one shard group of N shards
    /// (1..=100000), each writing to the fenced log of every shard it owns; the report
    /// adds the time to re-own a killed or paused member's shards.
    #[arg(long, value_name = "N")]
    shards: Option<u32>,
    /// How long to inject faults.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Lease TTL (renew every TTL/4, retry every TTL/2).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    ttl: Duration,
    /// Fault kinds to inject, comma-separated. `cut` goes through a loopback proxy in
    /// front of the store (connections reset, or blackholed for 1-3x the TTL: every
    /// worker's, or one worker's alone, a wedge) and, on PostgreSQL, also
    /// `pg_terminate_backend`. `lock` (SQL stores) holds a lease's row (SQLite: the file's
    /// write lock, half the time through a leader whose disk stalls inside its commit)
    /// for 1-3x the TTL, as a client stalled in a transaction would; on
    /// postgres:throwaway half of them stall the server's disk instead (every commit
    /// hangs inside the server), and on etcd:throwaway and kube:throwaway every one
    /// stalls the (API server's) etcd's disk through etcd's failpoint (the etcd of
    /// scripts/build-servers; every write hangs inside the server). `clock` (SQLite and
    /// Kubernetes, where no decision reads a wall clock) steps the workers' wall clock by 2-4x the TTL, forward
    /// and back, through libfaketime. `restart` stops or kills the server; on
    /// kube:throwaway the API server or its etcd. The postgres:throwaway server commits
    /// asynchronously, so a kill loses every commit of its last seconds not made durable
    /// by its connection, as tenure's are. `handoff` asks the leader, through the store
    /// as `tenure handoff` does, to hand its term to the worker that waited longest (one
    /// role only).
    #[arg(long, default_value = "pause,kill,restart,cut,handoff")]
    faults: String,
    /// Mean time between faults (default: TTL/4).
    #[arg(long, value_parser = parse_duration)]
    fault_every: Option<Duration>,
    /// Pause between a leader's writes (with --shards: per owned shard).
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    write_every: Duration,
    /// Seed of the fault plan (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Negative control: workers write WITHOUT the fence; the checker must report
    /// violations under pauses.
    #[arg(long)]
    unsafe_skip_fence: bool,
    /// How long a SQLite statement waits for the file's write lock (default: TTL/2).
    /// Above the TTL, an acquire the elector abandons can leave the lock held for good.
    #[arg(long, value_parser = parse_duration)]
    sqlite_busy_timeout: Option<Duration>,
    /// Keep histories and worker logs in this directory (default: a temporary one,
    /// removed when the run passes).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write the run as pictures into this directory (created if missing): timeline.html
    /// (a lane per worker incarnation with its terms, the faults and the fence's
    /// refusals), recovery-KIND.svg per fault kind, and report.json.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
}

/// `tenure chaos-worker` flags (set by `tenure chaos`; see `tenure_chaos::worker`).
#[derive(Args, Debug)]
pub struct WorkerFlags {
    #[arg(long)]
    role: String,
    #[arg(long)]
    shards: Option<u32>,
    #[arg(long)]
    name: String,
    #[arg(long)]
    history: PathBuf,
    #[arg(long)]
    ttl_ms: u64,
    #[arg(long)]
    write_every_ms: u64,
    #[arg(long)]
    app_name: String,
    #[arg(long)]
    unsafe_skip_fence: bool,
    #[arg(long)]
    sqlite_busy_ms: u64,
    /// Proxies to reach the store through, comma-separated `IP:PORT`s.
    #[arg(long, value_delimiter = ',')]
    via: Vec<std::net::SocketAddr>,
    /// Shard mode: heartbeat over a connection of its own, not through `--via`.
    #[arg(long)]
    registry_direct: bool,
}

fn usage(error: ChaosError) -> anyhow::Error {
    match error {
        ChaosError::Usage(message) => UsageError(message).into(),
        other => other.into(),
    }
}

/// Runs `tenure chaos`; exit 0 when the checker found nothing, 1 on any violation.
pub fn run(args: ChaosArgs) -> anyhow::Result<u8> {
    let store = StoreSpec::parse(&args.store).map_err(usage)?;
    let faults = tenure_chaos::parse_faults(&args.faults).map_err(usage)?;
    let seed = args.seed.unwrap_or_else(rand::random);
    let config = ChaosConfig {
        store,
        workers: args.workers,
        shards: args.shards,
        duration: args.duration,
        ttl: args.ttl,
        fault_every: args.fault_every.unwrap_or(args.ttl / 4),
        faults,
        seed,
        write_every: args.write_every,
        unsafe_skip_fence: args.unsafe_skip_fence,
        sqlite_busy_timeout: args.sqlite_busy_timeout,
        worker_command: (std::env::current_exe()?, vec!["chaos-worker".to_owned()]),
        run_dir: args.dir,
    };
    config.validate().map_err(usage)?;
    let report_dir = args
        .report
        .as_deref()
        .map(crate::report_dir::prepare)
        .transpose()?;
    if !args.json {
        eprintln!("tenure chaos: seed {seed}");
    }
    let report = crate::runtime()?
        .block_on(tenure_chaos::run(config))
        .map_err(usage)?;
    crate::output::print_report(&report, args.json, || report.render())?;
    if let Some(dir) = report_dir {
        let files = report.write_dir(&dir)?;
        crate::report_dir::announce(&dir, &files);
    }
    Ok(if report.passed() {
        exit::OK
    } else {
        exit::FAILURE
    })
}

/// Runs one worker process until SIGTERM.
pub fn worker(flags: WorkerFlags) -> anyhow::Result<u8> {
    let store_url = std::env::var("TENURE_STORE")
        .map_err(|_| UsageError("chaos-worker needs TENURE_STORE".to_owned()))?;
    let args = tenure_chaos::worker::WorkerArgs {
        store_url,
        role: flags.role,
        shards: flags.shards,
        name: flags.name,
        history: flags.history,
        ttl: Duration::from_millis(flags.ttl_ms),
        write_every: Duration::from_millis(flags.write_every_ms),
        app_name: flags.app_name,
        unsafe_skip_fence: flags.unsafe_skip_fence,
        sqlite_busy: Duration::from_millis(flags.sqlite_busy_ms),
        via: flags.via,
        registry_direct: flags.registry_direct,
    };
    crate::runtime()?
        .block_on(tenure_chaos::worker::run(args))
        .map_err(usage)?;
    Ok(exit::OK)
}
