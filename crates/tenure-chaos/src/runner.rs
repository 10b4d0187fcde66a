//! The orchestrator: owns the store (when throwaway), puts proxies in front of it (for
//! `cut`), starts the worker processes, runs the nemesis on its seeded plan, watches the
//! lease, then stops everything and checks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tenure_throwaway::etcd::EtcdServer;
use tenure_throwaway::kube::KubeServer;
use tenure_throwaway::postgres::PgServer;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::backend::{Backend, Connect};
use crate::checker::{check, check_shards, MembershipRun, ShardRecord};
use crate::config::{ChaosConfig, CutFlavour, FaultKind, StoreSpec, NO_ETCD, NO_KUBE};
use crate::faketime::FakeTime;
use crate::history::{mono_ns, read_histories};
use crate::proxy::Proxy;
use crate::report::Report;
use crate::schedule::plan;
use crate::timeline::Timeline;
use crate::ChaosError;

mod nemesis;
mod observe;
mod servers;
mod upstreams;
mod workers;

use nemesis::Nemesis;
use observe::{observe, Watched};
use servers::{blocking, Owned};
use upstreams::upstreams;
use workers::Spawner;

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
            (FaultKind::Handoff, _) if config.shards.is_some() => unavailable.push(
                "handoff: a shard group's shards move by placement, not by request".to_owned(),
            ),
            (FaultKind::Cut, spec) if spec.is_sqlite() => {
                unavailable.push("cut: sqlite has no connections to sever".to_owned())
            }
            (FaultKind::Lock, StoreSpec::Etcd(_) | StoreSpec::Kube(_)) => unavailable.push(
                "lock: etcd and kubernetes have no lock to hold; only the disk of a server the \
                 run owns can stall instead (use --store etcd:throwaway or kube:throwaway)"
                    .to_owned(),
            ),
            (FaultKind::Clock, spec) if !spec.steps_wall_clock() => unavailable.push(
                "clock: only sqlite and kubernetes judge time on the workers' host (the \
                 server's clock decides on postgres and etcd)"
                    .to_owned(),
            ),
            _ => kinds.push(kind),
        }
    }
    if kinds.is_empty() {
        return Err(nothing_to_inject(&unavailable));
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
            // Asynchronous commits, as a server tuned for speed has them: a `restart`
            // that kills the server loses every commit of the last seconds but those
            // made on connections that name `synchronous_commit`, as tenure's do.
            let server = blocking("start a throwaway PostgreSQL server", || {
                let server = PgServer::start()?;
                server.commit_asynchronously()?;
                Ok(server)
            })
            .await?;
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
    // etcd's disk stalls only in a build with its failpoints.
    if kinds.contains(&FaultKind::Lock) && owned.etcd().is_some_and(|etcd| !etcd.can_stall_wal()) {
        kinds.retain(|&k| k != FaultKind::Lock);
        unavailable.push(
            "lock: this etcd has no failpoints to stall its disk with (the etcd \
             scripts/build-servers builds, target/servers/etcd, has them)"
                .to_owned(),
        );
        if kinds.is_empty() {
            owned.shut_down().await;
            return Err(nothing_to_inject(&unavailable));
        }
    }
    // Workers reach the store through proxies the nemesis can cut, each worker slot
    // through its own (so that one worker can be cut off alone); the orchestrator
    // (observer, `pg_terminate_backend`, reading the log) goes straight to it.
    let mut proxies: Vec<Vec<Proxy>> = Vec::new();
    if kinds.contains(&FaultKind::Cut) {
        let upstreams = upstreams(&url, &config.store, kubeconfig.as_deref()).await;
        for _ in 0..config.workers {
            let mut slot = Vec::new();
            for &upstream in &upstreams {
                let proxy = Proxy::start(upstream)
                    .await
                    .map_err(|source| ChaosError::Io {
                        what: "cannot start the cut proxy",
                        source,
                    })?;
                slot.push(proxy);
            }
            proxies.push(slot);
        }
        proxies.retain(|slot| !slot.is_empty());
    }
    let mut cuts = Vec::new();
    if !proxies.is_empty() {
        cuts.extend([CutFlavour::Drop, CutFlavour::Blackhole, CutFlavour::Wedge]);
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
            return Err(nothing_to_inject(&unavailable));
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
        via: proxies
            .iter()
            .map(|slot| slot.iter().map(Proxy::local_addr).collect())
            .collect(),
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
    let registry = match config.shards {
        Some(_) => Some(backend.registry(config.ttl)?),
        None => None,
    };
    let observer = tokio::spawn(observe(
        backend.leases(),
        registry,
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
        held: None,
        locked: None,
        restarting: None,
        restarted: None,
        clock_offset_ms: 0,
        lock_faults: 0,
        holders,
        slots,
        faults: Vec::new(),
        skipped: 0,
        respawned: 0,
    };
    let outcome = nemesis.run(&schedule).await;
    let stopping = mono_ns();
    let stopped = nemesis.stop_all().await;
    stop_observer.cancel();
    let observed = observer.await.unwrap_or_default();
    let mut observations = observed.by_role;
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
    if !observed.members.is_empty() {
        if let Ok(members) = serde_json::to_vec(&observed.members) {
            let _ = std::fs::write(dir.join("members.json"), members);
        }
    }
    let mut analysis = match config.shards {
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
            let mut analysis = check_shards(&events, &records, &nemesis.faults);
            analysis.add_membership(MembershipRun {
                events: &events,
                readings: &observed.members,
                faults: &nemesis.faults,
                ttl_ns: u64::try_from(config.ttl.as_nanos()).unwrap_or(u64::MAX),
                stopping,
                shared_writer: config.store.is_sqlite(),
            });
            analysis
        }
    };
    analysis.add_stale_copies(observed.stale_copies);
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

/// The usage error of a run none of whose requested faults this store can have.
fn nothing_to_inject(unavailable: &[String]) -> ChaosError {
    ChaosError::Usage(format!(
        "none of the requested faults can be injected on this store: {}",
        unavailable.join("; ")
    ))
}
