//! The conformance suite on the in-memory backends, on a manual clock; the shard fault
//! scenarios, whose members run on tokio time, on a store that reads paused tokio time.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tenure::{
    InMemoryLeaseStore, InMemoryNodeRegistry, LeaseStore, ManualClock, NodeRegistry, TokioClock,
};
use tenure_testkit::{LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture};

struct Memory;

struct MemoryFixture {
    clock: ManualClock,
    store: Arc<InMemoryLeaseStore>,
}

struct MemoryRegistryFixture {
    clock: ManualClock,
    registry: Arc<InMemoryNodeRegistry>,
}

fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

#[async_trait]
impl LeaseBackend for Memory {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let clock = ManualClock::new(start());
        let store = Arc::new(InMemoryLeaseStore::with_clock(clock.clone()));
        Box::new(MemoryFixture { clock, store })
    }
}

#[async_trait]
impl LeaseFixture for MemoryFixture {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn pass_time(&self, by: Duration) {
        self.clock.advance(by);
    }
    fn ttl(&self) -> Duration {
        Duration::from_secs(10)
    }
    fn exact_clock(&self) -> bool {
        true
    }
    fn contenders(&self) -> usize {
        1_000
    }
}

#[async_trait]
impl RegistryBackend for Memory {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let clock = ManualClock::new(start());
        let registry = Arc::new(InMemoryNodeRegistry::with_clock(ttl, clock.clone()).unwrap());
        Box::new(MemoryRegistryFixture { clock, registry })
    }
}

#[async_trait]
impl RegistryFixture for MemoryRegistryFixture {
    fn registry(&self) -> Arc<dyn NodeRegistry> {
        self.registry.clone()
    }
    async fn reopen(&self) -> Arc<dyn NodeRegistry> {
        self.registry.clone()
    }
    async fn pass_time(&self, by: Duration) {
        self.clock.advance(by);
    }
    fn exact_clock(&self) -> bool {
        true
    }
}

tenure_testkit::lease_scenarios!(Memory, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::registry_scenarios!(Memory);
tenure_testkit::session_scenarios!(Memory, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::queue_scenarios!(Memory, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::queue_fault_scenarios!(Memory, flavor = "multi_thread", worker_threads = 2);

/// The in-memory store on tokio's clock, for scenarios that run shard-group members
/// (their renewals and looks are on tokio time): on paused time, the store's time and
/// the members' pass together, and nothing sleeps on the wall clock.
struct MemoryOnTokioTime;

struct TokioTimeFixture {
    store: Arc<InMemoryLeaseStore>,
}

#[async_trait]
impl LeaseBackend for MemoryOnTokioTime {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let store = Arc::new(InMemoryLeaseStore::with_clock(TokioClock::new()));
        Box::new(TokioTimeFixture { store })
    }
}

#[async_trait]
impl LeaseFixture for TokioTimeFixture {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn pass_time(&self, by: Duration) {
        // Paused time: the sleep advances the clock at once.
        tokio::time::sleep(by).await;
    }
    fn ttl(&self) -> Duration {
        Duration::from_secs(10)
    }
    fn exact_clock(&self) -> bool {
        true
    }
}

tenure_testkit::shard_fault_scenarios!(
    MemoryOnTokioTime,
    flavor = "current_thread",
    start_paused = true
);
