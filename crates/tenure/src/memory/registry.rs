//! [`InMemoryNodeRegistry`]: heartbeat membership in one process.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;

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
        })
    }

    fn record(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        validate_heartbeat(node_id, metadata)?;
        let now = self.clock.now();
        let mut members = self.members.lock();
        let ttl = self.ttl;
        let member = members.entry(node_id.to_owned()).or_insert_with(|| Member {
            last_heartbeat: now,
            first_seen: now,
            metadata: Metadata::new(),
        });
        if !is_live(member.last_heartbeat, ttl, now) {
            member.first_seen = now;
        }
        member.last_heartbeat = member.last_heartbeat.max(now);
        if let Some(metadata) = metadata {
            member.metadata = metadata.clone();
        }
        Ok(())
    }
}

fn is_live(last: SystemTime, ttl: Duration, now: SystemTime) -> bool {
    last.checked_add(ttl).is_some_and(|until| now < until)
}

#[async_trait]
impl NodeRegistry for InMemoryNodeRegistry {
    async fn heartbeat(&self, node_id: &str) -> Result<()> {
        self.record(node_id, None)
    }

    async fn heartbeat_with(&self, node_id: &str, metadata: &Metadata) -> Result<()> {
        self.record(node_id, Some(metadata))
    }

    async fn live_nodes(&self) -> Result<Vec<String>> {
        let now = self.clock.now();
        let members = self.members.lock();
        Ok(members
            .iter()
            .filter(|(_, m)| is_live(m.last_heartbeat, self.ttl, now))
            .map(|(id, _)| id.clone())
            .collect())
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
        Ok(removed.is_some_and(|m| is_live(m.last_heartbeat, self.ttl, now)))
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }
}
