//! Membership through a session: a node that holds a session of the store its registry
//! was made from ([`EtcdLeaseStore::registry`]) is kept alive by the session's
//! keep-alives, and the registry skips its own heartbeat writes meanwhile.
//!
//! The control runs the same steps with a registry made by [`EtcdNodeRegistry::new`]
//! (which shares no store's sessions, as every registry did before): there the member
//! lapses.

mod common;

use std::time::Duration;

use etcd_client::Client;
use tenure::{LeaseStore, NodeRegistry};
use tenure_etcd::{EtcdLeaseStore, EtcdNodeRegistry};
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::session_membership::{
    self as scenario, MembershipStorage, EVERY, SESSION_TTL, TTL,
};

/// One test's store on the shared etcd under a fresh prefix, its client and prefix.
struct Storage {
    store: EtcdLeaseStore,
    client: Client,
    prefix: String,
}

impl Storage {
    async fn open(tag: &str) -> Self {
        let client =
            common::client(&[EtcdServer::shared().expect("shared etcd server").endpoint()]).await;
        let prefix = common::unique_prefix(tag);
        let store = common::store_for(client.clone(), &prefix, true);
        Self {
            store,
            client,
            prefix,
        }
    }
}

impl MembershipStorage for Storage {
    type Store = EtcdLeaseStore;
    type Registry = EtcdNodeRegistry;
    /// The node record's own `last_heartbeat_ns` and its key's mod revision (moved only
    /// by a heartbeat write).
    type Heartbeat = Option<(u64, i64)>;

    fn store(&self) -> &EtcdLeaseStore {
        &self.store
    }

    fn registry(&self, ttl: Duration) -> EtcdNodeRegistry {
        self.store.registry(ttl).unwrap()
    }

    async fn unlinked(&self) -> EtcdNodeRegistry {
        EtcdNodeRegistry::new(self.client.clone(), &self.prefix, TTL).unwrap()
    }

    /// A registry of another client.
    async fn reader(&self) -> EtcdNodeRegistry {
        let server = EtcdServer::shared().expect("shared etcd server");
        let other = common::client(&[server.endpoint()]).await;
        EtcdNodeRegistry::new(other, &self.prefix, TTL).unwrap()
    }

    async fn own_heartbeat(&self, node: &str) -> Option<(u64, i64)> {
        let key = format!("{}/nodes/{node}", self.prefix);
        let response = self.client.kv_client().get(key, None).await.unwrap();
        let kv = response.kvs().first()?;
        let record: tenure_etcd::requests::NodeRecord = serde_json::from_slice(kv.value()).unwrap();
        Some((record.last_heartbeat_ns, kv.mod_revision()))
    }
}

// The close's waiter wakes when the node key's etcd lease expires, within two TTLs.
tenure_testkit::session_membership_scenarios!(Storage::open("membership").await);

/// While the session stands in, the node key's etcd lease (two TTLs long) is kept alive
/// once a TTL rather than at every heartbeat, and never lapses: over three TTLs the key
/// stays on the lease of its first write and is not written again, and the lease's time
/// left, read after each heartbeat, dips to about one TTL, where a keep-alive at every
/// heartbeat would keep it above two TTLs less one heartbeat period. A TTL of 3 s keeps
/// both apart in etcd's whole seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stood_in_members_lease_is_kept_alive_once_a_ttl() {
    const MEMBER_TTL: Duration = Duration::from_secs(3);
    let storage = Storage::open("membership-lease").await;
    let (store, client, prefix) = (&storage.store, &storage.client, &storage.prefix);
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
    scenario::keep_alive_and_beat(store, &registry, session.id, "m", EVERY).await;
    let written = storage.own_heartbeat("m").await;
    let mut least_left = i64::MAX;
    let until = tokio::time::Instant::now() + MEMBER_TTL * 3;
    while tokio::time::Instant::now() < until {
        // One keep-alive of the session and one heartbeat, then a pause of `EVERY`.
        scenario::keep_alive_and_beat(store, &registry, session.id, "m", EVERY / 2).await;
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
        storage.own_heartbeat("m").await,
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
