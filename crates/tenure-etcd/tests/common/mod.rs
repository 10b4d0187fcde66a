//! Shared helpers for the etcd integration tests: clients, unique prefixes, timing.
#![allow(dead_code)]

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
