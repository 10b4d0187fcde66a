//! # tenure-bench: what a store costs per operation and how fast it fails over
//!
//! The library behind `tenure bench`. Shared machines are noisy, so every figure stands
//! beside a baseline measured in the same process and the same minute:
//!
//! - **throughput and latency** of acquire, renew, release and heartbeat at each client
//!   count, in short rounds that alternate the store with the **raw** store (the
//!   backend's own statements issued directly with sqlx, the etcd store's own
//!   requests issued directly with etcd-client, or a bare locked map for the in-memory
//!   store), reported as medians and a median per-round ratio;
//! - **round trips per operation**: PostgreSQL statements from `pg_stat_statements`,
//!   etcd gRPC requests from the servers' `grpc_server_handled_total`, Kubernetes Lease
//!   requests from the API server's `apiserver_request_total`;
//! - **the herd** (`tenure bench --herd`, [`herd`]): one handover's requests and latency
//!   with 30 or 100 contenders waiting, with the queue and without it;
//! - **failover**: release -> successor's work running (two electors, retry interval
//!   60 s, so only the push path counts) beside the floor measured in the same run (for
//!   etcd: its own election API, `resign` -> a waiting `campaign`), and stall ->
//!   successor's work running, as the excess over the TTL, beside the bound TTL + retry
//!   interval.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure_bench::BenchError> {
//! use tenure_bench::{BenchConfig, StoreSpec};
//!
//! let mut config = BenchConfig::new(StoreSpec::parse("sqlite:throwaway")?);
//! config.trials = 20;
//! let report = tenure_bench::run(config).await?;
//! print!("{}", report.render());
//! # Ok(()) }
//! ```
//!
//! Throwaway stores (`sqlite:throwaway`, `postgres:throwaway`, `etcd:throwaway`,
//! `kube:throwaway`) are created by the run and removed when it ends. On a store of the
//! user's, the bench writes roles and nodes named `tb<run id>-...` (PostgreSQL: in schema
//! `tenure_bench`; etcd: under the URL's prefix plus `/tenure-bench`, removed when the run
//! ends; Kubernetes: Lease objects in the named namespace, deleted when the run ends if
//! the account may delete them).
//!
//! etcd needs the `etcd` cargo feature (its gRPC client needs protoc to build), Kubernetes
//! the `kube` feature; without them such a store is a usage error.
#![deny(missing_docs)]

mod backend;
pub mod config;
mod driver;
#[cfg(feature = "etcd")]
mod etcd;
mod failover;
pub mod herd;
#[cfg(any(feature = "etcd", feature = "kube"))]
mod http;
#[cfg(feature = "kube")]
mod kube;
mod machine;
mod memory;
pub mod plot;
mod postgres;
pub mod report;
pub mod shards;
mod sqlite;
pub mod stats;

use std::time::{Duration, SystemTime};

pub use config::{parse_clients, BenchConfig, StoreSpec};
pub use herd::{HerdBench, HerdReport};
pub use machine::Machine;
pub use report::Report;
pub use shards::{ShardBench, ShardReport};

use crate::backend::Backend;

/// Without the `etcd` feature, etcd is parsed (so the message is specific) but refused.
#[cfg(not(feature = "etcd"))]
const ETCD_NOT_BUILT: &str = "--store etcd: this build of tenure bench has no etcd support; \
                              build it with `--features etcd` (needs protoc)";

/// Without the `kube` feature, Kubernetes is parsed (so the message is specific) but
/// refused.
#[cfg(not(feature = "kube"))]
const KUBE_NOT_BUILT: &str = "--store kube: this build of tenure bench has no Kubernetes \
                              support; build it with `--features kube`";

/// Why a bench run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A bad setting; the message names the flag. Nothing was created.
    #[error("{0}")]
    Usage(String),
    /// The store failed (or could not be reached) while measuring.
    #[error(transparent)]
    Store(#[from] tenure::Error),
    /// A throwaway store could not be set up.
    #[error("cannot set up the store: {0}")]
    Setup(String),
}

/// Runs every section against the configured store and returns the report.
pub async fn run(config: BenchConfig) -> Result<Report, BenchError> {
    config.validate()?;
    let load_before = machine::load_average();
    let run_id = run_id();
    let backend = open(&config, &run_id).await?;
    let version = backend.version().await;
    tracing::info!(store = config.store.describe(), "measuring throughput");
    let throughput = driver::throughput(&*backend, &config, &run_id).await?;
    tracing::info!("counting round trips");
    let round_trips = driver::round_trips(&*backend, &run_id).await?;
    tracing::info!("measuring failover");
    let failover = failover::measure(&*backend, &config, &run_id).await?;
    let machine = machine::Machine::describe(load_before, version);
    let report = Report {
        store: config.store.describe().to_owned(),
        machine,
        settings: report::Settings {
            clients: config.clients.clone(),
            duration_ms: millis(config.duration),
            rounds: config.rounds(),
            roles: config.roles,
            trials: config.trials,
            ttl_ms: millis(config.ttl()),
        },
        raw_baseline: backend.raw_label().to_owned(),
        throughput,
        round_trips,
        failover,
    };
    backend.close().await;
    Ok(report)
}

/// Runs the shard-group scenarios of [`shards`] against the configured store.
pub async fn run_shards(
    config: BenchConfig,
    bench: ShardBench,
) -> Result<(Machine, ShardReport), BenchError> {
    config.validate()?;
    bench.validate(&config.store)?;
    let load_before = machine::load_average();
    let run_id = run_id();
    let backend = open(&config, &run_id).await?;
    let version = backend.version().await;
    let report = shards::measure(&*backend, &bench, &run_id).await;
    backend.close().await;
    Ok((machine::Machine::describe(load_before, version), report?))
}

/// Runs the herd scenario of [`herd`] against the configured store.
pub async fn run_herd(
    config: BenchConfig,
    bench: HerdBench,
) -> Result<(Machine, HerdReport), BenchError> {
    config.validate()?;
    bench.validate()?;
    let load_before = machine::load_average();
    let run_id = run_id();
    let backend = open(&config, &run_id).await?;
    let version = backend.version().await;
    let report = herd::measure(&*backend, &bench, config.store.describe(), &run_id).await;
    backend.close().await;
    Ok((machine::Machine::describe(load_before, version), report?))
}

async fn open(config: &BenchConfig, run_id: &str) -> Result<Box<dyn Backend>, BenchError> {
    Ok(match &config.store {
        StoreSpec::Memory => Box::new(memory::Memory::new()?),
        StoreSpec::Sqlite(url) => Box::new(sqlite::Sqlite::open(url, None).await?),
        StoreSpec::SqliteThrowaway => Box::new(sqlite::Sqlite::throwaway(run_id).await?),
        StoreSpec::Postgres(url) => Box::new(postgres::Postgres::open(url, None).await?),
        StoreSpec::PostgresThrowaway => Box::new(postgres::Postgres::throwaway().await?),
        #[cfg(feature = "etcd")]
        StoreSpec::Etcd(url) => Box::new(etcd::Etcd::open(url, run_id, None).await?),
        #[cfg(feature = "etcd")]
        StoreSpec::EtcdThrowaway => Box::new(etcd::Etcd::throwaway(run_id).await?),
        #[cfg(not(feature = "etcd"))]
        StoreSpec::Etcd(_) | StoreSpec::EtcdThrowaway => {
            return Err(BenchError::Usage(ETCD_NOT_BUILT.to_owned()))
        }
        #[cfg(feature = "kube")]
        StoreSpec::Kube(url) => Box::new(kube::Kube::open(url, run_id).await?),
        #[cfg(feature = "kube")]
        StoreSpec::KubeThrowaway => Box::new(kube::Kube::throwaway(run_id).await?),
        #[cfg(not(feature = "kube"))]
        StoreSpec::Kube(_) | StoreSpec::KubeThrowaway => {
            return Err(BenchError::Usage(KUBE_NOT_BUILT.to_owned()))
        }
    })
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A short id that keeps this run's roles apart from earlier runs on the same store.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!("tb{:x}{:05x}", std::process::id(), nanos & 0xf_ffff)
}
