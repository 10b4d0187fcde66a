//! A 3-member etcd cluster on loopback: tenure across an etcd leader that crashes, an
//! etcd leader or follower whose disk stalls, and the minority side of a lost quorum
//! refusing to hand out leases.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{ElectionState, FencingToken, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore};
use tenure_etcd::EtcdLeaseStore;
use tenure_testkit::etcd::EtcdCluster;
use tenure_testkit::{eventually, in_time, MustAnswer};
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

/// Tracing, and a fresh cluster of 3 etcd members, started off the runtime (starting
/// blocks until every member is healthy).
async fn three_members() -> Arc<EtcdCluster> {
    common::init_tracing();
    let cluster =
        tokio::task::spawn_blocking(|| EtcdCluster::start(3).expect("start an etcd cluster"))
            .await
            .unwrap();
    Arc::new(cluster)
}

/// The index of the member that is the raft leader, as the members themselves say.
async fn etcd_leader(cluster: &EtcdCluster) -> usize {
    let within = Duration::from_secs(10);
    eventually(within, Duration::from_millis(100), || async {
        for (i, member) in cluster.members().iter().enumerate() {
            if !member.is_running() {
                continue;
            }
            let mut client = common::client(&[member.endpoint()]).await;
            if let Ok(Ok(status)) = timeout(Duration::from_secs(2), client.status()).await {
                let me = status.header().map(|h| h.member_id());
                if status.leader() != 0 && Some(status.leader()) == me {
                    return Ok(i);
                }
            }
        }
        Err("no etcd leader found".to_owned())
    })
    .await
}

/// What the electors' work saw: terms in start order, and whether two ever overlapped.
#[derive(Default)]
struct Terms {
    active: AtomicUsize,
    overlapped: AtomicBool,
    started: Mutex<Vec<(String, FencingToken)>>,
}

/// What befalls one etcd member.
#[derive(Clone, Copy, Debug)]
enum MemberFault {
    /// The raft leader: SIGKILL, then a restart.
    LeaderCrash,
    /// The raft leader's disk stalls this long (etcd's failpoint before each WAL sync):
    /// it stops persisting, so it stops sending heartbeats, and the others elect a new
    /// leader while it hangs, its process running and its sockets open.
    LeaderDiskStall(Duration),
    /// A follower's disk stalls this long: the leader and the other follower keep a
    /// quorum and commit on, while the stalled follower answers nothing. A write sent to
    /// it meanwhile still reaches the leader (the follower forwards it, at once or, when
    /// its forward waits behind the stalled sync, once the disk answers) and is
    /// committed, but the follower answers only once it has applied it itself: its
    /// caller gives up on a write that is in the store.
    FollowerDiskStall(Duration),
}

impl MemberFault {
    /// How long the member's disk stalls, if that is the fault.
    fn stall(self) -> Option<Duration> {
        match self {
            MemberFault::LeaderCrash => None,
            MemberFault::LeaderDiskStall(stall) | MemberFault::FollowerDiskStall(stall) => {
                Some(stall)
            }
        }
    }
}

/// Setup: 3 etcd members; two electors (TTL 3 s, renew 1 s) whose clients know every
/// member. Kill the etcd leader member while a tenure leader holds the role: within the
/// TTL plus etcd's failover, someone leads (the same term kept, or a successor with a
/// higher token), and no two terms ever ran at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_crash_keeps_one_tenure_leader() {
    one_tenure_leader_through(three_members().await, MemberFault::LeaderCrash).await;
}

/// The same with the etcd leader's disk stalled for 6 s instead of a crash: the member
/// the clients' requests reach first may be the one that hangs (a slow disk under the
/// leader, etcd's classic outage). The cluster runs the etcd of `scripts/build-servers`,
/// which has etcd's failpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_disk_stall_keeps_one_tenure_leader() {
    let stall = Duration::from_secs(6);
    let cluster = three_members_with_failpoints().await;
    one_tenure_leader_through(cluster, MemberFault::LeaderDiskStall(stall)).await;
}

/// The same with a follower's disk stalled for 6 s: the cluster keeps its quorum, but a
/// client's requests that reach the stalled follower get no answer, and a write its
/// caller gave up there is in the store afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_follower_disk_stall_keeps_one_tenure_leader() {
    let stall = Duration::from_secs(6);
    let cluster = three_members_with_failpoints().await;
    one_tenure_leader_through(cluster, MemberFault::FollowerDiskStall(stall)).await;
}

/// Tracing, and a fresh cluster of 3 members of the etcd of `scripts/build-servers`,
/// which has etcd's failpoints.
async fn three_members_with_failpoints() -> Arc<EtcdCluster> {
    common::init_tracing();
    let bin = tenure_testkit::kube::etcd_binary()
        .expect("the etcd of scripts/build-servers (target/servers/etcd)");
    let cluster = tokio::task::spawn_blocking(move || {
        EtcdCluster::start_with(3, &bin).expect("start an etcd cluster")
    })
    .await
    .unwrap();
    assert!(
        cluster.member(0).can_stall_wal(),
        "this etcd has no failpoints: run scripts/build-servers"
    );
    Arc::new(cluster)
}

/// The key of a write given up at the stalled member.
const GIVEN_UP: &str = "/test/disk-stall/through-the-stalled";

/// The fault took: a write through the stalled member alone gets no answer (it is given
/// up after 1 s), and one through the other two is answered within 4 s (they have, or
/// elect, a leader of their own).
async fn stalled_member_hangs_while_the_others_write(cluster: &EtcdCluster, victim: usize) {
    let mut stalled = common::client(&[cluster.member(victim).endpoint()]).await;
    let put = stalled.put(GIVEN_UP, "x", None);
    assert!(
        timeout(Duration::from_secs(1), put).await.is_err(),
        "a write through the stalled member was answered"
    );
    let others = common::client(&endpoints_but(cluster, victim)).await;
    eventually(Duration::from_secs(4), Duration::from_millis(100), || {
        let mut client = others.clone();
        async move {
            match timeout(
                Duration::from_millis(500),
                client.put("/test/disk-stall/k", "x", None),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) => Err(format!("the others did not take a write: {error}")),
                Err(_) => Err("the others did not take a write".to_owned()),
            }
        }
    })
    .await;
}

/// The endpoints of every member but `but`.
fn endpoints_but(cluster: &EtcdCluster, but: usize) -> Vec<String> {
    (0..cluster.members().len())
        .filter(|&i| i != but)
        .map(|i| cluster.member(i).endpoint())
        .collect()
}

/// Whether the write given up at member `stalled` is in the store, as the other
/// members answer (a linearizable read).
async fn given_up_write_landed(cluster: &EtcdCluster, stalled: usize) -> bool {
    let mut client = common::client(&endpoints_but(cluster, stalled)).await;
    let got = timeout(Duration::from_secs(2), client.get(GIVEN_UP, None)).await;
    !got.expect("the others answer a read in time")
        .expect("the others answer a read")
        .kvs()
        .is_empty()
}

/// Two electors over `cluster` while `fault` strikes one of its members: someone leads
/// 8 s on (the same term kept or led again by its holder, or a successor with a higher
/// token), no two terms ever run at once, and the member is healthy again afterwards.
async fn one_tenure_leader_through(cluster: Arc<EtcdCluster>, fault: MemberFault) {
    let endpoints = cluster.endpoints();
    let prefix = common::unique_prefix("crash");
    let terms = Arc::new(Terms::default());
    let shutdown = CancellationToken::new();
    let mut runs = Vec::new();
    let mut states = Vec::new();
    for owner in ["a", "b"] {
        let store = EtcdLeaseStore::new(common::client(&endpoints).await, &prefix)
            .unwrap()
            .with_request_timeout(Duration::from_secs(1))
            .unwrap();
        let elector = LeaseLeaderElector::new(
            Arc::new(store),
            LeaseLeaderOptions {
                owner_id: owner.into(),
                lease_ttl: Duration::from_secs(3),
                renew_interval: Duration::from_secs(1),
                retry_interval: Duration::from_millis(500),
                ..Default::default()
            },
        )
        .unwrap();
        states.push(elector.watch());
        let terms = terms.clone();
        let shutdown = shutdown.clone();
        runs.push(tokio::spawn(async move {
            elector
                .run(
                    "job",
                    move |token, leadership| {
                        let terms = terms.clone();
                        async move {
                            if terms.active.fetch_add(1, Ordering::SeqCst) != 0 {
                                terms.overlapped.store(true, Ordering::SeqCst);
                            }
                            terms
                                .started
                                .lock()
                                .unwrap()
                                .push((owner.to_owned(), token));
                            leadership.cancelled().await;
                            terms.active.fetch_sub(1, Ordering::SeqCst);
                        }
                    },
                    shutdown,
                )
                .await
        }));
    }
    let leads = |states: &[tokio::sync::watch::Receiver<ElectionState>]| {
        states.iter().filter(|s| s.borrow().is_leader()).count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while leads(&states) == 0 {
        assert!(Instant::now() < deadline, "nobody led on a healthy cluster");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = terms.started.lock().unwrap()[0].clone();

    let leader = etcd_leader(&cluster).await;
    let victim = match fault {
        MemberFault::FollowerDiskStall(_) => (leader + 1) % cluster.members().len(),
        MemberFault::LeaderCrash | MemberFault::LeaderDiskStall(_) => leader,
    };
    tracing::info!(?fault, victim, leader, "--- the fault strikes");
    let struck = Instant::now();
    match fault.stall() {
        None => cluster.member(victim).kill(),
        Some(stall) => {
            cluster
                .member(victim)
                .stall_wal_for(stall)
                .expect("stall the member's disk");
            stalled_member_hangs_while_the_others_write(&cluster, victim).await;
        }
    }
    // Sample for TTL + failover: never two leaders at once, and a leader at the end.
    let until = Instant::now() + Duration::from_secs(8);
    let mut led_at_end = false;
    while Instant::now() < until {
        assert!(leads(&states) <= 1, "two electors lead at once");
        led_at_end = leads(&states) == 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(led_at_end, "nobody leads 8 s after the fault struck");
    let started = terms.started.lock().unwrap().clone();
    tracing::info!(?started, "terms");
    assert!(
        !terms.overlapped.load(Ordering::SeqCst),
        "two terms ran at once: {started:?}"
    );
    for pair in started.windows(2) {
        let ((earlier_owner, earlier), (later_owner, later)) = (&pair[0], &pair[1]);
        // A new holder has a higher token. The same holder may lead its own term again
        // with the same token: its renewals lapsed on its clock (a stalled etcd leader
        // answers none), its lease on the store did not, and nobody held it meanwhile.
        if later_owner == earlier_owner {
            assert!(later >= earlier, "tokens must not go back: {started:?}");
        } else {
            assert!(later > earlier, "tokens must increase: {started:?}");
        }
    }
    assert!(started[0] == first);

    tracing::info!("--- the member comes back");
    // A stall ends on its own, a set time after it struck (a real server's, which no
    // paused clock can shorten); a crashed member is restarted.
    if let Some(stall) = fault.stall() {
        tokio::time::sleep_until(struck + stall).await;
    }
    let back = cluster.clone();
    tokio::task::spawn_blocking(move || {
        if fault.stall().is_none() {
            back.member(victim).restart().expect("restart");
        }
        back.wait_healthy(Duration::from_secs(30))
            .expect("wait until healthy");
    })
    .await
    .unwrap();
    if let MemberFault::FollowerDiskStall(_) = fault {
        // The write its caller gave up at the stalled follower is in the store: the
        // follower passed it on to the leader, and only its answer waited on the disk.
        let cluster = &cluster;
        eventually(
            Duration::from_secs(5),
            Duration::from_millis(100),
            || async {
                match given_up_write_landed(cluster, victim).await {
                    true => Ok(()),
                    false => Err("the write given up at the follower did not land".to_owned()),
                }
            },
        )
        .await;
    }
    shutdown.cancel();
    for run in runs {
        in_time(Duration::from_secs(10), run, "run ends on shutdown")
            .await
            .unwrap();
    }
    assert!(!terms.overlapped.load(Ordering::SeqCst));
}

/// Setup: 3 etcd members; stop two. A store talking to the remaining member cannot
/// acquire (every attempt fails: no leader), and can again once a second member is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_cannot_acquire() {
    let cluster = three_members().await;
    let prefix = common::unique_prefix("minority");
    let lonely = cluster.member(0).endpoint();
    let store = EtcdLeaseStore::new(common::client(&[lonely]).await, &prefix)
        .unwrap()
        .with_request_timeout(Duration::from_secs(2))
        .unwrap();
    let ttl = Duration::from_secs(2);
    // A term by another owner, through the whole cluster, then lost quorum.
    let held = store.try_acquire("job", "majority", ttl).await;
    assert!(held.acquired);
    assert!(
        store
            .release_term("job", "majority", held.fencing_token)
            .await
    );
    let stopping = cluster.clone();
    tokio::task::spawn_blocking(move || {
        stopping.member(1).stop();
        stopping.member(2).stop();
    })
    .await
    .unwrap();

    tracing::info!("--- quorum lost");
    let until = Instant::now() + Duration::from_secs(4);
    let mut attempts = 0;
    while Instant::now() < until {
        attempts += 1;
        match store.try_acquire_or_renew("job", "minority", ttl).await {
            Ok(result) => assert!(
                !result.acquired,
                "the minority side handed out a lease: {result:?}"
            ),
            Err(error) => assert!(error.is_transient(), "{error:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(attempts >= 2);

    tracing::info!("--- quorum back");
    let starting = cluster.clone();
    tokio::task::spawn_blocking(move || {
        starting.member(1).restart().expect("restart");
        starting
            .member(0)
            .wait_healthy(Duration::from_secs(30))
            .expect("wait until healthy");
    })
    .await
    .unwrap();
    let within = Duration::from_secs(15);
    let result = eventually(within, Duration::from_millis(200), || async {
        match store.try_acquire_or_renew("job", "minority", ttl).await {
            Ok(result) if result.acquired => Ok(result),
            other => Err(format!("no lease after quorum came back: {other:?}")),
        }
    })
    .await;
    assert!(result.fencing_token > held.fencing_token);
}
