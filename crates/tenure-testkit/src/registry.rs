//! Registry wrappers for tests: [`Filtered`] passes every call through one
//! [`RegistryFilter`] (a fault, a count); [`CountedReads`] counts how often members read
//! the membership, so a member that reads in a loop shows as a count, not as a test
//! that hangs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure::{Metadata, NodeInfo, NodeRegistry, Result};
use tokio::time::Instant;

/// What a test changes of the calls that reach a registry through [`Filtered`]. Each
/// hook passes its calls on unchanged unless the test overrides it: one wrapper, so a
/// fault is one small type.
#[async_trait::async_trait]
pub trait RegistryFilter: Send + Sync + 'static {
    /// Before a write (a heartbeat or a leave): `Ok(true)` passes it on; `Ok(false)`
    /// drops it, answered as a registry answers a write with nothing to do (a heartbeat
    /// `Ok`, a leave `false`), as for a process that was killed; an error fails it.
    fn before_write(&self) -> Result<bool> {
        Ok(true)
    }

    /// Before a read of the membership (`live_nodes`, `members`).
    async fn before_read(&self) {}

    /// The deadline a wait for a change of the members passes on to the registry;
    /// `None` waits until `deadline` without asking it, as a backend that pushes no
    /// change (the trait's default) does.
    fn wait_until(&self, deadline: Instant) -> Option<Instant> {
        Some(deadline)
    }
}

/// A [`NodeRegistry`] whose calls pass through a [`RegistryFilter`] on their way to
/// `inner`.
pub struct Filtered<F> {
    inner: Arc<dyn NodeRegistry>,
    filter: F,
}

impl<F: RegistryFilter> Filtered<F> {
    /// `inner`, with its calls passing through `filter`.
    pub fn new(inner: Arc<dyn NodeRegistry>, filter: F) -> Filtered<F> {
        Filtered { inner, filter }
    }

    /// The registry behind the filter.
    pub fn inner(&self) -> &Arc<dyn NodeRegistry> {
        &self.inner
    }

    /// The filter, for the state a test reads back.
    pub fn filter(&self) -> &F {
        &self.filter
    }
}

#[async_trait::async_trait]
impl<F: RegistryFilter> NodeRegistry for Filtered<F> {
    async fn record_heartbeat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        if !self.filter.before_write()? {
            return Ok(());
        }
        self.inner.record_heartbeat(node_id, metadata).await
    }
    async fn live_nodes(&self) -> Result<Vec<String>> {
        self.filter.before_read().await;
        self.inner.live_nodes().await
    }
    async fn members(&self) -> Result<Vec<NodeInfo>> {
        self.filter.before_read().await;
        self.inner.members().await
    }
    async fn leave(&self, node_id: &str) -> Result<bool> {
        if !self.filter.before_write()? {
            return Ok(false);
        }
        self.inner.leave(node_id).await
    }
    fn ttl(&self) -> Duration {
        self.inner.ttl()
    }
    async fn wait_for_members_change(&self, observed: &[String], deadline: Instant) {
        match self.filter.wait_until(deadline) {
            Some(until) => self.inner.wait_for_members_change(observed, until).await,
            None => tokio::time::sleep_until(deadline).await,
        }
    }
}

/// A [`RegistryFilter`] that counts the reads of the membership. Past `cap` reads each
/// further read first waits an hour: on paused tokio time a member reading in a loop
/// would stop the clock, and the test could never report the count.
pub struct ReadCount {
    reads: AtomicUsize,
    cap: usize,
}

/// A registry whose reads of the membership are counted: see [`ReadCount`].
pub type CountedReads = Filtered<ReadCount>;

impl CountedReads {
    /// Counts the reads of `inner`, holding back every read past `cap`.
    pub fn counting(inner: Arc<dyn NodeRegistry>, cap: usize) -> CountedReads {
        let reads = AtomicUsize::new(0);
        Filtered::new(inner, ReadCount { reads, cap })
    }

    /// Reads of the membership so far.
    pub fn reads(&self) -> usize {
        self.filter.reads.load(Ordering::SeqCst)
    }

    /// Whether the reads reached the cap (and are being held back).
    pub fn capped(&self) -> bool {
        self.reads() >= self.filter.cap
    }
}

#[async_trait::async_trait]
impl RegistryFilter for ReadCount {
    async fn before_read(&self) {
        if self.reads.fetch_add(1, Ordering::SeqCst) >= self.cap {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
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
