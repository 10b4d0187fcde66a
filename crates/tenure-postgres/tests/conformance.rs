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
use tenure_testkit::{LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture};

/// Scenario TTL: several round trips fit in it even on a loaded 2-core machine.
const TTL: Duration = Duration::from_secs(2);

/// Extra wall-clock time slept on top of what a scenario asks for, so database time has
/// surely moved at least that far.
const MARGIN: Duration = Duration::from_millis(20);

struct Postgres;

struct PgFixture {
    server: &'static PgServer,
    schema: Schema,
    store: Arc<PgLeaseStore>,
    _pool: PgPool,
}

struct PgRegistryFixture {
    server: &'static PgServer,
    schema: Schema,
    ttl: Duration,
    registry: Arc<PgNodeRegistry>,
}

async fn fresh() -> (&'static PgServer, PgPool, Schema) {
    common::init_tracing();
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let pool = common::pool(server, 4, "conformance").await;
    let schema = common::fresh_schema();
    migrate(&pool, &schema).await.expect("migrate");
    (server, pool, schema)
}

#[async_trait]
impl LeaseBackend for Postgres {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let (server, pool, schema) = fresh().await;
        let store = Arc::new(PgLeaseStore::new(pool.clone(), schema.clone()));
        Box::new(PgFixture {
            server,
            schema,
            store,
            _pool: pool,
        })
    }
}

#[async_trait]
impl LeaseFixture for PgFixture {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        // A new pool and a new store instance: what another process would have.
        let pool = common::pool(self.server, 2, "conformance-reopen").await;
        Arc::new(PgLeaseStore::new(pool, self.schema.clone()))
    }

    async fn pass_time(&self, by: Duration) {
        tokio::time::sleep(by + MARGIN).await;
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn exact_clock(&self) -> bool {
        false
    }
}

#[async_trait]
impl RegistryBackend for Postgres {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let (server, pool, schema) = fresh().await;
        // Made from a store, as `connect` makes it: it counts the store's sessions.
        let store = PgLeaseStore::new(pool, schema.clone());
        let registry = Arc::new(store.registry(ttl).expect("registry"));
        Box::new(PgRegistryFixture {
            server,
            schema,
            ttl,
            registry,
        })
    }
}

#[async_trait]
impl RegistryFixture for PgRegistryFixture {
    fn registry(&self) -> Arc<dyn NodeRegistry> {
        self.registry.clone()
    }

    async fn reopen(&self) -> Arc<dyn NodeRegistry> {
        let pool = common::pool(self.server, 2, "conformance-reopened").await;
        Arc::new(PgNodeRegistry::new(pool, self.schema.clone(), self.ttl).expect("registry"))
    }

    async fn pass_time(&self, by: Duration) {
        tokio::time::sleep(by + MARGIN).await;
    }

    fn exact_clock(&self) -> bool {
        false
    }
}

tenure_testkit::backend_scenarios!(Postgres, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::session_handover_scenarios!(Postgres, flavor = "multi_thread", worker_threads = 2);
