//! The background heartbeat helper (`spawn_heartbeat`) on the in-memory registry, with
//! paused tokio time and a [`TokioClock`] so the registry's TTL and the loop's ticks move
//! together.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tenure::intercept::{FilteredRegistry, RegistryFilter};
use tenure::{
    spawn_heartbeat, Clock, Error, InMemoryNodeRegistry, Metadata, NodeRegistry, Result, TokioClock,
};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(3);
const INTERVAL: Duration = Duration::from_secs(1);

fn clock() -> TokioClock {
    TokioClock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
}

fn registry(clock: &TokioClock) -> Arc<InMemoryNodeRegistry> {
    Arc::new(InMemoryNodeRegistry::with_clock(TTL, clock.clone()).unwrap())
}

fn metadata() -> Metadata {
    Metadata::from([("addr".to_owned(), "10.0.0.7:8080".to_owned())])
}

/// Heartbeats node-a into `registry` every second, with [`metadata`], until the token
/// returned is cancelled.
fn beat_node_a(
    registry: Arc<dyn NodeRegistry>,
) -> (CancellationToken, tokio::task::JoinHandle<Result<()>>) {
    let cancel = CancellationToken::new();
    let handle = spawn_heartbeat(registry, "node-a", metadata(), INTERVAL, cancel.clone());
    (cancel, handle)
}

/// While `failing` is set, heartbeats (and leave) fail with `Error::Store`.
#[derive(Default)]
struct Flaky {
    failing: AtomicBool,
    failed: AtomicUsize,
}

impl RegistryFilter for Flaky {
    fn before_write(&self) -> Result<bool> {
        if self.failing.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(Error::store_msg("memory", "injected failure"));
        }
        Ok(true)
    }
}

/// Setup: registry TTL 3 s, heartbeat every 1 s. Over 20 TTLs the node is live at every
/// 250 ms probe with its metadata; on cancel it leaves at once (no store time passes)
/// while a second node that stopped heartbeating without leaving lapses only after the TTL.
#[tokio::test(start_paused = true)]
async fn heartbeat_keeps_a_node_live_and_cancel_leaves_at_once() {
    let clock = clock();
    let registry = registry(&clock);
    registry.heartbeat("node-b").await.unwrap();
    let (cancel, handle) = beat_node_a(registry.clone());

    tracing::info!("--- the loop keeps node-a live for 20 TTLs");
    let probe = Duration::from_millis(250);
    let mut probes = 0;
    while probes * probe < TTL * 20 {
        tokio::time::sleep(probe).await;
        probes += 1;
        let live = registry.live_nodes().await.unwrap();
        assert!(
            live.contains(&"node-a".to_owned()),
            "probe {probes}: {live:?}"
        );
        if probe * probes >= TTL {
            assert_eq!(live, ["node-a"], "node-b lapsed after its TTL");
        }
    }
    let members = registry.members().await.unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].metadata, metadata());
    assert!(members[0].heartbeat_age() <= INTERVAL);
    assert!(clock.now().duration_since(members[0].first_seen).unwrap() >= TTL * 20);

    tracing::info!("--- cancel: node-a leaves at once");
    let at = clock.now();
    cancel.cancel();
    handle.await.unwrap().unwrap();
    assert_eq!(clock.now(), at);
    assert!(registry.live_nodes().await.unwrap().is_empty());
}

/// Setup: a flaky registry (TTL 3 s, heartbeat every 1 s). Heartbeats fail for 1 s (less
/// than the TTL: the node stays live), then for 6 s (the node lapses), then succeed
/// again: the loop never ends and the node comes back with a new first-seen time.
#[tokio::test(start_paused = true)]
async fn heartbeat_failures_do_not_end_the_loop() {
    let clock = clock();
    let flaky = Arc::new(FilteredRegistry::new(registry(&clock), Flaky::default()));
    let (cancel, handle) = beat_node_a(flaky.clone());
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let first_seen = flaky.members().await.unwrap()[0].first_seen;

    tracing::info!("--- failures shorter than the TTL");
    flaky.filter().failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    flaky.filter().failing.store(false, Ordering::SeqCst);
    assert_eq!(flaky.filter().failed.load(Ordering::SeqCst), 1);
    assert_eq!(flaky.live_nodes().await.unwrap(), ["node-a"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(flaky.members().await.unwrap()[0].first_seen, first_seen);

    tracing::info!("--- failures longer than the TTL");
    flaky.filter().failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(flaky.live_nodes().await.unwrap().is_empty(), "lapsed");
    assert!(!handle.is_finished(), "failures never end the loop");
    flaky.filter().failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let members = flaky.members().await.unwrap();
    assert_eq!(members.len(), 1, "back after the failures");
    assert!(members[0].first_seen > first_seen, "a new membership");

    tracing::info!("--- cancel while leave fails: the loop still ends cleanly");
    flaky.filter().failing.store(true, Ordering::SeqCst);
    cancel.cancel();
    handle.await.unwrap().unwrap();
    flaky.filter().failing.store(false, Ordering::SeqCst);
    assert_eq!(
        flaky.live_nodes().await.unwrap(),
        ["node-a"],
        "leave failed"
    );
    tokio::time::sleep(TTL).await;
    assert!(
        flaky.live_nodes().await.unwrap().is_empty(),
        "lapsed after the TTL"
    );
}

/// Setup: none running. A zero interval or a bad node id makes the heartbeat task end
/// at once with `InvalidArgument` naming the field, without touching the registry.
#[tokio::test(start_paused = true)]
async fn heartbeat_bad_input_is_invalid_argument() {
    let clock = clock();
    let registry = registry(&clock);
    let zero = spawn_heartbeat(
        registry.clone(),
        "node-a",
        Metadata::new(),
        Duration::ZERO,
        CancellationToken::new(),
    );
    match zero.await.unwrap() {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "interval"),
        other => panic!("expected InvalidArgument(interval), got {other:?}"),
    }
    for bad in ["", "node\0a"] {
        let handle = spawn_heartbeat(
            registry.clone(),
            bad,
            Metadata::new(),
            INTERVAL,
            CancellationToken::new(),
        );
        match handle.await.unwrap() {
            Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "node_id"),
            other => panic!("expected InvalidArgument(node_id), got {other:?}"),
        }
    }
    assert!(registry.members().await.unwrap().is_empty());
}

/// A registry whose writes (heartbeats, leaves) never answer while `hanging` is set, as
/// on a connection that stopped answering; they are not applied.
struct Hanging {
    inner: Arc<InMemoryNodeRegistry>,
    hanging: AtomicBool,
    hung: AtomicUsize,
}

impl Hanging {
    async fn hang_if_set(&self) {
        if self.hanging.load(Ordering::SeqCst) {
            self.hung.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait::async_trait]
impl NodeRegistry for Hanging {
    async fn record_heartbeat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        self.hang_if_set().await;
        self.inner.record_heartbeat(node_id, metadata).await
    }
    async fn members(&self) -> Result<Vec<tenure::NodeInfo>> {
        self.inner.members().await
    }
    async fn leave(&self, node_id: &str) -> Result<bool> {
        self.hang_if_set().await;
        self.inner.leave(node_id).await
    }
    fn ttl(&self) -> Duration {
        self.inner.ttl()
    }
}

fn hanging(clock: &TokioClock) -> Arc<Hanging> {
    Arc::new(Hanging {
        inner: registry(clock),
        hanging: AtomicBool::new(false),
        hung: AtomicUsize::new(0),
    })
}

/// Setup: registry TTL 3 s, heartbeat every 1 s; one heartbeat never answers (the
/// registry's writes hang for half an interval). The loop gives it up after an interval
/// and sends the next: the node stays live at every 100 ms probe for 5 TTLs. (Waiting on
/// it for good, the node lapsed and never came back.)
#[tokio::test(start_paused = true)]
async fn a_heartbeat_that_never_answers_is_given_up_and_the_next_sent() {
    let clock = clock();
    let registry = hanging(&clock);
    let (cancel, handle) = beat_node_a(registry.clone());
    tokio::time::sleep(Duration::from_millis(2_700)).await;
    registry.hanging.store(true, Ordering::SeqCst);
    tokio::time::sleep(INTERVAL / 2).await;
    registry.hanging.store(false, Ordering::SeqCst);
    assert_eq!(
        registry.hung.load(Ordering::SeqCst),
        1,
        "one heartbeat hung"
    );
    let probe = Duration::from_millis(100);
    for probes in 1..=(5 * TTL).as_millis() / probe.as_millis() {
        tokio::time::sleep(probe).await;
        let live = registry.live_nodes().await.unwrap();
        assert_eq!(live, ["node-a"], "probe {probes} after the hung heartbeat");
    }
    cancel.cancel();
    handle.await.unwrap().unwrap();
    assert!(registry.live_nodes().await.unwrap().is_empty(), "left");
}

/// Setup: as above, but the loop is cancelled 200 ms into a heartbeat that hangs (the
/// registry answers again). The loop gives the heartbeat up at its interval, as ever,
/// then leaves: it ends 800 ms after the cancel (it waited on the hung heartbeat for
/// good). A leave that hangs too is given up after the TTL (the node lapses by then
/// anyway), so the loop still ends.
#[tokio::test(start_paused = true)]
async fn cancel_while_a_heartbeat_hangs_still_leaves_and_ends() {
    let clock = clock();
    let registry = hanging(&clock);

    tracing::info!("--- the registry answers again: the leave lands as the heartbeat is given up");
    let (cancel, handle) = beat_node_a(registry.clone());
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    registry.hanging.store(true, Ordering::SeqCst);
    tokio::time::sleep(INTERVAL / 2).await;
    registry.hanging.store(false, Ordering::SeqCst);
    let at = clock.now();
    cancel.cancel();
    let ended = tokio::time::timeout(TTL, handle).await;
    assert!(
        ended.is_ok(),
        "the loop did not end within a TTL of its cancel"
    );
    let given_up = INTERVAL - Duration::from_millis(200);
    assert_eq!(clock.now().duration_since(at).unwrap(), given_up);
    assert!(registry.live_nodes().await.unwrap().is_empty(), "left");

    tracing::info!("--- the leave hangs too: given up after the TTL");
    let (cancel, handle) = beat_node_a(registry.clone());
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    registry.hanging.store(true, Ordering::SeqCst);
    tokio::time::sleep(INTERVAL / 2).await;
    let at = clock.now();
    cancel.cancel();
    let ended = tokio::time::timeout(2 * TTL, handle).await;
    assert!(
        ended.is_ok(),
        "the loop did not end within two TTLs of its cancel"
    );
    assert_eq!(clock.now().duration_since(at).unwrap(), given_up + TTL);
    registry.hanging.store(false, Ordering::SeqCst);
    assert!(registry.live_nodes().await.unwrap().is_empty(), "lapsed");
}
