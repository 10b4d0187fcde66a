//! The store's server when the run owns it (a throwaway), and restarting it as a fault:
//! clean or crashed, on Kubernetes the API server or its etcd.

use std::sync::Arc;

use tenure_throwaway::etcd::EtcdServer;
use tenure_throwaway::kube::KubeServer;
use tenure_throwaway::postgres::PgServer;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::ChaosError;

/// The store's server when the run owns it.
pub(super) enum Owned {
    None,
    Postgres(Arc<PgServer>),
    Etcd(Arc<EtcdServer>),
    Kube(Arc<KubeServer>),
}

impl Owned {
    /// The etcd server the run owns (on Kubernetes, the API server's), if any.
    pub(super) fn etcd(&self) -> Option<&EtcdServer> {
        match self {
            Owned::Etcd(server) => Some(server),
            Owned::Kube(server) => Some(server.etcd()),
            Owned::None | Owned::Postgres(_) => None,
        }
    }

    /// Stops the server (the run is over); stopping blocks, and nothing waits on it.
    pub(super) async fn shut_down(self) {
        match self {
            Owned::None => {}
            Owned::Postgres(server) => {
                let _ = tokio::task::spawn_blocking(move || drop(server)).await;
            }
            Owned::Etcd(server) => {
                let _ = tokio::task::spawn_blocking(move || drop(server)).await;
            }
            Owned::Kube(server) => {
                let _ = tokio::task::spawn_blocking(move || drop(server)).await;
            }
        }
    }
}

fn stop_or_kill(crash: bool) -> &'static str {
    if crash {
        "kill"
    } else {
        "stop"
    }
}

/// The task restarting a server.
pub(super) type RestartTask = JoinHandle<Result<(), ChaosError>>;

/// A server restart under way.
pub(super) struct Restarting {
    /// Its fault record (healed when the task is done).
    pub(super) record: usize,
    pub(super) task: RestartTask,
    pub(super) began: Instant,
}

/// Starts restarting the owned server (`None` when there is none) the way `pick`
/// chooses: half the restarts are clean shutdowns, half crashes; on Kubernetes, half of
/// the API server and half of its etcd.
pub(super) fn restart(owned: &Owned, pick: u64) -> Option<(&'static str, RestartTask)> {
    let crash = pick % 2 == 1;
    Some(match owned {
        Owned::Postgres(server) => {
            let server = server.clone();
            let task = tokio::spawn(blocking("restart the PostgreSQL server", move || {
                if crash {
                    server.kill();
                } else {
                    server.stop();
                }
                server.start_again()
            }));
            (stop_or_kill(crash), task)
        }
        Owned::Etcd(server) => {
            let server = server.clone();
            let task = tokio::spawn(blocking("restart the etcd server", move || {
                if crash {
                    server.kill();
                }
                server.restart()
            }));
            (stop_or_kill(crash), task)
        }
        Owned::Kube(server) if (pick >> 1).is_multiple_of(2) => {
            let server = server.clone();
            let task = tokio::spawn(blocking("restart the Kubernetes API server", move || {
                if crash {
                    server.kill_apiserver();
                }
                server.restart_apiserver()
            }));
            (
                if crash {
                    "apiserver-kill"
                } else {
                    "apiserver-stop"
                },
                task,
            )
        }
        Owned::Kube(server) => {
            let server = server.clone();
            let task = tokio::spawn(blocking("restart the API server's etcd", move || {
                if crash {
                    server.etcd().kill();
                }
                server.restart_etcd()
            }));
            (if crash { "etcd-kill" } else { "etcd-stop" }, task)
        }
        Owned::None => return None,
    })
}

/// Runs a throwaway-server call off the runtime; its error says what failed.
pub(super) async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> tenure_throwaway::Result<T> + Send + 'static,
) -> Result<T, ChaosError> {
    tenure_throwaway::unblocked(f)
        .await
        .map_err(|e| ChaosError::Setup(format!("cannot {what}: {e}")))
}
