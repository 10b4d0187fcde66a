//! A member's place in its group's membership: heartbeats while it is in the group, a
//! leave when it drains or shuts down, and joining again after a drain.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::warn;

use super::GROUP_KEY;
use crate::{spawn_heartbeat, Metadata, NodeRegistry, Result};

/// Heartbeats of one member into the registry, started and stopped as the member joins
/// and leaves.
pub(super) struct Membership {
    registry: Arc<dyn NodeRegistry>,
    node_id: String,
    metadata: Metadata,
    beat_every: Duration,
    /// The heartbeat task while the member is in the group. Dropping the member (its
    /// task aborted, the process dying) stops the heartbeat too, so a member that is
    /// gone drops out of the group.
    beating: Option<(JoinHandle<Result<()>>, CancellationToken, DropGuard)>,
}

impl Membership {
    /// Not yet in the group `group`.
    pub(super) fn new(registry: Arc<dyn NodeRegistry>, group: &str, node_id: &str) -> Self {
        let mut metadata = Metadata::new();
        metadata.insert(GROUP_KEY.to_owned(), group.to_owned());
        let beat_every = (registry.ttl() / 3).max(Duration::from_millis(1));
        Membership {
            registry,
            node_id: node_id.to_owned(),
            metadata,
            beat_every,
            beating: None,
        }
    }

    /// Whether the member heartbeats into the group.
    pub(super) fn joined(&self) -> bool {
        self.beating.is_some()
    }

    /// Joins the group: a first heartbeat now (its failure is retried by the task), then
    /// one every third of the registry's TTL.
    pub(super) async fn join(&mut self) {
        if self.joined() {
            return;
        }
        self.registry
            .heartbeat_with(&self.node_id, &self.metadata)
            .await
            .unwrap_or_else(|error| warn!(%error, "first heartbeat failed; retrying"));
        let stop = CancellationToken::new();
        let task = spawn_heartbeat(
            self.registry.clone(),
            self.node_id.clone(),
            self.metadata.clone(),
            self.beat_every,
            stop.clone(),
        );
        self.beating = Some((task, stop.clone(), stop.drop_guard()));
    }

    /// Leaves the group: the heartbeat stops, then the registry is told, so the others
    /// retarget at once instead of after the membership TTL.
    pub(super) async fn leave(&mut self) {
        let Some((task, stop, _guard)) = self.beating.take() else {
            return;
        };
        stop.cancel();
        let _ = task.await;
        if let Err(error) = self.registry.leave(&self.node_id).await {
            warn!(%error, "could not leave the registry; membership lapses on its own");
        }
    }
}
