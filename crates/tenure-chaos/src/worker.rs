//! A worker: one OS process contending for the role and, while it leads, writing.
//!
//! `tenure chaos-worker` runs this. It contends through [`LeaseLeaderElector`] or, in
//! shard mode, is a member of a shard group through [`ShardElector`]; each term (of the
//! role, or of one shard) appends `(worker, token, seq)` rows to that role's log, one
//! every `write_every` (the time it takes to "prepare" a write after checking leadership),
//! recording every write's invocation and outcome in its history file. SIGTERM ends it
//! cleanly (the elector releases the lease).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure::{FencingToken, LeaseLeaderElector, LeaseLeaderOptions, ShardElector, ShardOptions};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::backend::{Backend, Connect, Entry, WriteOutcome};
use crate::history::{EventKind, HistoryWriter};
use crate::ChaosError;

/// The settings of one worker process (the flags of `tenure chaos-worker`).
#[derive(Clone, Debug)]
pub struct WorkerArgs {
    /// The store URL (passed in `TENURE_STORE`, never on the command line; a Kubernetes
    /// worker finds its kubeconfig as `kubectl` does, in `KUBECONFIG`).
    pub store_url: String,
    /// The role to contend for; in shard mode, the group (shard `k` is `role/k`).
    pub role: String,
    /// Shard mode: be a member of the group `role` of this many shards.
    pub shards: Option<u32>,
    /// This incarnation's name, `w<slot>.<incarnation>`.
    pub name: String,
    /// The history file to append to.
    pub history: PathBuf,
    /// Lease TTL.
    pub ttl: Duration,
    /// Pause between writes while leading.
    pub write_every: Duration,
    /// PostgreSQL application name, so the nemesis can cut these connections.
    pub app_name: String,
    /// Negative control: write without the fence.
    pub unsafe_skip_fence: bool,
    /// SQLite busy timeout (see [`Backend::open`]).
    pub sqlite_busy: Duration,
    /// Proxies to reach the store through (see [`Connect::via`]); empty: direct.
    pub via: Vec<SocketAddr>,
    /// Shard mode: heartbeat into the group's registry over a connection of its own,
    /// straight to the store rather than through `via`, so a wedge of the proxies
    /// stalls this member's store calls (session, terms, writes) while its heartbeats
    /// go on, as with a registry on another connection or server.
    pub registry_direct: bool,
}

impl WorkerArgs {
    /// The `tenure chaos-worker` flags for these settings (the store URL goes in the
    /// environment).
    pub fn to_flags(&self) -> Vec<String> {
        let mut flags = vec![
            "--role".to_owned(),
            self.role.clone(),
            "--name".to_owned(),
            self.name.clone(),
            "--history".to_owned(),
            self.history.display().to_string(),
            "--ttl-ms".to_owned(),
            self.ttl.as_millis().to_string(),
            "--write-every-ms".to_owned(),
            self.write_every.as_millis().to_string(),
            "--app-name".to_owned(),
            self.app_name.clone(),
            "--sqlite-busy-ms".to_owned(),
            self.sqlite_busy.as_millis().to_string(),
        ];
        if let Some(shards) = self.shards {
            flags.push("--shards".to_owned());
            flags.push(shards.to_string());
        }
        if self.unsafe_skip_fence {
            flags.push("--unsafe-skip-fence".to_owned());
        }
        if self.registry_direct {
            flags.push("--registry-direct".to_owned());
        }
        if !self.via.is_empty() {
            flags.push("--via".to_owned());
            let via: Vec<String> = self.via.iter().map(SocketAddr::to_string).collect();
            flags.push(via.join(","));
        }
        flags
    }
}

/// Runs a worker until SIGTERM.
pub async fn run(args: WorkerArgs) -> Result<(), ChaosError> {
    let history =
        HistoryWriter::create(&args.history, &args.name).map_err(|source| ChaosError::Io {
            what: "cannot open the history file",
            source,
        })?;
    // A shard member's owner is its node id, the incarnation's name.
    let owner = match args.shards {
        Some(_) => args.name.clone(),
        None => format!("{}-{}", args.name, std::process::id()),
    };
    history.record(EventKind::Start, 0, 0, Some(owner.clone()));
    let shutdown = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).map_err(|source| ChaosError::Io {
        what: "cannot listen for SIGTERM",
        source,
    })?;
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            term.recv().await;
            shutdown.cancel();
        });
    }
    if args.store_url.starts_with("sqlite:") {
        stall_disk_on_signals()?;
    }
    let Some(backend) = open(&args, &args.via, &shutdown).await? else {
        return Ok(());
    };
    let leases = backend.leases();
    let (ttl, shards, name) = (args.ttl, args.shards, args.name.clone());
    let term = Term {
        history,
        backend,
        seq: Arc::new(AtomicU64::new(0)),
        args: Arc::new(args),
    };
    let Some(shards) = shards else {
        let options = LeaseLeaderOptions {
            owner_id: owner,
            lease_ttl: ttl,
            renew_interval: ttl / 4,
            retry_interval: ttl / 2,
            // The nemesis asks for handoffs through the store.
            accept_handoff_requests: true,
            ..Default::default()
        };
        let elector = LeaseLeaderElector::new(leases, options)?;
        let role = term.args.role.clone();
        let work = {
            let role = role.clone();
            move |token, leadership| term.clone().lead(role.clone(), token, leadership)
        };
        elector.run(&role, work, shutdown).await?;
        return Ok(());
    };
    // The member's id is the incarnation's name: a restarted slot is a new member, as a
    // restarted process is a new owner. Membership lapses after one TTL, as the session.
    let options = ShardOptions {
        group: term.args.role.clone(),
        shards,
        node_id: name,
        lease_ttl: ttl,
        renew_interval: ttl / 4,
        retry_interval: ttl / 2,
        ..Default::default()
    };
    let registry = if term.args.registry_direct {
        let Some(direct) = open(&term.args, &[], &shutdown).await? else {
            return Ok(());
        };
        direct.registry(ttl)?
    } else {
        term.backend.registry(ttl)?
    };
    let elector = ShardElector::new(leases, registry, options)?;
    elector
        .run(
            move |shard, token, leadership| {
                let role = tenure::shard::role(&term.args.role, shard);
                Term {
                    history: term.history.for_shard(shard),
                    ..term.clone()
                }
                .lead(role, token, leadership)
            },
            shutdown,
        )
        .await?;
    Ok(())
}

/// What a signal does to the disk of [`stall_disk_on_signals`].
#[derive(Clone, Copy)]
enum DiskSignal {
    Stall,
    Fail,
    Heal,
}

/// Opens SQLite files through the chaos disk ([`crate::disk`]) and stalls it on
/// SIGUSR1, makes its syncs fail on SIGPWR, heals both on SIGUSR2: the nemesis's
/// `lock/disk` and `lock/disk-error`.
fn stall_disk_on_signals() -> Result<(), ChaosError> {
    crate::disk::install()?;
    for (kind, what) in [
        (SignalKind::user_defined1(), DiskSignal::Stall),
        (SignalKind::from_raw(nix::libc::SIGPWR), DiskSignal::Fail),
        (SignalKind::user_defined2(), DiskSignal::Heal),
    ] {
        let mut signals = signal(kind).map_err(|source| ChaosError::Io {
            what: "cannot listen for SIGUSR1, SIGPWR and SIGUSR2",
            source,
        })?;
        tokio::spawn(async move {
            while signals.recv().await.is_some() {
                match what {
                    DiskSignal::Stall => {
                        warn!("the disk stalls: syncs wait (a lock/disk fault)");
                        crate::disk::stall(true);
                    }
                    DiskSignal::Fail => {
                        warn!("the disk fails: syncs answer EIO (a lock/disk-error fault)");
                        crate::disk::fail(true);
                    }
                    DiskSignal::Heal => {
                        warn!("the disk answers again");
                        crate::disk::fail(false);
                        crate::disk::stall(false);
                    }
                }
            }
        });
    }
    Ok(())
}

/// Opens the store through `via` (empty: directly), retrying while the server may be
/// restarting; `None` when shut down first.
async fn open(
    args: &WorkerArgs,
    via: &[SocketAddr],
    shutdown: &CancellationToken,
) -> Result<Option<Backend>, ChaosError> {
    loop {
        let connect = Connect {
            app_name: &args.app_name,
            ttl: args.ttl,
            sqlite_busy: args.sqlite_busy,
            via,
            // `KUBECONFIG` in the environment, as for `kubectl`.
            kubeconfig: None,
        };
        match Backend::open(&args.store_url, connect).await {
            Ok(backend) => return Ok(Some(backend)),
            Err(ChaosError::Usage(m)) => return Err(ChaosError::Usage(m)),
            Err(error) => {
                warn!(%error, "cannot open the store yet; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        }
    }
}

/// What one term's writes need: the same for a role's term and a shard's.
#[derive(Clone)]
struct Term {
    history: HistoryWriter,
    backend: Backend,
    /// The incarnation's write counter, shared by all its shards so `(worker, seq)`
    /// names one write.
    seq: Arc<AtomicU64>,
    args: Arc<WorkerArgs>,
}

impl Term {
    /// Writes to `role`'s log under `token` until `leadership` is cancelled.
    async fn lead(self, role: String, token: FencingToken, leadership: CancellationToken) {
        let Term {
            history,
            backend,
            seq,
            args,
        } = self;
        let role = Arc::new(role);
        history.record(EventKind::Lead, token.get(), 0, None);
        // A write that hangs past two terms is abandoned as unknown; the server may
        // still commit it.
        let limit = args.ttl * 2;
        // Check, prepare, write: leadership is checked before each write is prepared,
        // as a real leader checks "am I still leader?" before acting, and not again
        // before the write is sent. A pause while preparing is the stalled leader: it
        // wakes and writes with an old token, and only the fence stops it.
        while !leadership.is_cancelled() {
            tokio::time::sleep(args.write_every).await;
            let n = seq.fetch_add(1, Ordering::Relaxed) + 1;
            history.record(EventKind::Invoke, token.get(), n, None);
            // The write runs as its own task: a timeout abandons the wait, never the
            // transaction half-way (sqlx cannot roll back a `BEGIN` whose future was
            // dropped; the connection would go back to the pool holding the SQLite
            // write lock).
            let write = {
                let (backend, args, role) = (backend.clone(), args.clone(), role.clone());
                tokio::spawn(async move {
                    let entry = Entry {
                        role: &role,
                        worker: &args.name,
                        token,
                        seq: n,
                    };
                    backend.write(entry, args.unsafe_skip_fence).await
                })
            };
            let (kind, note) = match tokio::time::timeout(limit, write).await {
                Ok(Ok(WriteOutcome::Ok)) => (EventKind::Ok, None),
                Ok(Ok(WriteOutcome::Fenced)) => (EventKind::Fenced, None),
                Ok(Ok(WriteOutcome::Error(m))) => (EventKind::Error, Some(m)),
                Ok(Ok(WriteOutcome::Unknown(m))) => (EventKind::Unknown, Some(m)),
                Ok(Err(join)) => (EventKind::Unknown, Some(join.to_string())),
                Err(_) => (EventKind::Unknown, Some("timed out".to_owned())),
            };
            history.record(kind, token.get(), n, note);
            if kind == EventKind::Fenced {
                // A fenced term is over; wait for the elector to see it too.
                leadership.cancelled().await;
            }
        }
        history.record(EventKind::Unlead, token.get(), 0, None);
    }
}
