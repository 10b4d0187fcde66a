//! `memory:`: the in-memory store beside a bare mutex-guarded map.
//!
//! The raw side does what any renewal on wall time must do: lock, read the clock,
//! update one map entry. The store adds its own decision, validation and the
//! `dyn LeaseStore` call; the ratio says what those cost.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use tenure::{InMemoryLeaseStore, InMemoryNodeRegistry, LeaseStore, Result};

use crate::backend::{unexpected, Backend, Client, Counter, Handles, BENCH_TTL, REGISTRY_TTL};
use crate::report::Floor;

struct RawLease {
    holder: Option<String>,
    token: u64,
    expires_at: SystemTime,
}

#[derive(Default)]
struct RawMaps {
    leases: Mutex<HashMap<String, RawLease>>,
    nodes: Mutex<HashMap<String, SystemTime>>,
}

pub(crate) struct Memory {
    handles: Handles,
    /// One shared registry per liveness TTL asked for, so members of one run see each other.
    registries: Mutex<BTreeMap<Duration, Arc<InMemoryNodeRegistry>>>,
    leases: Arc<InMemoryLeaseStore>,
    raw: Arc<RawMaps>,
}

impl Memory {
    pub(crate) fn new() -> Result<Memory> {
        let leases = Arc::new(InMemoryLeaseStore::new());
        let registry = Arc::new(InMemoryNodeRegistry::new(REGISTRY_TTL)?);
        Ok(Memory {
            handles: Handles {
                leases: leases.clone(),
                registry,
            },
            registries: Default::default(),
            leases,
            raw: Arc::default(),
        })
    }
}

struct RawClient(Arc<RawMaps>);

fn expiry(now: SystemTime) -> SystemTime {
    now.checked_add(BENCH_TTL).unwrap_or(now)
}

#[async_trait]
impl Client for RawClient {
    async fn acquire(&mut self, role: &str, owner: &str) -> Result<u64> {
        let mut leases = self.0.leases.lock();
        let now = SystemTime::now();
        let lease = leases.entry(role.to_owned()).or_insert(RawLease {
            holder: None,
            token: 0,
            expires_at: now,
        });
        if lease.holder.is_some() && now < lease.expires_at {
            return Err(unexpected(format!("raw acquire of {role}: held")));
        }
        lease.holder = Some(owner.to_owned());
        lease.token += 1;
        lease.expires_at = expiry(now);
        Ok(lease.token)
    }

    async fn renew(&mut self, role: &str, owner: &str) -> Result<()> {
        let mut leases = self.0.leases.lock();
        let now = SystemTime::now();
        match leases.get_mut(role) {
            Some(lease) if lease.holder.as_deref() == Some(owner) && now < lease.expires_at => {
                lease.expires_at = expiry(now);
                Ok(())
            }
            _ => Err(unexpected(format!("raw renewal of {role}: not held"))),
        }
    }

    async fn release(&mut self, role: &str, owner: &str, token: u64) -> Result<()> {
        let mut leases = self.0.leases.lock();
        let now = SystemTime::now();
        match leases.get_mut(role) {
            Some(lease)
                if lease.holder.as_deref() == Some(owner)
                    && lease.token == token
                    && now < lease.expires_at =>
            {
                lease.holder = None;
                lease.expires_at = now;
                Ok(())
            }
            _ => Err(unexpected(format!("raw release of {role}: not held"))),
        }
    }

    async fn heartbeat(&mut self, node: &str) -> Result<()> {
        let mut nodes = self.0.nodes.lock();
        let now = SystemTime::now();
        match nodes.get_mut(node) {
            Some(last) => *last = (*last).max(now),
            None => {
                nodes.insert(node.to_owned(), now);
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for Memory {
    async fn stores(&self, _clients: usize, registry_ttl: Duration) -> Result<Handles> {
        if registry_ttl == REGISTRY_TTL {
            return Ok(self.handles.clone());
        }
        let mut registries = self.registries.lock();
        let registry = match registries.get(&registry_ttl) {
            Some(registry) => registry.clone(),
            None => {
                let registry = Arc::new(InMemoryNodeRegistry::new(registry_ttl)?);
                registries.insert(registry_ttl, registry.clone());
                registry
            }
        };
        Ok(Handles {
            leases: self.handles.leases.clone(),
            registry,
        })
    }

    async fn raw(&self, clients: usize) -> Result<Vec<Box<dyn Client>>> {
        Ok((0..clients)
            .map(|_| Box::new(RawClient(Arc::clone(&self.raw))) as Box<dyn Client>)
            .collect())
    }

    fn raw_label(&self) -> &'static str {
        "a HashMap behind one mutex: lock, read the wall clock, update the entry"
    }

    async fn pair(&self) -> Result<(Arc<dyn LeaseStore>, Arc<dyn LeaseStore>)> {
        Ok((self.leases.clone(), self.leases.clone()))
    }

    async fn requests(&self) -> Result<Counter> {
        Ok(Counter::NotMeasured(
            "in-process store: no server, no round trips".to_owned(),
        ))
    }

    fn requests_label(&self) -> &'static str {
        "none"
    }

    async fn release_floor(&self, trials: usize, _run_id: &str) -> Result<Floor> {
        Ok(crate::failover::notify_floor(trials).await)
    }

    fn release_goal_ms(&self) -> Option<f64> {
        None
    }

    async fn version(&self) -> Option<String> {
        Some(format!("tenure {}", env!("CARGO_PKG_VERSION")))
    }
}
