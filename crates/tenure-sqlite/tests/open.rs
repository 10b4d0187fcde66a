//! Opening a database file: permissions, WAL, schema, urls, and every wrong path (files
//! of older schema versions: `migrations.rs`).
//!
//! A wrong path must be an error that names the path and the problem, and must leave
//! the file system as it was: no new file, no byte written to somebody else's file.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use tenure::{Error, LeaseStore};
use tenure_sqlite::{connect, SqliteDatabase, SqliteLeaseStore};
use tenure_testkit::MustAnswer;

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
    let lease = db.lease_store().try_acquire("r", "a", TTL).await;
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
    db.lease_store().try_acquire("r", "a", TTL).await;
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

/// A pool made elsewhere (by another application) on the file at `path`, creating the
/// file.
async fn pool_of_its_own(path: &std::path::Path) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    sqlx::SqlitePool::connect_with(options).await.unwrap()
}

/// An existing database of another application gains tenure's tables and keeps its own.
#[tokio::test]
async fn existing_database_keeps_its_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let pool = pool_of_its_own(&path).await;
        for statement in [
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)",
            "INSERT INTO orders (item) VALUES ('tea')",
        ] {
            sqlx::query(statement).execute(&pool).await.unwrap();
        }
        pool.close().await;
    }
    let db = SqliteDatabase::open(&path).await.unwrap();
    let lease = db.lease_store().try_acquire("r", "a", TTL).await;
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
    let pool = pool_of_its_own(&dir.path().join("pool.db")).await;
    let store = SqliteLeaseStore::from_pool(pool.clone()).await.unwrap();
    let a = store.try_acquire("r", "a", TTL).await;
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
        let lease = store.try_acquire("r", &owner, TTL).await;
        assert!(lease.acquired, "{owner} after a release must acquire");
        tokens.push(lease.fencing_token.get());
        assert!(store.release_term("r", &owner, lease.fencing_token).await);
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
    let lease = a.lease_store().try_acquire("r", "a", TTL).await;
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
    let lease = store.try_acquire("r", "a", TTL).await;
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
    store.try_acquire("r", "a", TTL).await;

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
    new.lease_store().try_acquire("x", "b", TTL).await;
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
