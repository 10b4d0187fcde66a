//! etcd-specific behaviour on a single member: durable tokens across restarts, push
//! takeover, fenced etcd transactions, TTL changes, the membership stream, and bad input
//! (TTLs etcd cannot honour, unreachable endpoints, malformed prefixes and URLs).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::TxnOp;
use tenure::{
    ElectionState, Error, FencingToken, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore,
    NodeRegistry,
};
use tenure_etcd::{EtcdLeaseStore, EtcdNodeRegistry, MembershipChange};
use tenure_testkit::etcd::EtcdServer;
use tenure_testkit::registry::waited_for_change;
use tenure_testkit::{assert_refused, in_time, MustAnswer};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

const SECOND: Duration = Duration::from_secs(1);

async fn shared_store(tag: &str) -> EtcdLeaseStore {
    let client =
        common::client(&[EtcdServer::shared().expect("shared etcd server").endpoint()]).await;
    EtcdLeaseStore::new(client, &common::unique_prefix(tag)).unwrap()
}

fn assert_invalid<T: std::fmt::Debug>(result: tenure::Result<T>, field: &str) {
    match result {
        Err(Error::InvalidArgument { field: f, .. }) if f == field => {}
        other => panic!("expected InvalidArgument for {field}, got {other:?}"),
    }
}

/// Setup: a private single-member etcd. Tokens strictly increase across release,
/// takeover after expiry, a graceful etcd restart and a SIGKILL restart; none repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_release_takeover_and_restart() {
    common::init_tracing();
    let server = EtcdServer::start().expect("start etcd");
    let endpoints = vec![server.endpoint()];
    let prefix = common::unique_prefix("durable");
    let store = EtcdLeaseStore::new(common::client(&endpoints).await, &prefix).unwrap();
    let mut seen = BTreeSet::new();
    let record = |token: FencingToken, seen: &mut BTreeSet<FencingToken>| {
        let last = seen.last().copied().unwrap_or_default();
        assert!(token > last, "token {token} after {last}");
        assert!(seen.insert(token), "token {token} handed out twice");
    };

    tracing::info!("--- release");
    let a = store.try_acquire("job", "a", SECOND).await;
    assert!(a.acquired);
    record(a.fencing_token, &mut seen);
    assert!(store.release_term("job", "a", a.fencing_token).await);
    let b = store.try_acquire("job", "b", SECOND).await;
    assert!(b.acquired);
    record(b.fencing_token, &mut seen);

    tracing::info!("--- takeover after expiry");
    tokio::time::sleep(SECOND + common::EXPIRY_MARGIN).await;
    let c = store.try_acquire("job", "c", SECOND).await;
    assert!(c.acquired, "{c:?}");
    record(c.fencing_token, &mut seen);

    for (phase, graceful) in [("graceful restart", true), ("kill -9 restart", false)] {
        tracing::info!("--- {phase}");
        if graceful {
            server.stop();
        } else {
            server.kill();
        }
        server.restart().expect("restart");
        // A fresh client and store: a process restart on top of the etcd restart.
        let store = EtcdLeaseStore::new(common::client(&endpoints).await, &prefix).unwrap();
        let info = store
            .get("job")
            .await
            .unwrap()
            .expect("role survives restart");
        assert!(Some(&info.fencing_token) >= seen.last(), "{info:?}");
        // etcd extends leases on restart; wait until the old term is surely over.
        let deadline = Instant::now() + Duration::from_secs(15);
        let d = loop {
            let d = store.try_acquire("job", "d", SECOND).await;
            if d.acquired || Instant::now() > deadline {
                break d;
            }
            store
                .wait_for_change(
                    "job",
                    d.fencing_token,
                    tokio::time::Instant::now() + Duration::from_secs(3),
                )
                .await;
        };
        assert!(d.acquired, "{phase}: d never acquired: {d:?}");
        record(d.fencing_token, &mut seen);
        assert!(store.release_term("job", "d", d.fencing_token).await);
    }
}

/// Setup: two electors on the shared etcd with a 60 s retry interval. When the leader's
/// work returns (releasing the lease), the follower takes over through the watch push in
/// well under a second, three times in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_takeover_beats_a_long_retry_interval() {
    common::init_tracing();
    let prefix = common::unique_prefix("push");
    let endpoint = EtcdServer::shared().expect("shared etcd server").endpoint();
    let options = |owner: &str| LeaseLeaderOptions {
        owner_id: owner.to_owned(),
        lease_ttl: Duration::from_secs(10),
        renew_interval: Duration::from_secs(3),
        retry_interval: Duration::from_secs(60),
        ..Default::default()
    };
    let (started_tx, mut started_rx) = mpsc::unbounded_channel::<(String, Instant)>();
    let mut handovers = Vec::new();
    let mut owners: Vec<String> = vec!["first".into(), "second".into()];
    // Each elector leads until told to stop (then its work returns and it releases).
    let spawn = |owner: String, store: Arc<EtcdLeaseStore>| {
        let started_tx = started_tx.clone();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let elector = LeaseLeaderElector::new(store, options(&owner)).unwrap();
        let state = elector.watch();
        let handle = tokio::spawn(async move {
            elector
                .run(
                    "job",
                    move |_token, leadership| {
                        let started_tx = started_tx.clone();
                        let owner = owner.clone();
                        let mut stop_rx = stop_rx.clone();
                        async move {
                            let _ = started_tx.send((owner, Instant::now()));
                            tokio::select! {
                                _ = stop_rx.wait_for(|stop| *stop) => {}
                                _ = leadership.cancelled() => {}
                            }
                        }
                    },
                    CancellationToken::new(),
                )
                .await
        });
        (handle, stop_tx, state)
    };
    let new_store = || async {
        Arc::new(
            EtcdLeaseStore::new(
                common::client(std::slice::from_ref(&endpoint)).await,
                &prefix,
            )
            .unwrap(),
        )
    };
    let mut leader = spawn(owners[0].clone(), new_store().await);
    let (who, _) = timeout(Duration::from_secs(10), started_rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(who, owners[0]);
    for round in 0..3 {
        let follower = spawn(owners[1].clone(), new_store().await);
        let mut state = follower.2.clone();
        in_time(
            Duration::from_secs(10),
            state.wait_for(|s| matches!(s, ElectionState::Follower { holder: Some(_) })),
            "follower sees the holder",
        )
        .await;
        // Let the follower's watch get established.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let stopped = Instant::now();
        leader.1.send(true).unwrap();
        let (who, started) = timeout(Duration::from_secs(10), started_rx.recv())
            .await
            .expect("takeover within 10 s (the retry interval is 60 s)")
            .unwrap();
        assert_eq!(who, owners[1], "round {round}");
        let handover = started.duration_since(stopped);
        handovers.push(handover);
        leader.0.await.unwrap().unwrap();
        leader = follower;
        owners.swap(0, 1);
    }
    tracing::info!(?handovers, "release -> takeover");
    for handover in &handovers {
        assert!(
            *handover < Duration::from_millis(1000),
            "handover took {handover:?}: {handovers:?}"
        );
    }
    leader.1.send(true).unwrap();
    leader.0.await.unwrap().unwrap();
}

/// Setup: a term on the shared etcd. A fenced transaction commits while the term is
/// live, and is rejected (nothing written) after release and after a lapse, with the
/// newer token reported as the highest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_txn_rejected_after_the_term_ends() {
    let store = shared_store("fence").await;
    let data = format!("{}/data", store.prefix());
    let mut kv = store.client().kv_client();
    let a = store.try_acquire("job", "a", SECOND).await;
    let ok = store
        .commit_fenced(
            "job",
            a.fencing_token,
            vec![TxnOp::put(data.clone(), "a1", None)],
        )
        .await
        .unwrap();
    assert!(ok.succeeded());
    // The builder form, composed by hand.
    let txn = store
        .fenced_txn("job", a.fencing_token)
        .unwrap()
        .and_then([TxnOp::put(data.clone(), "a2", None)]);
    assert!(kv.txn(txn).await.unwrap().succeeded());

    // A late write under `token`, committed fenced.
    let write_late =
        |token| store.commit_fenced("job", token, vec![TxnOp::put(data.clone(), "late", None)]);
    assert!(store.release_term("job", "a", a.fencing_token).await);
    match write_late(a.fencing_token).await {
        Err(Error::Fenced { presented, highest }) => {
            assert_eq!(presented, a.fencing_token);
            assert_eq!(highest, a.fencing_token, "no successor yet");
        }
        other => panic!("expected Fenced after release, got {other:?}"),
    }
    let b = store.try_acquire("job", "b", SECOND).await;
    assert!(b.acquired);
    match write_late(a.fencing_token).await {
        Err(Error::Fenced { highest, .. }) => assert_eq!(highest, b.fencing_token),
        other => panic!("expected Fenced under a successor, got {other:?}"),
    }
    let txn = store
        .fenced_txn("job", a.fencing_token)
        .unwrap()
        .and_then([TxnOp::put(data.clone(), "late", None)]);
    assert!(!kv.txn(txn).await.unwrap().succeeded());

    // b lapses without release: its token is fenced too.
    tokio::time::sleep(SECOND + common::EXPIRY_MARGIN).await;
    assert!(write_late(b.fencing_token).await.is_err());
    let value = kv.get(data, None).await.unwrap();
    assert_eq!(value.kvs()[0].value(), b"a2", "no stale write landed");
}

/// Setup: the shared etcd. Renewing with another TTL keeps the term and token (the key
/// moves to a new etcd lease), and the new TTL is what counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_with_a_new_ttl_keeps_the_token() {
    let store = shared_store("ttl-change").await;
    let a = store.try_acquire("job", "a", SECOND).await;
    let longer = store.try_acquire("job", "a", Duration::from_secs(5)).await;
    assert!(longer.acquired);
    assert_eq!(longer.fencing_token, a.fencing_token);
    assert!(longer.remaining() > Duration::from_secs(4), "{longer:?}");
    tokio::time::sleep(SECOND + common::EXPIRY_MARGIN).await;
    let other = store.try_acquire("job", "b", SECOND).await;
    assert_refused(&other, "a", "the 5 s term outlives the old 1 s lease");
}

/// Setup: a registry on the shared etcd. The membership stream reports a join, a leave,
/// and etcd expiring a node's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_stream_reports_joins_and_departures() {
    let client =
        common::client(&[EtcdServer::shared().expect("shared etcd server").endpoint()]).await;
    let registry =
        EtcdNodeRegistry::new(client, &common::unique_prefix("members"), SECOND).unwrap();
    let mut changes = registry.watch_members().await.unwrap();
    async fn next(changes: &mut tenure_etcd::MembershipWatch) -> MembershipChange {
        in_time(
            Duration::from_secs(5),
            changes.next(),
            "a change within 5 s",
        )
        .await
        .expect("watch open")
    }
    let mut meta = tenure::Metadata::new();
    meta.insert("addr".into(), "10.0.0.1:80".into());
    registry.heartbeat_with("n1", &meta).await.unwrap();
    assert_eq!(
        next(&mut changes).await,
        MembershipChange::Joined {
            node_id: "n1".into(),
            metadata: meta.clone()
        }
    );
    registry.heartbeat("n1").await.unwrap(); // a refresh is not a change
    registry.heartbeat("n2").await.unwrap();
    assert!(
        matches!(next(&mut changes).await, MembershipChange::Joined { node_id, .. } if node_id == "n2")
    );
    assert!(registry.leave("n1").await.unwrap());
    assert_eq!(
        next(&mut changes).await,
        MembershipChange::Left {
            node_id: "n1".into()
        }
    );
    // n2 stops heartbeating: etcd expires its lease and the stream says so.
    assert_eq!(
        next(&mut changes).await,
        MembershipChange::Left {
            node_id: "n2".into()
        }
    );
    assert!(registry.live_nodes().await.unwrap().is_empty());
}

/// Setup: the shared etcd, a registry read once. A wait for a change of what that read
/// showed lasts while nothing changes, and a join made after the read (even one made
/// before the wait began) ends it at once. The registry's shared watch of the nodes
/// outlives a compaction of the store's history: a wait still lasts while nothing
/// changes, and a leave ends it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_wait_watches_from_the_last_read() {
    let endpoint = EtcdServer::shared().expect("shared etcd server").endpoint();
    let prefix = common::unique_prefix("members-wait");
    let registry = EtcdNodeRegistry::new(
        common::client(std::slice::from_ref(&endpoint)).await,
        &prefix,
        30 * SECOND,
    )
    .unwrap();
    let other = EtcdNodeRegistry::new(
        common::client(std::slice::from_ref(&endpoint)).await,
        &prefix,
        30 * SECOND,
    )
    .unwrap();
    registry.heartbeat("n1").await.unwrap();
    let observed = registry.live_nodes().await.unwrap();
    let started = tokio::time::Instant::now();
    registry
        .wait_for_members_change(&observed, started + Duration::from_millis(500))
        .await;
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "nothing changed"
    );

    let observed = registry.live_nodes().await.unwrap();
    other.heartbeat("n2").await.unwrap();
    let waited = waited_for_change(&registry, &observed, 30 * SECOND).await;
    assert!(
        waited < 5 * SECOND,
        "a join after the read was missed: {waited:?}"
    );

    let observed = registry.live_nodes().await.unwrap();
    let mut client = common::client(&[endpoint]).await;
    let mut revision = 0;
    for i in 0..3 {
        let put = client
            .put(format!("{prefix}/elsewhere/{i}"), "x", None)
            .await
            .unwrap();
        revision = put.header().unwrap().revision();
    }
    client.compact(revision, None).await.unwrap();
    let waited = waited_for_change(&registry, &observed, Duration::from_millis(500)).await;
    assert!(
        waited >= Duration::from_millis(500),
        "nothing changed after the compaction: {waited:?}"
    );
    let waiter = {
        let registry = registry.clone();
        tokio::spawn(async move { waited_for_change(&registry, &observed, 30 * SECOND).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(other.leave("n2").await.unwrap());
    let waited = tokio::time::timeout(10 * SECOND, waiter)
        .await
        .expect("a leave after the compaction wakes the wait")
        .unwrap();
    assert!(
        waited < 5 * SECOND,
        "a leave after the compaction was missed: {waited:?}"
    );
}

/// Setup: the shared etcd. TTLs etcd cannot honour, malformed prefixes and malformed
/// URLs are `InvalidArgument` naming the field, before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_invalid_argument() {
    let store = shared_store("bad").await;
    assert_eq!(store.min_ttl(), SECOND);
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_millis(999),
        Duration::from_millis(1500),
        Duration::from_secs(9_000_000_001),
    ] {
        assert_invalid(store.try_acquire_or_renew("r", "a", ttl).await, "ttl");
    }
    assert!(store.list().await.unwrap().is_empty());
    let client = store.client().clone();
    for prefix in ["", "/", "/app/", "a b", "a\0b", "tab\there"] {
        assert_invalid(EtcdLeaseStore::new(client.clone(), prefix), "prefix");
        assert_invalid(
            EtcdNodeRegistry::new(client.clone(), prefix, SECOND),
            "prefix",
        );
    }
    assert_invalid(
        EtcdNodeRegistry::new(client.clone(), "/ok", Duration::from_millis(500)),
        "ttl",
    );
    assert_invalid(
        EtcdNodeRegistry::new(client.clone(), "/ok", Duration::from_millis(1500)),
        "ttl",
    );
    for url in [
        "http://127.0.0.1:2379",
        "etcd://",
        "etcd://host",
        "etcd://h:1/p/",
    ] {
        let result = tenure_etcd::connect(url).await;
        assert!(
            matches!(result, Err(Error::InvalidArgument { .. })),
            "{url}: {result:?}"
        );
    }
}

/// Setup: a closed loopback port. Connecting reports a store error naming the endpoint;
/// an elector on a store whose etcd is down keeps retrying (never returns an error) and
/// leads once etcd comes up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoints_error_clearly_and_electors_retry() {
    common::init_tracing();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let started = Instant::now();
    let error = tenure_etcd::connect(&format!("etcd://127.0.0.1:{port}/app"))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(error.is_transient(), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(&format!("127.0.0.1:{port}")),
        "error names the endpoint: {message}"
    );

    // An elector whose etcd is down at first.
    let server = Arc::new(EtcdServer::start().expect("start etcd"));
    let client = common::client(&[server.endpoint()]).await;
    server.stop();
    let store = Arc::new(
        EtcdLeaseStore::new(client, "/retry")
            .unwrap()
            .with_request_timeout(Duration::from_secs(1))
            .unwrap(),
    );
    let elector = LeaseLeaderElector::new(
        store,
        LeaseLeaderOptions {
            owner_id: "patient".into(),
            lease_ttl: Duration::from_secs(3),
            renew_interval: SECOND,
            retry_interval: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .unwrap();
    let mut state = elector.watch();
    let shutdown = CancellationToken::new();
    let run = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            elector
                .run(
                    "job",
                    |_token, leadership| async move { leadership.cancelled().await },
                    shutdown,
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!run.is_finished(), "store errors must not end run");
    assert!(!state.borrow().is_leader());
    let restarted = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || server.restart().expect("restart"))
    };
    in_time(
        Duration::from_secs(30),
        state.wait_for(ElectionState::is_leader),
        "leads once etcd is back",
    )
    .await;
    restarted.await.unwrap();
    shutdown.cancel();
    timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// A registry remembers the memberships it wrote and heartbeats them without reading
/// first. Setup: two registries (as two processes would have) heartbeating the same node
/// id on the shared etcd, one removing it, and its etcd lease revoked behind the
/// registry's back. Every heartbeat still succeeds and the membership stays one
/// membership (first seen unchanged) until it really ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_memberships_survive_changes_made_elsewhere() {
    let client =
        common::client(&[EtcdServer::shared().expect("shared etcd server").endpoint()]).await;
    let prefix = common::unique_prefix("own");
    let ttl = Duration::from_secs(10);
    let a = EtcdNodeRegistry::new(client.clone(), &prefix, ttl).unwrap();
    let b = EtcdNodeRegistry::new(client.clone(), &prefix, ttl).unwrap();
    let first_seen = |members: Vec<tenure::NodeInfo>| {
        assert_eq!(members.len(), 1, "{members:?}");
        members[0].first_seen
    };

    a.heartbeat("n1").await.unwrap();
    let started = first_seen(a.members().await.unwrap());
    for _ in 0..3 {
        a.heartbeat("n1").await.unwrap();
        // b's write moves the key on: a's remembered revision is stale from here.
        b.heartbeat("n1").await.unwrap();
    }
    assert_eq!(first_seen(a.members().await.unwrap()), started);

    // Removed by b: a's next heartbeat starts a new membership.
    assert!(b.leave("n1").await.unwrap());
    a.heartbeat("n1").await.unwrap();
    let restarted = first_seen(a.members().await.unwrap());
    assert!(restarted > started);

    // Its lease revoked (as etcd expiring it would): the heartbeat starts over too.
    let lease = client
        .kv_client()
        .get(format!("{prefix}/nodes/n1"), None)
        .await
        .unwrap()
        .kvs()[0]
        .lease();
    client.lease_client().revoke(lease).await.unwrap();
    a.heartbeat("n1").await.unwrap();
    let members = a.members().await.unwrap();
    assert!(first_seen(members) > restarted);
}

/// `connect` asks each endpoint its version and tunes renewals to the oldest: on Debian's
/// etcd (3.4.23, which predates the keep-alive fix) renewals wait for the keep-alive
/// before the transaction; on the etcd 3.6 `scripts/test` runs this suite again with,
/// both go together. Either way they renew under the same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunes_renewals_to_the_server_version() {
    let server = EtcdServer::shared().expect("shared etcd server");
    let url =
        tenure_etcd::EtcdUrl::parse(&format!("etcd://{}/version", server.host_port())).unwrap();
    let (_client, version) = tenure_etcd::connect_client(&url).await.unwrap();
    let version = version.expect("etcd reports a version that parses");
    let store = tenure_etcd::connect(&format!("etcd://{}/version", server.host_port()))
        .await
        .unwrap();
    assert_eq!(
        store.keeps_alive_first(),
        !version.keep_alive_is_safe(),
        "{version}"
    );

    let ttl = Duration::from_secs(2);
    let first = store.try_acquire("job", "a", ttl).await;
    let renewed = store.try_acquire("job", "a", ttl).await;
    assert!(first.acquired && renewed.acquired);
    assert_eq!(renewed.fencing_token, first.fencing_token);
}

/// A fresh prefix on the shared etcd, its keys, and a client to read and write them
/// directly.
async fn raw_prefix(tag: &str) -> (String, tenure_etcd::requests::Keys, etcd_client::Client) {
    common::init_tracing();
    let endpoint = EtcdServer::shared().expect("shared etcd server").endpoint();
    let prefix = common::unique_prefix(tag);
    let keys = tenure_etcd::requests::Keys::new(&prefix).unwrap();
    (prefix, keys, common::client(&[endpoint]).await)
}

/// The raw value and mod revision of `key`, if it exists.
async fn raw_get(client: &mut etcd_client::Client, key: &str) -> Option<(Vec<u8>, i64)> {
    let response = client.get(key, None).await.unwrap();
    response
        .kvs()
        .first()
        .map(|kv| (kv.value().to_vec(), kv.mod_revision()))
}

/// A term's value is written once, by the transaction that starts the term (`values/R`'s
/// mod revision is the token), and neither a renewal offering another value nor a change
/// of TTL writes it again, though both rewrite the term record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_leaves_the_value_alone() {
    let (prefix, keys, mut raw) = raw_prefix("value-renewal").await;
    let store = EtcdLeaseStore::new(raw.clone(), &prefix).unwrap();
    let ttl = Duration::from_secs(4);
    let a = store
        .try_acquire_with_value("job", "a", ttl, Some("http://a"))
        .await;
    assert!(a.acquired, "{a:?}");
    let token = i64::try_from(a.fencing_token.get()).unwrap();
    let (_, written_at) = raw_get(&mut raw, &keys.value("job")).await.expect("value");
    assert_eq!(written_at, token);

    let renewed = store
        .try_acquire_with_value("job", "a", ttl, Some("http://b"))
        .await;
    assert!(renewed.acquired && renewed.fencing_token == a.fencing_token);
    // Another instance renews through a read, and a new TTL moves the term to a new
    // etcd lease: neither is a new term.
    let other = EtcdLeaseStore::new(raw.clone(), &prefix).unwrap();
    let moved = other
        .try_acquire_or_renew_with_value("job", "a", Duration::from_secs(5), Some("http://c"))
        .await
        .unwrap();
    assert!(moved.acquired && moved.fencing_token == a.fencing_token);

    let (_, record_at) = raw_get(&mut raw, &keys.term("job")).await.expect("record");
    assert!(record_at > token, "renewals rewrite the term record");
    let (_, still_at) = raw_get(&mut raw, &keys.value("job")).await.expect("value");
    assert_eq!(still_at, token, "no renewal rewrote the value");
    let info = other.get("job").await.unwrap().unwrap();
    assert_eq!(info.value.as_deref(), Some("http://a"));

    assert!(other.release_term("job", "a", a.fencing_token).await);
    assert_eq!(raw_get(&mut raw, &keys.value("job")).await, None);
}

/// Setup: a role's keys as a tenure from before values wrote them: a `values/R` left by
/// an earlier term (as if a newer tenure's term advertised it), then a term started
/// without touching it, its record in the old encoding. The term reads (get and list) as
/// one that advertised nothing, renews and releases as any other, and a renewal offering
/// a value does not add one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_from_before_values_read_as_advertising_nothing() {
    use etcd_client::{PutOptions, Txn};

    let (prefix, keys, mut raw) = raw_prefix("old-layout").await;
    raw.put(keys.value("job"), r#"{"value":"http://stale"}"#, None)
        .await
        .unwrap();
    let lease = raw.lease_grant(4, None).await.unwrap().id();
    let expires_at_ns = tenure_etcd::requests::to_ns(std::time::SystemTime::now() + 4 * SECOND);
    let record = format!(
        r#"{{"owner":"old","expires_at_ns":{expires_at_ns},"ttl_secs":4,"lease_secs":4,"released":false}}"#
    );
    let started = raw
        .txn(Txn::new().and_then([
            TxnOp::put(
                keys.lease("job"),
                "old",
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::put(keys.term("job"), record, None),
        ]))
        .await
        .unwrap();
    let token = FencingToken::from(u64::try_from(started.header().unwrap().revision()).unwrap());

    let store = EtcdLeaseStore::new(raw.clone(), &prefix).unwrap();
    let info = store.get("job").await.unwrap().unwrap();
    assert_eq!(
        (info.holder.as_deref(), info.fencing_token, info.value),
        (Some("old"), token, None)
    );
    let listed = store.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].fencing_token, listed[0].value.as_deref()),
        (token, None)
    );

    let renewed = store
        .try_acquire_with_value("job", "old", 4 * SECOND, Some("http://new"))
        .await;
    assert!(
        renewed.acquired && renewed.fencing_token == token,
        "{renewed:?}"
    );
    assert_eq!(store.get("job").await.unwrap().unwrap().value, None);
    assert!(store.release_term("job", "old", token).await);
    let info = store.get("job").await.unwrap().unwrap();
    assert_eq!((info.holder, info.value), (None, None));
}

/// `wait_for_term` returns when a term above the token it was given begins: the first
/// term of a role whose key never existed, and the next term after a release; a
/// renewal, a change of TTL or a release is no new term. It returns at once when such a
/// term began before the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_term_returns_when_a_term_begins() {
    let (prefix, _, client) = raw_prefix("wait-for-term").await;
    let store = EtcdLeaseStore::new(client.clone(), &prefix).unwrap();
    let watcher = Arc::new(EtcdLeaseStore::new(client, &prefix).unwrap());
    let ttl = Duration::from_secs(4);
    let wait = |after: FencingToken| {
        let watcher = watcher.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            watcher.wait_for_term("job", after, deadline).await;
            Instant::now()
        })
    };
    let push = Duration::from_secs(2);

    let waiting = wait(FencingToken::from(0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "no term yet");
    let a = store.try_acquire("job", "a", ttl).await;
    in_time(push, waiting, "woken by the first term").await;

    let waiting = wait(a.fencing_token);
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.try_acquire("job", "a", ttl).await;
    store.try_acquire("job", "a", ttl + SECOND).await;
    assert!(store.release_term("job", "a", a.fencing_token).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "a renewal, a new TTL and a release are no new term"
    );
    let b = store.try_acquire("job", "b", ttl).await;
    assert!(b.acquired && b.fencing_token > a.fencing_token);
    in_time(push, waiting, "woken by the next term").await;

    let asked = Instant::now();
    in_time(
        push,
        wait(a.fencing_token),
        "a term above the token began already",
    )
    .await;
    assert!(asked.elapsed() < push);
}

/// Setup: a private etcd, stopped while a `wait_for_term` watches, and down when the
/// next one starts. Neither returns before its deadline: a broken watch sleeps to it
/// rather than letting an observer read (and fail) in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_term_sleeps_to_the_deadline_when_the_watch_fails() {
    common::init_tracing();
    let server = EtcdServer::start().expect("start etcd");
    let store = Arc::new(
        EtcdLeaseStore::new(common::client(&[server.endpoint()]).await, "/broken")
            .unwrap()
            .with_request_timeout(Duration::from_millis(500))
            .unwrap(),
    );
    for phase in ["watch broken", "etcd down"] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        let waiting = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .wait_for_term("job", FencingToken::from(0), deadline)
                    .await;
                tokio::time::Instant::now()
            })
        };
        if phase == "watch broken" {
            tokio::time::sleep(Duration::from_millis(500)).await;
            server.stop();
        }
        let returned = in_time(Duration::from_secs(10), waiting, "returns by the deadline").await;
        assert!(
            returned >= deadline,
            "{phase}: returned before the deadline"
        );
        assert!(
            returned < deadline + Duration::from_secs(1),
            "{phase}: returned long after the deadline"
        );
    }
}
