//! The orchestrator: owns the store (when throwaway), puts proxies in front of it (for
//! `cut`), starts the worker processes, runs the nemesis on its seeded plan, watches the
//! lease, then stops everything and checks.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tenure::LeaseStore;
use tenure_throwaway::etcd::EtcdServer;
use tenure_throwaway::kube::KubeServer;
use tenure_throwaway::postgres::PgServer;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backend::{Backend, Connect};
use crate::checker::{check, check_shards, FaultRecord, Observation, ShardRecord};
use crate::config::{ChaosConfig, CutFlavour, FaultKind, StoreSpec, NO_ETCD, NO_KUBE};
use crate::faketime::FakeTime;
use crate::history::{mono_ns, read_histories};
use crate::proxy::Proxy;
use crate::report::Report;
use crate::schedule::{plan, PlannedFault};
use crate::timeline::Timeline;
use crate::worker::WorkerArgs;
use crate::ChaosError;

/// How often the orchestrator reads the role's lease.
const OBSERVE_EVERY: Duration = Duration::from_millis(50);

/// One worker slot and its current incarnation.
struct Slot {
    index: usize,
    incarnation: u32,
    name: String,
    child: Child,
    pgid: Pid,
    /// When a pause of this slot ends, and which fault record it is.
    paused: Option<(Instant, usize)>,
}

/// Everything needed to start a worker incarnation.
struct Spawner {
    config: ChaosConfig,
    url: String,
    /// The role, or in shard mode the group.
    role: String,
    app_name: String,
    dir: PathBuf,
    /// The proxies workers connect through (empty: straight to the store).
    via: Vec<SocketAddr>,
    /// The workers' wall clock, when the run steps it.
    fake_time: Option<FakeTime>,
    /// More of the workers' environment (`KUBECONFIG` for a throwaway API server).
    env: Vec<(&'static str, OsString)>,
}

impl Spawner {
    fn spawn(&self, index: usize, incarnation: u32) -> Result<Slot, ChaosError> {
        let name = format!("w{index}.{incarnation}");
        let args = WorkerArgs {
            store_url: self.url.clone(),
            role: self.role.clone(),
            shards: self.config.shards,
            name: name.clone(),
            history: self.dir.join(format!("{name}.jsonl")),
            ttl: self.config.ttl,
            write_every: self.config.write_every,
            app_name: self.app_name.clone(),
            unsafe_skip_fence: self.config.unsafe_skip_fence,
            sqlite_busy: self.config.sqlite_busy(),
            via: self.via.clone(),
        };
        let log =
            std::fs::File::create(self.dir.join(format!("{name}.log"))).map_err(|source| {
                ChaosError::Io {
                    what: "cannot create a worker log",
                    source,
                }
            })?;
        let (program, prefix) = &self.config.worker_command;
        let mut command = Command::new(program);
        command
            .args(prefix)
            .args(args.to_flags())
            // The URL may hold a password: the environment, not the command line.
            .env("TENURE_STORE", &self.url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .envs(self.fake_time.iter().flat_map(FakeTime::env))
            .envs(self.env.iter().cloned())
            // Its own group, so a pause or kill takes everything it runs.
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                // Workers never outlive the orchestrator, however it ends.
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = command.spawn().map_err(|source| ChaosError::Io {
            what: "cannot start a worker process",
            source,
        })?;
        let pid = child.id().ok_or_else(|| ChaosError::Io {
            what: "a worker exited before it could be tracked",
            source: std::io::Error::other("no pid"),
        })?;
        debug!(%name, pid, "worker started");
        Ok(Slot {
            index,
            incarnation,
            name,
            child,
            pgid: Pid::from_raw(pid as i32),
            paused: None,
        })
    }
}

/// The store's server when the run owns it.
enum Owned {
    None,
    Postgres(Arc<PgServer>),
    Etcd(Arc<EtcdServer>),
    Kube(Arc<KubeServer>),
}

impl Owned {
    /// Stops the server (the run is over); stopping blocks, and nothing waits on it.
    async fn shut_down(self) {
        match self {
            Owned::None => {}
            Owned::Postgres(server) => {
                let _ = tokio::task::spawn_blocking(move || drop(server)).await;
            }
            Owned::Etcd(server) => {
                let _ = tokio::task::spawn_blocking(move || drop(server)).await;
            }
            Owned::Kube(server) => {
                let _ = tokio::task::spawn_blocking(move || drop(server)).await;
            }
        }
    }
}

/// The addresses the store's clients connect to, for proxies to stand in front of;
/// empty when there is nothing a TCP proxy can carry (SQLite, a Unix socket).
/// `kubeconfig`: as [`Connect::kubeconfig`].
async fn upstreams(url: &str, spec: &StoreSpec, kubeconfig: Option<&Path>) -> Vec<SocketAddr> {
    let hosts: Vec<String> = match spec {
        StoreSpec::SqliteThrowaway | StoreSpec::Sqlite(_) => Vec::new(),
        StoreSpec::PostgresThrowaway | StoreSpec::Postgres(_) => {
            match <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(url) {
                Ok(options) if !options.get_host().starts_with('/') => {
                    vec![format!("{}:{}", options.get_host(), options.get_port())]
                }
                _ => Vec::new(),
            }
        }
        StoreSpec::EtcdThrowaway | StoreSpec::Etcd(_) => etcd_hosts(url),
        StoreSpec::KubeThrowaway | StoreSpec::Kube(_) => kube_server(kubeconfig).await,
    };
    let mut addrs = Vec::new();
    for host in hosts {
        match tokio::net::lookup_host(host.as_str()).await {
            Ok(mut found) => addrs.extend(found.next()),
            Err(error) => warn!(%error, "cannot resolve a store endpoint for the cut proxy"),
        }
    }
    addrs
}

#[cfg(feature = "etcd")]
fn etcd_hosts(url: &str) -> Vec<String> {
    tenure_etcd::EtcdUrl::parse(url)
        .map(|u| {
            u.endpoints()
                .iter()
                .map(|e| e.trim_start_matches("http://").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(not(feature = "etcd"))]
fn etcd_hosts(_url: &str) -> Vec<String> {
    Vec::new()
}

#[cfg(feature = "kube")]
async fn kube_server(kubeconfig: Option<&Path>) -> Vec<String> {
    match crate::kube::server_address(kubeconfig).await {
        Ok(server) => vec![server],
        Err(error) => {
            warn!(%error, "cannot find the Kubernetes server for the cut proxy");
            Vec::new()
        }
    }
}

#[cfg(not(feature = "kube"))]
async fn kube_server(_kubeconfig: Option<&Path>) -> Vec<String> {
    Vec::new()
}

/// Runs a whole chaos round and checks it.
pub async fn run(config: ChaosConfig) -> Result<Report, ChaosError> {
    config.validate()?;
    if config.store.is_etcd() && !cfg!(feature = "etcd") {
        return Err(ChaosError::Usage(NO_ETCD.to_owned()));
    }
    if config.store.is_kube() && !cfg!(feature = "kube") {
        return Err(ChaosError::Usage(NO_KUBE.to_owned()));
    }
    let started = Instant::now();
    let mut kinds = Vec::new();
    let mut unavailable = Vec::new();
    for &kind in &config.faults {
        match (kind, &config.store) {
            (
                FaultKind::Restart,
                StoreSpec::Postgres(_) | StoreSpec::Etcd(_) | StoreSpec::Kube(_),
            ) => unavailable.push(
                "restart: the server is not owned by this run (use --store postgres:throwaway, \
                 etcd:throwaway or kube:throwaway)"
                    .to_owned(),
            ),
            (FaultKind::Cut, spec) if spec.is_sqlite() => {
                unavailable.push("cut: sqlite has no connections to sever".to_owned())
            }
            (FaultKind::Clock, spec) if !spec.steps_wall_clock() => unavailable.push(
                "clock: only sqlite and kubernetes judge time on the workers' host (the \
                 server's clock decides on postgres and etcd)"
                    .to_owned(),
            ),
            _ => kinds.push(kind),
        }
    }
    if kinds.is_empty() {
        return Err(ChaosError::Usage(format!(
            "none of the requested faults can be injected on this store: {}",
            unavailable.join("; ")
        )));
    }
    let run_id = format!("{:08x}", rand::random::<u32>());
    let (dir, temporary) = match &config.run_dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("tenure-chaos-{}-{run_id}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).map_err(|source| ChaosError::Io {
        what: "cannot create the run directory",
        source,
    })?;
    let fake_time = if kinds.contains(&FaultKind::Clock) {
        Some(FakeTime::new(dir.join("faketime-offset"))?)
    } else {
        None
    };
    // On a throwaway API server everything runs as the tenant: the service account
    // bound to tenure's documented Role (leases only) in a fresh namespace.
    let mut kubeconfig = None;
    let (url, owned) = match &config.store {
        StoreSpec::SqliteThrowaway => (
            format!("sqlite:{}", dir.join("chaos.db").display()),
            Owned::None,
        ),
        StoreSpec::Sqlite(url)
        | StoreSpec::Postgres(url)
        | StoreSpec::Etcd(url)
        | StoreSpec::Kube(url) => (url.clone(), Owned::None),
        StoreSpec::PostgresThrowaway => {
            let server = blocking("start a throwaway PostgreSQL server", PgServer::start).await?;
            (server.url(), Owned::Postgres(Arc::new(server)))
        }
        StoreSpec::EtcdThrowaway => {
            let server = blocking("start a throwaway etcd server", EtcdServer::start).await?;
            (
                format!("etcd://{}/tenure-chaos", server.host_port()),
                Owned::Etcd(Arc::new(server)),
            )
        }
        StoreSpec::KubeThrowaway => {
            let server = Arc::new(
                blocking("start a throwaway Kubernetes API server", KubeServer::start).await?,
            );
            let tenant = server.clone();
            let (namespace, path) = blocking("make the run's namespace", move || {
                let namespace = tenant.new_namespace("tenure-chaos")?;
                let path = tenant.tenant_kubeconfig(&namespace)?;
                Ok((namespace, path))
            })
            .await?;
            kubeconfig = Some(path);
            (format!("kube:{namespace}"), Owned::Kube(server))
        }
    };
    // Workers reach the store through proxies the nemesis can cut; the orchestrator
    // (observer, `pg_terminate_backend`, reading the log) goes straight to it.
    let mut proxies = Vec::new();
    if kinds.contains(&FaultKind::Cut) {
        for upstream in upstreams(&url, &config.store, kubeconfig.as_deref()).await {
            let proxy = Proxy::start(upstream)
                .await
                .map_err(|source| ChaosError::Io {
                    what: "cannot start the cut proxy",
                    source,
                })?;
            proxies.push(proxy);
        }
    }
    let mut cuts = Vec::new();
    if !proxies.is_empty() {
        cuts.extend([CutFlavour::Drop, CutFlavour::Blackhole]);
    }
    if matches!(
        config.store,
        StoreSpec::PostgresThrowaway | StoreSpec::Postgres(_)
    ) {
        cuts.push(CutFlavour::Terminate);
    }
    if cuts.is_empty() && kinds.contains(&FaultKind::Cut) {
        kinds.retain(|&k| k != FaultKind::Cut);
        unavailable.push("cut: no TCP endpoint to put a proxy in front of".to_owned());
        if kinds.is_empty() {
            owned.shut_down().await;
            return Err(ChaosError::Usage(format!(
                "none of the requested faults can be injected on this store: {}",
                unavailable.join("; ")
            )));
        }
    }
    // The role, or in shard mode the group (shard `k` is `chaos-<run>/k`).
    let role = format!("chaos-{run_id}");
    let app_name = format!("tenure-chaos-{run_id}");
    let nemesis_name = format!("{app_name}-nemesis");
    let opened = Backend::open(
        &url,
        Connect {
            app_name: &nemesis_name,
            ttl: config.ttl,
            sqlite_busy: config.sqlite_busy(),
            via: &[],
            kubeconfig: kubeconfig.as_deref(),
        },
    )
    .await;
    let backend = match opened {
        Ok(backend) => backend,
        Err(error) => {
            owned.shut_down().await;
            return Err(error);
        }
    };
    backend.prepare().await?;

    let schedule = plan(config.seed, &kinds, config.duration, config.fault_every);
    info!(faults = schedule.len(), seed = config.seed, %role, "chaos run planned");

    let spawner = Spawner {
        config: config.clone(),
        url,
        role: role.clone(),
        app_name: app_name.clone(),
        dir: dir.clone(),
        via: proxies.iter().map(Proxy::local_addr).collect(),
        fake_time,
        env: kubeconfig
            .iter()
            .map(|path| ("KUBECONFIG", path.clone().into_os_string()))
            .collect(),
    };
    let origin = mono_ns();
    let mut slots = Vec::with_capacity(config.workers);
    for index in 0..config.workers {
        slots.push(spawner.spawn(index, 0)?);
    }

    let holders: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop_observer = CancellationToken::new();
    let watched = match config.shards {
        Some(_) => Watched::Group(role.clone()),
        None => Watched::Role(role.clone()),
    };
    let observer = tokio::spawn(observe(
        backend.leases(),
        watched,
        holders.clone(),
        stop_observer.clone(),
        config.ttl,
    ));

    let mut nemesis = Nemesis {
        config: &config,
        spawner: &spawner,
        backend: &backend,
        owned: &owned,
        proxies: &proxies,
        cuts,
        blackhole: None,
        restarting: None,
        restarted: None,
        clock_offset_ms: 0,
        holders,
        slots,
        faults: Vec::new(),
        skipped: 0,
        respawned: 0,
    };
    let outcome = nemesis.run(&schedule).await;
    let stopped = nemesis.stop_all().await;
    stop_observer.cancel();
    let mut observations = observer.await.unwrap_or_default();
    outcome?;
    stopped?;

    let events = read_histories(&dir).map_err(|source| ChaosError::Io {
        what: "cannot read the histories",
        source,
    })?;
    // Beside the histories, for whoever investigates a kept run (not `.jsonl`: it is
    // not a history).
    if let Ok(faults) = serde_json::to_vec_pretty(&nemesis.faults) {
        let _ = std::fs::write(dir.join("faults.json"), faults);
    }
    let analysis = match config.shards {
        None => {
            let log = backend.read_log(&role).await?;
            let observations = observations.remove(&role).unwrap_or_default();
            check(&events, &log, &observations, &nemesis.faults)
        }
        Some(shards) => {
            let mut records = BTreeMap::new();
            for shard in 0..shards {
                let role = tenure::shard::role(&role, shard);
                let record = ShardRecord {
                    log: backend.read_log(&role).await?,
                    observations: observations.remove(&role).unwrap_or_default(),
                };
                records.insert(shard, record);
            }
            check_shards(&events, &records, &nemesis.faults)
        }
    };
    let timeline = Timeline::build(&events, &nemesis.faults, origin);
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for fault in &nemesis.faults {
        *by_kind.entry(fault.kind.name().to_owned()).or_default() += 1;
    }
    let passed = analysis.violation_count() == 0;
    // Keep the evidence of a failed run; a passing temporary one leaves nothing.
    let keep = !passed || !temporary;
    let report = Report {
        seed: config.seed,
        store: config.store.describe().to_owned(),
        workers: config.workers,
        shards: config.shards,
        duration_ms: config.duration.as_millis() as u64,
        ttl_ms: config.ttl.as_millis() as u64,
        retry_ms: config.retry_every().as_millis() as u64,
        unsafe_skip_fence: config.unsafe_skip_fence,
        faults_total: nemesis.faults.len() as u64,
        faults: by_kind,
        faults_skipped: nemesis.skipped,
        unexpected_exits: nemesis.respawned,
        unavailable,
        analysis,
        run_dir: keep.then(|| dir.display().to_string()),
        elapsed_ms: started.elapsed().as_millis() as u64,
        timeline,
    };
    drop(backend);
    drop(proxies);
    owned.shut_down().await;
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report)
}

fn stop_or_kill(crash: bool) -> &'static str {
    if crash {
        "kill"
    } else {
        "stop"
    }
}

/// The task restarting a server.
type RestartTask = JoinHandle<Result<(), ChaosError>>;

/// A server restart under way.
struct Restarting {
    /// Its fault record (healed when the task is done).
    record: usize,
    task: RestartTask,
    began: Instant,
}

/// Starts restarting the owned server (`None` when there is none) the way `pick`
/// chooses: half the restarts are clean shutdowns, half crashes; on Kubernetes, half of
/// the API server and half of its etcd.
fn restart(owned: &Owned, pick: u64) -> Option<(&'static str, RestartTask)> {
    let crash = pick % 2 == 1;
    Some(match owned {
        Owned::Postgres(server) => {
            let server = server.clone();
            let task = tokio::spawn(blocking("restart the PostgreSQL server", move || {
                if crash {
                    server.kill();
                } else {
                    server.stop();
                }
                server.start_again()
            }));
            (stop_or_kill(crash), task)
        }
        Owned::Etcd(server) => {
            let server = server.clone();
            let task = tokio::spawn(blocking("restart the etcd server", move || {
                if crash {
                    server.kill();
                }
                server.restart()
            }));
            (stop_or_kill(crash), task)
        }
        Owned::Kube(server) if (pick >> 1).is_multiple_of(2) => {
            let server = server.clone();
            let task = tokio::spawn(blocking("restart the Kubernetes API server", move || {
                if crash {
                    server.kill_apiserver();
                }
                server.restart_apiserver()
            }));
            (
                if crash {
                    "apiserver-kill"
                } else {
                    "apiserver-stop"
                },
                task,
            )
        }
        Owned::Kube(server) => {
            let server = server.clone();
            let task = tokio::spawn(blocking("restart the API server's etcd", move || {
                if crash {
                    server.etcd().kill();
                }
                server.restart_etcd()
            }));
            (if crash { "etcd-kill" } else { "etcd-stop" }, task)
        }
        Owned::None => return None,
    })
}

/// Runs a throwaway-server call off the runtime; its error says what failed.
async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> tenure_throwaway::Result<T> + Send + 'static,
) -> Result<T, ChaosError> {
    tenure_throwaway::unblocked(f)
        .await
        .map_err(|e| ChaosError::Setup(format!("cannot {what}: {e}")))
}

/// What the orchestrator watches on the store.
#[derive(Clone, Debug)]
enum Watched {
    /// One role, read with `get`.
    Role(String),
    /// Every shard of a group, read with one `list`.
    Group(String),
}

/// Reads the watched leases every [`OBSERVE_EVERY`]; publishes the worker names of
/// their live holders for the nemesis and returns every change seen, per role.
async fn observe(
    leases: Arc<dyn LeaseStore>,
    watched: Watched,
    holders: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
    ttl: Duration,
) -> BTreeMap<String, Vec<Observation>> {
    let mut seen: BTreeMap<String, Vec<Observation>> = BTreeMap::new();
    let mut tick = tokio::time::interval(OBSERVE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return seen,
            _ = tick.tick() => {}
        }
        let read = match &watched {
            Watched::Role(role) => tokio::time::timeout(ttl, leases.get(role))
                .await
                .map(|read| read.map(|lease| lease.into_iter().collect::<Vec<_>>())),
            Watched::Group(group) => {
                let prefix = format!("{group}/");
                tokio::time::timeout(ttl, leases.list_prefix(&prefix)).await
            }
        };
        // Errors while the server restarts are expected; the next tick retries.
        let Ok(Ok(read)) = read else { continue };
        let t = mono_ns();
        // A role's owner is `<worker>-<pid>`; a shard member's, the worker's name.
        let mut live: Vec<String> = read
            .iter()
            .filter_map(|lease| lease.live_holder())
            .map(|owner| {
                owner
                    .rsplit_once('-')
                    .map_or(owner, |(name, _)| name)
                    .to_owned()
            })
            .collect();
        live.sort_unstable();
        live.dedup();
        *holders.lock().unwrap_or_else(|e| e.into_inner()) = live;
        for lease in read {
            let observation = Observation {
                t,
                token: lease.fencing_token.get(),
                holder: lease.holder.clone(),
            };
            let history = seen.entry(lease.role).or_default();
            let changed = history.last().is_none_or(|last| {
                (last.token, &last.holder) != (observation.token, &observation.holder)
            });
            if changed {
                history.push(observation);
            }
        }
    }
}

struct Nemesis<'a> {
    config: &'a ChaosConfig,
    spawner: &'a Spawner,
    backend: &'a Backend,
    owned: &'a Owned,
    proxies: &'a [Proxy],
    /// The ways this store can be cut.
    cuts: Vec<CutFlavour>,
    /// When the current blackhole heals, and which fault record it is.
    blackhole: Option<(Instant, usize)>,
    /// A server restart under way. It runs beside the nemesis, which goes on injecting
    /// faults meanwhile.
    restarting: Option<Restarting>,
    /// When the last server restart was done (the server serving again) and how long
    /// it took.
    restarted: Option<(Instant, Duration)>,
    /// The workers' wall clock offset from the real one, ms.
    clock_offset_ms: i64,
    /// The worker names holding a live lease, as last observed.
    holders: Arc<Mutex<Vec<String>>>,
    slots: Vec<Slot>,
    faults: Vec<FaultRecord>,
    skipped: u64,
    respawned: u64,
}

impl Nemesis<'_> {
    async fn run(&mut self, schedule: &[PlannedFault]) -> Result<(), ChaosError> {
        let start = Instant::now();
        let mut next = 0;
        loop {
            self.reap_exited()?;
            let fault_at = schedule.get(next).map(|f| start + f.at);
            let resume_at = self
                .slots
                .iter()
                .filter_map(|s| s.paused.map(|p| p.0))
                .chain(self.blackhole.map(|b| b.0))
                .min();
            let wake = match (fault_at, resume_at) {
                (None, None) => break,
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
            };
            // Wake at least every 100 ms to notice workers that died on their own.
            tokio::time::sleep_until(wake.min(Instant::now() + Duration::from_millis(100))).await;
            let now = Instant::now();
            for i in 0..self.slots.len() {
                if self.slots[i].paused.is_some_and(|(until, _)| until <= now) {
                    self.resume(i);
                }
            }
            if self.blackhole.is_some_and(|(until, _)| until <= now) {
                self.heal();
            }
            self.finish_restart(false).await?;
            if fault_at.is_some_and(|at| at <= now) {
                self.inject(&schedule[next]).await?;
                next += 1;
            }
        }
        self.finish_restart(true).await?;
        // Let the last faults heal and be measured before stopping.
        tokio::time::sleep(self.config.ttl * 2 + self.config.retry_every()).await;
        Ok(())
    }

    /// Records the end of the server restart under way once it is done (`wait`: waits
    /// for it); a restart that failed ends the run.
    async fn finish_restart(&mut self, wait: bool) -> Result<(), ChaosError> {
        if !wait
            && !self
                .restarting
                .as_ref()
                .is_some_and(|r| r.task.is_finished())
        {
            return Ok(());
        }
        let Some(Restarting {
            record,
            task,
            began,
        }) = self.restarting.take()
        else {
            return Ok(());
        };
        task.await
            .map_err(|e| ChaosError::Setup(format!("a server restart panicked: {e}")))??;
        self.faults[record].healed = mono_ns();
        self.restarted = Some((Instant::now(), began.elapsed()));
        Ok(())
    }

    /// Ends the current blackhole, if any.
    fn heal(&mut self) {
        if let Some((_, record)) = self.blackhole.take() {
            for proxy in self.proxies {
                proxy.heal();
            }
            self.faults[record].healed = mono_ns();
        }
    }

    fn resume(&mut self, i: usize) {
        if let Some((_, record)) = self.slots[i].paused.take() {
            let _ = killpg(self.slots[i].pgid, Signal::SIGCONT);
            self.faults[record].healed = mono_ns();
        }
    }

    /// A worker that exited on its own (it should not) is restarted and counted.
    fn reap_exited(&mut self) -> Result<(), ChaosError> {
        for i in 0..self.slots.len() {
            if let Ok(Some(status)) = self.slots[i].child.try_wait() {
                warn!(worker = %self.slots[i].name, %status, "worker exited unexpectedly; restarting it");
                self.respawned += 1;
                self.replace(i)?;
            }
        }
        Ok(())
    }

    fn replace(&mut self, i: usize) -> Result<(), ChaosError> {
        let (index, incarnation) = (self.slots[i].index, self.slots[i].incarnation + 1);
        self.slots[i] = self.spawner.spawn(index, incarnation)?;
        Ok(())
    }

    /// The slots of current incarnations holding a live lease (the role's, or any
    /// shard's), paused ones only when `paused_too`.
    fn leaders(&self, paused_too: bool) -> Vec<usize> {
        let holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        (0..self.slots.len())
            .filter(|&i| paused_too || self.slots[i].paused.is_none())
            .filter(|&i| holders.contains(&self.slots[i].name))
            .collect()
    }

    fn pick(&self, pick: u64, prefer_leader: bool, unpaused_only: bool) -> Option<usize> {
        let pick_of = |candidates: Vec<usize>| {
            (!candidates.is_empty()).then(|| candidates[(pick % candidates.len() as u64) as usize])
        };
        if prefer_leader {
            if let Some(i) = pick_of(self.leaders(!unpaused_only)) {
                return Some(i);
            }
        }
        pick_of(
            (0..self.slots.len())
                .filter(|&i| !unpaused_only || self.slots[i].paused.is_none())
                .collect(),
        )
    }

    async fn inject(&mut self, fault: &PlannedFault) -> Result<(), ChaosError> {
        let at = mono_ns();
        match fault.kind {
            FaultKind::Pause => {
                // Keep one worker running: with every worker stopped there is nothing
                // left to fence out.
                let running = self.slots.iter().filter(|s| s.paused.is_none()).count();
                let Some(i) = self.pick(fault.pick, true, true).filter(|_| running > 1) else {
                    self.skipped += 1;
                    return Ok(());
                };
                let _ = killpg(self.slots[i].pgid, Signal::SIGSTOP);
                let until = Instant::now() + self.config.ttl.mul_f64(fault.factor);
                self.slots[i].paused = Some((until, self.faults.len()));
                self.record(fault.kind, None, Some(i), at, 0);
            }
            FaultKind::Kill => {
                // Half the kills hit the leader, half anyone.
                let Some(i) = self.pick(fault.pick, fault.pick.is_multiple_of(2), false) else {
                    self.skipped += 1;
                    return Ok(());
                };
                self.kill_and_replace(i, fault.kind, at).await?;
            }
            // A server restart takes 0.2 s (PostgreSQL), 1 s (etcd) or several seconds (a
            // kube-apiserver), longer than the gap between faults: back to back, the
            // store would do nothing but restart and no restart's recovery could be seen.
            // Restarts are spaced by two TTLs, and by at least as long as the last one
            // took, so the server serves at least half the time.
            FaultKind::Restart
                if !matches!(self.owned, Owned::None)
                    && (self.restarting.is_some()
                        || self.restarted.is_some_and(|(done, took)| {
                            done.elapsed() < (self.config.ttl * 2).max(took)
                        })) =>
            {
                self.skipped += 1;
            }
            // The restart runs beside the nemesis.
            FaultKind::Restart => match restart(self.owned, fault.pick) {
                Some((flavour, task)) => {
                    self.restarting = Some(Restarting {
                        record: self.faults.len(),
                        task,
                        began: Instant::now(),
                    });
                    self.record(fault.kind, Some(flavour), None, at, 0);
                }
                // SQLite has no server: kill the leader, which writes continuously and
                // so is almost always inside a transaction.
                None => {
                    let Some(i) = self.pick(fault.pick, true, false) else {
                        self.skipped += 1;
                        return Ok(());
                    };
                    self.kill_and_replace(i, fault.kind, at).await?;
                }
            },
            FaultKind::Cut => self.cut(fault, at).await,
            FaultKind::Clock => {
                let Some(fake_time) = &self.spawner.fake_time else {
                    self.skipped += 1;
                    return Ok(());
                };
                // More than a TTL each time, so a store on the wall clock would expire
                // (forward) or keep alive (back) every live lease.
                let step = self.config.ttl.mul_f64(1.0 + fault.factor).as_millis();
                let step = i64::try_from(step).unwrap_or(i64::MAX / 4);
                let (offset, flavour) = if self.clock_offset_ms > 0 {
                    (self.clock_offset_ms - step, "back")
                } else {
                    (self.clock_offset_ms + step, "forward")
                };
                fake_time.set_offset(offset)?;
                self.clock_offset_ms = offset;
                self.record(fault.kind, Some(flavour), None, at, mono_ns());
            }
        }
        Ok(())
    }

    async fn kill_and_replace(
        &mut self,
        i: usize,
        kind: FaultKind,
        at: u64,
    ) -> Result<(), ChaosError> {
        let _ = killpg(self.slots[i].pgid, Signal::SIGKILL);
        let _ = self.slots[i].child.wait().await;
        let name = self.slots[i].name.clone();
        if let Some((_, record)) = self.slots[i].paused.take() {
            self.faults[record].healed = mono_ns();
        }
        self.replace(i)?;
        self.faults.push(FaultRecord {
            kind,
            flavour: None,
            target: Some(name),
            at,
            healed: mono_ns(),
        });
        Ok(())
    }

    /// Severs the workers from the store one of the ways this store allows (chosen by
    /// the plan's pick; a cut during a blackhole drops the held connections).
    async fn cut(&mut self, fault: &PlannedFault, at: u64) {
        let mut flavour = self.cuts[((fault.pick >> 32) % self.cuts.len() as u64) as usize];
        if self.blackhole.is_some() && flavour != CutFlavour::Terminate {
            flavour = CutFlavour::Drop;
        }
        match flavour {
            CutFlavour::Drop => {
                let n: usize = self.proxies.iter().map(Proxy::drop_all).sum();
                debug!(connections = n, "reset worker connections");
            }
            CutFlavour::Blackhole => {
                for proxy in self.proxies {
                    proxy.blackhole();
                }
                let until = Instant::now() + self.config.ttl.mul_f64(fault.factor);
                self.blackhole = Some((until, self.faults.len()));
                self.record(fault.kind, Some(flavour.name()), None, at, 0);
                return;
            }
            CutFlavour::Terminate => {
                match self
                    .backend
                    .terminate_connections(&self.spawner.app_name)
                    .await
                {
                    Ok(n) => debug!(connections = n, "terminated worker connections"),
                    Err(error) => warn!(%error, "cannot terminate worker connections"),
                }
            }
        }
        self.record(fault.kind, Some(flavour.name()), None, at, mono_ns());
    }

    fn record(
        &mut self,
        kind: FaultKind,
        flavour: Option<&'static str>,
        slot: Option<usize>,
        at: u64,
        healed: u64,
    ) {
        self.faults.push(FaultRecord {
            kind,
            flavour,
            target: slot.map(|i| self.slots[i].name.clone()),
            at,
            healed,
        });
    }

    /// Resumes the paused, asks every worker to stop (SIGTERM: release and exit), and
    /// kills whoever has not stopped within a term and a bit.
    async fn stop_all(&mut self) -> Result<(), ChaosError> {
        self.heal();
        for i in 0..self.slots.len() {
            self.resume(i);
        }
        for slot in &self.slots {
            let _ = killpg(slot.pgid, Signal::SIGTERM);
        }
        let deadline = Instant::now() + self.config.ttl * 2 + Duration::from_secs(3);
        for slot in &mut self.slots {
            if tokio::time::timeout_at(deadline, slot.child.wait())
                .await
                .is_err()
            {
                warn!(worker = %slot.name, "worker did not stop on SIGTERM; killing it");
                let _ = killpg(slot.pgid, Signal::SIGKILL);
                let _ = slot.child.wait().await;
            }
        }
        Ok(())
    }
}
