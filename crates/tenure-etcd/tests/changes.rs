//! Reads of what changed on etcd (`list_prefix_changes`): what a read with a mark sends
//! back, and a mark the server cannot have made (its revision went back: a cluster
//! restored or made anew under the same endpoints).

mod common;

use std::time::Duration;

use tenure::lease::ChangesRead;
use tenure::{ChangeMark, LeaseStore};
use tenure_etcd::EtcdLeaseStore;
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::MustAnswer;

const TTL: Duration = Duration::from_secs(4);

/// A store on the shared etcd under a fresh prefix.
async fn store(tag: &str) -> EtcdLeaseStore {
    let client =
        common::client(&[EtcdServer::shared().expect("shared etcd server").endpoint()]).await;
    common::store_for(client, &common::unique_prefix(tag), true)
}

/// Setup: one session holding 50 roles, read completely. A read with that read's mark
/// lists the one role taken since, with the session's time left and the count of held
/// leases; a read after it lists nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_with_a_mark_lists_only_what_changed() {
    let store = store("changes-only").await;
    let session = store.open_session("node-a", TTL).await.unwrap().id;
    let roles: Vec<String> = (0..50).map(|i| format!("g/{i}")).collect();
    store
        .acquire_many_in_session(&roles, session)
        .await
        .unwrap();
    let first = store.changes(ChangesRead::complete("g/")).await;
    assert!(first.complete);
    assert_eq!(first.leases.len(), 50);
    assert_eq!(first.held, Some(50));
    assert!(first.leases.iter().all(|l| l.session == Some(session)));
    let mark = first.mark.expect("etcd marks its reads");

    store.acquire_in_session("g/50", session).await.unwrap();
    let changed = store
        .changes(ChangesRead::since("g/", mark, &[session]))
        .await;
    assert!(!changed.complete);
    let listed: Vec<_> = changed
        .leases
        .iter()
        .map(|l| l.info.role.as_str())
        .collect();
    assert_eq!(listed, ["g/50"]);
    assert_eq!(changed.held, Some(51));
    assert_eq!(changed.sessions.len(), 1, "{:?}", changed.sessions);
    assert!(changed.sessions[0].1 > Duration::ZERO);

    let mark = changed.mark.expect("marked");
    let quiet = store
        .changes(ChangesRead::since("g/", mark, &[session]))
        .await;
    assert!(quiet.leases.is_empty(), "{:?}", quiet.leases);
    assert_eq!(quiet.held, Some(51));
}

/// A mark past the server's revision was not made by this server (its revision went
/// back): the read is complete rather than empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_past_the_servers_revision_reads_everything() {
    let store = store("changes-reset").await;
    let session = store.open_session("node-a", TTL).await.unwrap().id;
    store.acquire_in_session("g/0", session).await.unwrap();
    let read = store.changes(ChangesRead::complete("g/")).await;
    let ahead = ChangeMark::new(read.mark.expect("marked").get() + 1_000_000);
    let changes = store
        .changes(ChangesRead::since("g/", ahead, &[session]))
        .await;
    assert!(changes.complete, "{changes:?}");
    assert_eq!(changes.leases.len(), 1);
}
