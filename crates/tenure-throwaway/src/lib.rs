//! Throwaway PostgreSQL, etcd and Kubernetes API servers on loopback, owned by the process
//! that starts them.
//!
//! - [`postgres::PgServer`]: a PostgreSQL cluster (Debian's `postgresql`).
//! - [`etcd::EtcdServer`] and [`etcd::EtcdCluster`]: etcd (Debian's `etcd-server`, or any
//!   binary, e.g. the etcd 3.6 of `scripts/build-servers`).
//! - [`kube::KubeServer`]: kube-apiserver on its own etcd, with TLS, an admin client
//!   certificate and a service account bound to leases only; kube-apiserver, kubectl and
//!   etcd 3.6 come from `scripts/build-servers` (no Debian package carries them), see
//!   `servers/README.md`.
//!
//! Each server gets a fresh data directory and free loopback ports, and can be stopped,
//! killed, restarted (same data, same ports), paused and resumed, which is what fault tests
//! and `tenure chaos` need. Nothing outlives the owning process: `Drop` stops a server, and
//! every server process is started with a parent-death signal from one long-lived spawner
//! thread, so it dies even when its owner is killed. Directories left by owners that died
//! are swept on the next start.
//!
//! Every call is fallible with a [`ThrowawayError`] that says what is missing or what
//! failed (with the server's log), never a panic. Calls block the calling thread while they
//! wait for a server (bounded, at most a minute); async callers run them with
//! `tokio::task::spawn_blocking` or an equivalent.
#![deny(missing_docs)]

mod error;
pub mod etcd;
pub mod kube;
pub mod postgres;
mod process;

pub use error::{Result, ThrowawayError};

/// Runs a harness call on tokio's blocking pool, for async callers (`tenure chaos`,
/// `tenure bench`): the calls block while they wait for a server.
pub async fn unblocked<T: Send + 'static>(
    call: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result,
        Err(join) => Err(ThrowawayError::Failed {
            what: "a throwaway-server call".to_owned(),
            detail: if join.is_panic() {
                "it panicked".to_owned()
            } else {
                "it was cancelled".to_owned()
            },
        }),
    }
}
