//! Heartbeat membership: which instances are live right now.
//!
//! A node is live while its last heartbeat is within the registry's TTL on store time
//! (`now < last + ttl`). Membership is a hint, eventually consistent: use a lease, not
//! the member list, to decide who may act.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::lease::validate_name;
use crate::{Error, Result};

/// Free-form node metadata (address, version, zone): a small string map.
pub type Metadata = BTreeMap<String, String>;

/// At most this many metadata entries per node.
pub const MAX_METADATA_ENTRIES: usize = 64;
/// At most this many bytes per metadata key.
pub const MAX_METADATA_KEY_LEN: usize = 255;
/// At most this many bytes per metadata value.
pub const MAX_METADATA_VALUE_LEN: usize = 4096;

/// One live member, from [`NodeRegistry::members`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    /// The node's id.
    pub node_id: String,
    /// Store time of the node's last heartbeat.
    pub last_heartbeat: SystemTime,
    /// Store time of the first heartbeat of the node's current membership (a node that
    /// lapsed or left and came back starts over).
    pub first_seen: SystemTime,
    /// What the node said about itself with its last [`NodeRegistry::heartbeat_with`].
    pub metadata: Metadata,
    /// Store time at which this view was read.
    pub now: SystemTime,
}

impl NodeInfo {
    /// How long ago the last heartbeat was, on store time.
    pub fn heartbeat_age(&self) -> Duration {
        self.now
            .duration_since(self.last_heartbeat)
            .unwrap_or(Duration::ZERO)
    }
}

/// A registry of nodes that prove they are alive by heartbeating.
#[async_trait]
pub trait NodeRegistry: Send + Sync + 'static {
    /// Records that `node_id` is alive as of store now, keeping its metadata.
    async fn heartbeat(&self, node_id: &str) -> Result<()> {
        self.record_heartbeat(node_id, None).await
    }

    /// Records that `node_id` is alive as of store now and replaces its metadata.
    async fn heartbeat_with(&self, node_id: &str, metadata: &Metadata) -> Result<()> {
        self.record_heartbeat(node_id, Some(metadata)).await
    }

    /// The one step behind [`heartbeat`](Self::heartbeat) and
    /// [`heartbeat_with`](Self::heartbeat_with), which every backend implements:
    /// `Some(metadata)` replaces the node's metadata, `None` keeps it.
    async fn record_heartbeat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()>;

    /// The ids of live nodes, sorted. The default reads [`members`](Self::members); a
    /// backend with a cheaper read of the ids alone overrides it.
    async fn live_nodes(&self) -> Result<Vec<String>> {
        let members = self.members().await?;
        Ok(members.into_iter().map(|member| member.node_id).collect())
    }

    /// Live nodes with their heartbeat times and metadata, sorted by id.
    async fn members(&self) -> Result<Vec<NodeInfo>>;

    /// Removes `node_id` at once; returns whether it was a member.
    async fn leave(&self, node_id: &str) -> Result<bool>;

    /// The liveness TTL: a node is live for this long after a heartbeat.
    fn ttl(&self) -> Duration;

    /// Waits until the live membership differs from `observed` (the sorted ids of
    /// [`live_nodes`](Self::live_nodes) as the caller last read them) or until
    /// `deadline`, whichever comes first.
    ///
    /// A backend that can push (a notify, a notification, a watch) returns as soon as a
    /// node joins (its first heartbeat, or the first after it lapsed) or leaves, so
    /// members react to a join or a leave in one round trip rather than one poll
    /// interval. A node that stops heartbeating is not pushed: it drops out when its TTL
    /// passes, which callers time themselves (from [`members`](Self::members)). It may
    /// return early spuriously; callers then read again. The default sleeps to the
    /// deadline.
    async fn wait_for_members_change(&self, observed: &[String], deadline: tokio::time::Instant) {
        let _ = observed;
        tokio::time::sleep_until(deadline).await;
    }
}

/// The live nodes a registry's last read of the members showed, tagged with where the
/// store stood when that read began (an etcd revision, a listener's count of
/// notifications): for backends, so that a wait for a change of exactly those nodes can
/// start from that point instead of reading again.
#[derive(Debug)]
pub struct LastRead<M> {
    read: parking_lot::Mutex<Option<(M, Vec<String>)>>,
}

impl<M> Default for LastRead<M> {
    fn default() -> Self {
        LastRead {
            read: parking_lot::Mutex::new(None),
        }
    }
}

impl<M: Copy> LastRead<M> {
    /// Keeps what a read that began `at` showed; `None` (the store cannot say where it
    /// stood) forgets the last one, so the next wait reads.
    pub fn remember(&self, at: Option<M>, live: Vec<String>) {
        *self.read.lock() = at.map(|at| (at, live));
    }

    /// Where the last read began, if it showed exactly `observed`: a wait for a change
    /// of `observed` may start from there.
    pub fn since(&self, observed: &[String]) -> Option<M> {
        let read = self.read.lock();
        read.as_ref()
            .filter(|(_, live)| live == observed)
            .map(|(at, _)| *at)
    }
}

/// Whether a node last heard of at `heard` is live at `now` for a registry of TTL `ttl`:
/// `now < heard + ttl`, the rule every registry's reads judge by (a time past the clock's
/// range is never live).
pub fn is_live(heard: SystemTime, ttl: Duration, now: SystemTime) -> bool {
    heard.checked_add(ttl).is_some_and(|until| now < until)
}

/// Checks metadata against the size limits.
pub fn validate_metadata(metadata: &Metadata) -> Result<()> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(Error::invalid(
            "metadata",
            format!(
                "has {} entries, at most {MAX_METADATA_ENTRIES} allowed",
                metadata.len()
            ),
        ));
    }
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_KEY_LEN || key.contains('\0') {
            return Err(Error::invalid(
                "metadata",
                format!("key {key:?} must be 1 to {MAX_METADATA_KEY_LEN} bytes without NUL"),
            ));
        }
        if value.len() > MAX_METADATA_VALUE_LEN || value.contains('\0') {
            return Err(Error::invalid(
                "metadata",
                format!(
                    "value of {key:?} must be at most {MAX_METADATA_VALUE_LEN} bytes without NUL"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks a heartbeat's arguments.
pub fn validate_heartbeat(node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
    validate_name("node_id", node_id)?;
    metadata.map_or(Ok(()), validate_metadata)
}

/// Heartbeats `node_id` every `interval` until `cancel` fires, then leaves.
///
/// Failed heartbeats are logged and retried on the next tick; they never end the loop.
/// Pick `interval` well under the registry's TTL (a third of it is usual).
///
/// No call waits on the registry for good, since a connection that stops answering
/// would otherwise hold the node out of the membership, or its caller's shutdown, for
/// as long as it hangs: a heartbeat unanswered after one `interval` is given up and the
/// next one sent at once, and the leave is given up after the registry's TTL (the node
/// has lapsed by then anyway). A cancel waits for a heartbeat in flight to answer or be
/// given up, so that the leave is not overtaken by it; one given up may still land
/// later, even after the leave, keeping the node for one TTL more.
pub async fn run_heartbeat(
    registry: Arc<dyn NodeRegistry>,
    node_id: String,
    metadata: Metadata,
    interval: Duration,
    cancel: CancellationToken,
) -> Result<()> {
    heartbeat_from(
        registry,
        node_id,
        metadata,
        interval,
        cancel,
        tokio::time::Instant::now(),
    )
    .await
}

/// [`run_heartbeat`] whose first heartbeat is sent at `first` (one sent just before
/// need not be sent again).
pub(crate) async fn heartbeat_from(
    registry: Arc<dyn NodeRegistry>,
    node_id: String,
    metadata: Metadata,
    interval: Duration,
    cancel: CancellationToken,
    first: tokio::time::Instant,
) -> Result<()> {
    validate_heartbeat(&node_id, Some(&metadata))?;
    if interval.is_zero() {
        return Err(Error::invalid("interval", "must be greater than zero"));
    }
    let mut ticker = tokio::time::interval_at(first, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            _ = ticker.tick() => {}
        }
        // Not raced with `cancel`: see above.
        beat_once(registry.as_ref(), &node_id, &metadata, interval).await;
    }
    let ttl = registry.ttl();
    match tokio::time::timeout(ttl, registry.leave(&node_id)).await {
        Ok(Ok(_)) => tracing::debug!(node_id = %node_id, "left membership"),
        Ok(Err(error)) => {
            tracing::warn!(node_id = %node_id, %error, "leave failed; the node lapses after the ttl")
        }
        Err(_) => tracing::warn!(node_id = %node_id, ?ttl,
            "leave unanswered after the ttl; given up, the node has lapsed"),
    }
    Ok(())
}

/// One heartbeat of `node_id`, given up if unanswered after `bound`; a failure is logged
/// and counted, for the caller to retry. Whether it was answered as written.
pub(crate) async fn beat_once(
    registry: &dyn NodeRegistry,
    node_id: &str,
    metadata: &Metadata,
    bound: Duration,
) -> bool {
    match tokio::time::timeout(bound, registry.heartbeat_with(node_id, metadata)).await {
        Ok(Ok(())) => {
            metrics::counter!("tenure_heartbeats_total", "outcome" => "ok").increment(1);
            return true;
        }
        Ok(Err(error)) => tracing::warn!(%node_id, %error, "heartbeat failed; retrying"),
        Err(_) => tracing::warn!(%node_id, ?bound, "heartbeat unanswered; given up, retrying"),
    }
    metrics::counter!("tenure_heartbeats_total", "outcome" => "failed").increment(1);
    metrics::counter!("tenure_store_errors_total", "operation" => "heartbeat").increment(1);
    false
}

/// Spawns [`run_heartbeat`] on the current tokio runtime.
pub fn spawn_heartbeat(
    registry: Arc<dyn NodeRegistry>,
    node_id: impl Into<String>,
    metadata: Metadata,
    interval: Duration,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<Result<()>> {
    tokio::spawn(run_heartbeat(
        registry,
        node_id.into(),
        metadata,
        interval,
        cancel,
    ))
}
