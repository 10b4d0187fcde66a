//! # tenure-etcd: tenure leases and membership on etcd
//!
//! When one database is not enough, leases can come from a replicated consensus store.
//! This crate implements tenure's [`LeaseStore`](tenure::LeaseStore) and
//! [`NodeRegistry`](tenure::NodeRegistry) on etcd's v3 API (etcd 3.4 or later), over the
//! caller's own [`etcd_client::Client`]:
//!
//! - [`EtcdLeaseStore`]: the term of role R is the key `<prefix>/leases/R` (value: the
//!   owner) attached to an etcd lease of the term's TTL; the fencing token is the key's
//!   create revision (strictly increasing per role, durable, not consecutive). TTLs are
//!   whole seconds, at least one. A term's advertised value
//!   ([`try_acquire_or_renew_with_value`](tenure::LeaseStore::try_acquire_or_renew_with_value))
//!   is written to `<prefix>/values/R` by the transaction that starts it, and left alone
//!   by renewals;
//! - sessions ([`open_session`](tenure::LeaseStore::open_session) and the calls after
//!   it): a session is an etcd lease and its id the etcd lease id; roles acquired under it
//!   have their keys attached to it, so one keep-alive (one etcd keep-alive plus one key
//!   written) renews them all however many there are, and closing it releases them all;
//! - a queue of candidates
//!   ([`try_acquire_or_queue`](tenure::LeaseStore::try_acquire_or_queue)): a candidate
//!   is a key `<prefix>/queue/N/R/OWNER` on an etcd lease of its own, ordered by create
//!   revision; a release hands the role to the oldest in two transactions, the role
//!   reserved between them (`<prefix>/leases/R` NUL `handoff`), and the waiters learn
//!   who leads from one shared watch per role
//!   ([`wait_for_successor`](tenure::LeaseStore::wait_for_successor));
//! - push takeover: [`wait_for_change`](tenure::LeaseStore::wait_for_change) watches the
//!   role's key, so a released lease is taken over in one notification round trip, and
//!   [`wait_for_term`](tenure::LeaseStore::wait_for_term) watches it for the next term,
//!   so [`tenure::observe()`] sees a new leader by push too;
//! - fenced etcd writes: [`EtcdLeaseStore::fenced_txn`] and
//!   [`EtcdLeaseStore::commit_fenced`] build transactions guarded by
//!   `create_revision(lease key) == token`, so writes to etcd itself commit only while the
//!   term is live;
//! - [`EtcdFence`]: a compare-and-reject fence kept in etcd, for side effects elsewhere;
//! - [`EtcdNodeRegistry`]: `<prefix>/nodes/ID` keys on per-node etcd leases, with a
//!   stream of membership changes ([`EtcdNodeRegistry::watch_members`]); made by
//!   [`EtcdLeaseStore::registry`], it counts the store's session keep-alives as
//!   heartbeats of their owners;
//! - [`connect`] and [`EtcdUrl`]: `etcd://host:port[,host:port...][/prefix]` URLs.
//!
//! ## What it guarantees, and what it does not
//!
//! At most one live term per role, as judged by etcd's lease expiry (driven by the etcd
//! leader). etcd reports no wall-clock time, so a result's `now` and `expires_at` are this
//! host's clock (see [`lease`] for how `expires_at` stays on the safe side). A paused
//! process can still act after its term ended: only fences stop it.
//!
//! ## Example
//!
//! ```no_run
//! # async fn demo() -> tenure::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tenure::{LeaseLeaderElector, LeaseLeaderOptions};
//! use tokio_util::sync::CancellationToken;
//!
//! let store = Arc::new(tenure_etcd::connect("etcd://127.0.0.1:2379/myapp").await?);
//! let elector = LeaseLeaderElector::new(
//!     store,
//!     LeaseLeaderOptions {
//!         lease_ttl: Duration::from_secs(10),
//!         renew_interval: Duration::from_secs(3),
//!         ..Default::default()
//!     },
//! )?;
//! elector
//!     .run("reports", |token, leadership| async move {
//!         // ... stamp every write with `token`; stop when `leadership` is cancelled ...
//!         leadership.cancelled().await;
//!         Ok::<(), tenure::Error>(())
//!     }, CancellationToken::new())
//!     .await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod conn;
mod fence;
pub mod lease;
mod linger;
pub mod registry;
mod schema;
pub mod url;
pub mod version;

pub use fence::EtcdFence;
pub use lease::EtcdLeaseStore;
pub use registry::{EtcdNodeRegistry, MembershipChange, MembershipWatch};
pub use schema::{validate_prefix, DEFAULT_PREFIX, MAX_PREFIX_LEN};
pub use url::{connect, connect_client, connect_options, EtcdUrl};
pub use version::EtcdVersion;

/// The requests the store and registry send, built by the same functions they use, so
/// `tenure bench`'s raw baseline sends exactly those through etcd-client directly. Not a
/// supported API: it changes with the store. It stays public (hidden) because a copy of
/// the builders in the bench would drift from the store it is meant to measure.
#[doc(hidden)]
pub mod requests {
    pub use crate::lease::{acquire_txn, release_txn, renew_txn};
    pub use crate::registry::node_txn;
    pub use crate::schema::{decode, to_ns, Keys, NodeRecord, TermRecord};
}

/// The etcd client crate this backend is built on, re-exported so callers use the same
/// version.
pub use etcd_client;
