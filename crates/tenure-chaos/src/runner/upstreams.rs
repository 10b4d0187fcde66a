//! Where the cut proxies stand: the addresses the store's clients connect to.

use std::net::SocketAddr;
use std::path::Path;

use tracing::warn;

use crate::config::StoreSpec;

/// The addresses the store's clients connect to, for proxies to stand in front of;
/// empty when there is nothing a TCP proxy can carry (SQLite, a Unix socket).
/// `kubeconfig`: as [`Connect::kubeconfig`](crate::backend::Connect::kubeconfig).
pub(super) async fn upstreams(
    url: &str,
    spec: &StoreSpec,
    kubeconfig: Option<&Path>,
) -> Vec<SocketAddr> {
    let hosts: Vec<String> = match spec {
        StoreSpec::SqliteThrowaway | StoreSpec::Sqlite(_) => Vec::new(),
        StoreSpec::PostgresThrowaway | StoreSpec::Postgres(_) => {
            match <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(url) {
                Ok(options) if !options.get_host().starts_with('/') => {
                    vec![format!("{}:{}", options.get_host(), options.get_port())]
                }
                _ => Vec::new(),
            }
        }
        StoreSpec::EtcdThrowaway | StoreSpec::Etcd(_) => etcd_hosts(url),
        StoreSpec::KubeThrowaway | StoreSpec::Kube(_) => kube_server(kubeconfig).await,
    };
    let mut addrs = Vec::new();
    for host in hosts {
        match tokio::net::lookup_host(host.as_str()).await {
            Ok(mut found) => addrs.extend(found.next()),
            Err(error) => warn!(%error, "cannot resolve a store endpoint for the cut proxy"),
        }
    }
    addrs
}

#[cfg(feature = "etcd")]
fn etcd_hosts(url: &str) -> Vec<String> {
    tenure_etcd::EtcdUrl::parse(url)
        .map(|u| {
            u.endpoints()
                .iter()
                .map(|e| e.trim_start_matches("http://").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(not(feature = "etcd"))]
fn etcd_hosts(_url: &str) -> Vec<String> {
    Vec::new()
}

#[cfg(feature = "kube")]
async fn kube_server(kubeconfig: Option<&Path>) -> Vec<String> {
    match crate::kube::server_address(kubeconfig).await {
        Ok(server) => vec![server],
        Err(error) => {
            warn!(%error, "cannot find the Kubernetes server for the cut proxy");
            Vec::new()
        }
    }
}

#[cfg(not(feature = "kube"))]
async fn kube_server(_kubeconfig: Option<&Path>) -> Vec<String> {
    Vec::new()
}
