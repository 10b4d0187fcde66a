//! Shared helpers for the etcd integration tests: clients, unique prefixes, timing.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::Client;
use tenure_etcd::EtcdLeaseStore;

/// etcd checks lease expiry every 500 ms and then commits the revoke through raft;
/// waiting this much past a TTL makes sure the term is gone.
pub const EXPIRY_MARGIN: Duration = Duration::from_millis(900);

/// A client on `endpoints` with the crate's connect options.
pub async fn client(endpoints: &[String]) -> Client {
    Client::connect(endpoints, Some(tenure_etcd::connect_options()))
        .await
        .expect("connect etcd client")
}

/// A store on `client` under `prefix`, tuned as `connect` tunes it for an etcd whose
/// keep-alive answers truly (`safe_server`) or for one it cannot trust (the default).
pub fn store_for(client: Client, prefix: &str, safe_server: bool) -> EtcdLeaseStore {
    let fixed = safe_server.then_some(tenure_etcd::version::SAFE_KEEP_ALIVE_SINCE[0]);
    EtcdLeaseStore::new(client, prefix)
        .expect("a valid prefix")
        .for_server(fixed)
}

/// A key prefix no other test (or earlier run) uses.
pub fn unique_prefix(tag: &str) -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "/test/{tag}-{}-{nanos}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Starts a tracing subscriber once (RUST_LOG controls it).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// The gRPC calls `host_port` has started, by method (`grpc_server_started_total`,
/// which counts a stream such as a keep-alive or a watch when it opens).
pub async fn calls(host_port: &str) -> BTreeMap<String, u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host_port).await.unwrap();
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {host_port}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    let mut counts = BTreeMap::new();
    for line in body.lines() {
        let Some(labels) = line.strip_prefix("grpc_server_started_total{") else {
            continue;
        };
        let method = labels
            .split(',')
            .find_map(|label| label.strip_prefix("grpc_method=\""))
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("?");
        let count = line
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0);
        *counts.entry(method.to_owned()).or_insert(0) += count as u64;
    }
    counts
}

/// The calls started between two readings, by method (those that did not change left out).
pub fn calls_since(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(method, n)| (method.clone(), n - before.get(method).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}
