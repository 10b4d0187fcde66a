//! The conformance suite on the in-memory backends, on a manual clock.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tenure::{InMemoryLeaseStore, InMemoryNodeRegistry, LeaseStore, ManualClock, NodeRegistry};
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
