//! The store's unit tests on a real etcd: values shown only with their term, and
//! answers that never report more than the lease across a wall-clock step.

use std::sync::atomic::{AtomicUsize, Ordering};

use tenure_testkit::etcd::EtcdServer;
use tokio::time::Instant;

use super::*;

const TTL: Duration = Duration::from_secs(4);
const STEP: Duration = Duration::from_millis(1500);

/// The host's wall clock, less the steps back a test makes (an NTP step, `date -s`).
#[derive(Clone, Debug, Default)]
struct SteppedClock(Arc<Mutex<Duration>>);

impl SteppedClock {
    fn step_back(&self, by: Duration) {
        *self.0.lock() += by;
    }
}

impl Clock for SteppedClock {
    fn now(&self) -> SystemTime {
        SystemTime::now() - *self.0.lock()
    }
}

fn unique_prefix(tag: &str) -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("/unit/{tag}-{}-{nanos}-{seq}", std::process::id())
}

async fn store(prefix: &str, clock: SteppedClock) -> EtcdLeaseStore {
    let endpoint = EtcdServer::shared().expect("shared etcd server").endpoint();
    let client = Client::connect([endpoint], Some(crate::connect_options()))
        .await
        .unwrap();
    EtcdLeaseStore::new(client, prefix)
        .unwrap()
        .with_wall_clock(clock)
}

/// `get` and `list` show a `values/R` only with the term that wrote it (its mod
/// revision is that term's token), never after a release, and keep it for a term
/// that lapsed unreleased.
#[test]
fn a_value_shows_only_with_the_term_that_wrote_it() {
    let now = SystemTime::now();
    let record = |token: Option<u64>, released: bool| TermRecord {
        owner: "a".into(),
        token,
        expires_at_ns: to_ns(now),
        ttl_secs: 4,
        lease_secs: 4,
        released,
    };
    let held = |token: i64| {
        Seen::Held(Holder {
            owner: "a".into(),
            token,
            lease: 1,
            ttl_secs: None,
            expires_at: None,
            session: None,
        })
    };
    let value = ("http://a".to_owned(), 7);
    let shown = |seen: &Seen, record: Option<&(TermRecord, i64)>| {
        lease_info("r", seen, record, Some(&value), now).and_then(|info| info.value)
    };
    let live = (record(None, false), 7);
    assert_eq!(shown(&held(7), Some(&live)).as_deref(), Some("http://a"));
    // A later term an older tenure started, which left `values/R` alone.
    assert_eq!(shown(&held(9), Some(&(record(None, false), 9))), None);
    // Lapsed unreleased: the record (rewritten by renewals) names the token.
    let lapsed = (record(Some(7), false), 12);
    assert_eq!(
        shown(&Seen::Absent, Some(&lapsed)).as_deref(),
        Some("http://a")
    );
    let released = (record(Some(7), true), 12);
    assert_eq!(shown(&Seen::Absent, Some(&released)), None);
    // The record as the acquire wrote it: the token is its mod revision.
    assert_eq!(
        shown(&Seen::Absent, Some(&live)).as_deref(),
        Some("http://a")
    );
    assert_eq!(
        lease_info("r", &held(7), Some(&live), None, now).and_then(|i| i.value),
        None
    );
}

/// Setup: `b` loses a race for a role (its etcd lease, kept alive beside the attempt,
/// stays as a spare); the wall clock steps back 1.5 s; the holder releases; `b` takes
/// the role on the spare, whose keep-alive fails while the transaction succeeds. The
/// etcd lease then ends no later than a TTL after the keep-alive beside the lost
/// attempt answered, and the term `b` is told it holds, counted from just before its
/// call (as the elector counts it), must end no later than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_spare_reports_no_more_than_its_lease_across_a_wall_step() {
    let prefix = unique_prefix("spare-wall-step");
    let clock = SteppedClock::default();
    let a = store(&prefix, SteppedClock::default()).await;
    let b = store(&prefix, clock.clone()).await;
    let held = a.try_acquire_or_renew("r", "a", TTL).await.unwrap();
    assert!(held.acquired, "{held:?}");
    let lost = b.try_acquire_or_renew("r", "b", TTL).await.unwrap();
    let last_kept_alive = Instant::now();
    assert!(!lost.acquired, "{lost:?}");
    let spare = b.spare.lock().first().map(|s| s.id).expect("a spare lease");

    clock.step_back(STEP);
    assert!(a.release("r", "a", held.fencing_token).await.unwrap());
    crate::conn::faults::fail_next_keep_alive(spare);
    let sent = Instant::now();
    let taken = b.try_acquire_or_renew("r", "b", TTL).await.unwrap();
    assert!(taken.acquired, "{taken:?}");
    assert!(!crate::conn::faults::keep_alive_pending(spare));
    assert_eq!(b.terms.lock()["r"].lease, spare, "the spare was reused");

    let told_end = sent + taken.remaining();
    let real_end = last_kept_alive + TTL;
    assert!(
        told_end <= real_end,
        "told {:?} left, {:?} more than the etcd lease has",
        taken.remaining(),
        told_end - real_end
    );
}

/// Setup: a session opened, the wall clock stepped back 1.5 s, then kept alive and a
/// role taken under it. etcd restarts the session's TTL no later than the keep-alive
/// answers, so neither answer may report more than a TTL from then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_answers_report_no_more_than_the_lease_across_a_wall_step() {
    let clock = SteppedClock::default();
    let store = store(&unique_prefix("session-wall-step"), clock.clone()).await;
    let opened = store.open_session("m", TTL).await.unwrap();

    clock.step_back(STEP);
    let sent = Instant::now();
    let kept = store
        .keep_alive_session(opened.id, TTL)
        .await
        .unwrap()
        .expect("live");
    let kept_alive = Instant::now();
    let real_end = kept_alive + TTL;
    assert!(
        sent + kept.remaining() <= real_end,
        "keep-alive: told {:?} left, {:?} more than the etcd lease has",
        kept.remaining(),
        sent + kept.remaining() - real_end
    );

    let sent = Instant::now();
    let role = store.acquire_in_session("g/0", opened.id).await.unwrap();
    assert!(role.acquired, "{role:?}");
    assert!(
        sent + role.remaining() <= real_end,
        "acquire in session: told {:?} left, {:?} more than the etcd lease has",
        role.remaining(),
        sent + role.remaining() - real_end
    );
    assert!(store.close_session(opened.id).await.unwrap());
}
