//! Sessions: one renewable lease per member that many roles are held under.
//!
//! A member holding a thousand shards must not renew a thousand leases per interval. It
//! opens one [session](LeaseStore::open_session) with a TTL instead, acquires each role
//! *under* it ([`LeaseStore::acquire_in_session`]), and keeps the session alive with one
//! call per interval ([`LeaseStore::keep_alive_session`]) that writes one row or key
//! however many roles it holds. A role held under a session is live exactly while the
//! session is. An expired session is never revived: its roles are free, and taking them
//! again starts new terms with new tokens, so every rule of a single lease (tokens
//! strictly increase per role, a lapsed term is never resumed) holds per role.
//!
//! This is the design of etcd leases with keys attached, ZooKeeper sessions with
//! ephemeral nodes and Chubby's KeepAlive; tenure's shard groups are built on it.

use std::time::{Duration, SystemTime};

use crate::lease::{validate_name, validate_ttl};
use crate::Result;

#[cfg(doc)]
use crate::LeaseStore;

/// A session's id: assigned by the store, never handed out twice.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct SessionId(u64);

impl SessionId {
    /// The raw id.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for SessionId {
    fn from(id: u64) -> Self {
        SessionId(id)
    }
}

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// The answer to opening or keeping alive a session: live until `expires_at`, on store
/// time.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionGrant {
    /// The session.
    pub id: SessionId,
    /// The owner it was opened for; roles held under it name this owner as holder.
    pub owner: String,
    /// When the session (and every role held under it) ends unless kept alive.
    pub expires_at: SystemTime,
    /// The store time at which the call was decided.
    pub now: SystemTime,
}

impl SessionGrant {
    /// Time left in the session as judged by the store at the call (`expires_at - now`).
    pub fn remaining(&self) -> Duration {
        self.expires_at
            .duration_since(self.now)
            .unwrap_or(Duration::ZERO)
    }
}

/// Checks the arguments of [`LeaseStore::open_session`] and returns `now + ttl`.
pub fn validate_open(
    owner: &str,
    ttl: Duration,
    min_ttl: Duration,
    now: SystemTime,
) -> Result<SystemTime> {
    validate_name("owner", owner)?;
    validate_ttl(ttl, min_ttl, now)
}
