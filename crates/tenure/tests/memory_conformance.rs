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

/// The registry rules on a registry made by a store, whose table of nodes the store's
/// keep-alives read.
mod linked {
    use super::*;

    struct MemoryLinked;

    #[async_trait]
    impl RegistryBackend for MemoryLinked {
        async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
            let clock = ManualClock::new(start());
            let store = InMemoryLeaseStore::with_clock(clock.clone());
            let registry = Arc::new(store.registry(ttl).unwrap());
            Box::new(MemoryRegistryFixture { clock, registry })
        }
    }

    tenure_testkit::registry_scenarios!(MemoryLinked);
}

/// Setup: a store and a registry it made, on a manual clock; nodes `a` (the session's
/// owner), `b` and `c` of another group. Each keep-alive of a's session tells when the
/// first other node lapses and how many are live, judged as `members` judges: a TTL
/// ahead with no other node, zero while one lapsed less than a TTL ago (though a read
/// of the members came between), and nothing once a registry of another TTL is made.
#[tokio::test]
async fn a_keep_alive_tells_when_the_other_nodes_lapse() {
    let ttl = Duration::from_secs(6);
    let clock = ManualClock::new(start());
    let store = InMemoryLeaseStore::with_clock(clock.clone());
    let a = store.open_session("a", ttl * 100).await.unwrap();
    let told = || async {
        let grant = store.keep_alive_session(a.id, ttl * 100).await.unwrap();
        grant.expect("a's session lives").peers_lapse
    };
    assert_eq!(told().await, None, "no registry yet");
    let registry = store.registry(ttl).unwrap();
    registry.record_heartbeat("a", None).await.unwrap();
    let alone = tenure::PeersLapse {
        after: ttl,
        live: 0,
        ttl,
    };
    assert_eq!(told().await, Some(alone), "no other node");

    registry.record_heartbeat("b", None).await.unwrap();
    clock.advance(Duration::from_secs(2));
    registry.record_heartbeat("c", None).await.unwrap();
    clock.advance(Duration::from_secs(1));
    let both = tenure::PeersLapse {
        after: Duration::from_secs(3),
        live: 2,
        ttl,
    };
    assert_eq!(told().await, Some(both), "b lapses first");

    clock.advance(Duration::from_secs(3));
    let b_lapsed = tenure::PeersLapse {
        after: Duration::ZERO,
        live: 1,
        ttl,
    };
    assert_eq!(told().await, Some(b_lapsed), "b lapsed just now");
    registry.record_heartbeat("a", None).await.unwrap();
    assert_eq!(registry.live_nodes().await.unwrap(), ["a", "c"]);
    clock.advance(ttl - Duration::from_secs(1));
    assert_eq!(
        registry.members().await.unwrap().len(),
        1,
        "a alone is live"
    );
    let c_lapsed = tenure::PeersLapse {
        after: Duration::ZERO,
        live: 0,
        ttl,
    };
    assert_eq!(
        told().await,
        Some(c_lapsed),
        "b lapsed less than a TTL ago, and c too, though a read came between"
    );
    clock.advance(ttl * 2);
    assert_eq!(told().await, Some(alone), "both lapsed more than a TTL ago");

    let _other = store.registry(ttl * 2).unwrap();
    assert_eq!(told().await, None, "two registry TTLs");
}
tenure_testkit::session_scenarios!(Memory, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::session_handover_scenarios!(Memory, flavor = "multi_thread", worker_threads = 2);
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
