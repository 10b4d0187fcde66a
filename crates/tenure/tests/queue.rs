//! The elector's queue, deterministically (paused tokio time, the in-memory store on a
//! [`TokioClock`]): a release hands the role to the contender that waited longest at
//! the cost of one release and one renewal, whatever the crowd; a planned handoff goes
//! to the chosen contender; a contender that stops is never handed the role.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::{
    ElectionState, FencingToken, InMemoryLeaseStore, LeaseLeaderElector, LeaseLeaderOptions,
    LeaseStore, Result, TokioClock,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const ROLE: &str = "reports";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn memory() -> Arc<InMemoryLeaseStore> {
    let start = SystemTime::UNIX_EPOCH + secs(1_800_000_000);
    Arc::new(InMemoryLeaseStore::with_clock(TokioClock::starting_at(
        start,
    )))
}

/// Counts the calls that write: acquire, renew, queue, release, handoff, withdraw.
#[derive(Default)]
struct Writes(AtomicUsize);

#[async_trait]
impl Interceptor for Writes {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        if matches!(
            call,
            Call::TryAcquireOrRenew { .. }
                | Call::Release { .. }
                | Call::HandOver { .. }
                | Call::Withdraw { .. }
        ) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        next.run(call).await
    }
}

/// ttl 10 s, renew 3 s, retry 60 s: waiting contenders refresh their place every 3 s
/// (the renew interval caps the retry) and otherwise act only on a push.
fn elector(store: Arc<dyn LeaseStore>, owner: &str) -> Arc<LeaseLeaderElector> {
    let options = LeaseLeaderOptions {
        owner_id: owner.to_owned(),
        lease_ttl: secs(10),
        renew_interval: secs(3),
        retry_interval: secs(60),
        accept_handoff_requests: true,
        ..Default::default()
    };
    Arc::new(LeaseLeaderElector::new(store, options).unwrap())
}

/// Runs `elector` with work that holds until leadership ends or `stop` fires.
fn run(
    elector: &Arc<LeaseLeaderElector>,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> JoinHandle<Result<()>> {
    let (elector, stop, shutdown) = (elector.clone(), stop.clone(), shutdown.clone());
    tokio::spawn(async move {
        elector
            .run(
                ROLE,
                move |_token, leadership: CancellationToken| {
                    let stop = stop.clone();
                    async move {
                        tokio::select! {
                            _ = leadership.cancelled() => {}
                            _ = stop.cancelled() => {}
                        }
                    }
                },
                shutdown,
            )
            .await
    })
}

async fn leads(state: &mut watch::Receiver<ElectionState>, what: &str) -> FencingToken {
    let led = tokio::time::timeout(secs(600), state.wait_for(ElectionState::is_leader))
        .await
        .map(|led| led.map(|state| state.clone()));
    match led {
        Ok(Ok(ElectionState::Leader { fencing_token })) => fencing_token,
        other => panic!("{what}: {other:?}"),
    }
}

async fn follows(state: &mut watch::Receiver<ElectionState>, what: &str) {
    let following = |s: &ElectionState| matches!(s, ElectionState::Follower { holder: Some(_) });
    let followed = tokio::time::timeout(secs(600), state.wait_for(following)).await;
    assert!(matches!(followed, Ok(Ok(_))), "{what}");
}

/// Three electors on `store` (what [`node_a_leads_b_and_c_wait`] returns): node-a, node-b
/// and node-c, their watches and their runs.
type Three = (
    [Arc<LeaseLeaderElector>; 3],
    [watch::Receiver<ElectionState>; 3],
    [JoinHandle<Result<()>>; 3],
);

/// Starts node-a, node-b and node-c on `store` together, with work that holds until
/// leadership ends, and waits until node-a leads (its token returned) and the other two
/// wait behind it.
async fn node_a_leads_b_and_c_wait(
    store: &Arc<dyn LeaseStore>,
    shutdown: &CancellationToken,
) -> (Three, FencingToken) {
    let never = CancellationToken::new();
    let electors = ["node-a", "node-b", "node-c"].map(|owner| elector(store.clone(), owner));
    let mut states = electors.each_ref().map(|elector| elector.watch());
    let runs = electors
        .each_ref()
        .map(|elector| run(elector, &never, shutdown));
    let token = leads(&mut states[0], "node-a leads").await;
    follows(&mut states[1], "node-b waits").await;
    follows(&mut states[2], "node-c waits").await;
    ((electors, states, runs), token)
}

/// Fires `shutdown` and waits until each of `runs` returns Ok.
async fn shut_down(
    shutdown: &CancellationToken,
    runs: impl IntoIterator<Item = JoinHandle<Result<()>>>,
) {
    shutdown.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
}

/// Setup: node-a leads; node-b, then node-c..node-j (ten contenders) queue behind it.
/// node-a's work returns. node-b, queued first, leads next under token 2, and the
/// handover costs the store exactly two writes (node-a's release, node-b's renewal): the
/// other eight waiters learn from the push that node-b leads and do not call the store.
/// Then node-b's work returns and node-c leads: the queue keeps arrival order.
#[tokio::test(start_paused = true)]
async fn a_release_hands_the_role_to_the_oldest_waiter_in_two_writes() {
    let memory = memory();
    let writes = Arc::new(Writes::default());
    let store: Arc<dyn LeaseStore> =
        Arc::new(InterceptStore::new(memory.clone()).with(writes.clone()));
    let shutdown = CancellationToken::new();
    let owners: Vec<String> = (b'a'..=b'j')
        .map(|c| format!("node-{}", c as char))
        .collect();
    let mut runs = Vec::new();
    let mut states = Vec::new();
    let mut stops = Vec::new();
    for owner in &owners {
        let elector = elector(store.clone(), owner);
        let mut state = elector.watch();
        let stop = CancellationToken::new();
        runs.push(run(&elector, &stop, &shutdown));
        if owner == "node-a" {
            leads(&mut state, "node-a leads").await;
        } else {
            follows(&mut state, "queued").await;
        }
        states.push(state);
        stops.push(stop);
        // One at a time, so the queue's order is the order above.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let before = writes.0.load(Ordering::SeqCst);
    stops[0].cancel();
    let token = leads(&mut states[1], "node-b leads next").await;
    assert_eq!(token.get(), 2);
    assert_eq!(
        writes.0.load(Ordering::SeqCst) - before,
        2,
        "one release and one renewal, whatever the crowd"
    );

    stops[1].cancel();
    assert_eq!(leads(&mut states[2], "node-c leads next").await.get(), 3);
    for state in &states[3..] {
        assert!(!state.borrow().is_leader());
    }
    shut_down(&shutdown, runs).await;
}

/// Setup: node-a leads; node-b and node-c wait (node-b first). A planned handoff to
/// node-c passes the term to it (token 2) though node-b waited longer, and node-a then
/// waits in line. A handoff asked of a follower, or to an owner nobody knows, answers
/// false; after the latter the leader keeps its term (same token) and its work runs
/// again.
#[tokio::test(start_paused = true)]
async fn a_planned_handoff_goes_to_the_chosen_contender() {
    let store: Arc<dyn LeaseStore> = memory();
    let shutdown = CancellationToken::new();
    let (([a, b, c], [mut a_state, mut b_state, mut c_state], runs), token) =
        node_a_leads_b_and_c_wait(&store, &shutdown).await;
    assert_eq!(token.get(), 1);

    assert!(!b.hand_off(None).await.unwrap(), "node-b does not lead");
    assert!(
        !a.hand_off(Some("node-x")).await.unwrap(),
        "nobody called node-x waits"
    );
    assert_eq!(
        leads(&mut a_state, "node-a leads on").await.get(),
        1,
        "the same term goes on"
    );

    assert!(a.hand_off(Some("node-c")).await.unwrap());
    assert_eq!(leads(&mut c_state, "node-c leads").await.get(), 2);
    assert!(!b_state.borrow().is_leader());
    follows(&mut a_state, "node-a waits in line").await;

    assert!(c.hand_off(None).await.unwrap());
    assert_eq!(
        leads(&mut b_state, "node-b leads").await.get(),
        3,
        "None hands to the oldest waiter"
    );
    shut_down(&shutdown, runs).await;
}

/// Setup: node-a leads; node-b waits, then shuts down; node-c waits. node-a's release
/// hands the role to node-c: node-b left the queue when it stopped.
#[tokio::test(start_paused = true)]
async fn a_contender_that_stops_is_never_handed_the_role() {
    let memory = memory();
    let store: Arc<dyn LeaseStore> = memory.clone();
    let shutdown = CancellationToken::new();
    let b_shutdown = CancellationToken::new();
    let (stop_a, never) = (CancellationToken::new(), CancellationToken::new());
    let (a, b, c) = (
        elector(store.clone(), "node-a"),
        elector(store.clone(), "node-b"),
        elector(store.clone(), "node-c"),
    );
    let (mut a_state, mut b_state, mut c_state) = (a.watch(), b.watch(), c.watch());
    let run_a = run(&a, &stop_a, &shutdown);
    leads(&mut a_state, "node-a leads").await;
    let run_b = run(&b, &never, &b_shutdown);
    follows(&mut b_state, "node-b waits").await;
    let run_c = run(&c, &never, &shutdown);
    follows(&mut c_state, "node-c waits").await;

    b_shutdown.cancel();
    run_b.await.unwrap().unwrap();
    stop_a.cancel();
    run_a.await.unwrap().unwrap();
    assert_eq!(leads(&mut c_state, "node-c leads").await.get(), 2);
    let info = memory.get(ROLE).await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-c"));
    shutdown.cancel();
    run_c.await.unwrap().unwrap();
}

/// Setup: node-a leads; node-b and node-c wait. A handoff asked through the store (as
/// `tenure handoff` does, from a process without the elector) moves the term to node-c;
/// the requester sees node-a hand over to node-c (token 2). A second request, to nobody
/// waiting under that name, times out with node-c still leading; with nobody leading the
/// answer is `NoLeader`.
#[tokio::test(start_paused = true)]
async fn a_handoff_asked_through_the_store_moves_the_term() {
    use tenure::handoff::{request_handoff, HandoffOutcome};
    let store: Arc<dyn LeaseStore> = memory();
    let shutdown = CancellationToken::new();
    let ((_electors, [_a_state, _b_state, mut c_state], runs), _) =
        node_a_leads_b_and_c_wait(&store, &shutdown).await;

    let outcome = request_handoff(store.clone(), ROLE, Some("node-c"), "ops-1", secs(30))
        .await
        .unwrap();
    match outcome {
        HandoffOutcome::HandedOver { from, to } => {
            assert_eq!(
                (from.owner.as_str(), from.fencing_token.get()),
                ("node-a", 1)
            );
            assert_eq!((to.owner.as_str(), to.fencing_token.get()), ("node-c", 2));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(leads(&mut c_state, "node-c leads").await.get(), 2);

    let outcome = request_handoff(store.clone(), ROLE, Some("node-x"), "ops-2", secs(5))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, HandoffOutcome::NotHandedOver { from } if from.owner == "node-c"),
        "{outcome:?}"
    );
    assert_eq!(leads(&mut c_state, "node-c leads on").await.get(), 2);

    assert_eq!(
        request_handoff(store.clone(), "nobody-leads", None, "ops-3", secs(5))
            .await
            .unwrap(),
        HandoffOutcome::NoLeader
    );
    shut_down(&shutdown, runs).await;
}

/// Delays every read of a role's queue (`candidates`) by its duration.
struct SlowQueueReads(Duration);

#[async_trait]
impl Interceptor for SlowQueueReads {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        if matches!(call, Call::Candidates { .. }) {
            eprintln!("candidates at {:?}", tokio::time::Instant::now());
            tokio::time::sleep(self.0).await;
        }
        next.run(call).await
    }
}

/// Setup: node-a leads; its store answers renewals at once but reads of who waits take
/// 30 s (three TTLs). A handoff asked through the store makes node-a read who waits
/// before it stops its work: while that read is slow, node-a must still renew, and lead
/// on under the same token throughout, whatever the read answers. (Before the fix the
/// leader stopped renewing while it read, lost its term at the local deadline, and took
/// its own lease again: its work was stopped and started again, as `tenure run`'s
/// command was.)
#[tokio::test(start_paused = true)]
async fn a_slow_read_of_who_waits_does_not_end_the_term() {
    use tenure::handoff::{request_handoff, HandoffOutcome};
    let memory = memory();
    let store: Arc<dyn LeaseStore> =
        Arc::new(InterceptStore::new(memory.clone()).with(Arc::new(SlowQueueReads(secs(30)))));
    let shutdown = CancellationToken::new();
    let never = CancellationToken::new();
    let a = elector(store.clone(), "node-a");
    let mut a_state = a.watch();
    let run_a = run(&a, &never, &shutdown);
    let token = leads(&mut a_state, "node-a leads").await;
    // Every state node-a passes through from here on.
    let mut watch_a = a_state.clone();
    let states = tokio::spawn(async move {
        let mut seen = Vec::new();
        while watch_a.changed().await.is_ok() {
            seen.push(watch_a.borrow().clone());
        }
        seen
    });

    let direct: Arc<dyn LeaseStore> = memory.clone();
    let outcome = request_handoff(direct, ROLE, Some("node-x"), "ops", secs(60))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, HandoffOutcome::NotHandedOver { from } if from.owner == "node-a"),
        "{outcome:?}"
    );
    let info = memory.get(ROLE).await.unwrap().unwrap();
    assert_eq!(
        (info.live_holder(), info.fencing_token),
        (Some("node-a"), token),
        "node-a's term went on"
    );
    shut_down(&shutdown, [run_a]).await;
    drop(a);
    let seen = states.await.unwrap();
    let before_shutdown: Vec<_> = seen
        .iter()
        .take_while(|state| !matches!(state, ElectionState::Idle))
        .collect();
    assert!(
        before_shutdown.len() <= 1,
        "node-a left its term before the shutdown: {seen:?}"
    );
}
