//! What a chaos run is asked to do: the store, the workers, the faults, the seed.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ChaosError;

/// Which store the run targets, and whether the run owns its server.
#[derive(Clone)]
pub enum StoreSpec {
    /// `sqlite:throwaway`: a fresh database file in the run directory.
    SqliteThrowaway,
    /// `sqlite:PATH`: the caller's file (the run uses a role and log rows of its own).
    Sqlite(String),
    /// `postgres:throwaway`: a throwaway server from the testkit, owned by the run, so
    /// `restart` faults can stop and start it.
    PostgresThrowaway,
    /// `postgres://...`: the caller's server; `restart` is not available.
    Postgres(String),
    /// `etcd:throwaway`: a one-member etcd server from the testkit, owned by the run, so
    /// `restart` faults can stop or kill it and start it again (feature `etcd`).
    EtcdThrowaway,
    /// `etcd://host:port[,...][/prefix]`: the caller's cluster; `restart` is not
    /// available (feature `etcd`).
    Etcd(String),
    /// `kube:throwaway`: a kube-apiserver on its own etcd from the testkit, owned by the
    /// run, so `restart` faults can stop or kill and start the API server or its etcd;
    /// the workers run as a service account bound to tenure's documented Role (leases
    /// only) in a fresh namespace (feature `kube`).
    KubeThrowaway,
    /// `kube:NAMESPACE` (or `kube:`, the configuration's namespace): the caller's cluster,
    /// configured as `kubectl` is; `restart` is not available (feature `kube`). A
    /// namespace named `throwaway` cannot be named this way.
    Kube(String),
}

/// What `--store etcd...` says when this build has no etcd support.
pub const NO_ETCD: &str = "this build of tenure chaos has no etcd support: build tenure with \
    `--features etcd` (its gRPC client needs protoc), or use sqlite:throwaway, \
    postgres:throwaway or postgres://USER@HOST/DB";

/// What `--store kube...` says when this build has no Kubernetes support.
pub const NO_KUBE: &str = "this build of tenure chaos has no Kubernetes support: build tenure \
    with `--features kube` (a default feature), or use sqlite:throwaway, postgres:throwaway \
    or postgres://USER@HOST/DB";

impl fmt::Debug for StoreSpec {
    // The URL may hold a password: only the kind is ever printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

impl StoreSpec {
    /// Parses `--store`.
    pub fn parse(raw: &str) -> Result<Self, ChaosError> {
        Self::parse_unnamed(raw).map_err(naming("--store"))
    }

    fn parse_unnamed(raw: &str) -> Result<Self, ChaosError> {
        let raw = raw.trim();
        let (scheme, rest) = raw.split_once(':').unwrap_or((raw, ""));
        match (scheme, rest) {
            ("sqlite", "throwaway") => Ok(StoreSpec::SqliteThrowaway),
            ("sqlite", _) => Ok(StoreSpec::Sqlite(raw.to_owned())),
            ("postgres" | "postgresql", "throwaway") => Ok(StoreSpec::PostgresThrowaway),
            ("postgres" | "postgresql", _) => {
                // Also keeps sqlx from logging a parameter it does not know, with its value.
                tenure_postgres::connect_options(raw)
                    .map_err(|error| ChaosError::Usage(error.to_string()))?;
                Ok(StoreSpec::Postgres(raw.to_owned()))
            }
            ("etcd", _) if !cfg!(feature = "etcd") => Err(ChaosError::Usage(NO_ETCD.to_owned())),
            ("etcd", "throwaway") => Ok(StoreSpec::EtcdThrowaway),
            ("etcd", _) => {
                #[cfg(feature = "etcd")]
                tenure_etcd::EtcdUrl::parse(raw).map_err(|e| ChaosError::Usage(e.to_string()))?;
                Ok(StoreSpec::Etcd(raw.to_owned()))
            }
            ("kube", _) if !cfg!(feature = "kube") => Err(ChaosError::Usage(NO_KUBE.to_owned())),
            ("kube", "throwaway") => Ok(StoreSpec::KubeThrowaway),
            ("kube", _) => {
                #[cfg(feature = "kube")]
                tenure_kube::KubeUrl::parse(raw).map_err(|e| ChaosError::Usage(e.to_string()))?;
                Ok(StoreSpec::Kube(raw.to_owned()))
            }
            _ => Err(ChaosError::Usage(
                "unknown store for tenure chaos; expected sqlite:throwaway, sqlite:PATH, \
                 postgres:throwaway, postgres://USER@HOST/DB, etcd:throwaway, \
                 etcd://HOST:PORT[/PREFIX], kube:throwaway or kube:NAMESPACE"
                    .to_owned(),
            )),
        }
    }

    /// The kind, for reports (never the URL).
    pub fn describe(&self) -> &'static str {
        match self {
            StoreSpec::SqliteThrowaway => "sqlite (throwaway file)",
            StoreSpec::Sqlite(_) => "sqlite",
            StoreSpec::PostgresThrowaway => "postgres (throwaway server, asynchronous commits)",
            StoreSpec::Postgres(_) => "postgres",
            StoreSpec::EtcdThrowaway => "etcd (throwaway server)",
            StoreSpec::Etcd(_) => "etcd",
            StoreSpec::KubeThrowaway => "kubernetes (throwaway API server)",
            StoreSpec::Kube(_) => "kubernetes",
        }
    }

    /// True for SQLite stores.
    pub fn is_sqlite(&self) -> bool {
        matches!(self, StoreSpec::SqliteThrowaway | StoreSpec::Sqlite(_))
    }

    /// True for etcd stores.
    pub fn is_etcd(&self) -> bool {
        matches!(self, StoreSpec::EtcdThrowaway | StoreSpec::Etcd(_))
    }

    /// True for Kubernetes stores.
    pub fn is_kube(&self) -> bool {
        matches!(self, StoreSpec::KubeThrowaway | StoreSpec::Kube(_))
    }

    /// True when the run starts (and so can restart) the store's server.
    pub fn is_owned(&self) -> bool {
        matches!(
            self,
            StoreSpec::PostgresThrowaway | StoreSpec::EtcdThrowaway | StoreSpec::KubeThrowaway
        )
    }

    /// True when nothing in the store reads the workers' wall clock as time, so a step
    /// of it must change nothing: SQLite, whose store time is the host's monotonic
    /// clock, and Kubernetes, where expiry is judged on each process's monotonic clock.
    /// (PostgreSQL and etcd keep time on the server, which the steps do not reach.)
    pub fn steps_wall_clock(&self) -> bool {
        self.is_sqlite() || self.is_kube()
    }
}

/// One kind of fault the nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGSTOP a worker's process group (the leader when known) for 1-3x the TTL.
    Pause,
    /// SIGKILL a worker and start a new incarnation in its slot.
    Kill,
    /// Stop (or kill) and start the store server (owned PostgreSQL or etcd; on
    /// Kubernetes the API server or its etcd); on SQLite, SIGKILL the leader, which
    /// writes continuously and so is almost always mid-transaction.
    Restart,
    /// Sever the workers' connections to the store (see [`CutFlavour`]).
    Cut,
    /// Hold a lease's row locked for 1-3x the TTL, as a client stalled inside a
    /// transaction would (SQL stores): on PostgreSQL a transaction of the nemesis's takes
    /// the row of the role (in shard mode, of one shard) `FOR UPDATE`; on SQLite it takes
    /// the file's write lock (`BEGIN IMMEDIATE`), or in turn with that a leader's disk
    /// stalls (`lock/disk`: its own commit hangs at the sync holding the write lock and
    /// lands when the disk answers) or fails (`lock/disk-error`: every sync answers EIO),
    /// see [`crate::disk`]. On a PostgreSQL server the run owns, in turn with the row
    /// lock, the server's WAL disk stalls (`lock/wal-disk`): every commit hangs inside
    /// the server, reads still answer. On an etcd server the run owns (and the
    /// Kubernetes API server's etcd) every lock is its WAL disk stalling for the lock's
    /// length, through etcd's failpoint (`lock/wal-disk`: every write, and every
    /// linearizable read, hangs inside the server). Calls on that
    /// row (SQLite and a stalled WAL disk: every write) wait in the store, their callers
    /// give up on them, and whatever still waits runs when the lock is freed.
    Lock,
    /// Step the workers' wall clock by 2-4x the TTL, forward from an offset at or
    /// below zero and back from one above (workers run under libfaketime with one
    /// offset file; their monotonic clock is untouched, as in an NTP step). SQLite, whose
    /// store time lives on the workers' host, and Kubernetes, whose expiry is judged on
    /// the workers' monotonic clocks (see [`StoreSpec::steps_wall_clock`]).
    Clock,
    /// Ask the leader, through the store as `tenure handoff` does, to hand its term to
    /// the worker that has waited longest (a planned handoff: its work stops, then one
    /// store write passes the term on). One role only: a shard group's shards move by
    /// placement.
    Handoff,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [FaultKind; 7] = [
        FaultKind::Pause,
        FaultKind::Kill,
        FaultKind::Restart,
        FaultKind::Cut,
        FaultKind::Lock,
        FaultKind::Clock,
        FaultKind::Handoff,
    ];

    /// The flag spelling.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Pause => "pause",
            FaultKind::Kill => "kill",
            FaultKind::Restart => "restart",
            FaultKind::Cut => "cut",
            FaultKind::Lock => "lock",
            FaultKind::Clock => "clock",
            FaultKind::Handoff => "handoff",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultKind {
    type Err = ChaosError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        FaultKind::ALL
            .into_iter()
            .find(|kind| kind.name() == raw.trim())
            .ok_or_else(|| {
                ChaosError::Usage(format!(
                    "unknown fault {:?}; expected pause, kill, restart, cut, lock, clock or handoff",
                    raw.chars().take(20).collect::<String>()
                ))
            })
    }
}

/// How a `cut` severs the workers from the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CutFlavour {
    /// The proxy resets every current connection.
    Drop,
    /// The proxy stops forwarding (sockets stay open) for 1-3x the TTL, then heals.
    Blackhole,
    /// The same for one worker's connections only (the leader's when known): its process
    /// runs on, its calls hang and are delivered on the heal, and the others reach the
    /// store as before, as with one host's wedged socket or a link that stops carrying.
    /// In a shard group the odd slots heartbeat straight to the store, around their
    /// proxies: a wedge of one of those, reported as `wedge-store`, stalls the member's
    /// session and writes while its heartbeats go on.
    Wedge,
    /// PostgreSQL ends every worker backend (`pg_terminate_backend`).
    Terminate,
}

impl CutFlavour {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            CutFlavour::Drop => "drop",
            CutFlavour::Blackhole => "blackhole",
            CutFlavour::Wedge => "wedge",
            CutFlavour::Terminate => "terminate",
        }
    }
}

/// Puts the flag in front of a usage error's message.
fn naming(flag: &'static str) -> impl Fn(ChaosError) -> ChaosError {
    move |error| match error {
        ChaosError::Usage(message) => ChaosError::Usage(format!("{flag}: {message}")),
        other => other,
    }
}

/// Parses `pause,kill,...` (no duplicates, at least one).
pub fn parse_faults(raw: &str) -> Result<Vec<FaultKind>, ChaosError> {
    let mut kinds = Vec::new();
    for part in raw.split(',').filter(|p| !p.trim().is_empty()) {
        let kind: FaultKind = part.parse().map_err(naming("--faults"))?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    if kinds.is_empty() {
        return Err(ChaosError::Usage(
            "--faults names no fault; expected a list such as pause,kill,restart,cut".to_owned(),
        ));
    }
    kinds.sort();
    Ok(kinds)
}

/// A whole chaos run.
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    /// The store.
    pub store: StoreSpec,
    /// Worker processes contending at once (one per slot).
    pub workers: usize,
    /// Shard mode: every worker is a member of one shard group of this many shards
    /// ([`tenure::ShardElector`]) and writes to each owned shard's fenced log; `None`:
    /// the workers contend for one role.
    pub shards: Option<u32>,
    /// How long faults are injected.
    pub duration: Duration,
    /// Lease TTL; renewals every TTL/4, retries every TTL/2.
    pub ttl: Duration,
    /// Mean time between faults (each gap is uniform in 0.5x..1.5x of it).
    pub fault_every: Duration,
    /// The fault kinds to inject.
    pub faults: Vec<FaultKind>,
    /// The schedule's seed.
    pub seed: u64,
    /// How long a leader waits between writes (shard mode: per owned shard).
    pub write_every: Duration,
    /// Negative control: workers write without the fence.
    pub unsafe_skip_fence: bool,
    /// How long a SQLite statement waits for another process's write lock; `None`
    /// means TTL/2, below the elector's local window (see [`crate::backend::Backend::open`]).
    pub sqlite_busy_timeout: Option<Duration>,
    /// The program to run as a worker and the arguments that put it in worker mode
    /// (`tenure chaos-worker`).
    pub worker_command: (PathBuf, Vec<String>),
    /// Where histories and worker logs go; a fresh temporary directory when `None`.
    pub run_dir: Option<PathBuf>,
}

impl ChaosConfig {
    /// The elector's renew interval for the TTL.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 4
    }

    /// The elector's retry interval for the TTL.
    pub fn retry_every(&self) -> Duration {
        self.ttl / 2
    }

    /// The SQLite busy timeout in force.
    pub fn sqlite_busy(&self) -> Duration {
        self.sqlite_busy_timeout.unwrap_or(self.ttl / 2)
    }

    /// Checks the numbers; errors name the flag.
    pub fn validate(&self) -> Result<(), ChaosError> {
        let usage = |m: &str| Err(ChaosError::Usage(m.to_owned()));
        if !(2..=64).contains(&self.workers) {
            return usage("--workers must be between 2 and 64");
        }
        if let Some(shards) = self.shards {
            if !(1..=tenure::shard::MAX_SHARDS).contains(&shards) {
                return Err(ChaosError::Usage(format!(
                    "--shards must be between 1 and {} (got {shards})",
                    tenure::shard::MAX_SHARDS
                )));
            }
        }
        if self.ttl < Duration::from_millis(200) {
            return usage("--ttl must be at least 200ms");
        }
        if self.duration.is_zero() {
            return usage("--duration must be greater than 0s");
        }
        if self.fault_every < Duration::from_millis(10) {
            return usage("--fault-every must be at least 10ms");
        }
        if self.write_every.is_zero() {
            return usage("--write-every must be greater than 0s");
        }
        if self.faults.is_empty() {
            return usage("--faults names no fault");
        }
        if self.store.is_etcd() && (self.ttl.subsec_nanos() != 0 || self.ttl.is_zero()) {
            return usage("--ttl must be whole seconds on etcd (etcd leases count seconds)");
        }
        if self.store.is_kube() && (self.ttl.subsec_nanos() != 0 || self.ttl.is_zero()) {
            return usage(
                "--ttl must be whole seconds on Kubernetes (Lease objects count \
                 leaseDurationSeconds)",
            );
        }
        Ok(())
    }
}
