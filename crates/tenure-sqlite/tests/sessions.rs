//! Sessions on a SQLite file beyond the shared suite: what one keep-alive writes, ids
//! that survive deletion, a new boot ending every session, forgetting ended sessions,
//! waking in-process waiters on close, and a schema-2 tenure meeting a migrated file
//! (the migration itself is in `open.rs`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tenure::{Error, FencingToken, LeaseResult, LeaseStore, SessionGrant};
use tenure_sqlite::{ManualHostClock, SqliteDatabase, SqliteOptions};
use tenure_testkit::{in_time, MustAnswer};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// A database on a manual clock in a fresh directory.
async fn manual_db(options: SqliteOptions) -> (tempfile::TempDir, ManualHostClock, SqliteDatabase) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualHostClock::new(start());
    let db = SqliteDatabase::open_with(
        dir.path().join("sessions.db"),
        options.with_clock(clock.clone()),
    )
    .await
    .unwrap();
    (dir, clock, db)
}

/// `session` has ended for good and `role`, which it held with `held`, is free: another
/// owner takes it with the next token.
async fn assert_ended(
    store: &dyn LeaseStore,
    session: tenure::SessionId,
    role: &str,
    held: FencingToken,
) {
    assert_eq!(store.keep_alive(session, TTL).await, None);
    assert_eq!(store.get(role).await.unwrap().unwrap().live_holder(), None);
    let taken = store.try_acquire(role, "node-other", TTL).await;
    assert!(taken.acquired, "{taken:?}");
    assert_eq!(taken.fencing_token, held.next());
}

/// node-a's session on `store`, holding `g/0`: the session and its term.
async fn session_holding_g0(store: &dyn LeaseStore) -> (SessionGrant, LeaseResult) {
    let session = store.open_session("node-a", TTL).await.unwrap();
    let held = store.acquire_in_session("g/0", session.id).await.unwrap();
    (session, held)
}

/// Every lease row and every session row, as stored.
async fn rows(
    db: &SqliteDatabase,
) -> (
    Vec<(String, Option<String>, i64, i64, Option<i64>)>,
    Vec<(i64, String, i64)>,
) {
    let leases = sqlx::query_as(
        "SELECT role, holder, token, expires_at, session_id FROM tenure_leases ORDER BY role",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let sessions = sqlx::query_as("SELECT id, owner, expires_at FROM tenure_sessions ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    (leases, sessions)
}

/// Setup: one session holding 1,000 roles, on a single-connection pool so SQLite's
/// `total_changes()` counts every row this process writes. One keep-alive changes
/// exactly one row (the session's), leaves every lease row as it was, and still moves
/// every role's expiry as `get` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_of_a_thousand_roles_writes_one_row() {
    let (_dir, clock, db) = manual_db(SqliteOptions::new().max_connections(1)).await;
    let store = db.lease_store();
    let session = store.open_session("node-a", TTL).await.unwrap();
    for shard in 0..1_000 {
        let held = store
            .acquire_in_session(&format!("g/{shard}"), session.id)
            .await
            .unwrap();
        assert!(held.acquired, "{held:?}");
    }
    clock.advance(TTL / 2);
    let changes = || async {
        sqlx::query_scalar::<_, i64>("SELECT total_changes()")
            .fetch_one(db.pool())
            .await
            .unwrap()
    };
    let (leases_before, sessions_before) = rows(&db).await;
    let before = changes().await;
    let kept = store.keep_alive(session.id, TTL).await.expect("live");
    let after = changes().await;
    let (leases_after, sessions_after) = rows(&db).await;

    assert_eq!(after - before, 1, "one keep-alive, one row changed");
    assert_eq!(leases_after, leases_before, "no lease row is written");
    assert_eq!(sessions_after.len(), 1);
    assert_ne!(sessions_after, sessions_before, "the session row moved");
    assert_eq!(kept.expires_at, session.expires_at + TTL / 2);
    for shard in [0, 499, 999] {
        let info = store.get(&format!("g/{shard}")).await.unwrap().unwrap();
        assert_eq!(
            info.expires_at, kept.expires_at,
            "g/{shard} expires with its session"
        );
    }
    assert_eq!(store.list().await.unwrap().len(), 1_000);
}

/// The newest session's row is deleted when it closes; the next session still gets a
/// new id, in this process and after reopening the file.
#[tokio::test]
async fn session_ids_are_never_handed_out_twice() {
    let (dir, clock, db) = manual_db(SqliteOptions::new()).await;
    let store = db.lease_store();
    let first = store.open_session("node-a", TTL).await.unwrap();
    assert!(store.close_session(first.id).await.unwrap());
    let second = store.open_session("node-a", TTL).await.unwrap();
    assert!(second.id > first.id, "{second:?} after {first:?}");
    assert!(store.close_session(second.id).await.unwrap());
    db.pool().close().await;

    let options = SqliteOptions::new().with_clock(clock);
    let reopened = SqliteDatabase::open_with(dir.path().join("sessions.db"), options)
        .await
        .unwrap()
        .lease_store();
    let third = reopened.open_session("node-a", TTL).await.unwrap();
    assert!(third.id > second.id, "{third:?} after {second:?}");
}

/// Setup: a live session holding a role, then the host reboots (the monotonic clock
/// restarts at zero, so the session's stored expiry would read as far in the future).
/// The new boot ends the session: keep-alive is `None`, acquiring under it is
/// `SessionEnded`, and the role is free with the next token.
#[tokio::test]
async fn a_new_boot_ends_every_session() {
    let (_dir, clock, db) = manual_db(SqliteOptions::new()).await;
    let store = db.lease_store();
    let (session, held) = session_holding_g0(&store).await;
    clock.reboot();
    assert!(matches!(
        store.acquire_in_session("g/1", session.id).await,
        Err(Error::SessionEnded(id)) if id == session.id
    ));
    assert_ended(&store, session.id, "g/0", held.fencing_token).await;
}

/// Opening a session forgets the sessions that ended; the roles they held stay ended
/// (they do not come back to life when their session row is gone), and the ended
/// session stays ended.
#[tokio::test]
async fn ended_sessions_are_forgotten_and_stay_ended() {
    let (_dir, clock, db) = manual_db(SqliteOptions::new()).await;
    let store = db.lease_store();
    let (old, held) = session_holding_g0(&store).await;
    clock.advance(TTL / 2);
    assert!(store.keep_alive(old.id, TTL).await.is_some());
    clock.advance(TTL + TTL / 2);
    let _fresh = store.open_session("node-b", TTL).await.unwrap();
    let (_, sessions) = rows(&db).await;
    assert_eq!(
        sessions.len(),
        1,
        "only the live session is kept: {sessions:?}"
    );

    assert!(!store.close_session(old.id).await.unwrap());
    assert_ended(&store, old.id, "g/0", held.fencing_token).await;
}

/// A waiter on the same database is woken by the close itself, not by polling: with a
/// 30 s polling interval it still returns at once, for every role the session held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_in_process_wakes_waiters_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions::new().poll_interval(Duration::from_secs(30));
    let db = SqliteDatabase::open_with(dir.path().join("w.db"), options)
        .await
        .unwrap();
    let store = Arc::new(db.lease_store());
    let session = store.open_session("node-a", TTL).await.unwrap();
    let mut waiters = Vec::new();
    for role in ["g/0", "g/1"] {
        let held = store.acquire_in_session(role, session.id).await.unwrap();
        let store = Arc::clone(&store);
        waiters.push(tokio::spawn(async move {
            store
                .wait_for_change(
                    role,
                    held.fencing_token,
                    Instant::now() + Duration::from_secs(60),
                )
                .await;
            Instant::now()
        }));
    }
    // Lets the waiters subscribe and block (a close before that returns them at once too).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let closed_at = Instant::now();
    assert!(store.close_session(session.id).await.unwrap());
    for waiter in waiters {
        let woke_at = in_time(
            Duration::from_secs(5),
            waiter,
            "a waiter must wake when its session closes",
        )
        .await;
        let delay = woke_at.saturating_duration_since(closed_at);
        assert!(
            delay < Duration::from_secs(2),
            "woke {delay:?} after the close"
        );
    }
}

/// A schema-2 tenure still running on a migrated file takes a role over with its own
/// statement, which knows no sessions. On a role held under a live session (whose own
/// `expires_at` that tenure reads as past) the write fails instead of leaving the new
/// term attached to the session (two holders); on a plain lease it still works.
#[tokio::test]
async fn a_schema_2_takeover_of_a_session_term_fails() {
    let (_dir, clock, db) = manual_db(SqliteOptions::new()).await;
    let store = db.lease_store();
    let (session, held) = session_holding_g0(&store).await;
    store.try_acquire("plain", "node-a", TTL).await;
    // Kept alive past the role's own `expires_at`, which is all schema 2 reads.
    clock.advance(TTL / 2);
    assert!(store.keep_alive(session.id, TTL).await.is_some());
    clock.advance(TTL / 2 + Duration::from_secs(1));
    // The takeover statement of schema 2.
    let old_takeover = |role: &'static str| {
        sqlx::query(
            "UPDATE tenure_leases SET holder = ?2, token = ?3, expires_at = ?4 WHERE role = ?1",
        )
        .bind(role)
        .bind("old-b")
        .bind(2_i64)
        .bind(i64::MAX)
        .execute(db.pool())
    };
    let refused = old_takeover("g/0").await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(old_takeover("plain").await.is_ok());
    let info = store.get("g/0").await.unwrap().unwrap();
    assert_eq!(info.fencing_token, held.fencing_token, "{info:?}");
}

/// A term started under a session advertises nothing, also when it takes over a lapsed
/// term that advertised a value; the holder's own later acquire (which makes it a plain
/// lease) keeps its term's value, none.
#[tokio::test]
async fn a_session_term_shows_no_value() {
    let (_dir, clock, db) = manual_db(SqliteOptions::new()).await;
    let lapse = || async { clock.advance(TTL + Duration::from_secs(1)) };
    tenure_testkit::observe::a_session_term_shows_no_value(&db.lease_store(), TTL, TTL, lapse)
        .await;
}
