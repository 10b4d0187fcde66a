//! Fault injection for node registries: [`FilteredRegistry`] passes every call of a
//! [`NodeRegistry`] through one [`RegistryFilter`] (drop the writes of a killed process,
//! delay or count the reads, stop the pushes), as [`InterceptStore`](super::InterceptStore)
//! does for lease stores. The registry trait is small, so one filter with a hook per kind
//! of call does what the store's stack of interceptors does there.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{Metadata, NodeInfo, NodeRegistry, Result};

/// What changes of the calls that reach a registry through [`FilteredRegistry`]. Each
/// hook passes its calls on unchanged unless the filter overrides it: one wrapper, so a
/// fault is one small type.
#[async_trait]
pub trait RegistryFilter: Send + Sync + 'static {
    /// Before a write (a heartbeat or a leave): `Ok(true)` passes it on; `Ok(false)`
    /// drops it, answered as a registry answers a write with nothing to do (a heartbeat
    /// `Ok`, a leave `false`), as for a process that was killed; an error fails it.
    fn before_write(&self) -> Result<bool> {
        Ok(true)
    }

    /// Before a leave, in place of [`before_write`](Self::before_write) (which it calls
    /// unless overridden): a leave lost on its way while heartbeats went through.
    fn before_leave(&self) -> Result<bool> {
        self.before_write()
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
pub struct FilteredRegistry<F> {
    inner: Arc<dyn NodeRegistry>,
    filter: F,
}

impl<F: RegistryFilter> FilteredRegistry<F> {
    /// `inner`, with its calls passing through `filter`.
    pub fn new(inner: Arc<dyn NodeRegistry>, filter: F) -> FilteredRegistry<F> {
        FilteredRegistry { inner, filter }
    }

    /// The registry behind the filter.
    pub fn inner(&self) -> &Arc<dyn NodeRegistry> {
        &self.inner
    }

    /// The filter, for the state it keeps.
    pub fn filter(&self) -> &F {
        &self.filter
    }
}

#[async_trait]
impl<F: RegistryFilter> NodeRegistry for FilteredRegistry<F> {
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
        if !self.filter.before_leave()? {
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
