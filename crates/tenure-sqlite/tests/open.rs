//! Opening a database file: permissions, WAL, schema, urls, and every wrong path.
//!
//! A wrong path must be an error that names the path and the problem, and must leave
//! the file system as it was: no new file, no byte written to somebody else's file.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use tenure::{Error, LeaseStore};
use tenure_sqlite::{connect, SqliteDatabase, SqliteLeaseStore};

const TTL: Duration = Duration::from_secs(30);

/// The `reason` of an `InvalidArgument` for `path`, or a panic describing what came back.
fn path_error<T: std::fmt::Debug>(result: tenure::Result<T>) -> String {
    match result {
        Err(Error::InvalidArgument {
            field: "path",
            reason,
        }) => reason,
        other => panic!("expected an invalid path error, got {other:?}"),
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A new file is created with mode 0600, in WAL mode, and its WAL file inherits the mode.
#[tokio::test]
async fn new_file_is_private_and_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenure.db");
    let db = SqliteDatabase::open(&path).await.unwrap();
    let lease = db
        .lease_store()
        .try_acquire_or_renew("r", "a", TTL)
        .await
        .unwrap();
    assert!(lease.acquired);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "database file mode is {mode:o}");
    let wal = dir.path().join("tenure.db-wal");
    let wal_mode = std::fs::metadata(&wal).unwrap().permissions().mode() & 0o777;
    assert_eq!(wal_mode, 0o600, "wal file mode is {wal_mode:o}");
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(journal, "wal");
}

/// A missing parent directory is an error naming it; nothing is created.
#[tokio::test]
async fn missing_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nowhere").join("tenure.db");
    let reason = path_error(SqliteDatabase::open(&path).await);
    assert!(reason.contains(&path.display().to_string()), "{reason}");
    assert!(reason.contains("does not exist"), "{reason}");
    assert!(entries(dir.path()).is_empty(), "nothing may be created");
}

/// A directory given as the database path is an error.
#[tokio::test]
async fn directory_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let reason = path_error(SqliteDatabase::open(dir.path()).await);
    assert!(reason.contains("is a directory"), "{reason}");
    assert!(
        reason.contains(&dir.path().display().to_string()),
        "{reason}"
    );
    assert!(entries(dir.path()).is_empty(), "nothing may be created");
}

/// A file with other content is refused without a single byte written, and no WAL or
/// shared-memory file appears beside it.
#[tokio::test]
async fn foreign_file_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let content: Vec<u8> = b"these are my notes, not a database\n"
        .iter()
        .copied()
        .cycle()
        .take(10_000)
        .collect();
    std::fs::write(&path, &content).unwrap();
    let reason = path_error(SqliteLeaseStore::open(&path).await);
    assert!(reason.contains("not a SQLite database"), "{reason}");
    assert!(reason.contains(&path.display().to_string()), "{reason}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        content,
        "the file was changed"
    );
    assert_eq!(entries(dir.path()), ["notes.txt"]);
    // Short files too (shorter than the SQLite header).
    std::fs::write(&path, b"hi").unwrap();
    path_error(SqliteLeaseStore::open(&path).await);
    assert_eq!(std::fs::read(&path).unwrap(), b"hi");
}

/// A read-only database file is refused by its mode bits (so even root is told), and
/// left unchanged.
#[tokio::test]
async fn read_only_file_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenure.db");
    let db = SqliteDatabase::open(&path).await.unwrap();
    db.lease_store()
        .try_acquire_or_renew("r", "a", TTL)
        .await
        .unwrap();
    db.pool().close().await;
    drop(db);
    // SQLite deletes the WAL when the last connection closes, but two connections
    // closing at once can each leave it to the other. One lone connection that
    // checkpoints and closes folds the WAL into the file and removes it for sure.
    let wal = dir.path().join("tenure.db-wal");
    {
        use sqlx::Connection;
        let mut lone = sqlx::SqliteConnection::connect(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut lone)
            .await
            .unwrap();
        lone.close().await.unwrap();
    }
    let waited = std::time::Instant::now();
    while wal.exists() {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the wal file stays"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
    let before = std::fs::read(&path).unwrap();
    let reason = path_error(SqliteDatabase::open(&path).await);
    assert!(reason.contains("read-only"), "{reason}");
    assert!(reason.contains(&path.display().to_string()), "{reason}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o400
    );
}

/// An existing database of another application gains tenure's tables and keeps its own.
#[tokio::test]
async fn existing_database_keeps_its_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
        sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO orders (item) VALUES ('tea')")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
    let db = SqliteDatabase::open(&path).await.unwrap();
    let lease = db
        .lease_store()
        .try_acquire_or_renew("r", "a", TTL)
        .await
        .unwrap();
    assert_eq!(lease.fencing_token.get(), 1);
    let item: String = sqlx::query_scalar("SELECT item FROM orders")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(item, "tea");
}

/// A pool made elsewhere works too: the schema is created on it.
#[tokio::test]
async fn from_pool_creates_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("pool.db"))
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let store = SqliteLeaseStore::from_pool(pool.clone()).await.unwrap();
    let a = store.try_acquire_or_renew("r", "a", TTL).await.unwrap();
    assert!(a.acquired);
    // Idempotent: a second store on the same pool sees the same lease.
    let again = SqliteLeaseStore::from_pool(pool).await.unwrap();
    let info = again.get("r").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("a"));
}

/// Many pools opening one new file at once all succeed on one schema and one counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_opens_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move { SqliteLeaseStore::open(path).await })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().unwrap());
    }
    let mut tokens = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let owner = format!("node-{i}");
        let lease = store.try_acquire_or_renew("r", &owner, TTL).await.unwrap();
        assert!(lease.acquired, "{owner} after a release must acquire");
        tokens.push(lease.fencing_token.get());
        assert!(store
            .release("r", &owner, lease.fencing_token)
            .await
            .unwrap());
    }
    assert_eq!(tokens, (1..=8).collect::<Vec<u64>>());
}

/// `connect` takes `sqlite:PATH` and `sqlite://PATH`; a bad url is an error that does
/// not repeat the url.
#[tokio::test]
async fn connect_parses_urls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("url.db");
    let a = connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    let lease = a
        .lease_store()
        .try_acquire_or_renew("r", "a", TTL)
        .await
        .unwrap();
    let b = connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let info = b.lease_store().get("r").await.unwrap().unwrap();
    assert_eq!(
        info.fencing_token, lease.fencing_token,
        "one file, two urls"
    );
    assert_eq!(b.path(), Some(path.as_path()));

    let secret_url = "postgres://admin:hunter2@db.example/tenure";
    match connect(secret_url).await {
        Err(error @ Error::InvalidArgument { field: "url", .. }) => {
            let shown = error.to_string();
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("sqlite:"), "says what is expected: {shown}");
        }
        other => panic!("expected an invalid url, got {other:?}"),
    }
    let missing = dir.path().join("no-such-dir").join("x.db");
    let reason = path_error(connect(&format!("sqlite:{}", missing.display())).await);
    assert!(reason.contains("does not exist"), "{reason}");
}

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
    assert_eq!(schema_version(&db).await, 4);
    assert_eq!(
        db.fence().highest("ledger").await.unwrap(),
        Some(tenure::FencingToken::from(7))
    );

    for (role, next) in [("expired", 4), ("released", 10)] {
        let lease = store.try_acquire_or_renew(role, "new", TTL).await.unwrap();
        assert!(lease.acquired, "{role}: {lease:?}");
        assert_eq!(lease.fencing_token.get(), next, "{role}");
    }
    let refused = store
        .try_acquire_or_renew("live", "new", TTL)
        .await
        .unwrap();
    assert!(!refused.acquired, "{refused:?}");
    clock.advance(Duration::from_secs(5));
    let taken = store
        .try_acquire_or_renew("live", "new", TTL)
        .await
        .unwrap();
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
/// and a released one (token 9). Opening it migrates it in place to schema 4: the live
/// lease keeps its holder and time, the released one is free with the next token, and
/// sessions work on the migrated file.
#[tokio::test]
async fn schema_2_file_gains_sessions_keeping_every_lease() {
    use tenure_sqlite::SqliteOptions;

    let (_dir, path, clock) = monotonic_file(SCHEMA_2).await;
    let options = SqliteOptions::new().with_clock(clock.clone());
    let db = SqliteDatabase::open_with(&path, options).await.unwrap();
    assert_eq!(schema_version(&db).await, 4);
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
/// and a released one (token 9). Opening it migrates it in place to schema 4: the live
/// lease keeps its holder and time and shows no value, the released one is taken with
/// the next token and a value every reader then sees, and a second open changes
/// nothing.
#[tokio::test]
async fn schema_3_file_gains_values_keeping_every_lease() {
    use tenure_sqlite::SqliteOptions;

    let (_dir, path, clock) = monotonic_file(SCHEMA_3).await;
    let options = SqliteOptions::new().with_clock(clock.clone());
    let db = SqliteDatabase::open_with(&path, options.clone())
        .await
        .unwrap();
    assert_eq!(schema_version(&db).await, 4);
    let store = db.lease_store();
    let live = store.get("live").await.unwrap().unwrap();
    assert_eq!(live.live_holder(), Some("old-a"), "{live:?}");
    assert_eq!(live.fencing_token.get(), 7);
    assert_eq!(live.remaining(), Duration::from_secs(5));
    assert_eq!(live.value, None);

    let url = "http://10.0.0.9:8080";
    let taken = store
        .try_acquire_or_renew_with_value("released", "node-b", TTL, Some(url))
        .await
        .unwrap();
    assert!(taken.acquired, "{taken:?}");
    assert_eq!(taken.fencing_token.get(), 10);
    let renewed = store
        .try_acquire_or_renew_with_value("live", "old-a", TTL, Some(url))
        .await
        .unwrap();
    assert!(renewed.acquired && renewed.fencing_token.get() == 7);
    assert_eq!(
        store.get("live").await.unwrap().unwrap().value,
        None,
        "a renewal of a migrated term does not give it a value"
    );

    let again = SqliteDatabase::open_with(&path, options).await.unwrap();
    assert_eq!(schema_version(&again).await, 4);
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
    let store = db.lease_store();
    let url = "http://10.0.0.7:8080";
    for role in ["taken", "released"] {
        let lease = store
            .try_acquire_or_renew_with_value(role, "node-a", TTL, Some(url))
            .await
            .unwrap();
        assert!(lease.acquired);
    }
    clock.advance(TTL + Duration::from_secs(1));
    // The takeover and release statements of schema 3.
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
    let info = store.get("taken").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("old-b"), "{info:?}");
    assert_eq!(info.value, None, "{info:?}");

    let lease = store
        .try_acquire_or_renew_with_value("released", "node-a", TTL, Some(url))
        .await
        .unwrap();
    assert!(lease.acquired && lease.fencing_token.get() == 2);
    sqlx::query(
        "UPDATE tenure_leases SET holder = NULL, expires_at = 0, session_id = NULL          WHERE role = ?1",
    )
    .bind("released")
    .execute(db.pool())
    .await
    .unwrap();
    let info = store.get("released").await.unwrap().unwrap();
    assert_eq!(info.value, None, "{info:?}");
}

/// The `message` of a `Store` error, or a panic describing what came back.
fn store_error<T: std::fmt::Debug>(result: tenure::Result<T>) -> String {
    match result {
        Err(Error::Store { message, .. }) => message,
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// A fresh `tenure.db` in a temporary directory, its store holding role `r` for `a`
/// under token 1: the directory, the file's path, the database and its store.
async fn holding_r() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    SqliteDatabase,
    SqliteLeaseStore,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenure.db");
    let db = SqliteDatabase::open(&path).await.unwrap();
    let store = db.lease_store();
    let lease = store.try_acquire_or_renew("r", "a", TTL).await.unwrap();
    assert_eq!(lease.fencing_token.get(), 1);
    (dir, path, db, store)
}

/// Deletes the database file in `dir` and its WAL and shared-memory files, as a user
/// cleaning up might while a store has it open.
fn delete_database(dir: &Path) {
    for name in ["tenure.db", "tenure.db-wal", "tenure.db-shm"] {
        let _ = std::fs::remove_file(dir.join(name));
    }
}

/// A hard-linked database file has one WAL and one lock per name, so two stores would
/// run on one file: both names are refused at open, and so is a file hard-linked while
/// open (on its next call). A hard-linked `-wal` beside a file is refused too.
#[tokio::test]
async fn hard_linked_file_is_refused() {
    let (dir, path, _db, store) = holding_r().await;

    tracing::info!("--- a second name for the open file");
    let other = dir.path().join("other.db");
    std::fs::hard_link(&path, &other).unwrap();
    let reason = store_error(store.try_acquire_or_renew("r", "a", TTL).await);
    assert!(reason.contains("hard link"), "{reason}");
    for name in [&path, &other] {
        let reason = path_error(SqliteDatabase::open(name).await);
        assert!(reason.contains("hard link"), "{reason}");
        assert!(reason.contains(&name.display().to_string()), "{reason}");
    }
    std::fs::remove_file(&other).unwrap();
    store.try_acquire_or_renew("r", "a", TTL).await.unwrap();

    tracing::info!("--- a hard-linked -wal beside a fresh file");
    let fresh = dir.path().join("fresh.db");
    std::fs::hard_link(
        dir.path().join("tenure.db-wal"),
        dir.path().join("fresh.db-wal"),
    )
    .unwrap();
    let reason = path_error(SqliteDatabase::open(&fresh).await);
    assert!(reason.contains("fresh.db-wal"), "{reason}");
    assert!(reason.contains("hard link"), "{reason}");
}

/// A database file deleted while a store has it open: the next call fails naming the
/// problem, rather than writing on into the unlinked file or handing out token 1 from
/// a new one.
#[tokio::test]
async fn deleted_file_is_detected_on_the_next_call() {
    let (dir, path, _db, store) = holding_r().await;
    delete_database(dir.path());
    let reason = store_error(store.try_acquire_or_renew("q", "a", TTL).await);
    assert!(reason.contains("deleted"), "{reason}");
    assert!(reason.contains(&path.display().to_string()), "{reason}");
    let reason = store_error(store.get("r").await);
    assert!(reason.contains("deleted"), "{reason}");
}

/// A database file replaced while a store has it open (deleted, and a new store made
/// at the path): the old store's next call fails instead of mixing the two files.
#[tokio::test]
async fn replaced_file_is_detected_on_the_next_call() {
    let (dir, path, _db, store) = holding_r().await;
    delete_database(dir.path());
    let new = SqliteDatabase::open(&path).await.unwrap();
    new.lease_store()
        .try_acquire_or_renew("x", "b", TTL)
        .await
        .unwrap();
    let reason = store_error(store.try_acquire_or_renew("r", "a", TTL).await);
    assert!(reason.contains("replaced"), "{reason}");
    assert!(reason.contains(&path.display().to_string()), "{reason}");
}

/// Local file systems (the temporary directory's, and tmpfs where there is one) are
/// accepted by the network-file-system check.
#[tokio::test]
async fn local_file_systems_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    SqliteDatabase::open(dir.path().join("tenure.db"))
        .await
        .unwrap();
    if Path::new("/dev/shm").is_dir() {
        if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
            SqliteDatabase::open(shm.path().join("tenure.db"))
                .await
                .unwrap();
        }
    }
}
