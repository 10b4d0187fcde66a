//! # tenure: fenced leader election and heartbeat membership
//!
//! A singleton job must run on exactly one instance of a cluster, and the dangerous
//! leader is not the dead one but the one that is alive and stalled. tenure gives:
//!
//! - a **renewable lease** per role ([`LeaseStore`]): leadership lasts only while the
//!   leader keeps renewing, so a stalled leader loses it;
//! - a **fencing token** ([`FencingToken`]) that grows on every change of holder, and
//!   **fences** ([`Fence`], and fenced SQL transactions in the backends) that reject
//!   writes stamped with an older token;
//! - an **elector** ([`LeaseLeaderElector`]) that runs your work while it leads and
//!   cancels it before its lease can expire on store time;
//! - **heartbeat membership** ([`NodeRegistry`]).
//!
//! This crate holds the contract and the in-memory backends; SQLite, PostgreSQL and etcd
//! live in their own crates and pass the same conformance suite. The rules in full (lease
//! decisions, tokens, the elector's deadline, store time per backend, the invariants) are
//! in the repository's `docs/semantics.md`.
//!
//! ## Automated: the elector
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use tenure::{Fence, InMemoryLeaseStore, LeaseLeaderElector, LeaseLeaderOptions, TokioClock};
//! use tokio_util::sync::CancellationToken;
//!
//! let store = Arc::new(InMemoryLeaseStore::with_clock(TokioClock::new()));
//! let fence = Arc::new(Fence::new());
//! let elector = LeaseLeaderElector::new(store, LeaseLeaderOptions::default())?;
//! let work_fence = fence.clone();
//! elector
//!     .run("reports", move |token, leadership| {
//!         let fence = work_fence.clone();
//!         async move {
//!             // Stamp every side effect with the token; stop when leadership ends.
//!             for batch in 0..3 {
//!                 if leadership.is_cancelled() {
//!                     break;
//!                 }
//!                 fence.admit("report-table", token)?;
//!                 println!("wrote batch {batch} under token {token}");
//!             }
//!             // Returning while leader releases the lease and ends `run`.
//!             Ok::<(), tenure::Error>(())
//!         }
//!     }, CancellationToken::new())
//!     .await?;
//! assert_eq!(fence.highest("report-table").map(|t| t.get()), Some(1));
//! # Ok::<(), tenure::Error>(())
//! # }).unwrap();
//! ```
//!
//! ## Manual: the raw store
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::time::Duration;
//! use tenure::{InMemoryLeaseStore, LeaseStore};
//!
//! let store = InMemoryLeaseStore::new();
//! let lease = store.try_acquire_or_renew("reports", "node-a", Duration::from_secs(15)).await?;
//! if lease.acquired {
//!     // ... work stamped with lease.fencing_token, renewing well before lease.remaining() ...
//!     store.release("reports", "node-a", lease.fencing_token).await?;
//! }
//! # Ok::<(), tenure::Error>(())
//! # }).unwrap();
//! ```
#![deny(missing_docs)]

mod clock;
mod elector;
mod error;
mod fence;
pub mod handoff;
pub mod intercept;
pub mod lease;
pub mod lease_copy;
pub mod memory;
pub mod observe;
mod owner;
pub mod placement;
pub mod registry;
pub mod session;
pub mod shard;
mod token;

pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use elector::{
    default_owner_id, work_outcome, ElectionState, LeaseLeaderElector, LeaseLeaderOptions,
    WorkOutcome,
};
pub use error::{BoxError, Error, Result};
pub use fence::{Fence, FenceStore};
pub use lease::{
    AcquireRequest, ChangeMark, ChangeRow, ChangesRead, EndRequest, Handover, LeaseInfo,
    LeaseResult, LeaseStore, ListedLease, PrefixChanges, TermChange,
};
pub use lease_copy::{CopiedLease, LeaseCopy};
pub use memory::{InMemoryLeaseStore, InMemoryNodeRegistry};
pub use observe::{observe, Leader, LeaderObserver};
pub use owner::{owner_id_with_label, MAX_OWNER_LABEL_LEN};
pub use placement::place;
pub use registry::{spawn_heartbeat, Metadata, NodeInfo, NodeRegistry};
pub use session::{PeersLapse, SessionGrant, SessionId};
pub use shard::{DrainOutcome, ShardElector, ShardOptions, ShardState};
pub use token::FencingToken;
