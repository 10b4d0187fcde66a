//! What every tenure-kube test shares: the throwaway API server (one per test binary)
//! and connections to a fresh namespace as the tenant service account, whose only
//! permissions are the documented Role on leases.

#![allow(dead_code)]

use std::time::Duration;

use tenure_kube::{KubeConnection, KubeUrl};
use tenure_testkit::kube::KubeServer;

/// How far past a TTL tests wait before expecting a term to have lapsed: observation
/// is exact on this process's clock, so only scheduling delay matters.
pub const EXPIRY_MARGIN: Duration = Duration::from_millis(150);

/// The API server of this test binary.
pub fn server() -> &'static KubeServer {
    KubeServer::shared().expect("throwaway kube-apiserver")
}

/// A new namespace with the tenant's RoleBinding in it.
pub fn new_namespace(prefix: &str) -> String {
    server().new_namespace(prefix).expect("new namespace")
}

/// A connection to `namespace` as the tenant service account.
pub async fn tenant(namespace: &str) -> KubeConnection {
    let path = server()
        .tenant_kubeconfig(namespace)
        .expect("tenant kubeconfig");
    connect_kubeconfig(&path, "kube:").await
}

/// A connection from a kubeconfig file and a `kube:` URL.
pub async fn connect_kubeconfig(path: &std::path::Path, url: &str) -> KubeConnection {
    try_connect_kubeconfig(path, url)
        .await
        .unwrap_or_else(|error| panic!("connect with {}: {error}", path.display()))
}

/// [`connect_kubeconfig`], returning the error.
pub async fn try_connect_kubeconfig(
    path: &std::path::Path,
    url: &str,
) -> tenure::Result<KubeConnection> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    tenure_kube::connect_with(config, &KubeUrl::parse(url).unwrap()).await
}

/// A connection to a fresh namespace.
pub async fn fresh(prefix: &str) -> KubeConnection {
    tenant(&new_namespace(prefix)).await
}
