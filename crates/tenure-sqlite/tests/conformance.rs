//! The shared conformance suite on SQLite files, with store time from manual host clocks.
//!
//! Each scenario gets a fresh file in its own temporary directory; `reopen` opens a new
//! pool on the same file (a "process restart" that keeps the clock), and time passes by
//! advancing the shared clock, so expiry is probed to the nanosecond and nothing sleeps.

use std::path::PathBuf;
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

/// A scenario's SQLite file, in its own temporary directory, on a manual host clock
/// that every store and registry opened on it shares.
struct File {
    dir: TempDir,
    clock: ManualHostClock,
}

impl File {
    fn new() -> File {
        File {
            dir: tempfile::tempdir().unwrap(),
            clock: ManualHostClock::new(start()),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("tenure.db")
    }

    fn options(&self) -> SqliteOptions {
        SqliteOptions::new().with_clock(self.clock.clone())
    }

    /// A lease store on a new pool: what another process would open.
    async fn store(&self) -> SqliteLeaseStore {
        SqliteLeaseStore::open_with(self.path(), self.options())
            .await
            .unwrap()
    }

    async fn registry(&self, ttl: Duration) -> SqliteNodeRegistry {
        SqliteNodeRegistry::open_with(self.path(), ttl, self.options())
            .await
            .unwrap()
    }
}

struct SqliteFixture {
    file: File,
    store: Arc<SqliteLeaseStore>,
}

#[async_trait]
impl LeaseBackend for Sqlite {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let file = File::new();
        let store = Arc::new(file.store().await);
        Box::new(SqliteFixture { file, store })
    }
}

#[async_trait]
impl LeaseFixture for SqliteFixture {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.file.store().await)
    }
    async fn pass_time(&self, by: Duration) {
        self.file.clock.advance(by);
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
    file: File,
    ttl: Duration,
    registry: Arc<SqliteNodeRegistry>,
}

#[async_trait]
impl RegistryBackend for Sqlite {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let file = File::new();
        let registry = Arc::new(file.registry(ttl).await);
        Box::new(SqliteRegistryFixture {
            file,
            ttl,
            registry,
        })
    }
}

#[async_trait]
impl RegistryFixture for SqliteRegistryFixture {
    fn registry(&self) -> Arc<dyn NodeRegistry> {
        self.registry.clone()
    }
    async fn reopen(&self) -> Arc<dyn NodeRegistry> {
        Arc::new(self.file.registry(self.ttl).await)
    }
    async fn pass_time(&self, by: Duration) {
        self.file.clock.advance(by);
    }
    fn exact_clock(&self) -> bool {
        true
    }
}

tenure_testkit::backend_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::session_handover_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
