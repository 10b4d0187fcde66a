//! An etcd server whose disk stalls: writes (and linearizable reads) hang inside the
//! server while their callers give up, and land when the disk answers again.
//!
//! The stall is etcd's own failpoint before each fsync of its write-ahead log, which the
//! etcd `scripts/build-servers` builds has enabled (Debian's etcd has no failpoints), so
//! these tests run that etcd whatever `$ETCD_BIN` says, each on a server of its own.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tenure::LeaseStore;
use tenure_etcd::EtcdLeaseStore;
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::stalled_disk::{self, EtcdWalDisk};

/// A throwaway etcd of the failpoint-enabled build, and a store on it under a fresh
/// prefix.
async fn server_with_failpoints(tag: &str) -> (EtcdServer, EtcdLeaseStore) {
    common::init_tracing();
    let bin = tenure_testkit::kube::etcd_binary()
        .expect("the etcd of scripts/build-servers (target/servers/etcd)");
    let server = EtcdServer::start_with(&bin).expect("start etcd");
    let client = common::client(&[server.endpoint()]).await;
    let store = EtcdLeaseStore::new(client, &common::unique_prefix(tag)).expect("a prefix");
    (server, store)
}

/// A release given up while the disk stalls lands when the disk answers again, with no
/// further call from its caller; a write of another role waits too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_given_up_on_a_stalled_disk_lands_when_it_answers() {
    let (server, store) = server_with_failpoints("stalled-release").await;
    let disk = EtcdWalDisk::new(server.member(), Duration::from_secs(3));
    stalled_disk::a_given_up_release_lands_when_the_disk_answers(&store, &disk).await;
    // etcd's tokens are revisions: the next term's is higher, not the next number.
}

/// An etcd without failpoints (Debian's) says it cannot stall its disk, and an attempt
/// fails with an error that says why.
#[test]
fn an_etcd_without_failpoints_cannot_stall_its_disk() {
    let server =
        EtcdServer::start_with(std::path::Path::new("/usr/bin/etcd")).expect("start Debian's etcd");
    assert!(!server.can_stall_wal());
    let error = server
        .stall_wal_for(Duration::from_secs(1))
        .expect_err("no failpoint to set")
        .to_string();
    assert!(
        error.contains("stalling the disk of etcd member m0")
            && error.contains("scripts/build-servers builds one that has"),
        "{error}"
    );
}

/// A disk stalled for longer than the TTL under a leader and a contender: the leader
/// stops by its local deadline, nobody leads while every write waits, the role is led
/// again after the stall, and no two terms' work overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_on_a_stalled_disk_stops_by_its_deadline() {
    let (server, store) = server_with_failpoints("stalled-leader").await;
    let contender = EtcdLeaseStore::new(common::client(&[server.endpoint()]).await, store.prefix())
        .expect("a prefix");
    let stores: [Arc<dyn LeaseStore>; 2] = [Arc::new(store), Arc::new(contender)];
    let disk = EtcdWalDisk::new(server.member(), Duration::from_secs(5));
    stalled_disk::a_leader_on_a_stalled_disk_stops_by_its_deadline(stores, &disk).await;
}
