//! Store time under host clock events: wall-clock steps (which must change nothing but
//! the times shown) and reboots (which end every lease and keep every token).
//!
//! Each test drives a [`ManualHostClock`]: `advance` is time passing, `set_wall` an NTP
//! step or `date -s` (the monotonic clock stays), `reboot` a new boot id. Two opens of
//! one file stand for two processes on the host.

use std::time::{Duration, SystemTime};

use tenure::{FencingToken, LeaseResult, LeaseStore, NodeRegistry};
use tenure_sqlite::{ManualHostClock, SqliteDatabase, SqliteLeaseStore, SqliteOptions};
use tenure_testkit::{assert_refused, MustAnswer};

const TTL: Duration = Duration::from_secs(10);

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn open_at(path: &std::path::Path, clock: &ManualHostClock) -> SqliteDatabase {
    SqliteDatabase::open_with(path, SqliteOptions::new().with_clock(clock.clone()))
        .await
        .unwrap()
}

/// A new file `name` in a temporary directory of its own, and a host clock at [`t0`] to
/// open it on.
fn new_file(name: &str) -> (tempfile::TempDir, std::path::PathBuf, ManualHostClock) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path, ManualHostClock::new(t0()))
}

/// A new file shared by two hosts (through a network file system or a shared folder),
/// and a store on it for each: A's on `host_a`'s clock, B's on `host_b`'s.
async fn shared_file(
    host_a: &ManualHostClock,
    host_b: &ManualHostClock,
) -> (tempfile::TempDir, SqliteLeaseStore, SqliteLeaseStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let a = open_at(&path, host_a).await.lease_store();
    let b = open_at(&path, host_b).await.lease_store();
    (dir, a, b)
}

/// Asserts `answer` (to `what`) is the store's refusal of a second kernel on the file,
/// its message naming that and each of `also`.
fn assert_second_kernel(answer: &tenure::Result<LeaseResult>, what: &str, also: &[&str]) {
    match answer {
        Err(tenure::Error::Store { message, .. }) => {
            for words in ["two kernels"].iter().chain(also) {
                assert!(message.contains(words), "{message}");
            }
        }
        other => panic!("{what} must be refused as a second kernel's: {other:?}"),
    }
}

/// Asserts `owner` still holds "r" with `token`, and renews it under that token.
async fn assert_still_holds(store: &dyn LeaseStore, owner: &str, token: FencingToken) {
    let held = store.get("r").await.unwrap().unwrap();
    assert_eq!(held.live_holder(), Some(owner), "{held:?}");
    assert_eq!(held.fencing_token, token);
    let renewed = store.try_acquire("r", owner, TTL).await;
    assert!(
        renewed.acquired && renewed.fencing_token == token,
        "{renewed:?}"
    );
}

/// Setup: node-a acquires with a 10 s TTL; the wall clock steps forward 20 s while no
/// monotonic time passes. Another process's node-b must not acquire (the lease has all
/// of its 10 s left), and node-a's renewal keeps its token. Answers show the stepped
/// wall clock, with `expires_at - now` exact.
#[tokio::test]
async fn wall_step_forward_keeps_a_live_lease() {
    let (_dir, path, clock) = new_file("step.db");
    let holder = open_at(&path, &clock).await.lease_store();
    let other = open_at(&path, &clock).await.lease_store();
    let a = holder.try_acquire("r", "node-a", TTL).await;
    assert!(a.acquired);

    tracing::info!("--- the wall clock steps forward 20 s");
    clock.set_wall(t0() + secs(20));
    let b = other.try_acquire("r", "node-b", TTL).await;
    assert_refused(&b, "node-a", "a wall step forward expired a live lease");
    assert_eq!(b.fencing_token, a.fencing_token);
    assert_eq!(b.now, t0() + secs(20), "answers show the wall clock");
    assert_eq!(
        b.expires_at,
        t0() + secs(20) + TTL,
        "all of the TTL is left"
    );
    let info = other.get("r").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-a"));
    assert_eq!(info.remaining(), TTL);

    let renewed = holder.try_acquire("r", "node-a", TTL).await;
    assert!(renewed.acquired);
    assert_eq!(
        renewed.fencing_token, a.fencing_token,
        "a renewal, not a new term"
    );

    tracing::info!("--- monotonic time passes: the lease expires exactly a TTL later");
    clock.advance(TTL - Duration::from_nanos(1));
    assert!(!other.try_acquire("r", "node-b", TTL).await.acquired);
    clock.advance(Duration::from_nanos(1));
    let taken = other.try_acquire("r", "node-b", TTL).await;
    assert!(taken.acquired);
    assert_eq!(taken.fencing_token.get(), a.fencing_token.get() + 1);
}

/// Setup: the wall clock steps forward an hour and a write happens there, then it steps
/// back two hours (the old store kept a high-water mark here and froze store time for an
/// hour). node-a acquires and crashes: its lease still expires after exactly one TTL of
/// monotonic time, and its lapsed term cannot be revived or released.
#[tokio::test]
async fn crashed_holder_expires_after_steps_back_and_forth() {
    let (_dir, path, clock) = new_file("step.db");
    let store = open_at(&path, &clock).await.lease_store();

    tracing::info!("--- forward an hour, a write, back two hours");
    clock.set_wall(t0() + secs(3600));
    store.try_acquire("other", "node-x", TTL).await;
    clock.set_wall(t0() - secs(3600));
    let a = store.try_acquire("r", "node-a", TTL).await;
    assert!(a.acquired);
    assert_eq!(a.now, t0() - secs(3600));

    tracing::info!("--- node-a crashes; a TTL of monotonic time passes");
    clock.advance(TTL - Duration::from_nanos(1));
    let early = store.try_acquire("r", "node-b", TTL).await;
    assert!(!early.acquired, "{early:?}");
    clock.advance(Duration::from_nanos(1));
    clock.set_wall(t0() + secs(7200));
    let b = store.try_acquire("r", "node-b", TTL).await;
    assert!(
        b.acquired,
        "the crashed holder's lease never expired: {b:?}"
    );
    assert_eq!(b.fencing_token.get(), 2);

    let revived = store.try_acquire("r", "node-a", TTL).await;
    assert!(!revived.acquired, "{revived:?}");
    assert!(!store.release_term("r", "node-a", a.fencing_token).await);
}

/// Setup: leases on two roles (one released), and a heartbeat; the host reboots. Before
/// any write, reads already show no live lease and no live node; the first write (by
/// either of two processes) starts the new boot once: every token continues from where
/// it was, and a lease taken after the switch is not expired by a later write.
#[tokio::test]
async fn new_boot_expires_every_lease_and_keeps_tokens() {
    let (_dir, path, clock) = new_file("boot.db");
    let first = open_at(&path, &clock).await;
    let second = open_at(&path, &clock).await;
    let store = first.lease_store();
    let registry = first.node_registry(TTL).unwrap();
    let a = store.try_acquire("r", "node-a", TTL).await;
    for owner in ["node-x", "node-y", "node-z"] {
        let lease = store.try_acquire("q", owner, TTL).await;
        assert!(store.release_term("q", owner, lease.fencing_token).await);
    }
    registry.heartbeat("node-a").await.unwrap();
    clock.advance(secs(1));

    tracing::info!("--- reboot: the monotonic clock restarts, the boot id changes");
    clock.reboot();
    let info = second.lease_store().get("r").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), None, "a lease of a past boot: {info:?}");
    assert_eq!(info.fencing_token, a.fencing_token);
    assert!(second
        .node_registry(TTL)
        .unwrap()
        .live_nodes()
        .await
        .unwrap()
        .is_empty());

    let b = second.lease_store().try_acquire("r", "node-b", TTL).await;
    assert!(b.acquired, "{b:?}");
    assert_eq!(b.fencing_token.get(), a.fencing_token.get() + 1);
    // The other process's write must not start the boot again (it would end b's term).
    let q = store.try_acquire("q", "node-q", TTL).await;
    assert_eq!(
        q.fencing_token.get(),
        4,
        "the released role's counter goes on"
    );
    let refused = store.try_acquire("r", "node-a", TTL).await;
    assert_refused(&refused, "node-b", "b's new term must stay live");
    assert!(!store.release_term("r", "node-a", a.fencing_token).await);
    assert!(registry.members().await.unwrap().is_empty());
    registry.heartbeat("node-a").await.unwrap();
    assert_eq!(registry.live_nodes().await.unwrap(), ["node-a"]);
}

/// Two kernels on one file (an NFS home reached from two hosts, a VM's shared folder):
/// host A holds "r"; host B's first write looks like a reboot and ends it (nothing can
/// tell them apart yet); then A writes again under its boot id, which the file saw
/// before B's. A reboot never brings back an earlier boot id, so that write is refused
/// and B's live term stays.
#[tokio::test]
async fn an_earlier_boot_id_again_is_a_second_kernel_not_a_reboot() {
    let host_a = ManualHostClock::new(t0());
    let host_b = ManualHostClock::new(t0());
    host_b.reboot();
    let (_dir, a, b) = shared_file(&host_a, &host_b).await;
    let first = a.try_acquire("r", "node-a", TTL).await;
    assert!(first.acquired);

    let taken = b.try_acquire("r", "node-b", TTL).await;
    assert!(taken.acquired, "a new boot id reads as a reboot: {taken:?}");

    let again = a.try_acquire_or_renew("r", "node-a", TTL).await;
    let what = "host A's write under its earlier boot id";
    assert_second_kernel(&again, what, &["PostgreSQL"]);
    assert_still_holds(&b, "node-b", taken.fencing_token).await;
}

/// Host B booted an hour ago, host A (on the same file, through a network file system
/// or a shared folder) just now. A writes; then B's first write under its own boot id:
/// the file's boot began after B's own, so it cannot be B's previous boot, and B must be
/// refused rather than end A's live lease as a reboot would.
#[tokio::test]
async fn a_foreign_kernel_that_booted_later_is_refused_at_its_first_write() {
    let host_b = ManualHostClock::new(t0());
    host_b.reboot();
    host_b.advance(secs(3600));
    let host_a = ManualHostClock::new(t0() + secs(3600));
    let (_dir, a, b) = shared_file(&host_a, &host_b).await;
    let first = a.try_acquire("r", "node-a", TTL).await;
    assert!(first.acquired);

    let taken = b.try_acquire_or_renew("r", "node-b", TTL).await;
    assert_second_kernel(&taken, "host B's first write", &[]);
    assert_still_holds(&a, "node-a", first.fencing_token).await;
}

/// A file written by a build without the boot history (simulated by dropping the
/// table) still tells a second kernel from a reboot: the history starts with the boot
/// the file recorded, so A, B, A is refused after the first crossing.
#[tokio::test]
async fn a_file_without_boot_history_gains_it_with_its_recorded_boot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let host_a = ManualHostClock::new(t0());
    let host_b = ManualHostClock::new(t0());
    host_b.reboot();
    let db_a = open_at(&path, &host_a).await;
    let a = db_a.lease_store();
    a.try_acquire("r", "node-a", TTL).await;
    sqlx::query("DROP TABLE tenure_boot_history")
        .execute(db_a.pool())
        .await
        .unwrap();
    let b = open_at(&path, &host_b).await.lease_store();
    let taken = b.try_acquire("r", "node-b", TTL).await;
    assert!(taken.acquired, "{taken:?}");
    let again = a.try_acquire_or_renew("r", "node-a", TTL).await;
    assert_second_kernel(&again, "host A's write after the crossing", &[]);
}

/// Reboots only push old boot ids out of the history, which stays bounded (64), and
/// every reboot still starts its boot.
#[tokio::test]
async fn boot_history_is_bounded() {
    let (_dir, path, clock) = new_file("reboots.db");
    let db = open_at(&path, &clock).await;
    let store = db.lease_store();
    for boot in 1..=70_u64 {
        let lease = store.try_acquire("r", "node-a", TTL).await;
        assert!(lease.acquired, "boot {boot}: {lease:?}");
        assert_eq!(lease.fencing_token.get(), boot, "a new term per boot");
        clock.reboot();
    }
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM tenure_boot_history")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(kept, 64);
}

/// Setup: a heartbeat with a 10 s liveness TTL; the wall clock steps forward 20 s and
/// then back 20 s. The node stays live throughout (no monotonic time passed), its times
/// are shown on the current wall clock, and it lapses after exactly one TTL.
#[tokio::test]
async fn wall_steps_do_not_change_membership() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualHostClock::new(t0());
    let db = open_at(&dir.path().join("nodes.db"), &clock).await;
    let registry = db.node_registry(TTL).unwrap();
    registry.heartbeat("node-a").await.unwrap();
    clock.advance(secs(2));
    for wall in [t0() + secs(22), t0() - secs(18)] {
        clock.set_wall(wall);
        let members = registry.members().await.unwrap();
        let a = members
            .iter()
            .find(|m| m.node_id == "node-a")
            .unwrap_or_else(|| panic!("node-a lapsed on a wall step: {members:?}"));
        assert_eq!(a.now, wall);
        assert_eq!(a.last_heartbeat, wall - secs(2));
        registry.heartbeat("node-b").await.unwrap();
    }
    clock.advance(secs(8) - Duration::from_nanos(1));
    assert_eq!(registry.live_nodes().await.unwrap(), ["node-a", "node-b"]);
    clock.advance(Duration::from_nanos(1));
    assert_eq!(registry.live_nodes().await.unwrap(), ["node-b"]);
}

/// Setup: a lease at token 5 on a file shared by four opens (processes); the host
/// reboots and 32 contenders race on the role across the four at once. The new boot is
/// started by exactly one write transaction: exactly one contender wins, with token 6,
/// and every other sees that winner (a second start would end the winner's term and let
/// another win).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_boot_is_started_once_under_contention() {
    let (_dir, path, clock) = new_file("race.db");
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(open_at(&path, &clock).await.lease_store());
    }
    for i in 0..5 {
        let owner = format!("before-{i}");
        let lease = stores[0].try_acquire("r", &owner, TTL).await;
        if i < 4 {
            assert!(stores[0]
                .release("r", &owner, lease.fencing_token)
                .await
                .unwrap());
        }
    }
    clock.reboot();
    let racers: Vec<_> = (0..32)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move {
                let owner = format!("after-{i}");
                let lease = store.try_acquire("r", &owner, TTL).await;
                (owner, lease)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut holders = std::collections::BTreeSet::new();
    for racer in racers {
        let (owner, lease) = racer.await.unwrap();
        holders.insert(lease.holder.clone());
        if lease.acquired {
            assert_eq!(lease.fencing_token.get(), 6, "{lease:?}");
            winners.push(owner);
        }
    }
    assert_eq!(winners.len(), 1, "one winner after the reboot: {winners:?}");
    assert_eq!(holders.into_iter().collect::<Vec<_>>(), winners);
}
