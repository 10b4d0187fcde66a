//! A store server whose disk stops answering, on any server-backed store: the calls its
//! clients give up on wait inside the server and land when the disk answers again.
//!
//! The tests of each backend stall their throwaway server's disk their own way
//! (PostgreSQL's WAL through a preloaded library until healed, etcd's through its
//! failpoint for a set time) and run the same scenarios: a given-up release lands late
//! (PostgreSQL, etcd: one write each; a release through the Kubernetes API server reads
//! first, and a read given up on the stalled etcd sends no write), and a leader on the
//! stalled store stops by its own deadline with no two terms' work overlapping (all
//! three). The elector helpers ([`Running`], [`TermLog`]) serve the other fault tests of
//! the server-backed stores too.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure::{FencingToken, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore, WorkOutcome};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{eventually, in_time, MustAnswer};

/// An elector for `owner` over `store`: terms of `ttl`, renewed every `renew`, failed
/// attempts retried every `retry`.
pub fn elector(
    store: Arc<dyn LeaseStore>,
    owner: &str,
    ttl: Duration,
    renew: Duration,
    retry: Duration,
) -> Arc<LeaseLeaderElector> {
    let options = LeaseLeaderOptions {
        owner_id: owner.to_owned(),
        lease_ttl: ttl,
        renew_interval: renew,
        retry_interval: retry,
        ..Default::default()
    };
    Arc::new(LeaseLeaderElector::new(store, options).expect("valid elector options"))
}

/// An elector's `run` on a task of its own, until [`Running::stop`].
pub struct Running {
    task: JoinHandle<tenure::Result<()>>,
    shutdown: CancellationToken,
}

impl Running {
    /// Runs `elector` for `role` with `work`.
    pub fn start<W, Fut>(elector: &Arc<LeaseLeaderElector>, role: &'static str, work: W) -> Running
    where
        W: FnMut(FencingToken, CancellationToken) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let shutdown = CancellationToken::new();
        let (elector, stop) = (elector.clone(), shutdown.clone());
        let task = tokio::spawn(async move { elector.run(role, work, stop).await });
        Running { task, shutdown }
    }

    /// Whether the run has returned.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Shuts the run down; it returns `Ok` within 10 s.
    pub async fn stop(self) {
        self.shutdown.cancel();
        in_time(
            Duration::from_secs(10),
            self.task,
            "run returns on shutdown",
        )
        .await
        .expect("the run ends without an error");
    }
}

/// The terms an elector's work ran under: token, when the work began and when it ended.
pub type TermLog = Arc<Mutex<Vec<(FencingToken, Instant, Option<Instant>)>>>;

/// An elector's work that logs its term in `terms` and lasts until leadership ends.
pub async fn log_term(terms: TermLog, token: FencingToken, leadership: CancellationToken) {
    let index = {
        let mut terms = terms.lock().expect("the term log");
        terms.push((token, Instant::now(), None));
        terms.len() - 1
    };
    leadership.cancelled().await;
    terms.lock().expect("the term log")[index].2 = Some(Instant::now());
}

/// The first `n` entries of `items` once there are that many; fails after `within`.
pub async fn wait_for<T: Clone>(items: &Mutex<Vec<T>>, n: usize, within: Duration) -> Vec<T> {
    eventually(within, Duration::from_millis(10), || {
        let items = items.lock().expect("the term log");
        let found = (items.len() >= n)
            .then(|| items.clone())
            .ok_or_else(|| format!("fewer than {n} terms within {within:?}"));
        async move { found }
    })
    .await
}

/// Waits for the first logged term's work to end, by its local deadline: within `ttl`
/// of `fault`'s start at `since`, as the last renewal that answered was sent before it.
pub async fn first_term_ends_within_ttl(
    terms: &TermLog,
    since: Instant,
    ttl: Duration,
    fault: &str,
) {
    let within =
        (since + ttl + Duration::from_millis(500)).saturating_duration_since(Instant::now());
    let ended = eventually(within, Duration::from_millis(10), || {
        let ended = terms.lock().expect("the term log")[0].2.ok_or_else(|| {
            format!("the first term's work did not end within the TTL of the {fault}")
        });
        async move { ended }
    })
    .await;
    assert!(
        ended <= since + ttl,
        "the first term's work ended {:?} after the {fault}",
        ended - since
    );
}

/// How a test stalls its server's disk and waits for it to answer again.
pub trait StalledDisk {
    /// Stalls the disk: every write the server makes durable waits from now on.
    fn stall(&self);
    /// Returns once the disk answers again (heals it, or waits out a stall of a set
    /// length).
    fn heal(&self) -> impl Future<Output = ()> + Send;
    /// Whether the server answers reads while its disk stalls (PostgreSQL does; a single
    /// etcd member answers no linearizable read).
    fn reads_answer(&self) -> bool;
}

/// An etcd member's disk stalled for a set time
/// ([`EtcdMember::stall_wal_for`](crate::etcd::EtcdMember::stall_wal_for), etcd's
/// failpoint): the heal is the end of that time. A single member answers no
/// linearizable read meanwhile; on Kubernetes, the API server's etcd.
pub struct EtcdWalDisk<'a> {
    member: &'a crate::etcd::EtcdMember,
    stall: Duration,
    stalled_at: Mutex<Option<Instant>>,
}

impl<'a> EtcdWalDisk<'a> {
    /// `member`'s disk, to be stalled for `stall` at a time. Fails when the member's
    /// binary has no failpoints (only the etcd of `scripts/build-servers` has them).
    pub fn new(member: &'a crate::etcd::EtcdMember, stall: Duration) -> Self {
        assert!(
            member.can_stall_wal(),
            "this etcd has no failpoints: run scripts/build-servers"
        );
        EtcdWalDisk {
            member,
            stall,
            stalled_at: Mutex::new(None),
        }
    }
}

impl StalledDisk for EtcdWalDisk<'_> {
    fn stall(&self) {
        self.member
            .stall_wal_for(self.stall)
            .expect("stall etcd's WAL disk");
        *self.stalled_at.lock().expect("the stall's start") = Some(Instant::now());
    }

    async fn heal(&self) {
        let stalled_at = *self.stalled_at.lock().expect("the stall's start");
        let healed = stalled_at.expect("stalled before the heal") + self.stall;
        tokio::time::sleep_until(healed.into()).await;
    }

    fn reads_answer(&self) -> bool {
        false
    }
}

/// A release given up while the server's disk stalls lands when the disk answers
/// again, with no further call from its caller; meanwhile every write waits (and on a
/// server that reads without its disk, the term stands). The next term then has a
/// higher token. `store` is fresh, on the stalled server. Returns the two terms' tokens.
pub async fn a_given_up_release_lands_when_the_disk_answers(
    store: &dyn LeaseStore,
    disk: &impl StalledDisk,
) -> (FencingToken, FencingToken) {
    let ttl = Duration::from_secs(30);
    let first = store.try_acquire("r", "a", ttl).await;
    assert!(first.acquired, "{first:?}");

    disk.stall();
    let release = store.release("r", "a", first.fencing_token);
    let given_up = tokio::time::timeout(Duration::from_millis(500), release).await;
    assert!(given_up.is_err(), "the release waits on the disk");
    let other = store.try_acquire_or_renew("other", "b", ttl);
    let given_up = tokio::time::timeout(Duration::from_millis(300), other).await;
    assert!(
        given_up.is_err(),
        "a write of another role waits on the disk too"
    );
    if disk.reads_answer() {
        let seen = in_time(Duration::from_secs(5), store.get("r"), "a read answers")
            .await
            .expect("the role's lease");
        assert_eq!(
            (seen.live_holder(), seen.fencing_token),
            (Some("a"), first.fencing_token),
            "the term stands while the release waits"
        );
    }

    disk.heal().await;
    eventually(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async {
            match store.get("r").await {
                Ok(lease) if lease.as_ref().and_then(|l| l.live_holder()) == Some("a") => {
                    Err(format!("the given-up release never landed: {lease:?}"))
                }
                Ok(_) => Ok(()),
                Err(error) => Err(format!("a read after the heal failed: {error}")),
            }
        },
    )
    .await;
    let next = store.try_acquire("r", "b", ttl).await;
    assert!(next.acquired, "{next:?}");
    assert!(
        next.fencing_token > first.fencing_token,
        "{next:?} after {first:?}"
    );
    (first.fencing_token, next.fencing_token)
}

/// A server whose disk stalls for longer than the TTL (2 s), under a leader and a
/// contender (`stores`, one each, on the stalled server): the leader's renewals hang
/// inside the server, so its work stops by its local deadline; nobody's term begins
/// while every write waits; when the disk answers the stalled calls land late, and the
/// role is led again. No two terms' work ever overlaps, and a later term never has a
/// lower token.
pub async fn a_leader_on_a_stalled_disk_stops_by_its_deadline(
    stores: [Arc<dyn LeaseStore>; 2],
    disk: &impl StalledDisk,
) {
    let ttl = Duration::from_secs(2);
    let owners = ["a", "b"];
    let terms = TermLog::default();
    let mut runs = Vec::new();
    for (store, owner) in stores.into_iter().zip(owners) {
        let elector = elector(
            store,
            owner,
            ttl,
            Duration::from_millis(400),
            Duration::from_millis(300),
        );
        let terms = terms.clone();
        runs.push(Running::start(
            &elector,
            "stalled",
            move |token, leadership| log_term(terms.clone(), token, leadership),
        ));
    }
    wait_for(&terms, 1, Duration::from_secs(10)).await;

    disk.stall();
    let stalled = Instant::now();
    first_term_ends_within_ttl(&terms, stalled, ttl, "stall").await;
    tokio::time::sleep_until((stalled + ttl + ttl / 2).into()).await;
    assert_eq!(
        terms.lock().expect("the term log").len(),
        1,
        "no term begins while every write waits"
    );

    disk.heal().await;
    let after = wait_for(&terms, 2, Duration::from_secs(15)).await;
    for run in runs {
        run.stop().await;
    }
    let mut terms = terms.lock().expect("the term log").clone();
    terms.sort_by_key(|&(_, start, _)| start);
    for pair in terms.windows(2) {
        let (earlier, later) = (pair[0], pair[1]);
        let ended = earlier.2.expect("every term ended by the shutdown");
        assert!(ended <= later.1, "two terms worked at once: {after:?}");
        assert!(
            later.0 >= earlier.0,
            "a later term has a lower token: {after:?}"
        );
    }
}
