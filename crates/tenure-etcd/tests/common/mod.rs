//! Shared helpers for the etcd integration tests: clients, unique prefixes, timing.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::Client;

/// etcd checks lease expiry every 500 ms and then commits the revoke through raft;
/// waiting this much past a TTL makes sure the term is gone.
pub const EXPIRY_MARGIN: Duration = Duration::from_millis(900);

/// A client on `endpoints` with the crate's connect options.
pub async fn client(endpoints: &[String]) -> Client {
    Client::connect(endpoints, Some(tenure_etcd::connect_options()))
        .await
        .expect("connect etcd client")
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
