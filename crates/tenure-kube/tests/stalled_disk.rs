//! The Kubernetes API server over an etcd whose disk stalls: the API server's writes
//! hang inside etcd while tenure's callers give up, and land when the disk answers
//! again. The same two scenarios PostgreSQL's and etcd's tests run.
//!
//! This binary owns its API server (a stall holds every write of every test on it), and
//! runs the scenarios one after the other. Its etcd is the one `scripts/build-servers`
//! builds, with etcd's failpoints.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tenure::LeaseStore;
use tenure_kube::KubeLeaseStore;
use tenure_testkit::stalled_disk::{self, EtcdWalDisk};

/// A release given up while the disk stalls lands when it answers again; then, in a
/// namespace of its own, a leader on the stalled disk stops by its deadline, nobody
/// leads while every write waits, and no two terms' work overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_etcd_disk_scenarios() {
    let etcd = common::server().etcd().member();

    let namespace = common::new_namespace("stalled-release");
    let store = KubeLeaseStore::new(common::tenant(&namespace).await);
    let disk = EtcdWalDisk::new(etcd, Duration::from_secs(3));
    stalled_disk::a_given_up_release_lands_when_the_disk_answers(&store, &disk).await;

    let namespace = common::new_namespace("stalled-leader");
    let mut stores = Vec::new();
    for _ in 0..2 {
        let store = KubeLeaseStore::new(common::tenant(&namespace).await);
        stores.push(Arc::new(store) as Arc<dyn LeaseStore>);
    }
    let stores: [Arc<dyn LeaseStore>; 2] = stores.try_into().unwrap_or_else(|_| unreachable!());
    let disk = EtcdWalDisk::new(etcd, Duration::from_secs(5));
    stalled_disk::a_leader_on_a_stalled_disk_stops_by_its_deadline(stores, &disk).await;
}
