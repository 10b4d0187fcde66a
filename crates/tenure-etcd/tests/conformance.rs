//! The shared conformance suite on a real single-member etcd (one server per test
//! binary, a fresh key prefix per scenario). etcd TTLs are whole seconds and expiry is
//! checked every 500 ms, so scenarios use a 4 s TTL and `pass_time` sleeps past the
//! requested time by [`common::EXPIRY_MARGIN`].
//!
//! The lease, session and queue scenarios run twice (the queue's and the shard group's fault scenarios once): with renewals (and session keep-alives)
//! that wait for the keep-alive before the transaction (the default, and what an etcd
//! release with unsafe keep-alive answers gets) and with both sent together (what a
//! fixed release gets).

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure::{LeaseStore, NodeRegistry};
use tenure_etcd::{EtcdLeaseStore, EtcdNodeRegistry};
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::{LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture};

/// The backend; `safe_server` stands for an etcd release whose keep-alive answers are
/// safe, so renewals send keep-alive and transaction together.
struct Etcd {
    safe_server: bool,
}

struct EtcdFixture {
    endpoints: Vec<String>,
    prefix: String,
    safe_server: bool,
    store: Arc<EtcdLeaseStore>,
}

async fn store_on(endpoints: &[String], prefix: &str, safe_server: bool) -> Arc<EtcdLeaseStore> {
    let store = common::store_for(common::client(endpoints).await, prefix, safe_server);
    assert_eq!(store.keeps_alive_first(), !safe_server);
    Arc::new(store)
}

#[async_trait]
impl LeaseBackend for Etcd {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let endpoints = vec![EtcdServer::shared().expect("shared etcd server").endpoint()];
        let prefix = common::unique_prefix("conformance");
        let store = store_on(&endpoints, &prefix, self.safe_server).await;
        Box::new(EtcdFixture {
            endpoints,
            prefix,
            safe_server: self.safe_server,
            store,
        })
    }
}

#[async_trait]
impl LeaseFixture for EtcdFixture {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        store_on(&self.endpoints, &self.prefix, self.safe_server).await
    }

    async fn pass_time(&self, by: Duration) {
        tokio::time::sleep(by + common::EXPIRY_MARGIN).await;
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(4)
    }

    fn exact_clock(&self) -> bool {
        false
    }

    fn contenders(&self) -> usize {
        32
    }
}

struct EtcdRegistryFixture {
    endpoints: Vec<String>,
    prefix: String,
    ttl: Duration,
    registry: Arc<EtcdNodeRegistry>,
}

#[async_trait]
impl RegistryBackend for Etcd {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let endpoints = vec![EtcdServer::shared().expect("shared etcd server").endpoint()];
        let client = common::client(&endpoints).await;
        let prefix = common::unique_prefix("registry");
        let registry = EtcdNodeRegistry::new(client, &prefix, ttl).unwrap();
        Box::new(EtcdRegistryFixture {
            endpoints,
            prefix,
            ttl,
            registry: Arc::new(registry),
        })
    }
}

#[async_trait]
impl RegistryFixture for EtcdRegistryFixture {
    fn registry(&self) -> Arc<dyn NodeRegistry> {
        self.registry.clone()
    }

    async fn reopen(&self) -> Arc<dyn NodeRegistry> {
        let client = common::client(&self.endpoints).await;
        Arc::new(EtcdNodeRegistry::new(client, &self.prefix, self.ttl).unwrap())
    }

    async fn pass_time(&self, by: Duration) {
        // Liveness is judged on this host's clock (`now < last + ttl`), so a small margin
        // for scheduling is enough.
        tokio::time::sleep(by + Duration::from_millis(20)).await;
    }

    fn exact_clock(&self) -> bool {
        false
    }
}

tenure_testkit::backend_scenarios!(
    Etcd { safe_server: false },
    flavor = "multi_thread",
    worker_threads = 2
);
tenure_testkit::session_handover_release_scenarios!(
    Etcd { safe_server: false },
    flavor = "multi_thread",
    worker_threads = 2
);

/// The lease scenarios with keep-alive and transaction sent together.
mod renewals_in_one_round_trip {
    use super::*;

    tenure_testkit::lease_scenarios!(
        Etcd { safe_server: true },
        flavor = "multi_thread",
        worker_threads = 2
    );
    tenure_testkit::session_scenarios!(
        Etcd { safe_server: true },
        flavor = "multi_thread",
        worker_threads = 2
    );
    tenure_testkit::queue_scenarios!(
        Etcd { safe_server: true },
        flavor = "multi_thread",
        worker_threads = 2
    );
}
