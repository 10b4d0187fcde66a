//! What a backend provides so the conformance scenarios can run against it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure::{LeaseStore, NodeRegistry};

/// A backend under test: makes fresh, isolated lease storage for each scenario.
#[async_trait]
pub trait LeaseBackend: Send + Sync {
    /// Fresh, empty storage (a new file, schema, key prefix or instance).
    async fn create(&self) -> Box<dyn LeaseFixture>;
}

/// One scenario's storage and its control of time.
#[async_trait]
pub trait LeaseFixture: Send + Sync {
    /// The store the scenario drives.
    fn store(&self) -> Arc<dyn LeaseStore>;

    /// Another store instance over the same storage: new connections, or for durable
    /// backends a freshly opened store (a "process restart"). In-memory fixtures, whose
    /// tokens are not durable, return the same instance.
    async fn reopen(&self) -> Arc<dyn LeaseStore>;

    /// Lets at least `by` of store time pass: advance a manual clock, or wait on the wall
    /// clock for real servers (which is why their TTLs are short).
    async fn pass_time(&self, by: Duration);

    /// The TTL scenarios use: long enough for a few calls to fit in it on this backend,
    /// short enough to wait out.
    fn ttl(&self) -> Duration;

    /// True when [`pass_time`](LeaseFixture::pass_time) moves store time exactly, so
    /// scenarios may probe the instant `expires_at` itself.
    fn exact_clock(&self) -> bool;

    /// The number of concurrent contenders the contention scenario uses.
    fn contenders(&self) -> usize {
        32
    }
}

/// A backend under test for membership.
#[async_trait]
pub trait RegistryBackend: Send + Sync {
    /// A fresh, empty registry whose liveness TTL is `ttl`.
    async fn create(&self, ttl: Duration) -> Box<dyn RegistryFixture>;
}

/// One scenario's registry and its control of time.
#[async_trait]
pub trait RegistryFixture: Send + Sync {
    /// The registry the scenario drives.
    fn registry(&self) -> Arc<dyn NodeRegistry>;

    /// Another registry on the same storage, as another process would open it (the same
    /// one where a backend lives in one process only).
    async fn reopen(&self) -> Arc<dyn NodeRegistry>;

    /// Lets at least `by` of store time pass.
    async fn pass_time(&self, by: Duration);

    /// True when time moves exactly (manual clock).
    fn exact_clock(&self) -> bool;
}
