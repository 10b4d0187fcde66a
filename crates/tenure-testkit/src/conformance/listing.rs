//! Reading without contending: `get`, `list` and `list_prefix`.

use tenure::LeaseStore;

use crate::fixture::begin;
use crate::LeaseBackend;
use crate::MustAnswer;

/// `get` reads without changing; `list` shows every role sorted.
pub async fn scenario_get_and_list(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    assert_eq!(store.get("nobody").await.unwrap(), None);
    assert!(store.list().await.unwrap().is_empty());
    let b = store.try_acquire("beta", "node-b", ttl).await;
    let a = store.try_acquire("alpha", "node-a", ttl).await;
    let info = store.get("beta").await.unwrap().unwrap();
    assert_eq!(info.role, "beta");
    assert_eq!(info.holder.as_deref(), Some("node-b"));
    assert_eq!(info.fencing_token, b.fencing_token);
    assert_eq!(info.expires_at, b.expires_at, "get must not renew");
    let list = store.list().await.unwrap();
    let roles: Vec<_> = list.iter().map(|l| l.role.as_str()).collect();
    assert_eq!(roles, ["alpha", "beta"], "list is sorted by role");
    assert_eq!(list[0].fencing_token, a.fencing_token);
    store.release_term("alpha", "node-a", a.fencing_token).await;
    let list = store.list().await.unwrap();
    assert_eq!(list.len(), 2, "released leases stay listed");
    assert_eq!(list[0].live_holder(), None);
}

/// Every role `list` shows, in its order.
pub(super) async fn all_roles(store: &dyn LeaseStore) -> Vec<String> {
    let listed = store.list().await.unwrap();
    listed.into_iter().map(|l| l.role).collect()
}

async fn roles_with(store: &dyn LeaseStore, prefix: &str) -> Vec<String> {
    let listed = store.list_prefix(prefix).await.unwrap();
    listed.into_iter().map(|l| l.role).collect()
}

/// `list_prefix` shows the roles that start with the prefix, sorted, and nothing else:
/// characters that are wildcards in SQL or regular expressions are plain characters.
pub async fn scenario_list_prefix(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    for role in ["g/1", "g/10", "g/2", "g2/1", "h", "g%/1", "g_x"] {
        let lease = store.try_acquire(role, "node-a", ttl).await;
        assert!(lease.acquired, "{role}");
    }
    assert_eq!(roles_with(&*store, "g/").await, ["g/1", "g/10", "g/2"]);
    assert_eq!(roles_with(&*store, "g/1").await, ["g/1", "g/10"]);
    assert_eq!(
        roles_with(&*store, "g").await,
        ["g%/1", "g/1", "g/10", "g/2", "g2/1", "g_x"]
    );
    assert_eq!(
        roles_with(&*store, "g%").await,
        ["g%/1"],
        "% is a plain character"
    );
    assert_eq!(
        roles_with(&*store, "g_").await,
        ["g_x"],
        "_ is a plain character"
    );
    assert!(roles_with(&*store, "zz").await.is_empty());
    assert!(roles_with(&*store, ".*").await.is_empty());
    let all = all_roles(&*store).await;
    assert_eq!(all.len(), 7);
    assert_eq!(roles_with(&*store, "").await, all);
}
