//! Membership through a session: a node that holds a session of the store its registry
//! was made from ([`EtcdLeaseStore::registry`]) is kept alive by the session's
//! keep-alives, and the registry skips its own heartbeat writes meanwhile.
//!
//! The control runs the same steps with a registry made by [`EtcdNodeRegistry::new`]
//! (which shares no store's sessions, as every registry did before): there the member
//! lapses.

mod common;

use std::sync::Arc;

use etcd_client::Client;
use tenure_etcd::{EtcdLeaseStore, EtcdNodeRegistry};
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::session_membership::{self as scenario, TTL};

/// A store on the shared etcd under a fresh prefix, its client and prefix.
async fn setup(tag: &str) -> (EtcdLeaseStore, Client, String) {
    let client =
        common::client(&[EtcdServer::shared().expect("shared etcd server").endpoint()]).await;
    let prefix = common::unique_prefix(tag);
    let store = common::store_for(client.clone(), &prefix, true);
    (store, client, prefix)
}

/// The node record's own `last_heartbeat_ns` and its key's mod revision (moved only by a
/// heartbeat write).
async fn own_heartbeat(client: &Client, prefix: &str, node: &str) -> Option<(u64, i64)> {
    let key = format!("{prefix}/nodes/{node}");
    let response = client.kv_client().get(key, None).await.unwrap();
    let kv = response.kvs().first()?;
    let record: tenure_etcd::requests::NodeRecord = serde_json::from_slice(kv.value()).unwrap();
    Some((record.last_heartbeat_ns, kv.mod_revision()))
}

/// The scenario of that name: the heartbeats write nothing while the session keeps the
/// member alive. A registry of another client (another process) sees the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_kept_alive_by_its_session_writes_no_heartbeat_and_stays_live() {
    let (store, client, prefix) = setup("membership-skip").await;
    let registry = store.registry(TTL).unwrap();
    scenario::a_member_kept_alive_by_its_session_writes_no_heartbeat_and_stays_live(
        &store,
        &registry,
        || own_heartbeat(&client, &prefix, "m"),
        |a, b| a == b,
        || async {
            let server = EtcdServer::shared().expect("shared etcd server");
            let other = common::client(&[server.endpoint()]).await;
            EtcdNodeRegistry::new(other, &prefix, TTL).unwrap()
        },
    )
    .await;
}

/// Control: a registry sharing no store's sessions writes each heartbeat, and a member
/// whose heartbeats stop lapses after a TTL though its session is kept alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_registry_writes_every_heartbeat() {
    let (store, client, prefix) = setup("membership-unlinked").await;
    let registry = EtcdNodeRegistry::new(client.clone(), &prefix, TTL).unwrap();
    scenario::an_unlinked_registry_writes_every_heartbeat(&store, &registry, || {
        own_heartbeat(&client, &prefix, "m")
    })
    .await;
}

/// The scenario of that name: a closed session or a leave removes the member at once
/// (the waiter wakes when the node key's etcd lease expires, within its TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_session_or_a_leave_removes_the_member_at_once() {
    let (store, _client, _prefix) = setup("membership-close").await;
    let registry = Arc::new(store.registry(TTL).unwrap());
    scenario::a_closed_session_or_a_leave_removes_the_member_at_once(&store, registry).await;
}

/// The scenario of that name: a member goes a TTL after its session's last keep-alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_goes_a_ttl_after_its_sessions_last_keep_alive() {
    let (store, _client, _prefix) = setup("membership-lapse").await;
    let registry = store.registry(TTL).unwrap();
    scenario::a_member_goes_a_ttl_after_its_sessions_last_keep_alive(&store, &registry).await;
}

/// The scenario of that name: heartbeats resume when keep-alives stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_resume_when_keep_alives_stop() {
    let (store, client, prefix) = setup("membership-resume").await;
    let registry = store.registry(TTL).unwrap();
    scenario::heartbeats_resume_when_keep_alives_stop(
        &store,
        &registry,
        || own_heartbeat(&client, &prefix, "m"),
        |a, b| a == b,
    )
    .await;
}
