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
use tenure_testkit::{
    LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture, Storage, StorageLeaseFixture,
    StorageRegistryFixture, StoreTime,
};

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

    /// Store time on this file: its manual clock, moved exactly.
    fn time(&self) -> StoreTime {
        let clock = self.clock.clone();
        StoreTime::Manual(Arc::new(move |by| clock.advance(by)))
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

#[async_trait]
impl Storage for File {
    async fn open_store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.store().await)
    }
    async fn open_registry(&self, ttl: Duration) -> Arc<dyn NodeRegistry> {
        Arc::new(self.registry(ttl).await)
    }
}

#[async_trait]
impl LeaseBackend for Sqlite {
    async fn create(&self) -> Box<dyn LeaseFixture> {
        let file = File::new();
        let time = file.time();
        Box::new(StorageLeaseFixture::open(file, time, Duration::from_secs(10)).await)
    }
}

#[async_trait]
impl RegistryBackend for Sqlite {
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture> {
        let file = File::new();
        let time = file.time();
        Box::new(StorageRegistryFixture::open(file, time, ttl).await)
    }
}

tenure_testkit::backend_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
tenure_testkit::session_handover_scenarios!(Sqlite, flavor = "multi_thread", worker_threads = 2);
