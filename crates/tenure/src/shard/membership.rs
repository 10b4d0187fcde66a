//! A member's place in its group's membership: heartbeats while it is in the group (it
//! holds a session and is not drained), a leave when it drains, loses its session or
//! shuts down, and joining again after.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::info;

use super::{Member, GROUP_KEY};
use crate::registry::heartbeat_from;
use crate::{Metadata, NodeRegistry, Result};

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
    /// A heartbeat task told to stop and not awaited (see [`Membership::stop`]): it
    /// leaves the registry as it ends, which must land before the member joins again.
    stopping: Option<JoinHandle<Result<()>>>,
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
            stopping: None,
        }
    }

    /// Whether the member heartbeats into the group.
    pub(super) fn joined(&self) -> bool {
        self.beating
            .as_ref()
            .is_some_and(|(_, stop, _)| !stop.is_cancelled())
    }

    /// Joins the group for as long as `session` (the member's session's `alive`) is not
    /// cancelled: a first heartbeat now (its failure is retried by the task at once), then
    /// one every third of the registry's TTL. The heartbeats stop, and the task leaves the
    /// registry, as the session is lost, even while the member's loop is stuck in a store
    /// call and cannot tell. A member without a session holds no shard, and one whose
    /// store calls hang may not open another for long: left in the group it would keep
    /// shards targeted at it, free, while the others, settled, wait on nothing (a
    /// session's lapse writes nothing, so no push and no keep-alive tells them).
    pub(super) async fn join(&mut self, session: &CancellationToken) {
        if self.joined() || session.is_cancelled() {
            return;
        }
        // The heartbeats of a session since lost end with a leave, which must land first.
        self.stop();
        self.stopped().await;
        // Bounded as the task bounds each of its own: a registry that stopped answering
        // must not hold the member's loop.
        let written = crate::registry::beat_once(
            self.registry.as_ref(),
            &self.node_id,
            &self.metadata,
            self.beat_every,
        )
        .await;
        // The task's first heartbeat: one interval on, or at once to retry this one.
        let next = if written {
            Instant::now() + self.beat_every
        } else {
            Instant::now()
        };
        let stop = session.child_token();
        let task = tokio::spawn(heartbeat_from(
            self.registry.clone(),
            self.node_id.clone(),
            self.metadata.clone(),
            self.beat_every,
            stop.clone(),
            next,
        ));
        self.beating = Some((task, stop.clone(), stop.drop_guard()));
    }

    /// Leaves the group: the heartbeat task stops and, as it ends, tells the registry
    /// (see [`run_heartbeat`](crate::registry::run_heartbeat)), so the others retarget
    /// at once instead of after the membership TTL.
    pub(super) async fn leave(&mut self) {
        self.stop();
        self.stopped().await;
    }

    /// Stops the heartbeats without waiting for them: the heartbeat task leaves the
    /// registry as it ends.
    fn stop(&mut self) {
        if let Some((task, stop, _guard)) = self.beating.take() {
            stop.cancel();
            self.stopping = Some(task);
        }
    }

    /// Waits for a heartbeat task told to stop to end (its leave landed or failed).
    async fn stopped(&mut self) {
        if let Some(task) = self.stopping.take() {
            let _ = task.await;
        }
    }
}

/// The member's side of its membership: in the group while it holds a session and is
/// not drained.
impl Member<'_> {
    /// Drains or ends the drain as the drain requests now say, and keeps the member in
    /// the group's membership only while it is not drained and holds a session: leaves
    /// it when drained (the others retarget its shards at once), joins it again when
    /// neither holds.
    pub(super) async fn follow_drains(&mut self) {
        let draining = self
            .drains
            .iter_mut()
            .any(|drain| *drain.borrow_and_update());
        let in_group = !draining && self.session.is_some();
        if draining == self.draining && self.membership.joined() == in_group {
            return;
        }
        if draining && !self.draining {
            info!(group = %self.options().group, node = %self.options().node_id,
                "draining: leaving the group and handing every shard over");
        }
        self.draining = draining;
        let session = self.session.as_ref().map(|s| s.alive.clone());
        // Without a session its heartbeats stopped with the session (see `join`).
        if let Some(session) = session.filter(|_| in_group) {
            self.membership.join(&session).await;
        } else if draining {
            self.membership.leave().await;
        }
    }
}
