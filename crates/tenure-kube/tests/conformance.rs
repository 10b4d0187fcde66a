//! The shared conformance, session and queue suites on a real kube-apiserver (one per test
//! binary, on its own etcd), each scenario in a fresh namespace, as the tenant service
//! account with only the documented Role on leases. TTLs are whole seconds; expiry is
//! judged by observation, so `pass_time` sleeps just past the requested time.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure::{LeaseStore, NodeRegistry};
use tenure_kube::{KubeConnection, KubeLeaseStore, KubeNodeRegistry};
use tenure_testkit::{LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture};

struct Kube;

struct KubeFixture {
    namespace: String,
    store: Arc<KubeLeaseStore>,
}

#[async_trait]
impl LeaseBackend for Kube {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let namespace = common::new_namespace("conformance");
        let store = Arc::new(KubeLeaseStore::new(common::tenant(&namespace).await));
        Box::new(KubeFixture { namespace, store })
    }
}

#[async_trait]
impl LeaseFixture for KubeFixture {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        Arc::new(KubeLeaseStore::new(common::tenant(&self.namespace).await))
    }

    async fn pass_time(&self, by: Duration) {
        tokio::time::sleep(by + common::EXPIRY_MARGIN).await;
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(3)
    }

    fn exact_clock(&self) -> bool {
        false
    }

    fn contenders(&self) -> usize {
        16
    }
}

struct KubeRegistryFixture {
    connection: KubeConnection,
    ttl: Duration,
    registry: Arc<KubeNodeRegistry>,
}

#[async_trait]
impl RegistryBackend for Kube {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let connection = common::fresh("registry").await;
        let registry = Arc::new(KubeNodeRegistry::new(connection.clone(), ttl).unwrap());
        Box::new(KubeRegistryFixture {
            connection,
            ttl,
            registry,
        })
    }
}

#[async_trait]
impl RegistryFixture for KubeRegistryFixture {
    fn registry(&self) -> Arc<dyn NodeRegistry> {
        self.registry.clone()
    }

    async fn reopen(&self) -> Arc<dyn NodeRegistry> {
        let connection = common::tenant(&self.connection.namespace).await;
        Arc::new(KubeNodeRegistry::new(connection, self.ttl).unwrap())
    }

    async fn pass_time(&self, by: Duration) {
        tokio::time::sleep(by + common::EXPIRY_MARGIN).await;
    }

    fn exact_clock(&self) -> bool {
        false
    }
}

tenure_testkit::backend_scenarios!(Kube, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::session_handover_release_scenarios!(
    Kube,
    flavor = "multi_thread",
    worker_threads = 2
);
