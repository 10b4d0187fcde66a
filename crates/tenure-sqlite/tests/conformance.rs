//! The shared conformance suite on SQLite files, with store time from manual host clocks.
//!
//! Each scenario gets a fresh file in its own temporary directory; `reopen` opens a new
//! pool on the same file (a "process restart" that keeps the clock), and time passes by
//! advancing the shared clock, so expiry is probed to the nanosecond and nothing sleeps.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tempfile::TempDir;
use tenure::{LeaseStore, NodeRegistry};
use tenure_sqlite::{ManualHostClock, SqliteLeaseStore, SqliteNodeRegistry, SqliteOptions};
use tenure_testkit::{LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture};

struct Sqlite;

fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

struct SqliteFixture {
    dir: TempDir,
    clock: ManualHostClock,
    store: Arc<SqliteLeaseStore>,
}

impl SqliteFixture {
    fn options(&self) -> SqliteOptions {
        SqliteOptions::new().with_clock(self.clock.clone())
    }
}

#[async_trait]
impl LeaseBackend for Sqlite {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualHostClock::new(start());
        let options = SqliteOptions::new().with_clock(clock.clone());
        let store = SqliteLeaseStore::open_with(dir.path().join("tenure.db"), options)
            .await
            .unwrap();
        Box::new(SqliteFixture {
            dir,
            clock,
            store: Arc::new(store),
        })
    }
}

#[async_trait]
impl LeaseFixture for SqliteFixture {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        let store = SqliteLeaseStore::open_with(self.dir.path().join("tenure.db"), self.options())
            .await
            .unwrap();
        Arc::new(store)
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
        32
    }
}

struct SqliteRegistryFixture {
    dir: TempDir,
    clock: ManualHostClock,
    ttl: Duration,
    registry: Arc<SqliteNodeRegistry>,
}

#[async_trait]
impl RegistryBackend for Sqlite {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualHostClock::new(start());
        let options = SqliteOptions::new().with_clock(clock.clone());
        let registry = SqliteNodeRegistry::open_with(dir.path().join("tenure.db"), ttl, options)
            .await
            .unwrap();
        Box::new(SqliteRegistryFixture {
            dir,
            clock,
            ttl,
            registry: Arc::new(registry),
        })
    }
}

#[async_trait]
impl RegistryFixture for SqliteRegistryFixture {
    fn registry(&self) -> Arc<dyn NodeRegistry> {
        self.registry.clone()
    }
    async fn reopen(&self) -> Arc<dyn NodeRegistry> {
        let options = SqliteOptions::new().with_clock(self.clock.clone());
        let path = self.dir.path().join("tenure.db");
        Arc::new(
            SqliteNodeRegistry::open_with(path, self.ttl, options)
                .await
                .unwrap(),
        )
    }
    async fn pass_time(&self, by: Duration) {
        self.clock.advance(by);
    }
    fn exact_clock(&self) -> bool {
        true
    }
}

tenure_testkit::lease_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::registry_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::session_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::queue_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::queue_fault_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::shard_fault_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
