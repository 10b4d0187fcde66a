//! Store URLs: which backend a command talks to.
//!
//! `memory:` (this process only), `sqlite:PATH`, `postgres://...`, `etcd://...`. Errors
//! name the problem and never echo a password.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use tenure::{Fence, FenceStore, InMemoryLeaseStore, InMemoryNodeRegistry, LeaseStore, NodeRegistry, TokioClock};

/// A parsed `--store` value.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory:`: in this process only.
    Memory,
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
        }
    }
}

impl StoreUrl {
    /// Parses a store URL; the error says what is wrong and what is accepted.
    pub fn parse(raw: &str) -> anyhow::Result<Self> {
        let raw = raw.trim();
        let Some((scheme, _rest)) = raw.split_once(':') else {
            bail!("store URL has no scheme; expected one of memory:, sqlite:PATH, postgres://..., etcd://HOST:PORT");
        };
        match scheme {
            "memory" => Ok(StoreUrl::Memory),
            other => bail!(
                "unknown store scheme {:?}; expected one of memory:, sqlite:PATH, postgres://..., etcd://HOST:PORT",
                redact_scheme(other)
            ),
        }
    }

    /// Whether several processes can share this store.
    pub fn is_shared(&self) -> bool {
        !matches!(self, StoreUrl::Memory)
    }
}

/// A scheme as typed, cut short so a mistyped URL cannot leak credentials into a message.
fn redact_scheme(scheme: &str) -> String {
    scheme.chars().take(20).collect()
}

/// Everything a command may need from one backend.
pub struct Stores {
    /// Leases.
    pub leases: Arc<dyn LeaseStore>,
    /// Membership.
    pub registry: Arc<dyn NodeRegistry>,
    /// The store's downstream fence.
    pub fence: Arc<dyn FenceStore>,
}

/// Opens the in-memory backends on a clock that follows tokio's (possibly paused) time.
pub fn memory(registry_ttl: Duration) -> anyhow::Result<Stores> {
    let clock = TokioClock::new();
    Ok(Stores {
        leases: Arc::new(InMemoryLeaseStore::with_clock(clock.clone())),
        registry: Arc::new(InMemoryNodeRegistry::with_clock(registry_ttl, clock)?),
        fence: Arc::new(Fence::new()),
    })
}
