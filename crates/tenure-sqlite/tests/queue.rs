//! The queue of candidates in a SQLite file, beyond the shared scenarios: waiters in
//! other processes poll the file and learn the successor from the row without writing
//! anything, lapsed candidacies are swept, a term begun in a session ends its owner's
//! candidacy, and a new boot forgets every candidacy (their times belong to the past
//! boot).
//!
//! Two opens of one file stand for two processes on the host; store time comes from a
//! [`ManualHostClock`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sqlx::Connection;
use tenure::{FencingToken, LeaseStore, TermChange};
use tenure_sqlite::{ManualHostClock, SqliteDatabase, SqliteLeaseStore, SqliteOptions};
use tenure_testkit::{in_time, MustAnswer};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

/// A file on a host whose store time is a manual clock, starting at a fixed time: each
/// open of the file stands for a process of its own.
struct Host {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    clock: ManualHostClock,
}

impl Host {
    /// A fresh file named `file`.
    fn new(file: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(file);
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        Host {
            _dir: dir,
            path,
            clock: ManualHostClock::new(start),
        }
    }

    /// The file opened as another process would, its waits polling every 5 ms.
    async fn open(&self) -> SqliteDatabase {
        self.open_polling(Duration::from_millis(5)).await
    }

    /// The file opened as another process would, its waits polling every `poll`.
    async fn open_polling(&self, poll: Duration) -> SqliteDatabase {
        let options = SqliteOptions::new()
            .with_clock(self.clock.clone())
            .poll_interval(poll);
        SqliteDatabase::open_with(&self.path, options)
            .await
            .unwrap()
    }

    /// The store of [`open_polling`](Host::open_polling).
    async fn store_polling(&self, poll: Duration) -> Arc<SqliteLeaseStore> {
        Arc::new(self.open_polling(poll).await.lease_store())
    }
}

async fn candidates(db: &SqliteDatabase, role: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT owner FROM tenure_candidates WHERE role = ?1 ORDER BY seq")
        .bind(role)
        .fetch_all(db.pool())
        .await
        .unwrap()
}

/// `PRAGMA data_version` on a connection of its own: it changes whenever another
/// connection commits a write to the file.
struct WriteWatch(sqlx::SqliteConnection);

impl WriteWatch {
    async fn open(path: &std::path::Path) -> WriteWatch {
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
        WriteWatch(
            sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap(),
        )
    }

    async fn version(&mut self) -> i64 {
        sqlx::query_scalar("PRAGMA data_version")
            .fetch_one(&mut self.0)
            .await
            .unwrap()
    }
}

/// Ten contenders, each in a "process" of its own, queue behind node-a and wait for a
/// successor by polling: while they wait nobody writes the file, a release hands the
/// role to the first of them, which learns it from the row and renews, and every other
/// one learns who leads from the row it read and goes on waiting without writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_waiters_write_nothing_and_learn_the_successor() {
    let host = Host::new("queue.db");
    let holder = host.open().await.lease_store();
    let a = holder.acquire_or_queue("r", "node-a", TTL).await;
    assert!(a.acquired);
    let mut waiting = Vec::new();
    for n in 1..=10 {
        let store = Arc::new(host.open().await.lease_store());
        let me = format!("node-{n}");
        let queued = store.acquire_or_queue("r", &me, TTL).await;
        assert!(!queued.acquired);
        waiting.push(tokio::spawn(async move {
            let change = store
                .wait_for_successor("r", queued.fencing_token, Instant::now() + TTL)
                .await;
            if let TermChange::Began { holder, .. } = &change {
                if *holder == me {
                    let renewed = store.acquire_or_queue("r", &me, TTL).await;
                    assert!(renewed.acquired, "{renewed:?}");
                }
            }
            (change, Instant::now())
        }));
    }
    let mut watch = WriteWatch::open(&host.path).await;
    let before = watch.version().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(watch.version().await, before, "polling waiters wrote");

    let released = Instant::now();
    assert!(holder.release_term("r", "node-a", a.fencing_token).await);
    let next = FencingToken::from(a.fencing_token.get() + 1);
    let mut learned = Vec::new();
    for task in waiting {
        let (change, at) = task.await.unwrap();
        assert_eq!(
            change,
            TermChange::Began {
                holder: "node-1".to_owned(),
                fencing_token: next,
                session: None,
            }
        );
        learned.push(at - released);
    }
    learned.sort();
    println!(
        "release -> every waiter learned the successor: median {:?}, last {:?}",
        learned[learned.len() / 2],
        learned[learned.len() - 1]
    );
    let info = holder.get("r").await.unwrap().unwrap();
    assert_eq!(
        (info.live_holder(), info.fencing_token),
        (Some("node-1"), next)
    );
    assert_eq!(candidates(holder.database(), "r").await.len(), 9);
}

/// A release wakes its successor in another process at once, and a planned handoff
/// too: both stores poll every 10 s here, so only the wake can bring the news within
/// the bound. (Linux: the wake is an abstract Unix socket per candidate.)
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_successor_in_another_process() {
    let host = Host::new("wake.db");
    let open = || host.store_polling(Duration::from_secs(10));
    let (a, b) = (open().await, open().await);
    let mut term = a.acquire_or_queue("r", "node-a", TTL).await;
    assert!(term.acquired);
    for (from, to, by_handoff) in [(&a, "node-b", false), (&b, "node-a", true)] {
        let next = if to == "node-b" { &b } else { &a };
        let queued = next.acquire_or_queue("r", to, TTL).await;
        assert!(!queued.acquired, "{queued:?}");
        let waiter = {
            let next = Arc::clone(next);
            tokio::spawn(async move {
                next.wait_for_successor("r", queued.fencing_token, Instant::now() + TTL)
                    .await
            })
        };
        // The waiter has read the row once and sleeps on its 10 s poll.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let holder = term.holder.clone();
        let ended = if by_handoff {
            from.hand_over("r", &holder, term.fencing_token, Some(to))
                .await
        } else {
            from.release("r", &holder, term.fencing_token).await
        };
        assert!(ended.unwrap());
        let change = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .unwrap_or_else(|_| panic!("{to} was not woken within 2 s of the release"))
            .unwrap();
        let token = FencingToken::from(term.fencing_token.get() + 1);
        assert_eq!(
            change,
            TermChange::Began {
                holder: to.to_owned(),
                fencing_token: token,
                session: None,
            }
        );
        term = next.acquire_or_queue("r", to, TTL).await;
        assert!(term.acquired && term.fencing_token == token, "{term:?}");
    }
}

/// A candidate that is not next learns of the handover from the role's watch: the
/// release wakes the next candidate's process (it was handed the role) and announces the
/// new term to the process watching the role, so a third process waiting its turn knows
/// the new holder without its poll (30 s here). (Linux.)
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_candidate_hears_a_handover_to_another() {
    let host = Host::new("watch.db");
    let open = || host.store_polling(Duration::from_secs(30));
    let (holder, next, last) = (open().await, open().await, open().await);
    let term = holder.acquire_or_queue("r", "node-a", TTL).await;
    let queued = next.try_acquire_or_queue("r", "node-b", TTL, None);
    assert!(!queued.await.unwrap().acquired);
    let waiting = last.try_acquire_or_queue("r", "node-c", TTL, None).await;
    let observed = waiting.unwrap().fencing_token;
    let waiter = {
        let last = Arc::clone(&last);
        tokio::spawn(async move {
            let change = last
                .wait_for_successor("r", observed, Instant::now() + TTL)
                .await;
            (change, Instant::now())
        })
    };
    // The waiter has read the row once and sleeps on its 30 s poll.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    assert!(holder.release_term("r", "node-a", term.fencing_token).await);
    let (change, woke_at) = in_time(
        Duration::from_secs(5),
        waiter,
        "the candidate waiting its turn did not hear of the handover",
    )
    .await;
    let delay = woke_at.saturating_duration_since(released_at);
    assert!(
        delay < Duration::from_secs(2),
        "heard {delay:?} after the release"
    );
    let handed = FencingToken::from(term.fencing_token.get() + 1);
    assert_eq!(
        change,
        TermChange::Began {
            holder: "node-b".to_owned(),
            fencing_token: handed,
            session: None,
        }
    );
}

/// Candidacies that lapsed are swept when a contender joins and when a term is handed
/// over; a refresh sweeps nothing and a live candidacy is never swept. A term begun in
/// a session ends its owner's candidacy, as any acquire does.
#[tokio::test]
async fn lapsed_candidacies_are_swept() {
    let host = Host::new("sweep.db");
    let (db, clock) = (host.open().await, &host.clock);
    let store = SqliteLeaseStore::new(&db);
    let short = Duration::from_secs(2);
    // node-e refreshes for longer, so node-d's term lapses before its candidacy.
    let end_term = || async {
        store.acquire_or_queue("r", "node-e", TTL * 4).await;
        clock.advance(TTL);
    };
    tenure_testkit::queue::lapsed_candidacies_are_swept(
        &store,
        short,
        TTL,
        || async { clock.advance(short) },
        end_term,
        || candidates(&db, "r"),
    )
    .await;
}

/// A new boot forgets every candidacy (their expiries are times of the past boot): the
/// release of a term begun after it frees the role rather than hand it to a contender
/// that queued before the reboot.
#[tokio::test]
async fn a_new_boot_forgets_every_candidacy() {
    let host = Host::new("boot.db");
    let (db, clock) = (host.open().await, &host.clock);
    let store = SqliteLeaseStore::new(&db);
    let a = store.try_acquire("r", "node-a", TTL).await;
    assert!(a.acquired);
    store.acquire_or_queue("r", "node-b", TTL).await;
    clock.reboot();
    let c = store.try_acquire("r", "node-c", TTL).await;
    assert!(c.acquired, "{c:?}");
    assert!(candidates(&db, "r").await.is_empty());
    assert!(store.release_term("r", "node-c", c.fencing_token).await);
    assert_eq!(store.get("r").await.unwrap().unwrap().live_holder(), None);
    assert!(!store.withdraw("r", "node-b").await.unwrap());
}
