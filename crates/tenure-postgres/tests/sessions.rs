//! Sessions on a real PostgreSQL server, beyond the shared scenarios: what a keep-alive
//! writes, the races between a keep-alive and a takeover of one of the session's roles,
//! and lease tables made before sessions existed.

mod common;

use std::time::Duration;

use sqlx::PgPool;
use tenure::{ChangesRead, LeaseResult, LeaseStore, SessionGrant};
use tenure_postgres::{PgLeaseStore, Schema};
use tokio::time::Instant;

use common::{migrated as setup, table};
use tenure_testkit::{eventually, in_time, MustAnswer};

/// Every lease row's current version: a row rewritten in any way gets a new `xmin`
/// (the writing transaction) and a new `ctid` (its place), so equal snapshots mean no
/// row version was written in between.
async fn lease_versions(pool: &PgPool, schema: &Schema) -> Vec<(String, String, String)> {
    let sql = format!(
        "SELECT role, xmin::text, ctid::text FROM {} ORDER BY role",
        table(schema, "tenure_leases")
    );
    sqlx::query_as(&sql).fetch_all(pool).await.unwrap()
}

async fn session_version(pool: &PgPool, schema: &Schema, id: u64) -> String {
    let sql = format!(
        "SELECT xmin::text || ctid::text FROM {} WHERE id = $1",
        table(schema, "tenure_sessions")
    );
    sqlx::query_scalar(&sql)
        .bind(i64::try_from(id).unwrap())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The TTL of the session the race tests let lapse, and the TTL of everything else.
const SHORT: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(30);

/// A store, and a session of [`SHORT`] TTL for `node-a` holding `roles`: when it was
/// opened (on this host), the session, and the terms of its roles.
async fn short_session_holding(
    app: &str,
    roles: &[&str],
) -> (
    PgPool,
    Schema,
    PgLeaseStore,
    Instant,
    SessionGrant,
    Vec<LeaseResult>,
) {
    let (pool, schema, store) = common::with_store(setup(app).await);
    let opened = Instant::now();
    let session = store.open_session("node-a", SHORT).await.unwrap();
    let mut held = Vec::new();
    for role in roles {
        let result = store.acquire_in_session(role, session.id).await.unwrap();
        assert!(result.acquired, "{result:?}");
        held.push(result);
    }
    (pool, schema, store, opened, session, held)
}

/// The point of sessions: keeping one alive that holds 1,000 roles writes the session
/// row and not one lease row, and acquiring again a role the session holds writes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_writes_one_row_whatever_the_roles() {
    let (pool, schema, store) = common::with_store(setup("sessions-writes").await);
    let ttl = Duration::from_secs(60);
    let session = store.open_session("node-a", ttl).await.unwrap();
    let roles: Vec<String> = (0..1000).map(|i| format!("shard/{i:04}")).collect();
    for role in &roles {
        let held = store.acquire_in_session(role, session.id).await.unwrap();
        assert!(held.acquired, "{held:?}");
    }
    let before = lease_versions(&pool, &schema).await;
    assert_eq!(before.len(), roles.len());

    let mut last_expiry = session.expires_at;
    let mut session_row = session_version(&pool, &schema, session.id.get()).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let kept = store.keep_alive(session.id, ttl).await.expect("live");
        assert!(kept.expires_at > last_expiry);
        last_expiry = kept.expires_at;
        let now = session_version(&pool, &schema, session.id.get()).await;
        assert_ne!(now, session_row, "the keep-alive writes the session row");
        session_row = now;
    }
    for role in roles.iter().step_by(100) {
        let again = store.acquire_in_session(role, session.id).await.unwrap();
        assert!(again.acquired);
        assert_eq!(again.expires_at, last_expiry, "roles follow their session");
        let info = store.get(role).await.unwrap().expect("lease");
        assert_eq!(info.expires_at, last_expiry);
    }
    assert_eq!(
        lease_versions(&pool, &schema).await,
        before,
        "no lease row version was written by keep-alives or by acquiring held roles"
    );
}

/// A keep-alive that arrived while the session lived but ran after it ended (its
/// `statement_timestamp()` predates the expiry; here it waits behind a sleep in the
/// same message, as behind a lock or a starved backend) must not revive the session
/// once another owner took one of its roles: the owner would believe it still holds
/// that role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_keep_alive_does_not_revive_an_ended_session() {
    let (pool, schema, store, opened, session, _) =
        short_session_holding("sessions-late", &["r"]).await;

    let late_sql = tenure_postgres::statements::keep_alive_statement(
        &table(&schema, "tenure_leases"),
        &table(&schema, "tenure_sessions"),
        &table(&schema, "tenure_nodes"),
    )
    .replace("$1", &session.id.get().to_string())
    .replace("$2", &LONG.as_micros().to_string())
    .replace("$3", "NULL");
    let late = common::run_late(&pool, 2.0, late_sql);
    tokio::time::sleep_until(opened + Duration::from_millis(1300)).await;
    let taken = store.try_acquire("r", "node-b", LONG).await;
    assert!(taken.acquired, "the session ended: {taken:?}");
    late.await.unwrap();

    assert_eq!(
        store.keep_alive(session.id, LONG).await,
        None,
        "the late keep-alive revived the session"
    );
    let info = store.get("r").await.unwrap().expect("lease");
    assert_eq!(info.live_holder(), Some("node-b"));
}

/// Waits (bounded) until a backend of `app` runs a statement containing `needle` and
/// waits on a lock: the only way to know a statement sent from another task has got
/// as far as a row lock.
async fn wait_until_lock_waiting(pool: &PgPool, app: &str, needle: &str, within: Duration) {
    eventually(within, Duration::from_millis(5), || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND wait_event_type = 'Lock'
                 AND position($2 in query) > 0",
        )
        .bind(app)
        .bind(needle)
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            Ok(())
        } else {
            Err(format!(
                "no statement with {needle:?} waited on a lock within {within:?}"
            ))
        }
    })
    .await;
}

/// A keep-alive that reached the session row while the session lived, but had to wait
/// for a contender's `FOR SHARE` on it (the lock every takeover check takes), must not
/// revive the session once it ended and a takeover took one of its roles. Share locks
/// do not queue behind a waiting writer, so the takeover's own `FOR SHARE` gets in
/// while the keep-alive still waits, and a lock (unlike a new row version) makes no one
/// re-check anything: the keep-alive has to judge liveness once it holds the row.
///
/// The contender's lock is held open here to pin the interleaving that a stream of
/// contenders, or a keep-alive's backend descheduled between reading and writing the
/// row, produces in production.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_queued_behind_a_share_lock_does_not_revive_a_taken_session() {
    let app = "sessions-queued";
    let (pool, schema, store, opened, session, held) = short_session_holding(app, &["r"]).await;
    let sessions = table(&schema, "tenure_sessions");

    // A contender checking the session while it still lives.
    let mut contender = pool.begin().await.unwrap();
    let live: bool = sqlx::query_scalar(&format!(
        "SELECT expires_at > statement_timestamp() FROM {sessions} WHERE id = $1 FOR SHARE"
    ))
    .bind(i64::try_from(session.id.get()).unwrap())
    .fetch_one(&mut *contender)
    .await
    .unwrap();
    assert!(live, "the session must still live when the contender looks");

    let keep_alive = {
        let store = store.clone();
        tokio::spawn(async move { store.keep_alive_session(session.id, LONG).await })
    };
    // The keep-alive must reach the row (and queue on the lock) while the session
    // lives; half the TTL is plenty.
    wait_until_lock_waiting(&pool, app, &sessions, Duration::from_millis(500)).await;
    assert!(
        Instant::now() < opened + SHORT,
        "too slow to queue the keep-alive before the session ended; the race was not set up"
    );

    // The session ends while the keep-alive waits; a takeover judges it ended and
    // takes its role.
    tokio::time::sleep_until(opened + Duration::from_millis(1300)).await;
    let taken = in_time(
        Duration::from_secs(5),
        store.try_acquire_or_renew("r", "node-b", LONG),
        "the takeover's share lock does not wait for a queued keep-alive",
    )
    .await;
    assert!(taken.acquired, "the session ended: {taken:?}");
    assert_eq!(taken.fencing_token, held[0].fencing_token.next());

    contender.commit().await.unwrap();
    let kept = in_time(
        Duration::from_secs(5),
        keep_alive,
        "the keep-alive answers once the locks are gone",
    )
    .await
    .unwrap();
    assert_eq!(
        kept, None,
        "a keep-alive revived the session after {taken:?} ended it and took its role"
    );
    let expires_at: time::OffsetDateTime =
        sqlx::query_scalar(&format!("SELECT expires_at FROM {sessions} WHERE id = $1"))
            .bind(i64::try_from(session.id.get()).unwrap())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        std::time::SystemTime::from(expires_at) <= taken.now,
        "the session was extended to {expires_at} past the takeover's decision at {:?}",
        taken.now
    );
    assert_eq!(store.keep_alive(session.id, LONG).await, None);
    let info = store.get("r").await.unwrap().expect("lease");
    assert_eq!(info.live_holder(), Some("node-b"));
    assert_eq!(info.fencing_token, taken.fencing_token);
}

/// A takeover of a session's role that runs while a keep-alive of that session is in
/// flight (it updated the session row, not yet committed) waits for it and sees the
/// extended session: it must not take the role on the expiry it read before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_for_a_keep_alive_in_flight() {
    let (pool, schema, store, opened, session, held) =
        short_session_holding("sessions-inflight", &["r", "q"]).await;
    let rival = store.open_session("node-c", LONG).await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    let keep_alive = tenure_postgres::statements::keep_alive_statement(
        &table(&schema, "tenure_leases"),
        &table(&schema, "tenure_sessions"),
        &table(&schema, "tenure_nodes"),
    );
    let kept = sqlx::query(&keep_alive)
        .bind(i64::try_from(session.id.get()).unwrap())
        .bind(i64::try_from(LONG.as_micros()).unwrap())
        .bind(None::<i64>)
        .fetch_optional(&mut *tx)
        .await
        .unwrap();
    assert!(kept.is_some(), "the session was live");
    // Past the expiry the takeovers' snapshots show.
    tokio::time::sleep_until(opened + Duration::from_millis(1300)).await;
    let plain = {
        let store = store.clone();
        tokio::spawn(async move { store.try_acquire_or_renew("r", "node-b", LONG).await })
    };
    let other_session = {
        let store = store.clone();
        tokio::spawn(async move { store.acquire_in_session("q", rival.id).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.commit().await.unwrap();

    let plain = plain.await.unwrap().unwrap();
    assert!(
        !plain.acquired,
        "taken from a session kept alive: {plain:?}"
    );
    assert_eq!(plain.holder, "node-a");
    assert_eq!(plain.fencing_token, held[0].fencing_token);
    let other_session = other_session.await.unwrap().unwrap();
    assert!(
        !other_session.acquired,
        "taken from a session kept alive: {other_session:?}"
    );
    assert_eq!(other_session.holder, "node-a");
}

/// A lease table made before sessions existed gains the session column on `migrate`,
/// keeps its terms, and works with sessions; migrating again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_sessions_to_an_existing_lease_table() {
    let (pool, schema, leases) = common::first_version("sessions-migrate").await;
    let old = format!(
        "INSERT INTO {leases} VALUES ('old', 'node-a', 7, now() + interval '30 seconds', 1);"
    );
    let store = common::upgraded(&pool, &schema, &old).await;
    let info = store.get("old").await.unwrap().expect("kept");
    assert_eq!(info.live_holder(), Some("node-a"));
    assert_eq!(info.fencing_token.get(), 7);
    let session = store
        .open_session("node-b", Duration::from_secs(30))
        .await
        .unwrap();
    let refused = store.acquire_in_session("old", session.id).await.unwrap();
    assert!(!refused.acquired && refused.fencing_token.get() == 7);
    let fresh = store.acquire_in_session("new", session.id).await.unwrap();
    assert!(fresh.acquired);
    assert!(store.close_session(session.id).await.unwrap());
    assert_eq!(store.get("new").await.unwrap().unwrap().live_holder(), None);
}

/// A session table made before keep-alives counted the terms handed to a session
/// (no `terms_handed`) gains the column on `migrate` with every open session at 0, and
/// the count works on it; migrating again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_count_of_handed_terms_to_an_existing_session_table() {
    let (pool, schema, store) = common::with_store(setup("sessions-handed-migrate").await);
    let a = store.open_session("node-a", LONG).await.unwrap();
    let b = store.open_session("node-b", LONG).await.unwrap();
    let sessions = table(&schema, "tenure_sessions");
    let drop = format!("ALTER TABLE {sessions} DROP COLUMN terms_handed");
    let store = common::upgraded(&pool, &schema, &drop).await;
    let kept = store.keep_alive_session(b.id, LONG).await.unwrap();
    assert_eq!(kept.expect("live").terms_handed, Some(0));
    let held = store.acquire_in_session("g/1", a.id).await.unwrap();
    assert!(held.acquired);
    assert!(store
        .hand_to_session("g/1", "node-a", held.fencing_token, "node-b")
        .await
        .unwrap());
    let kept = store.keep_alive_session(b.id, LONG).await.unwrap();
    assert_eq!(kept.expect("live").terms_handed, Some(1));
}

/// One session acquiring the same fresh roles from many tasks at once: every call
/// acquires, and every role has one term, token 1. A call whose snapshot missed the term
/// a sibling just started runs again (a few of the 800 calls do, as the debug log
/// shows), and must then answer that term rather than fail or start another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_racing_itself_gets_one_term_per_role() {
    let (pool, schema) = setup("sessions-self").await;
    let store = PgLeaseStore::new(pool, schema);
    let session = store.open_session("node-a", LONG).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut results = Vec::new();
                for i in 0..100 {
                    let role = format!("g/{i}");
                    results.push(store.acquire_in_session(&role, session.id).await);
                }
                results
            })
        })
        .collect();
    for task in tasks {
        for result in task.await.unwrap() {
            let result = result.expect("no error");
            assert!(result.acquired, "{result:?}");
            assert_eq!(result.fencing_token.get(), 1, "{result:?}");
        }
    }
}

async fn session_ids(pool: &PgPool, schema: &Schema) -> Vec<i64> {
    let sql = format!(
        "SELECT id FROM {} ORDER BY id",
        table(schema, "tenure_sessions")
    );
    sqlx::query_scalar(&sql).fetch_all(pool).await.unwrap()
}

/// Ended sessions are forgotten when a session opens, so members that come and go do
/// not grow the table for ever; one a lease row still names is kept (the row's term is
/// judged by it), and forgetting never changes an answer.
#[tokio::test]
async fn opening_a_session_forgets_ended_ones_no_lease_names() {
    let (pool, schema, store) = common::with_store(setup("sessions-forget").await);
    // Ended without a close, still named by the role it held.
    let lapsed = store.open_session("node-b", LONG).await.unwrap();
    let held = store.acquire_in_session("jobs/1", lapsed.id).await.unwrap();
    assert!(held.acquired);
    let closed = store.open_session("node-a", LONG).await.unwrap();
    store.close_session(closed.id).await.unwrap();
    let end_now = format!(
        "UPDATE {} SET expires_at = statement_timestamp() - interval '1 second' WHERE id = $1",
        table(&schema, "tenure_sessions")
    );
    sqlx::query(&end_now)
        .bind(i64::try_from(lapsed.id.get()).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    let before = session_ids(&pool, &schema).await;
    assert_eq!(before.len(), 2, "{before:?}");

    let fresh = store.open_session("node-c", LONG).await.unwrap();

    let after = session_ids(&pool, &schema).await;
    let id = |grant: &SessionGrant| i64::try_from(grant.id.get()).unwrap();
    assert_eq!(
        after,
        vec![id(&lapsed), id(&fresh)],
        "the closed session is forgotten, the one a lease names is kept"
    );
    // Answers are unchanged: the closed session is still ended, the lapsed one's role
    // is free to another session and keeps its token history.
    assert!(store.keep_alive(closed.id, LONG).await.is_none());
    assert!(matches!(
        store.acquire_in_session("jobs/2", closed.id).await,
        Err(tenure::Error::SessionEnded(_))
    ));
    let taken = store.acquire_in_session("jobs/1", fresh.id).await.unwrap();
    assert!(taken.acquired);
    assert!(taken.fencing_token > held.fencing_token);
}

/// A session's keep-alive does not wait behind the store's other calls: with every
/// connection the store may use taken by a call blocked on a row another process holds
/// locked, the keep-alive still answers (a member contending for or handing over many
/// shards at once must not lapse its own session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_does_not_wait_behind_blocked_calls() {
    const APP: &str = "sessions-keep-alive-lane";
    let (_pool, schema, store) = common::with_store(common::migrated_with(APP, 1).await);
    let session = store.open_session("node-a", LONG).await.unwrap();
    store.try_acquire("locked", "node-b", LONG).await;
    let server = tenure_testkit::postgres::PgServer::shared().expect("shared server");
    let other = common::pool(server, 2, "sessions-keep-alive-locker").await;
    let lock = common::row_locked(&other, &schema, "tenure_leases", "locked").await;

    let blocked = {
        let store = store.clone();
        tokio::spawn(async move { store.try_acquire_or_renew("locked", "node-b", LONG).await })
    };
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE application_name = $1 AND wait_event_type = 'Lock'";
    let started = Instant::now();
    while sqlx::query_scalar::<_, i64>(waiting)
        .bind(APP)
        .fetch_one(&other)
        .await
        .unwrap()
        == 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the renewal never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let kept = tokio::time::timeout(
        Duration::from_secs(5),
        store.keep_alive_session(session.id, LONG),
    )
    .await;
    lock.rollback().await.unwrap();
    assert!(
        matches!(kept, Ok(Ok(Some(_)))),
        "the keep-alive answered while the store's only other connection waited: {kept:?}"
    );
    blocked.await.unwrap().unwrap();
}

/// How many statements of the pool tagged `app` wait on a lock right now.
async fn waiting_on_locks(pool: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = $1 AND wait_event_type = 'Lock'",
    )
    .bind(app)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits (polling, for at most 10 s) until `n` statements of `app` wait on a lock.
async fn until_waiting_on_locks(pool: &PgPool, app: &str, n: i64) {
    let until = Instant::now() + Duration::from_secs(10);
    while waiting_on_locks(pool, app).await < n {
        assert!(
            Instant::now() < until,
            "{n} statements never waited on a lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A session's close and another session's acquire of the roles it holds lock the same
/// rows. The acquire locks them in role order. Were the close to lock them in another
/// order (the table's, which follows the order the terms began in), each could wait on
/// the other: PostgreSQL breaks such a cycle only after `deadlock_timeout` (a second by
/// default), by failing one of the statements. A graceful leave is this race: the
/// others contend for the leaver's shards while it closes its session.
///
/// Made certain here: a third transaction holds the first role's row, so the acquire
/// waits on it holding nothing, and the close, sent next, locks what it can before it
/// waits too; then the third lets go. Both must answer, at once.
#[tokio::test]
async fn a_close_and_an_acquire_of_its_roles_never_deadlock() {
    const APP: &str = "close-lock-order";
    let (pool, schema, store) = common::with_store(common::migrated_with(APP, 8).await);
    let roles: Vec<String> = (0..64).map(|k| format!("lock-order/{k:02}")).collect();
    let a = store.open_session("node-a", LONG).await.unwrap();
    // One at a time in a scrambled order: the rows lie in the table in that order.
    for k in 0..roles.len() {
        let role = &roles[(k * 37 + 5) % roles.len()];
        assert!(store.acquire_in_session(role, a.id).await.unwrap().acquired);
    }
    let b = store.open_session("node-b", LONG).await.unwrap();

    let mut blocker = pool.begin().await.unwrap();
    let lock_first = format!(
        "SELECT 1 FROM {} WHERE role = $1 FOR UPDATE",
        table(&schema, "tenure_leases")
    );
    sqlx::query(&lock_first)
        .bind(&roles[0])
        .execute(&mut *blocker)
        .await
        .unwrap();
    let acquire = tokio::spawn({
        let (store, roles) = (store.clone(), roles.clone());
        async move { store.acquire_many_in_session(&roles, b.id).await }
    });
    until_waiting_on_locks(&pool, APP, 1).await;
    let close = tokio::spawn({
        let store = store.clone();
        async move { store.close_session(a.id).await }
    });
    until_waiting_on_locks(&pool, APP, 2).await;
    let let_go = Instant::now();
    blocker.commit().await.unwrap();
    let acquired = acquire.await.unwrap();
    let closed = close.await.unwrap();
    let took = let_go.elapsed();
    let acquired = acquired.expect("the acquire answers");
    assert!(closed.expect("the close answers"), "a's session was open");
    assert!(
        acquired.iter().all(|answer| !answer.acquired),
        "a's session held every role when the acquire locked it"
    );
    assert!(
        took < Duration::from_millis(500),
        "the two waited on each other for {took:?}"
    );
}

/// Reads of what changed (`list_prefix_changes`) return the changed rows and the held
/// leases of their own, not every row: after 300 roles taken under a session, a release
/// and a plain lease come back alone, with the session's time left. Other tests' open
/// transactions on the shared server can hold the mark back (a read then returns more,
/// which is allowed), so each step reads until one returns what it must, a bounded number
/// of times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_changes_returns_what_changed() {
    let (_pool, schema) = setup("pg-changes").await;
    let store = PgLeaseStore::new(_pool.clone(), schema);
    let session = store.open_session("node-a", LONG).await.unwrap();
    let roles: Vec<String> = (0..300).map(|k| format!("c/{k}")).collect();
    let taken = store
        .acquire_many_in_session(&roles, session.id)
        .await
        .unwrap();
    assert!(taken.iter().all(|t| t.acquired));
    let complete = store.changes(ChangesRead::complete("c/")).await;
    assert!(complete.complete);
    assert_eq!(complete.leases.len(), 300);
    assert!(complete
        .leases
        .iter()
        .all(|l| l.session == Some(session.id)));
    let mut mark = complete.mark.expect("postgres reads changes from a mark");

    // Reads until one returns no more than `most` leases; returns that read.
    let mut settle = async |most: usize| {
        for _ in 0..100 {
            let read = store
                .changes(ChangesRead::since("c/", mark, &[session.id]))
                .await;
            assert!(!read.complete);
            mark = read.mark.unwrap();
            if read.leases.len() <= most {
                return read;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("every read of changes returned more than {most} leases");
    };
    let quiet = settle(0).await;
    assert_eq!(quiet.sessions.len(), 1);
    assert!(quiet.sessions[0].1 > LONG / 2, "{quiet:?}");

    assert!(store
        .release("c/7", "node-a", taken[7].fencing_token)
        .await
        .unwrap());
    store.try_acquire("c/x", "node-b", LONG).await;
    let changed = settle(2).await;
    let roles: Vec<&str> = changed
        .leases
        .iter()
        .map(|l| l.info.role.as_str())
        .collect();
    assert_eq!(roles, ["c/7", "c/x"], "{changed:?}");
    assert_eq!(changed.leases[0].info.live_holder(), None);
    // The plain lease is read every time (its renewals change no term); nothing else.
    let again = settle(1).await;
    assert_eq!(again.leases.len(), 1);
    assert_eq!(again.leases[0].info.role, "c/x");
}
