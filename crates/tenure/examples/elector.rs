//! The README's library example: lead role "reports" and work while leading.
//!
//! Run: `cargo run -p tenure --example elector` (Ctrl-C to stop).

use std::{sync::Arc, time::Duration};
use tenure::{InMemoryLeaseStore, LeaseLeaderElector, LeaseLeaderOptions};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), tenure::Error> {
    let store = Arc::new(InMemoryLeaseStore::new()); // or a SQLite/PostgreSQL/etcd store
    let options = LeaseLeaderOptions {
        lease_ttl: Duration::from_secs(15),
        renew_interval: Duration::from_secs(5),
        ..Default::default()
    };
    let elector = LeaseLeaderElector::new(store, options)?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    elector.run("reports", |token, leadership: CancellationToken| async move {
        // Stamp every side effect with `token`; a fence refuses older tokens.
        while !leadership.is_cancelled() {
            println!("generating a report under fencing token {token}");
            tokio::select! { _ = leadership.cancelled() => {}, _ = tokio::time::sleep(Duration::from_secs(1)) => {} }
        }
    }, shutdown).await
}
