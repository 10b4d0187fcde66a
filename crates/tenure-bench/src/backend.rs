//! What each backend supplies to the generic sections: store handles, raw clients, a
//! round-trip counter and the floor of a release handover.
//!
//! The store side of every measurement is the same code for every backend
//! ([`StoreClient`] over `dyn LeaseStore` / `dyn NodeRegistry`); only the raw side and
//! the counters are backend-specific.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure::{Error, LeaseStore, NodeRegistry, Result};

use crate::report::Floor;
use crate::BenchError;

/// The lease TTL of throughput clients: long, so a renewal always renews and an
/// acquired role is still live when the release round comes.
pub(crate) const BENCH_TTL: Duration = Duration::from_secs(600);

/// The liveness TTL of throughput heartbeats.
pub(crate) const REGISTRY_TTL: Duration = Duration::from_secs(600);

/// One client's way to the store (or to the raw baseline). Each call is one operation;
/// an answer other than the expected one (not acquired, not released) is an error, so
/// a throughput figure never counts a refusal.
#[async_trait]
pub(crate) trait Client: Send + 'static {
    /// Takes the free role `role` for `owner`; returns the token.
    async fn acquire(&mut self, role: &str, owner: &str) -> Result<u64>;
    /// Renews `owner`'s live term on `role`.
    async fn renew(&mut self, role: &str, owner: &str) -> Result<()>;
    /// Releases `owner`'s term `token` on `role`.
    async fn release(&mut self, role: &str, owner: &str, token: u64) -> Result<()>;
    /// Records a heartbeat of `node`.
    async fn heartbeat(&mut self, node: &str) -> Result<()>;
}

/// The store handles one client count shares.
#[derive(Clone)]
pub(crate) struct Handles {
    pub leases: Arc<dyn LeaseStore>,
    pub registry: Arc<dyn NodeRegistry>,
}

/// Which operation an extra comparison measures (see [`ExtraCell`]).
// Only the Kubernetes backend adds cells so far.
#[cfg_attr(not(feature = "kube"), allow(dead_code))]
pub(crate) enum ExtraKind {
    /// Renewal of a live term, as the `renew` row.
    Renew,
    /// Acquire of a role whose object exists and was released (a takeover), where the
    /// `acquire` row takes fresh roles: each client cycles through a pool of its own
    /// released roles, released again (untimed) after each turn.
    Takeover,
}

/// A comparison a backend adds beside the four operations: the store against another
/// raw client, in interleaved rounds like the others.
#[cfg_attr(not(feature = "kube"), allow(dead_code))]
pub(crate) struct ExtraCell {
    /// The operation.
    pub kind: ExtraKind,
    /// The row's `op` in the report (`renew`, `acquire (released role)`).
    pub op: &'static str,
    /// What the raw side is, for the row.
    pub baseline: &'static str,
    /// One raw client per store client.
    pub raw: Vec<Box<dyn Client>>,
}

/// What the round-trip counter saw.
pub(crate) enum Counter {
    /// A cumulative count of server requests (statements, RPCs).
    Count(u64),
    /// Not countable here, and why.
    NotMeasured(String),
}

#[async_trait]
pub(crate) trait Backend: Send + Sync {
    /// Store handles for `clients` concurrent clients (a pool of that many connections),
    /// with a registry whose members are live `registry_ttl` after a heartbeat.
    async fn stores(&self, clients: usize, registry_ttl: Duration) -> Result<Handles>;

    /// `clients` raw clients, each on its own connection.
    async fn raw(&self, clients: usize) -> Result<Vec<Box<dyn Client>>>;

    /// What the raw baseline is, for the report.
    fn raw_label(&self) -> &'static str;

    /// More comparisons at `clients` clients, beside other raw baselines.
    async fn extra_cells(&self, _clients: usize) -> Result<Vec<ExtraCell>> {
        Ok(Vec::new())
    }

    /// Two lease stores on separate connections for a handover (in-memory: one store).
    async fn pair(&self) -> Result<(Arc<dyn LeaseStore>, Arc<dyn LeaseStore>)>;

    /// The server's cumulative request count, read without adding to it.
    async fn requests(&self) -> Result<Counter>;

    /// What the counter counts (`statements (pg_stat_statements)`).
    fn requests_label(&self) -> &'static str;

    /// How long the server's counters may lag behind what was done (a measuring window
    /// starts that long after a burst, so the burst is not counted in it).
    fn counter_lag(&self) -> Duration {
        Duration::ZERO
    }

    /// Rows the store's tables have had written (inserted, updated, deleted), cumulative.
    async fn rows_written(&self) -> Result<Counter> {
        Ok(Counter::NotMeasured(
            "this store has no count of rows written".to_owned(),
        ))
    }

    /// What [`rows_written`](Backend::rows_written) counts.
    fn rows_label(&self) -> &'static str {
        "row versions written (inserted, updated, deleted)"
    }

    /// Whether the server counts requests of its own in [`requests`](Backend::requests)
    /// (a Kubernetes API server renews its identity lease): a shard run then also counts
    /// an equally long window with nothing of the bench's running.
    fn counts_own_traffic(&self) -> bool {
        false
    }

    /// Whether creating many roles' objects at once contends on one object (Kubernetes:
    /// each creation takes an epoch from the namespace's counter object with a
    /// conditional write). A shard run then allows more time to settle, starts the group
    /// once more with its objects in place, and creates the per-role electors' objects
    /// one by one before they start.
    fn creates_contend(&self) -> bool {
        false
    }

    /// Whether expiry is judged by observation (Kubernetes): a contender counts a stalled
    /// holder's TTL from its own first sighting of the term, not from the write. The
    /// stall trials then also take when the successor's store first read the term.
    fn observes_expiry(&self) -> bool {
        false
    }

    /// The floor or bound of release -> successor running, measured in this run.
    async fn release_floor(&self, trials: usize, run_id: &str) -> Result<Floor>;

    /// The p99 goal of release -> successor running, in milliseconds.
    fn release_goal_ms(&self) -> Option<f64>;

    /// How far past the TTL a stalled leader's successor may start (the goal).
    fn stall_goal(&self) -> Duration {
        Duration::from_millis(50)
    }

    /// The server's (or library's) version, when cheap to get.
    async fn version(&self) -> Option<String>;

    /// Closes connections and stops what the run owns.
    async fn close(&self) {}
}

/// The store side: the backend's `LeaseStore` and `NodeRegistry` as users call them.
pub(crate) struct StoreClient(pub Handles);

impl StoreClient {
    /// Acquires or renews; a refusal is an error. Returns the token.
    async fn take(&self, role: &str, owner: &str, what: &str) -> Result<u64> {
        let lease = self
            .0
            .leases
            .try_acquire_or_renew(role, owner, BENCH_TTL)
            .await?;
        if !lease.acquired {
            return Err(unexpected(format!("{what} of {role} was refused")));
        }
        Ok(lease.fencing_token.get())
    }
}

#[async_trait]
impl Client for StoreClient {
    async fn acquire(&mut self, role: &str, owner: &str) -> Result<u64> {
        self.take(role, owner, "acquire").await
    }

    async fn renew(&mut self, role: &str, owner: &str) -> Result<()> {
        self.take(role, owner, "renewal").await.map(drop)
    }

    async fn release(&mut self, role: &str, owner: &str, token: u64) -> Result<()> {
        if !self.0.leases.release(role, owner, token.into()).await? {
            return Err(unexpected(format!("release of {role} found no live term")));
        }
        Ok(())
    }

    async fn heartbeat(&mut self, node: &str) -> Result<()> {
        self.0.registry.heartbeat(node).await
    }
}

/// An answer the bench did not set up for: the store (or a concurrent user of it)
/// changed a role the bench owns.
pub(crate) fn unexpected(message: String) -> Error {
    Error::store_msg("bench", message)
}

/// Runs a throwaway-server call off the runtime (the servers' start and setup); its
/// error says what failed.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> tenure_throwaway::Result<T> + Send + 'static,
) -> Result<T, BenchError> {
    tenure_throwaway::unblocked(f)
        .await
        .map_err(|e| BenchError::Setup(format!("cannot {what}: {e}")))
}
