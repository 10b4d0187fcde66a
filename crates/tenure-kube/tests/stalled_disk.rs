//! The Kubernetes API server over an etcd whose disk stalls: the API server's writes
//! hang inside etcd while tenure's callers give up. A leader on it stops by its own
//! deadline, as on PostgreSQL and etcd (`tenure_testkit::stalled_disk`).
//!
//! Not run here: the scenario in which a given-up release lands when the disk answers.
//! A release on Kubernetes reads the role's candidates before it writes, from its
//! store's watch of the namespace once that has listed them, else by a list the API
//! server answers from etcd; a list waits on a stalled etcd too, so a release given up
//! there never sent its write, nothing lands, and its term runs out instead. Both
//! outcomes are safe; only one is what that scenario asserts.
//!
//! This binary owns its API server (a stall holds every write of every test on it). Its
//! etcd is the one `scripts/build-servers` builds, with etcd's failpoints.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tenure::LeaseStore;
use tenure_kube::KubeLeaseStore;
use tenure_testkit::stalled_disk::{self, EtcdWalDisk};

/// A leader on the stalled disk stops by its deadline, nobody leads while every write
/// waits, the role is led again after the stall, and no two terms' work overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_on_a_stalled_etcd_disk_stops_by_its_deadline() {
    let etcd = common::server().etcd().member();
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
