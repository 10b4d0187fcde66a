//! etcd-specific session behaviour on the shared single member: what a keep-alive costs
//! in writes, what readers see of a session's roles, a session's lease revoked behind
//! the store's back, and the TTL rules of etcd leases.

mod common;

use std::time::Duration;

use etcd_client::Client;
use tenure::{Error, LeaseStore, SessionId};
use tenure_etcd::EtcdLeaseStore;
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::MustAnswer;

const TTL: Duration = Duration::from_secs(4);

/// A store on the shared etcd under a fresh prefix, tuned as for a server whose
/// keep-alive answers are safe (`safe_server`) or not.
async fn store(tag: &str, safe_server: bool) -> (EtcdLeaseStore, Client) {
    let client =
        common::client(&[EtcdServer::shared().expect("shared etcd server").endpoint()]).await;
    let store = common::store_for(client.clone(), &common::unique_prefix(tag), safe_server);
    (store, client)
}

/// The store's current revision: it grows by one per transaction that writes.
async fn revision(client: &Client) -> i64 {
    let mut kv = client.kv_client();
    let response = kv.get("/no-such-key", None).await.unwrap();
    response.header().expect("header").revision()
}

/// How many keys under `prefix` were written after revision `since` (other tests write
/// to the shared etcd too, so the global revision alone does not tell).
async fn written_since(client: &Client, prefix: &str, since: i64) -> usize {
    let options = etcd_client::GetOptions::new().with_prefix();
    let response = client
        .kv_client()
        .get(format!("{prefix}/"), Some(options))
        .await
        .unwrap();
    response
        .kvs()
        .iter()
        .filter(|kv| kv.mod_revision() > since)
        .count()
}

/// The session has ended for `store`: keep-alive answers `None`, acquiring under it is
/// `SessionEnded`.
async fn assert_ended(store: &EtcdLeaseStore, id: SessionId) {
    assert_eq!(store.keep_alive(id, TTL).await, None);
    assert!(matches!(
        store.acquire_in_session("g/1", id).await,
        Err(Error::SessionEnded(ended)) if ended == id
    ));
}

fn lease_of(id: SessionId) -> i64 {
    i64::try_from(id.get()).unwrap()
}

/// Setup: one session holding 40 roles, in both renewal modes. Each keep-alive writes
/// one key (the session's), and afterwards every role still
/// reads as held, with the session's new expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_writes_once_however_many_roles() {
    for safe_server in [false, true] {
        let (store, client) = store("session-cost", safe_server).await;
        let session = store.open_session("node-a", TTL).await.unwrap();
        let roles: Vec<String> = (0..40).map(|i| format!("g/{i}")).collect();
        for role in &roles {
            assert!(
                store
                    .acquire_in_session(role, session.id)
                    .await
                    .unwrap()
                    .acquired
            );
        }
        let mut last = session.expires_at;
        for _ in 0..3 {
            let before = revision(&client).await;
            let kept = store.keep_alive(session.id, TTL).await.expect("live");
            let writes = written_since(&client, store.prefix(), before).await;
            assert_eq!(
                writes, 1,
                "one keep-alive of 40 roles wrote {writes} keys (safe server: {safe_server})"
            );
            assert!(kept.expires_at >= last);
            last = kept.expires_at;
        }
        let info = store.get("g/17").await.unwrap().expect("lease");
        assert_eq!(info.live_holder(), Some("node-a"));
        assert_eq!(info.expires_at, last, "get shows the session's expiry");
        let listed = store.list().await.unwrap();
        assert_eq!(listed.len(), roles.len());
        assert!(
            listed.iter().all(|info| info.expires_at == last),
            "list shows the session's expiry: {listed:?}"
        );
        let refused = store.try_acquire("g/3", "node-b", TTL).await;
        assert!(!refused.acquired);
        assert_eq!(
            refused.expires_at, last,
            "a refusal names the session's expiry"
        );
        assert!(store.close_session(session.id).await.unwrap());
    }
}

/// Setup: a session holding 150 roles (more than one closing transaction's worth),
/// closed. Its roles read as released (no holder, tokens kept) in `get` and `list`, like
/// a release, not like a lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_clears_its_roles_holders() {
    let (store, _client) = store("session-close", false).await;
    let session = store.open_session("node-a", TTL).await.unwrap();
    let mut tokens = std::collections::BTreeMap::new();
    for i in 0..150 {
        let role = format!("g/{i:03}");
        let held = store.acquire_in_session(&role, session.id).await.unwrap();
        tokens.insert(role, held.fencing_token);
    }
    assert!(store.close_session(session.id).await.unwrap());
    let info = store.get("g/000").await.unwrap().expect("lease");
    assert_eq!(info.holder, None, "released by the close: {info:?}");
    assert_eq!(info.fencing_token, tokens["g/000"]);
    let listed = store.list().await.unwrap();
    assert_eq!(listed.len(), tokens.len());
    for info in listed {
        assert_eq!(info.holder, None, "{info:?}");
        assert_eq!(info.fencing_token, tokens[&info.role], "{info:?}");
    }
}

/// Setup: a session whose etcd lease an operator revokes directly. The store that opened
/// it (and remembers it) finds it ended: keep-alive answers `None`, acquiring under it
/// is `SessionEnded`, closing it answers `false`, and its role is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_revoked_behind_the_store_has_ended() {
    for safe_server in [false, true] {
        let (store, client) = store("session-revoked", safe_server).await;
        let session = store.open_session("node-a", TTL).await.unwrap();
        let held = store.acquire_in_session("g/0", session.id).await.unwrap();
        client
            .lease_client()
            .revoke(lease_of(session.id))
            .await
            .unwrap();
        assert_ended(&store, session.id).await;
        assert!(!store.close_session(session.id).await.unwrap());
        let taken = store.try_acquire("g/0", "node-b", TTL).await;
        assert!(taken.acquired && taken.fencing_token > held.fencing_token);
    }
}

/// Setup: the shared etcd. An etcd lease keeps the TTL it was granted, so a session's TTL
/// is whole seconds, and a keep-alive may ask for a shorter TTL (the session keeps its
/// own) but not a longer one. Ids etcd never hands out are simply ended sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_ttls_follow_etcd_leases() {
    let (store, _client) = store("session-ttl", false).await;
    let invalid = |result: tenure::Result<_>| {
        matches!(result, Err(Error::InvalidArgument { field: "ttl", .. }))
    };
    assert!(invalid(
        store
            .open_session("node-a", Duration::from_millis(1500))
            .await
            .map(|_| ())
    ));
    assert!(invalid(
        store
            .open_session("node-a", Duration::from_millis(500))
            .await
            .map(|_| ())
    ));
    let session = store.open_session("node-a", TTL).await.unwrap();
    assert!(invalid(
        store
            .keep_alive_session(session.id, TTL * 2)
            .await
            .map(|_| ())
    ));
    let kept = store
        .keep_alive(session.id, Duration::from_secs(1))
        .await
        .expect("live");
    assert!(kept.remaining() > Duration::from_secs(3), "{kept:?}");
    for never in [SessionId::from(0), SessionId::from(u64::MAX)] {
        assert_eq!(store.keep_alive(never, TTL).await, None);
        assert!(matches!(
            store.acquire_in_session("g/0", never).await,
            Err(Error::SessionEnded(_))
        ));
        assert!(!store.close_session(never).await.unwrap());
    }
}

/// Setup: a session's etcd lease revoked, then granted again under the same id (etcd
/// accepts a client-chosen id once the old lease is gone) with another owner's session
/// key on it: what etcd would produce if it ever handed out the id again. The store that
/// knew the first session never takes the new one for it: keep-alive answers `None` and
/// acquiring under it is `SessionEnded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_lease_id_is_not_the_old_session() {
    for safe_server in [false, true] {
        let (store, client) = store("session-reused", safe_server).await;
        let session = store.open_session("node-a", TTL).await.unwrap();
        let lease = lease_of(session.id);
        let mut leases = client.lease_client();
        leases.revoke(lease).await.unwrap();
        let options = etcd_client::LeaseGrantOptions::new().with_id(lease);
        leases.grant(4, Some(options)).await.unwrap();
        let key = format!("{}/sessions/{lease:x}", store.prefix());
        let record = format!(
            r#"{{"owner":"intruder","expires_at_ns":{},"ttl_secs":4,"lease_secs":4}}"#,
            tenure_etcd::requests::to_ns(session.expires_at)
        );
        let put = etcd_client::PutOptions::new().with_lease(lease);
        client
            .kv_client()
            .put(key, record, Some(put))
            .await
            .unwrap();

        assert_ended(&store, session.id).await;
        leases.revoke(lease).await.unwrap();
    }
}

/// Setup: a private etcd, a session holding three roles, and a store whose requests give
/// up after 500 ms. etcd stalls (SIGSTOP) for about 1.2 s, well inside the session's 4 s
/// TTL, so one keep-alive fails. A failed call proves nothing about the session: its etcd
/// lease lives on, and so do the role keys on it, which nobody else can take. So after
/// etcd resumes the next keep-alive renews the session, and every role is still held
/// under it with its token. In both renewal modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_keep_alive_does_not_end_the_session() {
    common::init_tracing();
    let server = EtcdServer::start().expect("start etcd");
    for safe_server in [false, true] {
        let client = common::client(&[server.endpoint()]).await;
        let store = common::store_for(client, &common::unique_prefix("session-blip"), safe_server)
            .with_request_timeout(Duration::from_millis(500))
            .unwrap();
        let session = store.open_session("node-a", TTL).await.unwrap();
        let mut tokens = Vec::new();
        for i in 0..3 {
            let role = format!("g/{i}");
            let held = store.acquire_in_session(&role, session.id).await.unwrap();
            assert!(held.acquired, "{held:?}");
            tokens.push((role, held.fencing_token));
        }

        server.pause();
        let failed = store.keep_alive_session(session.id, TTL).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        server.resume();
        assert!(
            failed.is_err(),
            "a keep-alive to a stalled etcd answered {failed:?}"
        );
        server
            .member()
            .wait_healthy(Duration::from_secs(5))
            .expect("etcd healthy after the stall");

        let kept = store.keep_alive(session.id, TTL).await;
        assert!(
            kept.is_some(),
            "the keep-alive after one failed call answered that the session ended, though \
             its etcd lease is alive (safe server: {safe_server})"
        );
        for (role, token) in &tokens {
            let again = store.acquire_in_session(role, session.id).await.unwrap();
            assert!(
                again.acquired && again.fencing_token == *token,
                "{role} after the blip: {again:?}, held under token {token} before"
            );
            let info = store.get(role).await.unwrap().expect("lease");
            assert_eq!(info.live_holder(), Some("node-a"), "{info:?}");
            assert_eq!(info.fencing_token, *token, "{info:?}");
        }
        assert!(store.close_session(session.id).await.unwrap());
    }
}

/// A group of 40,000 shards held under one session: reading it whole is several
/// megabytes, more than a gRPC client decodes by default (4 MB). The read must still
/// answer, with every role live under the session; closing the session releases them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_larger_than_a_grpc_message_is_read_whole() {
    const SHARDS: usize = 40_000;
    let (store, _client) = store("big-group", true).await;
    // Long enough to outlast the acquires (a few seconds) without keep-alives.
    let session = store
        .open_session("node-a", Duration::from_secs(120))
        .await
        .unwrap();
    let roles: Vec<String> = (0..SHARDS).map(|k| format!("big/{k}")).collect();
    // Calls of more than one transaction's worth: each is sent as full transactions
    // (as many roles as etcd's limit on operations allows) and a rest.
    for batch in roles.chunks(2 * store.acquire_batch_size() + 10) {
        let answers = store
            .acquire_many_in_session(batch, session.id)
            .await
            .unwrap();
        assert!(answers.iter().all(|a| a.acquired), "{answers:?}");
    }
    let leases = store.list_prefix("big/").await.unwrap();
    assert_eq!(leases.len(), SHARDS);
    assert!(leases.iter().all(|l| l.live_holder() == Some("node-a")));
    // Closing releases them (no holder, rather than lapsed under node-a), in
    // transactions as full as the acquires'.
    assert!(store.close_session(session.id).await.unwrap());
    let leases = store.list_prefix("big/").await.unwrap();
    assert_eq!(leases.len(), SHARDS);
    assert!(
        leases.iter().all(|l| l.holder.is_none()),
        "{:?}",
        leases.first()
    );
}
