//! Shared test support for every tenure backend.
//!
//! - [`conformance`]: the lease and membership rules of `docs/semantics.md` as plain
//!   `async fn scenario_*(backend)` functions; each backend crate's tests call every
//!   scenario with its own
//!   [`LeaseBackend`] / [`RegistryBackend`].
//! - [`sessions`]: the session scenarios (many roles held under one renewable session).
//! - [`queue`]: the queue of candidates, handoff and `wait_for_successor`.
//! - [`handover`]: a term handed to a member's session in one step.
//! - [`queue_faults`]: the queue under lost answers, late calls and candidates that die
//!   in the queue, injected with `tenure::intercept` on the real store.
//! - [`faults`]: the [`faults::Faults`] interceptor both fault sets inject with.
//! - [`shard_faults`]: shard-group members whose batched acquires lose their answer or
//!   reach the store late, on the real store.
//! - [`stalled_disk`]: a server whose disk stalls (given-up calls land late) on
//!   PostgreSQL, etcd and (its leader scenario) the Kubernetes API server's etcd, and the
//!   elector helpers the server fault tests share.
//! - the throwaway servers of `tenure-throwaway` (PostgreSQL, etcd, kube-apiserver), re-exported for
//!   tests that start, stop, kill and pause them.
//! - [`fuzz`] (feature `fuzz`): inputs for the parsers' property tests.
#![deny(missing_docs)]

mod calls;
pub mod conformance;
pub mod faults;
mod fixture;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub mod handover;
pub mod observe;
mod poll;
pub mod queue;
pub mod queue_faults;
pub mod registry;
pub mod session_membership;
pub mod sessions;
pub mod shard_faults;
pub mod stalled_disk;

pub use calls::{assert_refused, MustAnswer};
pub use fixture::{
    LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture, Storage, StorageLeaseFixture,
    StorageRegistryFixture, StoreTime,
};
pub use poll::{eventually, in_time};
pub use tenure_throwaway::{etcd, kube, postgres};

/// How long any one step of a fault scenario (a store call, a member's stop, a caught
/// call's arrival) may take before the scenario fails instead of hanging: a loaded
/// 2-core CI machine with a kube-apiserver answers well within it.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);
