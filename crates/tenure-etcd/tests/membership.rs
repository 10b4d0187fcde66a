//! Membership through a session: a node that holds a session of the store its registry
//! was made from ([`EtcdLeaseStore::registry`]) is kept alive by the session's
//! keep-alives, and the registry skips its own heartbeat writes meanwhile.
//!
//! The control runs the same steps with a registry made by [`EtcdNodeRegistry::new`]
//! (which shares no store's sessions, as every registry did before): there the member
//! lapses.

mod common;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tenure::{LeaseStore, NodeRegistry};
use tenure_etcd::{EtcdLeaseStore, EtcdNodeRegistry};
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::session_membership::{self as scenario, EVERY, SESSION_TTL, TTL};

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
/// (the waiter wakes when the node key's etcd lease expires, within two TTLs).
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

/// While the session stands in, the node key's etcd lease (two TTLs long) is kept alive
/// once a TTL rather than at every heartbeat, and never lapses: over three TTLs the key
/// stays on the lease of its first write and is not written again, and the lease's time
/// left, read after each heartbeat, dips to about one TTL, where a keep-alive at every
/// heartbeat would keep it above two TTLs less one heartbeat period. A TTL of 3 s keeps
/// both apart in etcd's whole seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stood_in_members_lease_is_kept_alive_once_a_ttl() {
    const MEMBER_TTL: Duration = Duration::from_secs(3);
    let (store, client, prefix) = setup("membership-lease").await;
    let registry = store.registry(MEMBER_TTL).unwrap();
    let session = store.open_session("m", SESSION_TTL).await.unwrap();
    registry
        .heartbeat_with("m", &scenario::group())
        .await
        .unwrap();
    let key = format!("{prefix}/nodes/m");
    let lease_of_key = || {
        let mut kv = client.kv_client();
        let key = key.clone();
        async move {
            let response = kv.get(key, None).await.unwrap();
            response.kvs().first().map(|kv| kv.lease())
        }
    };
    let lease = lease_of_key()
        .await
        .expect("the first heartbeat wrote the key");
    // The first keep-alive finds the record naming the session.
    scenario::keep_alive_and_beat(&store, &registry, session.id, "m", EVERY).await;
    let written = own_heartbeat(&client, &prefix, "m").await;
    let mut least_left = i64::MAX;
    let until = tokio::time::Instant::now() + MEMBER_TTL * 3;
    while tokio::time::Instant::now() < until {
        // One keep-alive of the session and one heartbeat, then a pause of `EVERY`.
        scenario::keep_alive_and_beat(&store, &registry, session.id, "m", EVERY / 2).await;
        let left = client
            .lease_client()
            .time_to_live(lease, None)
            .await
            .unwrap()
            .ttl();
        least_left = least_left.min(left);
    }
    assert_eq!(lease_of_key().await, Some(lease), "one lease throughout");
    assert_eq!(
        own_heartbeat(&client, &prefix, "m").await,
        written,
        "no heartbeat written"
    );
    assert_eq!(registry.live_nodes().await.unwrap(), ["m"]);
    assert!(
        least_left > 0,
        "the lease never ran out: {least_left} s left"
    );
    assert!(
        least_left <= 4,
        "kept alive at every heartbeat: never less than {least_left} s of 6 left"
    );
}
