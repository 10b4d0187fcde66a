//! `tenure demo`: the stalled-leader story, narrated as a timeline.
//!
//! Two nodes contend for one role. node-a leads and writes through the fence, then
//! stalls (its store calls hang and its worker freezes mid-write, as in a long GC
//! pause). Its lease expires, node-b takes over with a higher token; when node-a wakes,
//! its late write is refused by the fence. Membership shows node-a drop out and come
//! back, and a graceful release hands leadership over at once.
//!
//! On the in-memory store the demo runs on a paused tokio clock, so it takes virtual
//! seconds and real milliseconds; on a real store it runs in real time with short TTLs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use async_trait::async_trait;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::{
    ElectionState, Error, FenceStore, FencingToken, LeaseLeaderElector, LeaseLeaderOptions,
    LeaseStore, Metadata, NodeRegistry,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Timing of one demo run.
#[derive(Clone, Copy, Debug)]
pub struct DemoTiming {
    /// Lease TTL of both nodes.
    pub ttl: Duration,
    /// Renew interval of both nodes.
    pub renew: Duration,
    /// How often a leader writes.
    pub write_every: Duration,
    /// How long node-a stalls.
    pub stall: Duration,
}

impl DemoTiming {
    /// Timings for a store with exact, fast operations (in-memory, SQL).
    pub fn fast() -> Self {
        DemoTiming {
            ttl: Duration::from_secs(3),
            renew: Duration::from_secs(1),
            write_every: Duration::from_millis(700),
            stall: Duration::from_secs(9),
        }
    }

    /// Timings for stores whose TTL is whole seconds and expiry coarse (etcd).
    pub fn coarse() -> Self {
        DemoTiming {
            ttl: Duration::from_secs(2),
            renew: Duration::from_millis(600),
            write_every: Duration::from_millis(500),
            stall: Duration::from_secs(6),
        }
    }
}

/// What the demo needs from a backend.
pub struct DemoStores {
    /// Where leases live.
    pub leases: Arc<dyn LeaseStore>,
    /// Where membership lives.
    pub registry: Arc<dyn NodeRegistry>,
    /// The downstream fence the leaders write through.
    pub fence: Arc<dyn FenceStore>,
}

/// Names unique to one run, so a demo on a persistent store never meets an earlier one.
struct Names {
    role: String,
    resource: String,
    node_a: String,
    node_b: String,
}

impl Names {
    fn new(unique: bool) -> Self {
        let suffix = if unique {
            format!("-{:06x}", rand::random::<u32>() & 0xff_ffff)
        } else {
            String::new()
        };
        Names {
            role: format!("demo-reports{suffix}"),
            resource: format!("demo-ledger{suffix}"),
            node_a: format!("node-a{suffix}"),
            node_b: format!("node-b{suffix}"),
        }
    }
}

/// Prints timeline lines stamped with time since the demo began.
#[derive(Clone)]
struct Narrator {
    start: Instant,
}

impl Narrator {
    fn say(&self, who: &str, what: impl AsRef<str>) {
        let at = self.start.elapsed();
        println!("[{:>7.3}s] {who:<8} {}", at.as_secs_f64(), what.as_ref());
    }
}

/// A switch that freezes everything behind it, the way SIGSTOP or a GC pause would.
#[derive(Clone)]
struct Stall(watch::Sender<bool>);

impl Stall {
    fn new() -> Self {
        Stall(watch::Sender::new(false))
    }
    fn set(&self, stalled: bool) {
        self.0.send_replace(stalled);
    }
    async fn wait_until_running(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|stalled| !stalled).await;
    }
}

/// A frozen process's lease calls: a renewal or release waits while it is stalled.
#[async_trait]
impl Interceptor for Stall {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        if matches!(call, Call::TryAcquireOrRenew { .. } | Call::Release { .. }) {
            self.wait_until_running().await;
        }
        next.run(call).await
    }
}

/// One fenced write as the demo saw it.
#[derive(Debug)]
struct WriteOutcome {
    node: String,
    token: FencingToken,
    admitted: bool,
}

/// Runs the story; fails if any beat of it does not happen as told.
pub async fn run(stores: DemoStores, timing: DemoTiming, unique_names: bool) -> anyhow::Result<()> {
    let names = Names::new(unique_names);
    let narrator = Narrator {
        start: Instant::now(),
    };
    let DemoTiming {
        ttl,
        renew,
        write_every,
        stall: stall_for,
    } = timing;
    println!(
        "tenure demo: role {:?}, lease ttl {ttl:?}, renew every {renew:?}; fence on {:?}\n",
        names.role, names.resource
    );

    let (writes_tx, mut writes) = mpsc::unbounded_channel::<WriteOutcome>();
    let stall_a = Stall::new();
    let shutdown_a = CancellationToken::new();
    let shutdown_b = CancellationToken::new();

    // Membership: both nodes heartbeat; node-a's heartbeats freeze with it.
    let heartbeat_every = stores.registry.ttl() / 3;
    let membership_a = spawn_member(
        stores.registry.clone(),
        names.node_a.clone(),
        heartbeat_every,
        stall_a.clone(),
        shutdown_a.clone(),
    );
    let membership_b = spawn_member(
        stores.registry.clone(),
        names.node_b.clone(),
        heartbeat_every,
        Stall::new(),
        shutdown_b.clone(),
    );

    let options = |owner: &str| LeaseLeaderOptions {
        owner_id: owner.to_owned(),
        lease_ttl: ttl,
        renew_interval: renew,
        retry_interval: Duration::from_secs(60),
        ..Default::default()
    };
    let leases_a = InterceptStore::new(stores.leases.clone()).with(Arc::new(stall_a.clone()));
    let leases_a: Arc<dyn LeaseStore> = Arc::new(leases_a);
    let elector_a = Arc::new(LeaseLeaderElector::new(leases_a, options(&names.node_a))?);
    let elector_b = Arc::new(LeaseLeaderElector::new(
        stores.leases.clone(),
        options(&names.node_b),
    )?);

    spawn_state_narrator(&elector_a, "node-a", narrator.clone());
    spawn_state_narrator(&elector_b, "node-b", narrator.clone());
    narrator.say("node-a", "starts and contends for the role");
    let node_a = spawn_node(
        elector_a.clone(),
        &names,
        "node-a",
        stores.fence.clone(),
        stall_a.clone(),
        write_every,
        writes_tx.clone(),
        narrator.clone(),
        shutdown_a.clone(),
    );
    let token_a = wait_leader(&elector_a, ttl * 4)
        .await
        .context("node-a never led")?;
    let first = writes.recv().await.context("node-a never wrote")?;
    ensure!(
        first.admitted,
        "node-a's first write was refused: {first:?}"
    );

    narrator.say("node-b", "starts and contends for the role");
    let node_b = spawn_node(
        elector_b.clone(),
        &names,
        "node-b",
        stores.fence.clone(),
        Stall::new(),
        write_every,
        writes_tx.clone(),
        narrator.clone(),
        shutdown_b.clone(),
    );
    tokio::time::sleep(renew).await;
    let state_b = elector_b.watch().borrow().clone();
    if let ElectionState::Follower {
        holder: Some((holder, token)),
    } = state_b
    {
        narrator.say("node-b", format!("follows: {holder} holds token {token}"));
    }
    print_members(&narrator, stores.registry.as_ref()).await?;

    narrator.say(
        "node-a",
        format!("STALLS for {stall_for:?} (GC pause / frozen VM): renewals, heartbeats and its worker freeze"),
    );
    stall_a.set(true);
    let stall_started = Instant::now();
    let token_b = wait_leader(&elector_b, ttl * 3)
        .await
        .context("node-b never took over")?;
    ensure!(
        token_b > token_a,
        "takeover token {token_b} is not above {token_a}"
    );
    loop {
        let write = writes.recv().await.context("node-b never wrote")?;
        if write.node == "node-b" && write.admitted {
            break;
        }
    }
    tokio::time::sleep(stores.registry.ttl()).await;
    print_members(&narrator, stores.registry.as_ref()).await?;

    tokio::time::sleep_until(stall_started + stall_for).await;
    narrator.say(
        "node-a",
        "WAKES UP and finishes the write it started before the stall",
    );
    stall_a.set(false);
    let stale = loop {
        let write = writes
            .recv()
            .await
            .context("node-a never retried its write")?;
        if write.node == "node-a" {
            break write;
        }
    };
    ensure!(
        !stale.admitted && stale.token == token_a,
        "the stale write with token {token_a} was not refused: {stale:?}"
    );
    tokio::time::sleep(heartbeat_every * 2).await;
    print_members(&narrator, stores.registry.as_ref()).await?;

    narrator.say("node-b", "shuts down gracefully and releases the lease");
    let handover = Instant::now();
    shutdown_b.cancel();
    let token_c = wait_leader(&elector_a, ttl * 3)
        .await
        .context("node-a never took over after release")?;
    let took = handover.elapsed();
    ensure!(
        token_c > token_b,
        "handover token {token_c} is not above {token_b}"
    );
    narrator.say(
        "node-a",
        format!(
            "took over {:.1} ms after the release (pushed by the store, no retry wait)",
            took.as_secs_f64() * 1e3
        ),
    );
    loop {
        let write = writes
            .recv()
            .await
            .context("node-a never wrote in its new term")?;
        if write.node == "node-a" && write.admitted && write.token == token_c {
            break;
        }
    }

    shutdown_a.cancel();
    for handle in [node_a, node_b] {
        handle.await.context("node task")??;
    }
    for handle in [membership_a, membership_b] {
        handle.await.context("membership task")??;
    }
    drop(writes_tx);
    let highest = stores.fence.highest(&names.resource).await?;
    println!(
        "\nsummary: tokens {token_a} -> {token_b} -> {token_c}; the stale write with token {token_a} \
         was refused by the fence; highest admitted token: {}",
        highest.map_or_else(|| "none".to_owned(), |t| t.to_string())
    );
    if highest != Some(token_c) {
        bail!("the fence's highest token is {highest:?}, expected {token_c}");
    }
    Ok(())
}

async fn wait_leader(
    elector: &LeaseLeaderElector,
    within: Duration,
) -> anyhow::Result<FencingToken> {
    let mut state = elector.watch();
    let leader = tokio::time::timeout(within, state.wait_for(ElectionState::is_leader))
        .await
        .context("timed out")?
        .context("elector gone")?
        .clone();
    match leader {
        ElectionState::Leader { fencing_token } => Ok(fencing_token),
        other => bail!("unexpected state {other:?}"),
    }
}

/// Narrates the moment an elector stops leading, which the worker may not see.
fn spawn_state_narrator(elector: &LeaseLeaderElector, label: &'static str, narrator: Narrator) {
    let mut state = elector.watch();
    tokio::spawn(async move {
        let mut leading = false;
        while state.changed().await.is_ok() {
            let now_leading = state.borrow_and_update().is_leader();
            if leading && !now_leading {
                narrator.say(
                    label,
                    "elector ends its leadership (leadership token cancelled)",
                );
            }
            leading = now_leading;
        }
    });
}

async fn print_members(narrator: &Narrator, registry: &dyn NodeRegistry) -> anyhow::Result<()> {
    let live: Vec<String> = registry
        .live_nodes()
        .await?
        .into_iter()
        .map(|id| display_node(&id))
        .collect();
    narrator.say("members", format!("live nodes: [{}]", live.join(", ")));
    Ok(())
}

/// `node-a-1a2b3c` -> `node-a`.
fn display_node(id: &str) -> String {
    id.get(..6).unwrap_or(id).to_owned()
}

fn spawn_member(
    registry: Arc<dyn NodeRegistry>,
    node_id: String,
    every: Duration,
    stall: Stall,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<tenure::Result<()>> {
    tokio::spawn(async move {
        let mut metadata = Metadata::new();
        metadata.insert("demo".to_owned(), "true".to_owned());
        loop {
            stall.wait_until_running().await;
            registry.heartbeat_with(&node_id, &metadata).await?;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
        }
        registry.leave(&node_id).await.map(|_| ())
    })
}

#[allow(clippy::too_many_arguments)]
fn spawn_node(
    elector: Arc<LeaseLeaderElector>,
    names: &Names,
    label: &'static str,
    fence: Arc<dyn FenceStore>,
    stall: Stall,
    write_every: Duration,
    writes: mpsc::UnboundedSender<WriteOutcome>,
    narrator: Narrator,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<tenure::Result<()>> {
    let role = names.role.clone();
    let resource = names.resource.clone();
    tokio::spawn(async move {
        elector
            .run(
                &role,
                move |token, leadership| {
                    let fence = fence.clone();
                    let stall = stall.clone();
                    let writes = writes.clone();
                    let narrator = narrator.clone();
                    let resource = resource.clone();
                    async move {
                        narrator.say(label, format!("elected with fencing token {token}"));
                        let mut batch = 0u32;
                        loop {
                            batch += 1;
                            // The worker decided to write; a stall here freezes it
                            // between deciding and writing, as a GC pause would.
                            stall.wait_until_running().await;
                            let admitted = match fence.admit(&resource, token).await {
                                Ok(()) => {
                                    narrator.say(label, format!("writes batch {batch} with token {token}: admitted"));
                                    true
                                }
                                Err(Error::Fenced { presented, highest }) => {
                                    narrator.say(label, format!(
                                        "writes batch {batch} with token {presented}: REJECTED by the fence (highest admitted is {highest})"
                                    ));
                                    false
                                }
                                Err(other) => return Err(other),
                            };
                            let _ = writes.send(WriteOutcome { node: label.to_owned(), token, admitted });
                            if !admitted {
                                narrator.say(label, "steps down: its term is over");
                                return Ok(());
                            }
                            tokio::select! {
                                _ = leadership.cancelled() => return Ok(()),
                                _ = tokio::time::sleep(write_every) => {}
                            }
                        }
                    }
                },
                shutdown,
            )
            .await
    })
}

/// `tenure demo --store URL`: virtual time in memory, real time (short TTLs) elsewhere.
pub fn run_cli(url: &crate::store::StoreUrl) -> anyhow::Result<()> {
    use crate::store::StoreUrl;
    if let StoreUrl::Memory = url {
        // Virtual time: the story's seconds pass in milliseconds.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()?;
        return runtime.block_on(async {
            let timing = DemoTiming::fast();
            let stores = crate::store::memory(timing.ttl)?;
            run(into_demo(stores), timing, false).await
        });
    }
    let timing = match url {
        StoreUrl::Etcd(_) | StoreUrl::Kube(_) => DemoTiming::coarse(),
        _ => DemoTiming::fast(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(crate::store::with_store(url, timing.ttl, |stores| {
        run(into_demo(stores), timing, true)
    }))
}

fn into_demo(stores: crate::store::Stores) -> DemoStores {
    DemoStores {
        leases: stores.leases,
        registry: stores.registry,
        fence: stores.fence,
    }
}
