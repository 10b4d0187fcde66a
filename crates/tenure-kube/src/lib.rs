//! # tenure-kube: tenure on the Kubernetes API
//!
//! For services running in pods, which reach the API server and nothing else: tenure's
//! [`LeaseStore`](tenure::LeaseStore) (with sessions, for shard groups),
//! [`NodeRegistry`](tenure::NodeRegistry) and [`FenceStore`](tenure::FenceStore) on
//! `coordination.k8s.io/v1` Lease objects in one namespace.
//!
//! - [`KubeLeaseStore`]: one Lease per role ([`names`] maps role names to object names),
//!   `holderIdentity`, `leaseDurationSeconds`, `acquireTime`, `renewTime` and
//!   `leaseTransitions` set as client-go sets them, so `kubectl get lease` reads them.
//!   Every write is conditional on the `resourceVersion` just read. The fencing token is
//!   `epoch * 2^31 + leaseTransitions + 1` (module `record`), never repeating,
//!   also when an operator deletes the object.
//! - the queue of candidates ([`LeaseStore::try_acquire_or_queue`](tenure::LeaseStore::try_acquire_or_queue)):
//!   one Lease per (role, owner) queued, `tenure.candidate-<role>.by-<owner>`, its place
//!   the `acquireTime` it joined with. A release hands the role to the oldest live
//!   candidate in its one conditional write of the role's Lease, judging candidates from
//!   the namespace watch; waiters learn who leads next from the watch alone
//!   (`wait_for_successor`), and the successor renews with one write: two requests per
//!   handover however many wait, and one per queue refresh.
//! - sessions: one Lease per session, kept alive with one write per interval however
//!   many roles are held under it.
//! - [`KubeNodeRegistry`]: one Lease per member.
//! - [`KubeFence`]: a fence kept in a Lease object.
//! - [`connect`] and [`KubeUrl`]: `kube:` and `kube:NAMESPACE`, configured as `kubectl`
//!   is (kubeconfig, or the pod's service account).
//!
//! ## What it guarantees, and what it does not
//!
//! The API server keeps no timers. Expiry is judged by observation, as client-go's
//! elector judges it (module `observe`): a contender takes a term over only
//! after it saw the record unchanged for its whole duration on its own monotonic clock,
//! so only clock *rates* must agree. Two consequences the other backends do not have: a
//! reader that starts late (a new process, `tenure status`) counts a dead holder's time
//! from its own first read, so it sees that holder as live for up to one more TTL; and
//! membership is as fresh as that.
//!
//! TTLs are whole seconds, at least one. The API server's own availability bounds
//! everything: while it is down nobody can renew, so every holder's local deadline ends
//! its term.
//!
//! A library must not pick the Kubernetes API version of `k8s-openapi`; the binary that
//! uses this crate enables one of its `v1_*` features (tenure's CLI enables `v1_33`).
#![deny(missing_docs)]

mod conn;
mod fence;
mod lease;
mod links;
pub mod names;
mod observe;
mod record;
mod registry;
mod watch;

pub use conn::{connect, connect_with, KubeConnection, KubeUrl, NEEDED_RBAC};
pub use fence::KubeFence;
pub use lease::KubeLeaseStore;
pub use registry::KubeNodeRegistry;

/// The backend's name in errors.
pub const BACKEND: &str = "kubernetes";
