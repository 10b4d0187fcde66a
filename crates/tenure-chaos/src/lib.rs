//! # tenure-chaos: fault injection that checks tenure's invariants on a real store
//!
//! `tenure chaos` runs worker processes (the `tenure` binary as `tenure chaos-worker`)
//! that contend for one role through [`tenure::LeaseLeaderElector`] and, while leading,
//! append `(worker, token, seq)` entries to a log inside fenced transactions (SQL: a
//! table; etcd: one key per entry; Kubernetes: Lease objects, one conditional write per
//! entry; see [`backend`]). With `--shards N`
//! ([`ChaosConfig::shards`]) every worker is instead a member of one shard group
//! ([`tenure::ShardElector`], node id = the incarnation's name, member TTL = lease TTL)
//! and writes, per owned shard term, to that shard's log, fenced on the shard's own role
//! `G/k`; the checker checks every shard as one role, and the report adds the time to
//! re-own a struck member's shards. A seeded nemesis pauses (SIGSTOP)
//! the leader, kills workers, restarts the store's server (when the run owns it),
//! severs connections (through a [`proxy`] in front of the store for each worker:
//! every worker's, or one worker's alone; or `pg_terminate_backend`), holds a lease's
//! row (SQLite: the file's write lock, or a leader's [`disk`] that stops answering inside
//! its commit, or fails its syncs) as a stalled transaction would, and, on SQLite
//! and Kubernetes, steps the workers' wall clock (through [`faketime`]); afterwards the [`checker`] verifies the invariants of
//! `docs/semantics.md` over the workers' histories, the log and the lease as observed
//! (the orchestrator also keeps a [`tenure::LeaseCopy`] of the watched leases by reads of
//! changes, which must not stay behind its complete readings: `stale_copy`; in shard
//! mode it reads the live members too, and a killed or stopped member must leave them
//! within its TTL: `ghost_member`, see [`checker::membership`]).
//! [`Report::write_dir`] draws the run ([`timeline`]: a page with a lane per worker
//! incarnation, and a recovery chart per fault kind) for `tenure chaos --report DIR`.
//!
//! Stores: `sqlite:throwaway` (a fresh file), `sqlite:PATH`, `postgres:throwaway`,
//! `etcd:throwaway` and `kube:throwaway` (throwaway servers the run owns, so `restart`
//! can stop or kill and start them; on Kubernetes the API server or its etcd),
//! `postgres://...`, `etcd://...` and `kube:NAMESPACE` (no `restart`). etcd needs the
//! `etcd` cargo feature (its gRPC client needs protoc), Kubernetes the `kube` feature;
//! without it such a store is a usage error that names the feature. On a throwaway API
//! server the workers run as a service account holding only tenure's documented Role
//! (leases) in a fresh namespace, so a passing run also shows that Role suffices.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure_chaos::ChaosError> {
//! use std::time::Duration;
//! use tenure_chaos::{ChaosConfig, FaultKind, StoreSpec};
//!
//! let report = tenure_chaos::run(ChaosConfig {
//!     store: StoreSpec::parse("sqlite:throwaway")?,
//!     workers: 5,
//!     shards: None,
//!     duration: Duration::from_secs(20),
//!     ttl: Duration::from_secs(1),
//!     fault_every: Duration::from_millis(250),
//!     faults: vec![FaultKind::Pause, FaultKind::Kill, FaultKind::Restart],
//!     seed: 42,
//!     write_every: Duration::from_millis(10),
//!     unsafe_skip_fence: false,
//!     sqlite_busy_timeout: None,
//!     worker_command: (std::env::current_exe().unwrap(), vec!["chaos-worker".into()]),
//!     run_dir: None,
//! })
//! .await?;
//! print!("{}", report.render());
//! assert!(report.passed());
//! # Ok(()) }
//! ```
//!
//! ## What it found
//!
//! On SQLite, with the default 5 s busy timeout, a worker paused while holding the
//! file's write lock makes every other worker's `BEGIN IMMEDIATE` wait; the elector
//! abandons an acquire that has not answered within its local window (about the TTL),
//! and when the abandoned `BEGIN IMMEDIATE` later gets the lock, its transaction stays
//! open on a pooled connection and holds the write lock for good: the store wedges (no
//! safety violation; every later fault shows as unrecovered). A pause *during* an
//! acquire does the same without any busy wait: on SIGCONT the elector's timeout has
//! already expired and the in-flight `BEGIN IMMEDIATE` is dropped. tenure-sqlite's
//! `begin_immediate` is now cancel-safe (a dropped begin finishes or rolls back on its own
//! task), and the workers hand the elector the store as it is: three seeded SQLite runs
//! of pauses, kills and kills mid-transaction (701 faults, one with the 5 s busy timeout)
//! ended with no violation and every fault recovered. Workers still run their own writes
//! with a busy timeout of TTL/2, below the elector's local window.
//!
//! ## Recovery times
//!
//! The report gives, per fault (and flavour: `cut/blackhole`, `restart/kill`), the time
//! from the fault (restart and cut but a wedge: from its heal) to the next admitted write. With a
//! fault every fraction of a TTL, most of these windows hold further faults (a server
//! restart alone takes 0.2 s on PostgreSQL, about 1 s on etcd, seconds on a
//! kube-apiserver), so p99 over all samples measures fault bursts, not one fault; the
//! `isolated` columns keep only samples no other fault struck into. A restart runs beside
//! the nemesis, which goes on pausing, killing and cutting meanwhile. Server restarts are
//! spaced by at least two TTLs and by as long as the last one took, or the store would
//! do little but restart.
//!
//! ## Shard mode
//!
//! "Re-own" runs from a kill or pause of a member to the moment every shard it held
//! then has a new term (on another member, or on the paused one after it wakes, with a
//! new token); a kill of an already paused member is no sample. A member's shards live
//! as long as its session, so a re-own takes at least what was left of the victim's
//! session (up to one TTL) plus the time the others take to notice: on quiet runs (16
//! shards, 5 members, TTL 2 s, a pause or kill every 5 s) the shards of one victim were
//! all taken within about 10 ms of each other, 1.8-2.9 s after the fault on PostgreSQL
//! and 1.9-2.5 s on SQLite: up to about a retry interval (TTL/2) past the TTL, as the
//! survivors see a lapsed member at their next look, not at once. On etcd, whose watch
//! pushes the lapse, 1.9-2.1 s.
//!
//! What it found: on SQLite every member writes, so a member paused inside a write
//! transaction holds the file's write lock for the whole pause, and every other member's
//! `BEGIN IMMEDIATE` fails with the busy timeout meanwhile: no shard admits a write
//! until the paused member wakes (a 2.5 s pause, the next write anywhere 2.5 s later; a
//! 5.6 s pause, 5.6 s). Safety holds (the fence refuses the woken member's late writes);
//! availability on SQLite is one stalled writer away from zero, for a group as for a
//! single role whose leader stalls.
//!
//! ## On Kubernetes
//!
//! The log and its fence live in Lease objects, one conditional write per append (see
//! [`kube`]). Under the CI plan (5 workers, TTL 1 s, a fault every 170 ms of pause, kill,
//! restart, cut and clock, 50 s, debug build, a loaded 2-core VM) runs inject about 245
//! faults with no violation, but recover more slowly than on etcd (p50 several seconds,
//! against about 1 s): a newly started worker counts a dead holder's time from its own
//! first read, so a killed leader's slot stays empty for a TTL after its successor's
//! first look; and the API server is down for seconds per restart. Restarting the
//! throwaway server took, on that VM: 3.5-5 s to kill and start the API server again,
//! 15 s plus that to stop it gracefully (with the workers' watches open its shutdown
//! waits out the harness's whole 15 s grace, then it is killed), 1 s to kill and
//! restart its etcd and 6-10 s to stop and restart it. The paused-leader plan shows the
//! fence at work (7-8 late writes refused in 12 s) and, unfenced, is caught (12-16
//! violations).
//!
//! ## Not yet
//!
//! A run against a caller's PostgreSQL, etcd or Kubernetes cluster cannot `restart` it;
//! a PostgreSQL URL on a Unix socket gets `pg_terminate_backend` cuts only (the proxy
//! speaks TCP), and one that verifies the server's TLS host name cannot go through the
//! proxy's loopback address.
#![deny(missing_docs)]

pub mod backend;
pub mod checker;
pub mod config;
pub mod disk;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod faketime;
pub mod history;
#[cfg(feature = "kube")]
pub mod kube;
pub mod proxy;
pub mod report;
mod runner;
pub mod schedule;
pub mod timeline;
pub mod worker;

pub use config::{parse_faults, ChaosConfig, CutFlavour, FaultKind, StoreSpec};
pub use report::Report;
pub use runner::run;

/// What can stop a chaos run (violations are not errors: they are in the [`Report`]).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// A bad flag or store; the message names it.
    #[error("{0}")]
    Usage(String),
    /// The run could not be set up (e.g. a throwaway server did not start).
    #[error("{0}")]
    Setup(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] tenure::Error),
    /// A local file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}
