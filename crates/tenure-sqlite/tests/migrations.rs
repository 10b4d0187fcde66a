//! Opening a file an older tenure wrote: each schema version is migrated in place,
//! keeping every token, live term and fence.

use std::path::Path;
use std::time::Duration;

use tenure::{ChangesRead, LeaseStore};
use tenure_sqlite::SqliteDatabase;
use tenure_testkit::MustAnswer;

const TTL: Duration = Duration::from_secs(30);

/// The schema version this build writes.
const CURRENT: i64 = 7;

/// The tables schemas 1 and 2 share, as those versions of tenure created them.
macro_rules! old_tables {
    () => {
        "
CREATE TABLE tenure_meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL);
CREATE TABLE tenure_leases (role TEXT PRIMARY KEY NOT NULL, holder TEXT,
    token INTEGER NOT NULL CHECK (token >= 1), expires_at INTEGER NOT NULL);
CREATE TABLE tenure_nodes (node_id TEXT PRIMARY KEY NOT NULL, last_heartbeat INTEGER NOT NULL,
    first_seen INTEGER NOT NULL, metadata TEXT NOT NULL);
CREATE INDEX tenure_nodes_last_heartbeat ON tenure_nodes (last_heartbeat);
CREATE TABLE tenure_fences (resource TEXT PRIMARY KEY NOT NULL, highest INTEGER NOT NULL);
"
    };
}

/// Schema 1: wall-clock nanoseconds and a high-water mark.
const SCHEMA_1: &str = concat!(
    old_tables!(),
    "CREATE TABLE tenure_clock (id INTEGER PRIMARY KEY CHECK (id = 0), high_water INTEGER NOT NULL);
INSERT INTO tenure_meta VALUES ('schema_version', 1);"
);

/// Schema 2: monotonic nanoseconds under a boot id, no sessions.
const SCHEMA_2: &str = concat!(
    old_tables!(),
    "CREATE TABLE tenure_boot (id INTEGER PRIMARY KEY CHECK (id = 0), boot_id TEXT NOT NULL);
INSERT INTO tenure_meta VALUES ('schema_version', 2);"
);

/// A file at `path` with the tables of `schema` and the lease rows
/// `(role, holder, token, expires_at)`, as an older tenure left it; more rows go
/// through the returned pool, which the caller closes.
async fn old_file(
    path: &Path,
    schema: &str,
    leases: &[(&str, Option<&str>, i64, i64)],
) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    for statement in schema.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    for (role, holder, token, expires) in leases {
        sqlx::query(
            "INSERT INTO tenure_leases (role, holder, token, expires_at) VALUES (?1, ?2, ?3, ?4)",
        )
        .bind(role)
        .bind(holder)
        .bind(token)
        .bind(expires)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool
}

async fn schema_version(db: &SqliteDatabase) -> i64 {
    sqlx::query_scalar("SELECT value FROM tenure_meta WHERE key = 'schema_version'")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// Opens the file at `path` with `options`, which migrates it, asserting it is then at
/// the current schema.
async fn open_current(path: &Path, options: tenure_sqlite::SqliteOptions) -> SqliteDatabase {
    let db = SqliteDatabase::open_with(path, options).await.unwrap();
    assert_eq!(schema_version(&db).await, CURRENT);
    db
}

/// Runs `statements` on `db`, which take away what later schemas added, and closes it:
/// the file as a build of the older schema would have left it.
async fn leave_at_older_schema(db: SqliteDatabase, statements: &[&str]) {
    for statement in statements {
        sqlx::query(statement).execute(db.pool()).await.unwrap();
    }
    db.pool().close().await;
}

/// Setup: a schema-1 file at wall time t0 whose high-water mark is t0 + 2 s (its store
/// time then), with a live lease (token 7, expiring t0 + 7 s), an expired one (token 3),
/// a released one (token 9), a live and a lapsed node, and a fence. Opening it migrates
/// it in place: every token and fence is kept, the live lease keeps exactly the 5 s it
/// had left on the old store time, the others are free with the next token, and the
/// old clock table is gone (so an old tenure still running fails instead of writing
/// wall-clock times).
#[tokio::test]
async fn schema_1_file_is_migrated_keeping_tokens_and_remaining_time() {
    use std::time::SystemTime;
    use tenure::NodeRegistry;
    use tenure_sqlite::{ManualHostClock, SqliteOptions};

    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let at = |secs: i64| 1_800_000_000_000_000_000_i64 + secs * 1_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let leases = [
            ("live", Some("old-a"), 7, at(7)),
            ("expired", Some("old-b"), 3, at(1)),
            ("released", None, 9, at(-5)),
        ];
        let pool = old_file(&path, SCHEMA_1, &leases).await;
        sqlx::query("INSERT INTO tenure_clock VALUES (0, ?1)")
            .bind(at(2))
            .execute(&pool)
            .await
            .unwrap();
        for (node, last) in [("fresh", at(1)), ("lapsed", at(-20))] {
            sqlx::query("INSERT INTO tenure_nodes VALUES (?1, ?2, ?2, '{}')")
                .bind(node)
                .bind(last)
                .execute(&pool)
                .await
                .unwrap();
        }
        sqlx::query("INSERT INTO tenure_fences VALUES ('ledger', 7)")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }

    let clock = ManualHostClock::new(t0);
    let options = SqliteOptions::new().with_clock(clock.clone());
    let db = SqliteDatabase::open_with(&path, options).await.unwrap();
    let store = db.lease_store();
    let live = store.get("live").await.unwrap().unwrap();
    assert_eq!(live.live_holder(), Some("old-a"), "{live:?}");
    assert_eq!(live.remaining(), Duration::from_secs(5));
    let registry = db.node_registry(Duration::from_secs(10)).unwrap();
    assert_eq!(registry.live_nodes().await.unwrap(), ["fresh"]);
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE name = 'tenure_clock'")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert!(tables.is_empty(), "the schema-1 clock table must be gone");
    assert_eq!(schema_version(&db).await, CURRENT);
    assert_eq!(
        db.fence().highest("ledger").await.unwrap(),
        Some(tenure::FencingToken::from(7))
    );

    for (role, next) in [("expired", 4), ("released", 10)] {
        let lease = store.try_acquire(role, "new", TTL).await;
        assert!(lease.acquired, "{role}: {lease:?}");
        assert_eq!(lease.fencing_token.get(), next, "{role}");
    }
    let refused = store.try_acquire("live", "new", TTL).await;
    assert!(!refused.acquired, "{refused:?}");
    clock.advance(Duration::from_secs(5));
    let taken = store.try_acquire("live", "new", TTL).await;
    assert!(taken.acquired, "{taken:?}");
    assert_eq!(taken.fencing_token.get(), 8);
    // A second open finds the file current and changes nothing.
    let again = SqliteDatabase::open(&path).await.unwrap();
    assert_eq!(
        again
            .lease_store()
            .get("live")
            .await
            .unwrap()
            .unwrap()
            .fencing_token
            .get(),
        8
    );
}

/// A file with the tables of `schema` (2 or later: monotonic time) under the boot of
/// the returned clock, 100 s after it began, with a live lease (`live`, token 7, 5 s
/// left) and a released one (`released`, token 9).
async fn monotonic_file(
    schema: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    tenure_sqlite::ManualHostClock,
) {
    use std::time::SystemTime;
    use tenure_sqlite::{HostClock, ManualHostClock};

    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let clock = ManualHostClock::new(start);
    clock.advance(Duration::from_secs(100));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let second = 1_000_000_000_i64;
    let leases = [
        ("live", Some("old-a"), 7, 105 * second),
        ("released", None, 9, 90 * second),
    ];
    let pool = old_file(&path, schema, &leases).await;
    sqlx::query("INSERT INTO tenure_boot VALUES (0, ?1)")
        .bind(clock.now().unwrap().boot_id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    (dir, path, clock)
}

/// Setup: a schema-2 file under the clock's boot with a live lease (token 7, 5 s left)
/// and a released one (token 9). Opening it migrates it in place to the current schema: the live
/// lease keeps its holder and time, the released one is free with the next token, and
/// sessions work on the migrated file.
#[tokio::test]
async fn schema_2_file_gains_sessions_keeping_every_lease() {
    use tenure_sqlite::SqliteOptions;

    let (_dir, path, clock) = monotonic_file(SCHEMA_2).await;
    let options = SqliteOptions::new().with_clock(clock.clone());
    let db = open_current(&path, options).await;
    let store = db.lease_store();
    let live = store.get("live").await.unwrap().unwrap();
    assert_eq!(live.live_holder(), Some("old-a"), "{live:?}");
    assert_eq!(live.remaining(), Duration::from_secs(5));

    let session = store.open_session("node-b", TTL).await.unwrap();
    let refused = store.acquire_in_session("live", session.id).await.unwrap();
    assert!(
        !refused.acquired && refused.holder == "old-a",
        "{refused:?}"
    );
    let taken = store
        .acquire_in_session("released", session.id)
        .await
        .unwrap();
    assert!(taken.acquired, "{taken:?}");
    assert_eq!(taken.fencing_token.get(), 10);
    clock.advance(Duration::from_secs(5));
    let after = store.acquire_in_session("live", session.id).await.unwrap();
    assert!(after.acquired, "{after:?}");
    assert_eq!(after.fencing_token.get(), 8);
}

/// Schema 3: sessions, no advertised values; its view reads no `value`. (Its trigger
/// is left out: it has a `;` inside, and the migration creates it if missing.)
const SCHEMA_3: &str = "
CREATE TABLE tenure_meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL);
CREATE TABLE tenure_boot (id INTEGER PRIMARY KEY CHECK (id = 0), boot_id TEXT NOT NULL);
CREATE TABLE tenure_leases (role TEXT PRIMARY KEY NOT NULL, holder TEXT,
    token INTEGER NOT NULL CHECK (token >= 1), expires_at INTEGER NOT NULL, session_id INTEGER);
CREATE TABLE tenure_sessions (id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL,
    expires_at INTEGER NOT NULL);
CREATE TABLE tenure_nodes (node_id TEXT PRIMARY KEY NOT NULL, last_heartbeat INTEGER NOT NULL,
    first_seen INTEGER NOT NULL, metadata TEXT NOT NULL);
CREATE INDEX tenure_nodes_last_heartbeat ON tenure_nodes (last_heartbeat);
CREATE TABLE tenure_fences (resource TEXT PRIMARY KEY NOT NULL, highest INTEGER NOT NULL);
CREATE INDEX tenure_leases_session ON tenure_leases (session_id) WHERE session_id IS NOT NULL;
CREATE VIEW tenure_terms AS
    SELECT l.role, l.holder, l.token, coalesce(s.expires_at, l.expires_at) AS expires_at,
           l.session_id
    FROM tenure_leases l LEFT JOIN tenure_sessions s ON s.id = l.session_id;
INSERT INTO tenure_meta VALUES ('schema_version', 3);
";

/// Setup: a schema-3 file under the clock's boot with a live lease (token 7, 5 s left)
/// and a released one (token 9). Opening it migrates it in place to the current schema: the live
/// lease keeps its holder and time and shows no value, the released one is taken with
/// the next token and a value every reader then sees, and a second open changes
/// nothing.
#[tokio::test]
async fn schema_3_file_gains_values_keeping_every_lease() {
    use tenure_sqlite::SqliteOptions;

    let (_dir, path, clock) = monotonic_file(SCHEMA_3).await;
    let options = SqliteOptions::new().with_clock(clock.clone());
    let db = open_current(&path, options.clone()).await;
    let store = db.lease_store();
    let live = store.get("live").await.unwrap().unwrap();
    assert_eq!(live.live_holder(), Some("old-a"), "{live:?}");
    assert_eq!(live.fencing_token.get(), 7);
    assert_eq!(live.remaining(), Duration::from_secs(5));
    assert_eq!(live.value, None);

    let url = "http://10.0.0.9:8080";
    let taken = store
        .try_acquire_with_value("released", "node-b", TTL, Some(url))
        .await;
    assert!(taken.acquired, "{taken:?}");
    assert_eq!(taken.fencing_token.get(), 10);
    let renewed = store
        .try_acquire_with_value("live", "old-a", TTL, Some(url))
        .await;
    assert!(renewed.acquired && renewed.fencing_token.get() == 7);
    assert_eq!(
        store.get("live").await.unwrap().unwrap().value,
        None,
        "a renewal of a migrated term does not give it a value"
    );

    let again = open_current(&path, options).await;
    let listed = again.lease_store().list().await.unwrap();
    let values: Vec<_> = listed
        .iter()
        .map(|info| (info.role.as_str(), info.value.as_deref()))
        .collect();
    assert_eq!(values, [("live", None), ("released", Some(url))]);
}

/// A schema-3 tenure still running on a migrated file starts terms and releases with
/// its own statements, which know no values: the value of the term before is never
/// shown for the term it starts, nor for a role it released.
#[tokio::test]
async fn a_schema_3_term_never_shows_its_predecessors_value() {
    use tenure_sqlite::{ManualHostClock, SqliteOptions};

    let dir = tempfile::tempdir().unwrap();
    let start = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let clock = ManualHostClock::new(start);
    let options = SqliteOptions::new().with_clock(clock.clone());
    let db = SqliteDatabase::open_with(dir.path().join("mixed.db"), options)
        .await
        .unwrap();
    let lapse = || async { clock.advance(TTL + Duration::from_secs(1)) };
    // The takeover and release statements of schema 3.
    let take_over = || async {
        sqlx::query(
            "UPDATE tenure_leases SET holder = ?2, token = ?3, expires_at = ?4, session_id = NULL          WHERE role = ?1",
        )
        .bind("taken")
        .bind("old-b")
        .bind(2_i64)
        .bind(i64::MAX)
        .execute(db.pool())
        .await
        .unwrap();
    };
    let release = || async {
        sqlx::query(
            "UPDATE tenure_leases SET holder = NULL, expires_at = 0, session_id = NULL          WHERE role = ?1",
        )
        .bind("released")
        .execute(db.pool())
        .await
        .unwrap();
    };
    tenure_testkit::observe::an_earlier_term_never_shows_its_predecessors_value(
        &db.lease_store(),
        TTL,
        TTL,
        lapse,
        take_over,
        release,
    )
    .await;
}

/// Setup: a schema-4 file (everything but the queue) under the clock's boot, with a
/// live term (node-a) and a released role. Opening it migrates it in place to schema 5:
/// the term goes on with its token, a contender queues behind it and is handed the role
/// by its release, the released role is taken with the next token, and a second open
/// changes nothing.
#[tokio::test]
async fn schema_4_file_gains_the_queue_keeping_every_lease() {
    use tenure_sqlite::{ManualHostClock, SqliteOptions};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v4.db");
    let start = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let clock = ManualHostClock::new(start);
    let options = SqliteOptions::new().with_clock(clock.clone());
    let a = {
        let db = SqliteDatabase::open_with(&path, options.clone())
            .await
            .unwrap();
        let store = db.lease_store();
        let released = store.try_acquire("released", "node-a", TTL).await;
        assert!(
            store
                .release_term("released", "node-a", released.fencing_token)
                .await
        );
        let a = store.try_acquire("live", "node-a", TTL).await;
        // Schema 4 is exactly this schema without the queue.
        let older = [
            "DROP TABLE tenure_candidates",
            "UPDATE tenure_meta SET value = 4 WHERE key = 'schema_version'",
        ];
        leave_at_older_schema(db, &older).await;
        a
    };

    let db = open_current(&path, options.clone()).await;
    let store = db.lease_store();
    let live = store.get("live").await.unwrap().unwrap();
    assert_eq!(live.live_holder(), Some("node-a"), "{live:?}");
    assert_eq!(live.fencing_token, a.fencing_token);
    let b = store
        .try_acquire_or_queue("live", "node-b", TTL, Some("b:1"))
        .await
        .unwrap();
    assert!(!b.acquired, "{b:?}");
    assert!(store.release_term("live", "node-a", a.fencing_token).await);
    let handed = store.get("live").await.unwrap().unwrap();
    assert_eq!(handed.live_holder(), Some("node-b"), "{handed:?}");
    assert_eq!(handed.fencing_token.get(), a.fencing_token.get() + 1);
    assert_eq!(handed.value.as_deref(), Some("b:1"));
    let taken = store.try_acquire("released", "node-c", TTL).await;
    assert!(
        taken.acquired && taken.fencing_token.get() == 2,
        "{taken:?}"
    );

    let again = open_current(&path, options).await;
    let info = again.lease_store().get("live").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-b"));
}

/// Setup: a schema-5 file (this schema without membership through sessions) with a live
/// node and an open session. Opening it migrates it to the current schema: the node
/// stays live, and a node kept alive by its session stays live without its own
/// heartbeats; a second open changes nothing.
#[tokio::test]
async fn schema_5_file_gains_membership_through_sessions() {
    use tenure::NodeRegistry;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v5.db");
    let member_ttl = Duration::from_secs(2);
    {
        let db = SqliteDatabase::open(&path).await.unwrap();
        db.node_registry(TTL)
            .unwrap()
            .heartbeat("old")
            .await
            .unwrap();
        let older = [
            "DROP INDEX tenure_nodes_session",
            "ALTER TABLE tenure_nodes DROP COLUMN session_id",
            "ALTER TABLE tenure_sessions DROP COLUMN kept_at",
            "UPDATE tenure_meta SET value = 5 WHERE key = 'schema_version'",
        ];
        leave_at_older_schema(db, &older).await;
    }
    let db = open_current(&path, Default::default()).await;
    let registry = db.node_registry(member_ttl).unwrap();
    assert_eq!(registry.live_nodes().await.unwrap(), ["old"]);
    let store = db.lease_store();
    let session = store.open_session("m", TTL).await.unwrap();
    registry.heartbeat("m").await.unwrap();
    let until = tokio::time::Instant::now() + member_ttl * 2;
    while tokio::time::Instant::now() < until {
        store.keep_alive_session(session.id, TTL).await.unwrap();
        registry.heartbeat("m").await.unwrap();
        tokio::time::sleep(member_ttl / 3).await;
    }
    assert!(registry
        .live_nodes()
        .await
        .unwrap()
        .contains(&"m".to_owned()));
    db.pool().close().await;
    open_current(&path, Default::default()).await;
}

/// Setup: a schema-6 file (this schema without change numbers) with roles held under a
/// session. Opening it migrates it to the current schema: a first read of changes is
/// complete, and a read from its mark returns what changed after (a release), not the
/// rows written before the migration; a second open changes nothing.
#[tokio::test]
async fn schema_6_file_gains_change_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v6.db");
    let (session, token) = {
        let db = SqliteDatabase::open(&path).await.unwrap();
        let store = db.lease_store();
        let session = store.open_session("m", TTL).await.unwrap().id;
        let roles: Vec<String> = (0..3).map(|k| format!("g/{k}")).collect();
        let taken = store
            .acquire_many_in_session(&roles, session)
            .await
            .unwrap();
        let older = [
            "DROP TRIGGER tenure_leases_number_new",
            "DROP TRIGGER tenure_leases_number_change",
            "DROP INDEX tenure_leases_changed",
            "DROP INDEX tenure_leases_held_alone",
            "DROP VIEW tenure_terms",
            "ALTER TABLE tenure_leases DROP COLUMN changed",
            "UPDATE tenure_meta SET value = 6 WHERE key = 'schema_version'",
        ];
        leave_at_older_schema(db, &older).await;
        (session, taken[1].fencing_token)
    };
    let db = open_current(&path, Default::default()).await;
    let store = db.lease_store();
    let complete = store.changes(ChangesRead::complete("g/")).await;
    assert!(complete.complete);
    assert_eq!(complete.leases.len(), 3);
    let mark = complete.mark.expect("sqlite reads changes from a mark");
    assert!(store.release("g/1", "m", token).await.unwrap());
    let changed = store
        .changes(ChangesRead::since("g/", mark, &[session]))
        .await;
    assert!(!changed.complete);
    let roles: Vec<&str> = changed
        .leases
        .iter()
        .map(|l| l.info.role.as_str())
        .collect();
    assert_eq!(roles, ["g/1"]);
    assert_eq!(changed.sessions.len(), 1);
    db.pool().close().await;
    open_current(&path, Default::default()).await;
}

/// A schema-7 file made before keep-alives counted the terms handed to a session (no
/// `tenure_sessions.terms_handed`) gains the column when opened, keeping its version
/// (a build of schema 7 still opens it), with every open session at 0, and the count
/// works on it.
#[tokio::test]
async fn schema_7_file_gains_the_count_of_handed_terms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v7.db");
    let (a, b) = {
        let db = SqliteDatabase::open(&path).await.unwrap();
        let store = db.lease_store();
        let a = store.open_session("node-a", TTL).await.unwrap().id;
        let b = store.open_session("node-b", TTL).await.unwrap().id;
        let older = ["ALTER TABLE tenure_sessions DROP COLUMN terms_handed"];
        leave_at_older_schema(db, &older).await;
        (a, b)
    };
    let db = open_current(&path, Default::default()).await;
    let store = db.lease_store();
    let kept = store.keep_alive_session(b, TTL).await.unwrap();
    assert_eq!(kept.expect("live").terms_handed, Some(0));
    let held = store.acquire_in_session("g/1", a).await.unwrap();
    assert!(held.acquired);
    assert!(store
        .hand_to_session("g/1", "node-a", held.fencing_token, "node-b")
        .await
        .unwrap());
    let kept = store.keep_alive_session(b, TTL).await.unwrap();
    assert_eq!(kept.expect("live").terms_handed, Some(1));
}
