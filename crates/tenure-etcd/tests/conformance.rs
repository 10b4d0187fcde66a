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
use tenure_etcd::EtcdNodeRegistry;
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::{
    LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture, Storage, StorageLeaseFixture,
    StorageRegistryFixture, StoreTime,
};

/// The backend; `safe_server` stands for an etcd release whose keep-alive answers are
/// safe, so renewals send keep-alive and transaction together.
struct Etcd {
    safe_server: bool,
}

/// A scenario's key prefix on the shared server.
struct Prefix {
    endpoints: Vec<String>,
    prefix: String,
    safe_server: bool,
}

impl Prefix {
    fn new(tag: &str, safe_server: bool) -> Prefix {
        Prefix {
            endpoints: vec![EtcdServer::shared().expect("shared etcd server").endpoint()],
            prefix: common::unique_prefix(tag),
            safe_server,
        }
    }
}

#[async_trait]
impl Storage for Prefix {
    async fn open_store(&self) -> Arc<dyn LeaseStore> {
        let client = common::client(&self.endpoints).await;
        let store = common::store_for(client, &self.prefix, self.safe_server);
        assert_eq!(store.keeps_alive_first(), !self.safe_server);
        Arc::new(store)
    }

    async fn open_registry(&self, ttl: Duration) -> Arc<dyn NodeRegistry> {
        let client = common::client(&self.endpoints).await;
        Arc::new(EtcdNodeRegistry::new(client, &self.prefix, ttl).unwrap())
    }
}

#[async_trait]
impl LeaseBackend for Etcd {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let prefix = Prefix::new("conformance", self.safe_server);
        let time = StoreTime::Wall {
            margin: common::EXPIRY_MARGIN,
        };
        Box::new(StorageLeaseFixture::open(prefix, time, Duration::from_secs(4)).await)
    }
}

#[async_trait]
impl RegistryBackend for Etcd {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let prefix = Prefix::new("registry", self.safe_server);
        // Liveness is judged on this host's clock (`now < last + ttl`), so a small margin
        // for scheduling is enough.
        let time = StoreTime::Wall {
            margin: Duration::from_millis(20),
        };
        Box::new(StorageRegistryFixture::open(prefix, time, ttl).await)
    }
}

/// Generates each named testkit suite's tests on `Etcd { safe_server: $safe }`, all with
/// the same runtime, so the two runs below differ only in the server they stand for.
macro_rules! etcd_suites {
    ($safe:expr; $($suite:ident),*) => {
        $(tenure_testkit::$suite!(
            Etcd { safe_server: $safe },
            flavor = "multi_thread",
            worker_threads = 2
        );)*
    };
}

etcd_suites!(false; backend_scenarios, session_handover_release_scenarios);

/// The lease scenarios with keep-alive and transaction sent together.
mod renewals_in_one_round_trip {
    use super::*;

    etcd_suites!(true; lease_scenarios, session_scenarios, queue_scenarios);
}
