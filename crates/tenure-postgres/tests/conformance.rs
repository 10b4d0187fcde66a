//! The shared conformance suite on a real PostgreSQL server (wall-clock store time).
//!
//! One throwaway server serves this whole test binary; every scenario gets a fresh
//! schema, and `pass_time` sleeps, which is why the TTL is short.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgPool;
use tenure::{LeaseStore, NodeRegistry};
use tenure_postgres::{migrate, PgLeaseStore, PgNodeRegistry, Schema};
use tenure_testkit::postgres::PgServer;
use tenure_testkit::{
    LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture, Storage, StorageLeaseFixture,
    StorageRegistryFixture, StoreTime,
};

/// Scenario TTL: several round trips fit in it even on a loaded 2-core machine.
const TTL: Duration = Duration::from_secs(2);

/// Extra wall-clock time slept on top of what a scenario asks for, so database time has
/// surely moved at least that far.
const MARGIN: Duration = Duration::from_millis(20);

struct Postgres;

/// Wall-clock store time, slept past by [`MARGIN`].
const TIME: StoreTime = StoreTime::Wall { margin: MARGIN };

/// A scenario's fresh, migrated schema on the shared server, and the pool that made it.
struct Fresh {
    server: &'static PgServer,
    pool: PgPool,
    schema: Schema,
}

impl Fresh {
    async fn new() -> Fresh {
        common::init_tracing();
        let server = PgServer::shared().expect("shared PostgreSQL server");
        let pool = common::pool(server, 4, "conformance").await;
        let schema = common::fresh_schema();
        migrate(&pool, &schema).await.expect("migrate");
        Fresh {
            server,
            pool,
            schema,
        }
    }
}

#[async_trait]
impl Storage for Fresh {
    async fn open_store(&self) -> Arc<dyn LeaseStore> {
        // A new pool and a new store instance: what another process would have.
        let pool = common::pool(self.server, 2, "conformance-reopen").await;
        Arc::new(PgLeaseStore::new(pool, self.schema.clone()))
    }

    async fn open_registry(&self, ttl: Duration) -> Arc<dyn NodeRegistry> {
        let pool = common::pool(self.server, 2, "conformance-reopened").await;
        Arc::new(PgNodeRegistry::new(pool, self.schema.clone(), ttl).expect("registry"))
    }
}

#[async_trait]
impl LeaseBackend for Postgres {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let fresh = Fresh::new().await;
        let store = Arc::new(PgLeaseStore::new(fresh.pool.clone(), fresh.schema.clone()));
        Box::new(StorageLeaseFixture::new(fresh, store, TIME, TTL))
    }
}

#[async_trait]
impl RegistryBackend for Postgres {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let fresh = Fresh::new().await;
        // Made from a store, as `connect` makes it: it counts the store's sessions.
        let store = PgLeaseStore::new(fresh.pool.clone(), fresh.schema.clone());
        let registry = Arc::new(store.registry(ttl).expect("registry"));
        Box::new(StorageRegistryFixture::new(fresh, registry, TIME, ttl))
    }
}

tenure_testkit::backend_scenarios!(Postgres, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::session_handover_scenarios!(Postgres, flavor = "multi_thread", worker_threads = 2);
