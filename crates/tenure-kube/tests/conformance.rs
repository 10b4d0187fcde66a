//! The shared conformance, session and queue suites on a real kube-apiserver (one per test
//! binary, on its own etcd), each scenario in a fresh namespace, as the tenant service
//! account with only the documented Role on leases. TTLs are whole seconds; expiry is
//! judged by observation, so `pass_time` sleeps just past the requested time.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure::{LeaseStore, NodeRegistry};
use tenure_kube::{KubeLeaseStore, KubeNodeRegistry};
use tenure_testkit::{
    LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture, Storage, StorageLeaseFixture,
    StorageRegistryFixture, StoreTime,
};

struct Kube;

/// A scenario's namespace, reached as the tenant.
struct Namespace(String);

/// Expiry is judged by observation on this process's clock.
const TIME: StoreTime = StoreTime::Wall {
    margin: common::EXPIRY_MARGIN,
};

#[async_trait]
impl Storage for Namespace {
    async fn open_store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(KubeLeaseStore::new(common::tenant(&self.0).await))
    }

    async fn open_registry(&self, ttl: Duration) -> Arc<dyn NodeRegistry> {
        let connection = common::tenant(&self.0).await;
        Arc::new(KubeNodeRegistry::new(connection, ttl).unwrap())
    }
}

#[async_trait]
impl LeaseBackend for Kube {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let namespace = Namespace(common::new_namespace("conformance"));
        let fixture = StorageLeaseFixture::open(namespace, TIME, Duration::from_secs(3)).await;
        Box::new(fixture.with_contenders(16))
    }
}

#[async_trait]
impl RegistryBackend for Kube {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let namespace = Namespace(common::new_namespace("registry"));
        Box::new(StorageRegistryFixture::open(namespace, TIME, ttl).await)
    }
}

tenure_testkit::backend_scenarios!(Kube, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::session_handover_release_scenarios!(
    Kube,
    flavor = "multi_thread",
    worker_threads = 2
);
