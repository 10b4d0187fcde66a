//! A kube-rs controller that runs on one replica at a time.
//!
//! Every replica contends for the role `configmap-labeler`; the leader runs a
//! [`Controller`] over the ConfigMaps of its namespace until its term ends, then stops
//! it (a stalled leader's term ends at its local deadline, and another replica's
//! controller starts). Each write is admitted by a fence first, so a leader that wakes up
//! after losing its term is refused rather than overwriting its successor's work.
//!
//! Run it against a cluster (the service account needs the leases Role of
//! `deploy/kubernetes/rbac.yaml`, plus get/list/watch/patch on configmaps):
//! `cargo run -p tenure-kube --example controller`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use tenure::{FenceStore, FencingToken, LeaseLeaderElector, LeaseLeaderOptions};
use tenure_kube::{KubeFence, KubeLeaseStore, KubeUrl};
use tokio_util::sync::CancellationToken;

/// What each reconcile needs: the API, the term's token and the fence.
struct Context {
    configmaps: Api<ConfigMap>,
    token: FencingToken,
    fence: KubeFence,
}

#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Tenure(#[from] tenure::Error),
}

async fn reconcile(
    configmap: Arc<ConfigMap>,
    context: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let Some(name) = configmap.metadata.name.as_deref() else {
        return Ok(Action::await_change());
    };
    // Refused with Error::Fenced once a newer term has written.
    context
        .fence
        .admit("configmap-labeler", context.token)
        .await?;
    let patch = serde_json::json!({
        "metadata": { "labels": { "example.com/seen-by-term": context.token.to_string() } }
    });
    context
        .configmaps
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(_: Arc<ConfigMap>, error: &ReconcileError, _: Arc<Context>) -> Action {
    tracing::warn!(%error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().init();
    let connection = tenure_kube::connect(&KubeUrl::parse("kube:")?).await?;
    let configmaps: Api<ConfigMap> =
        Api::namespaced(connection.client.clone(), &connection.namespace);
    let elector = LeaseLeaderElector::new(
        Arc::new(KubeLeaseStore::new(connection.clone())),
        LeaseLeaderOptions {
            lease_ttl: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            ..Default::default()
        },
    )?;
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    elector
        .run(
            "configmap-labeler",
            |token, leadership: CancellationToken| {
                let context = Arc::new(Context {
                    configmaps: configmaps.clone(),
                    token,
                    fence: KubeFence::new(connection.clone()),
                });
                async move {
                    tracing::info!(%token, "leading: starting the controller");
                    Controller::new(context.configmaps.clone(), watcher::Config::default())
                        .graceful_shutdown_on(leadership.cancelled_owned())
                        .run(reconcile, error_policy, context)
                        .for_each(|_| async {})
                        .await;
                    tracing::info!(%token, "term over: the controller stopped");
                    Ok::<(), tenure::Error>(())
                }
            },
            shutdown,
        )
        .await?;
    Ok(())
}
