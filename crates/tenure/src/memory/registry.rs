//! [`InMemoryNodeRegistry`]: heartbeat membership in one process.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::lease::validate_name;
use crate::registry::{validate_heartbeat, Metadata, NodeInfo};
use crate::{Clock, Error, NodeRegistry, Result, SystemClock};

#[derive(Debug)]
struct Member {
    last_heartbeat: SystemTime,
    first_seen: SystemTime,
    metadata: Metadata,
}

/// Heartbeat membership for one process, on an injected [`Clock`].
#[derive(Debug)]
pub struct InMemoryNodeRegistry {
    ttl: Duration,
    clock: Arc<dyn Clock>,
    members: Mutex<BTreeMap<String, Member>>,
    /// Woken when a node joins or leaves.
    changed: Notify,
}

impl InMemoryNodeRegistry {
    /// A registry on the system clock where a node is live for `ttl` after a heartbeat.
    pub fn new(ttl: Duration) -> Result<Self> {
        Self::with_clock(ttl, SystemClock)
    }

    /// A registry whose time comes from `clock`.
    pub fn with_clock(ttl: Duration, clock: impl Clock) -> Result<Self> {
        if ttl.is_zero() {
            return Err(Error::invalid("ttl", "must be greater than zero"));
        }
        Ok(InMemoryNodeRegistry {
            ttl,
            clock: Arc::new(clock),
            members: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
        })
    }

    fn record(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        validate_heartbeat(node_id, metadata)?;
        let now = self.clock.now();
        let mut members = self.members.lock();
        let ttl = self.ttl;
        let mut joined = false;
        let member = members.entry(node_id.to_owned()).or_insert_with(|| {
            joined = true;
            Member {
                last_heartbeat: now,
                first_seen: now,
                metadata: Metadata::new(),
            }
        });
        if !is_live(member.last_heartbeat, ttl, now) {
            member.first_seen = now;
            joined = true;
        }
        member.last_heartbeat = member.last_heartbeat.max(now);
        if let Some(metadata) = metadata {
            member.metadata = metadata.clone();
        }
        drop(members);
        if joined {
            self.changed.notify_waiters();
        }
        Ok(())
    }

    fn live_ids(&self) -> Vec<String> {
        let now = self.clock.now();
        let members = self.members.lock();
        members
            .iter()
            .filter(|(_, m)| is_live(m.last_heartbeat, self.ttl, now))
            .map(|(id, _)| id.clone())
            .collect()
    }
}

fn is_live(last: SystemTime, ttl: Duration, now: SystemTime) -> bool {
    last.checked_add(ttl).is_some_and(|until| now < until)
}

#[async_trait]
impl NodeRegistry for InMemoryNodeRegistry {
    async fn record_heartbeat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        self.record(node_id, metadata)
    }

    async fn live_nodes(&self) -> Result<Vec<String>> {
        Ok(self.live_ids())
    }

    async fn members(&self) -> Result<Vec<NodeInfo>> {
        let now = self.clock.now();
        let mut members = self.members.lock();
        members.retain(|_, m| is_live(m.last_heartbeat, self.ttl, now));
        Ok(members
            .iter()
            .map(|(id, m)| NodeInfo {
                node_id: id.clone(),
                last_heartbeat: m.last_heartbeat,
                first_seen: m.first_seen,
                metadata: m.metadata.clone(),
                now,
            })
            .collect())
    }

    async fn leave(&self, node_id: &str) -> Result<bool> {
        validate_name("node_id", node_id)?;
        let now = self.clock.now();
        let removed = self.members.lock().remove(node_id);
        let was_live = removed.is_some_and(|m| is_live(m.last_heartbeat, self.ttl, now));
        if was_live {
            self.changed.notify_waiters();
        }
        Ok(was_live)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn wait_for_members_change(&self, observed: &[String], deadline: tokio::time::Instant) {
        let notified = self.changed.notified();
        tokio::pin!(notified);
        // Register before comparing, so a join or leave in between is not missed.
        notified.as_mut().enable();
        if self.live_ids() != observed {
            return;
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}
