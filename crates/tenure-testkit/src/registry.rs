//! A registry wrapper for tests that count how often members read the membership: a
//! member that reads in a loop shows as a count, not as a test that hangs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure::{Metadata, NodeInfo, NodeRegistry, Result};
use tokio::time::Instant;

/// A [`NodeRegistry`] that counts the reads of the membership (`live_nodes`, `members`)
/// and passes every call on. Past `cap` reads each further read first waits an hour:
/// on paused tokio time a member reading in a loop would stop the clock, and the test
/// could never report the count.
pub struct CountedReads {
    inner: Arc<dyn NodeRegistry>,
    reads: AtomicUsize,
    cap: usize,
}

impl CountedReads {
    /// Counts the reads of `inner`, holding back every read past `cap`.
    pub fn new(inner: Arc<dyn NodeRegistry>, cap: usize) -> CountedReads {
        CountedReads {
            inner,
            reads: AtomicUsize::new(0),
            cap,
        }
    }

    /// Reads of the membership so far.
    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    /// Whether the reads reached the cap (and are being held back).
    pub fn capped(&self) -> bool {
        self.reads() >= self.cap
    }

    /// The registry whose reads are counted.
    pub fn inner(&self) -> &Arc<dyn NodeRegistry> {
        &self.inner
    }

    async fn read(&self) {
        if self.reads.fetch_add(1, Ordering::SeqCst) >= self.cap {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
}

#[async_trait::async_trait]
impl NodeRegistry for CountedReads {
    async fn heartbeat(&self, node_id: &str) -> Result<()> {
        self.inner.heartbeat(node_id).await
    }
    async fn heartbeat_with(&self, node_id: &str, metadata: &Metadata) -> Result<()> {
        self.inner.heartbeat_with(node_id, metadata).await
    }
    async fn live_nodes(&self) -> Result<Vec<String>> {
        self.read().await;
        self.inner.live_nodes().await
    }
    async fn members(&self) -> Result<Vec<NodeInfo>> {
        self.read().await;
        self.inner.members().await
    }
    async fn leave(&self, node_id: &str) -> Result<bool> {
        self.inner.leave(node_id).await
    }
    fn ttl(&self) -> Duration {
        self.inner.ttl()
    }
    async fn wait_for_members_change(&self, observed: &[String], deadline: Instant) {
        self.inner.wait_for_members_change(observed, deadline).await
    }
}

/// How long `registry.wait_for_members_change(observed, ..)` waited, given `limit`
/// from now as its deadline.
pub async fn waited_for_change(
    registry: &dyn NodeRegistry,
    observed: &[String],
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    registry
        .wait_for_members_change(observed, started + limit)
        .await;
    started.elapsed()
}
