//! A disk that fails its syncs for a while (EIO, through `tenure_chaos::disk`) under a
//! SQLite store: every write made meanwhile fails and leaves nothing behind, and the
//! same store (the same pool of connections, not reopened) answers again as soon as the
//! disk does. A connection left inside a failed transaction would hold the file's write
//! lock for good, as a stalled one does, and wedge every process on the file.

use std::time::Duration;

use tenure::{LeaseStore, NodeRegistry};
use tenure_chaos::disk;
use tenure_sqlite::SqliteDatabase;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_disk_failed_answers_again_when_it_heals() {
    disk::install().expect("the VFS installs");
    let dir = std::env::temp_dir().join(format!("tenure-disk-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let path = dir.join("tenure.db");
    let db = SqliteDatabase::open(&path).await.expect("the store opens");
    let (store, fence) = (db.lease_store(), db.fence());
    let registry = db.node_registry(TTL).expect("a registry");
    let term = store
        .try_acquire_or_renew("r", "a", TTL)
        .await
        .expect("an acquire");
    assert!(term.acquired);
    fence
        .admit("table", term.fencing_token)
        .await
        .expect("the fence admits the term");
    let session = store.open_session("m", TTL).await.expect("a session");
    let session = session.id;
    registry.heartbeat("n").await.expect("a heartbeat");

    let failed = disk::failed_syncs();
    disk::fail(true);
    let renew = store.try_acquire_or_renew("r", "a", TTL).await;
    let take = store.try_acquire_or_renew("s", "b", TTL).await;
    let kept = store.keep_alive_session(session, TTL).await;
    let beat = registry.heartbeat("n2").await;
    let release = store.release("r", "a", term.fencing_token).await;
    disk::fail(false);
    assert!(disk::failed_syncs() > failed, "no sync failed");
    assert!(renew.is_err(), "a renewal on a failing disk: {renew:?}");
    assert!(take.is_err(), "an acquire on a failing disk: {take:?}");
    assert!(kept.is_err(), "a keep-alive on a failing disk: {kept:?}");
    assert!(beat.is_err(), "a heartbeat on a failing disk: {beat:?}");
    assert!(release.is_err(), "a release on a failing disk: {release:?}");

    // The same store answers, as the failed calls left it: nothing of theirs landed.
    let renewed = store
        .try_acquire_or_renew("r", "a", TTL)
        .await
        .expect("a renewal after the disk healed");
    assert!(renewed.acquired, "{renewed:?}");
    assert_eq!(renewed.fencing_token, term.fencing_token, "the same term");
    let taken = store
        .try_acquire_or_renew("s", "b", TTL)
        .await
        .expect("an acquire after the disk healed");
    assert!(taken.acquired, "{taken:?}");
    let kept = store
        .keep_alive_session(session, TTL)
        .await
        .expect("a keep-alive after the disk healed");
    assert!(kept.is_some(), "the session lives");
    registry.heartbeat("n2").await.expect("a heartbeat after");
    assert_eq!(
        registry.live_nodes().await.expect("the members"),
        ["n", "n2"]
    );
    fence
        .admit("table", renewed.fencing_token)
        .await
        .expect("the fence admits the term again");

    // Another process's view (a second database on the file) agrees.
    let other = SqliteDatabase::open(&path).await.expect("a second opening");
    let r = other
        .lease_store()
        .get("r")
        .await
        .expect("a read")
        .expect("the role's lease");
    assert_eq!(r.live_holder(), Some("a"), "{r:?}");
    assert_eq!(r.fencing_token, term.fencing_token);
    let other_store = other.lease_store();
    let refused = other_store
        .try_acquire_or_renew("r", "c", TTL)
        .await
        .expect("an acquire of a held role");
    assert!(!refused.acquired, "the held role is refused: {refused:?}");
    other.close().await;
    db.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
