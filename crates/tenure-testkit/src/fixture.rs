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

/// A lease scenario's start: a fresh fixture of `backend`, its store and its TTL (keep
/// the fixture alive: it owns the storage).
pub(crate) async fn begin(
    backend: &dyn LeaseBackend,
) -> (Box<dyn LeaseFixture>, Arc<dyn LeaseStore>, Duration) {
    let fx = backend.create().await;
    let (store, ttl) = (fx.store(), fx.ttl());
    (fx, store, ttl)
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

/// How store time passes in a backend's scenarios.
#[derive(Clone)]
pub enum StoreTime {
    /// The server's own clock: the scenario sleeps what it asks for and `margin` more, so
    /// that the server's time has surely moved that far; not exact.
    Wall {
        /// How far past the asked-for time to sleep: what the server needs to notice.
        margin: Duration,
    },
    /// A manual clock that the function moves exactly as far as asked.
    Manual(Arc<dyn Fn(Duration) + Send + Sync>),
}

impl StoreTime {
    async fn pass(&self, by: Duration) {
        match self {
            StoreTime::Wall { margin } => tokio::time::sleep(by + *margin).await,
            StoreTime::Manual(advance) => advance(by),
        }
    }

    fn exact(&self) -> bool {
        matches!(self, StoreTime::Manual(_))
    }
}

/// A scenario's storage as a backend opens it: what [`StorageLeaseFixture`] and
/// [`StorageRegistryFixture`] need from a backend.
#[async_trait]
pub trait Storage: Send + Sync + 'static {
    /// A new lease store on this storage, as another process would open it.
    async fn open_store(&self) -> Arc<dyn LeaseStore>;

    /// A new registry with liveness TTL `ttl` on this storage, as another process would
    /// open it.
    async fn open_registry(&self, ttl: Duration) -> Arc<dyn NodeRegistry>;
}

/// The [`LeaseFixture`] of a backend that can describe its storage as a [`Storage`].
pub struct StorageLeaseFixture<S> {
    storage: S,
    store: Arc<dyn LeaseStore>,
    time: StoreTime,
    ttl: Duration,
    contenders: usize,
}

impl<S: Storage> StorageLeaseFixture<S> {
    /// A fixture driving `store` on `storage`, whose scenarios use `ttl` and 32
    /// contenders.
    pub fn new(storage: S, store: Arc<dyn LeaseStore>, time: StoreTime, ttl: Duration) -> Self {
        StorageLeaseFixture {
            storage,
            store,
            time,
            ttl,
            contenders: 32,
        }
    }

    /// A fixture driving a store newly opened on `storage`; see [`new`](Self::new).
    pub async fn open(storage: S, time: StoreTime, ttl: Duration) -> Self {
        let store = storage.open_store().await;
        Self::new(storage, store, time, ttl)
    }

    /// The same fixture with `contenders` concurrent contenders in the contention
    /// scenario.
    pub fn with_contenders(self, contenders: usize) -> Self {
        StorageLeaseFixture { contenders, ..self }
    }
}

#[async_trait]
impl<S: Storage> LeaseFixture for StorageLeaseFixture<S> {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    async fn reopen(&self) -> Arc<dyn LeaseStore> {
        self.storage.open_store().await
    }

    async fn pass_time(&self, by: Duration) {
        self.time.pass(by).await;
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn exact_clock(&self) -> bool {
        self.time.exact()
    }

    fn contenders(&self) -> usize {
        self.contenders
    }
}

/// The [`RegistryFixture`] of a backend that can describe its storage as a [`Storage`].
pub struct StorageRegistryFixture<S> {
    storage: S,
    registry: Arc<dyn NodeRegistry>,
    time: StoreTime,
    ttl: Duration,
}

impl<S: Storage> StorageRegistryFixture<S> {
    /// A fixture driving `registry`, of liveness TTL `ttl`, on `storage`.
    pub fn new(
        storage: S,
        registry: Arc<dyn NodeRegistry>,
        time: StoreTime,
        ttl: Duration,
    ) -> Self {
        StorageRegistryFixture {
            storage,
            registry,
            time,
            ttl,
        }
    }

    /// A fixture driving a registry newly opened on `storage`; see [`new`](Self::new).
    pub async fn open(storage: S, time: StoreTime, ttl: Duration) -> Self {
        let registry = storage.open_registry(ttl).await;
        Self::new(storage, registry, time, ttl)
    }
}

#[async_trait]
impl<S: Storage> RegistryFixture for StorageRegistryFixture<S> {
    fn registry(&self) -> Arc<dyn NodeRegistry> {
        self.registry.clone()
    }

    async fn reopen(&self) -> Arc<dyn NodeRegistry> {
        self.storage.open_registry(self.ttl).await
    }

    async fn pass_time(&self, by: Duration) {
        self.time.pass(by).await;
    }

    fn exact_clock(&self) -> bool {
        self.time.exact()
    }
}
