//! [`InMemoryNodeRegistry`]: heartbeat membership in one process.
//!
//! Registries made by [`InMemoryLeaseStore::registry`](crate::InMemoryLeaseStore::registry)
//! share one table of nodes with the store, as the durable backends' registries share
//! their database with its store: the store's session keep-alives then tell when the
//! other nodes lapse ([`PeersLapse`]), judged exactly as [`NodeRegistry::members`] judges.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::lease::validate_name;
use crate::registry::{is_live, validate_heartbeat, Metadata, NodeInfo};
use crate::session::RegistryTtls;
use crate::{Clock, Error, NodeRegistry, PeersLapse, Result, SystemClock};

#[derive(Debug)]
struct Member {
    last_heartbeat: SystemTime,
    first_seen: SystemTime,
    metadata: Metadata,
}

/// The nodes every registry sharing it has heard of, on their own TTLs.
#[derive(Debug, Default)]
pub(super) struct NodeTable {
    members: Mutex<BTreeMap<String, Member>>,
    /// Woken when a node joins or leaves.
    changed: Notify,
    /// The TTL of every registry ever made over the table.
    ttls: RegistryTtls,
}

impl NodeTable {
    /// The TTL a keep-alive judges the other nodes by: the registries', while all
    /// have the same one.
    pub(super) fn peers_ttl(&self) -> Option<Duration> {
        self.ttls.single()
    }

    /// How long after its last heartbeat a node may be forgotten: it is no longer live
    /// by any registry's TTL, nor lapsed less than a TTL ago (which a keep-alive's
    /// account of the peers tells).
    fn kept_for(&self) -> Duration {
        self.ttls.longest().unwrap_or_default().saturating_mul(2)
    }

    /// When the first node other than `owner` lapses unless heard from again, judged
    /// by TTL `ttl` at `now` (see [`PeersLapse`]): zero if one lapsed less than a TTL
    /// ago.
    pub(super) fn peers_lapse(&self, owner: &str, ttl: Duration, now: SystemTime) -> PeersLapse {
        let members = self.members.lock();
        let others = members.iter().filter(|(id, _)| id.as_str() != owner);
        PeersLapse::judge(
            others.map(|(_, member)| (member.last_heartbeat, member.last_heartbeat)),
            ttl,
            now,
        )
    }
}

/// Heartbeat membership for one process, on an injected [`Clock`].
#[derive(Debug)]
pub struct InMemoryNodeRegistry {
    ttl: Duration,
    clock: Arc<dyn Clock>,
    table: Arc<NodeTable>,
}

impl InMemoryNodeRegistry {
    /// A registry on the system clock where a node is live for `ttl` after a heartbeat.
    pub fn new(ttl: Duration) -> Result<Self> {
        Self::with_clock(ttl, SystemClock)
    }

    /// A registry whose time comes from `clock`.
    pub fn with_clock(ttl: Duration, clock: impl Clock) -> Result<Self> {
        Self::on_table(ttl, Arc::new(clock), Arc::default())
    }

    /// A registry over `table`, which other registries and a store may share.
    pub(super) fn on_table(
        ttl: Duration,
        clock: Arc<dyn Clock>,
        table: Arc<NodeTable>,
    ) -> Result<Self> {
        if ttl.is_zero() {
            return Err(Error::invalid("ttl", "must be greater than zero"));
        }
        table.ttls.made(ttl);
        Ok(InMemoryNodeRegistry { ttl, clock, table })
    }

    fn record(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        validate_heartbeat(node_id, metadata)?;
        let now = self.clock.now();
        let mut members = self.table.members.lock();
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
            self.table.changed.notify_waiters();
        }
        Ok(())
    }

    fn live_ids(&self) -> Vec<String> {
        let now = self.clock.now();
        let members = self.table.members.lock();
        members
            .iter()
            .filter(|(_, m)| is_live(m.last_heartbeat, self.ttl, now))
            .map(|(id, _)| id.clone())
            .collect()
    }
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
        let mut members = self.table.members.lock();
        let kept_for = self.table.kept_for();
        members.retain(|_, m| is_live(m.last_heartbeat, kept_for, now));
        Ok(members
            .iter()
            .filter(|(_, m)| is_live(m.last_heartbeat, self.ttl, now))
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
        let removed = self.table.members.lock().remove(node_id);
        let was_live = removed.is_some_and(|m| is_live(m.last_heartbeat, self.ttl, now));
        if was_live {
            self.table.changed.notify_waiters();
        }
        Ok(was_live)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn wait_for_members_change(&self, observed: &[String], deadline: tokio::time::Instant) {
        let notified = self.table.changed.notified();
        tokio::pin!(notified);
        // Register before comparing, so a join or leave in between is not missed.
        notified.as_mut().enable();
        if self.live_ids() != observed {
            return;
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}
