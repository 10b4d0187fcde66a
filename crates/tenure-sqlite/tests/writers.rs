//! Writers of one SQLite file through separate handles (as separate processes are): a
//! handle that writes now and then is not starved by another that writes back to back.
//! SQLite has one write lock per file and no queue for it; a writer that finds it taken
//! sleeps and retries, so the retry schedule decides who gets it next.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure::LeaseStore;
use tenure_sqlite::SqliteDatabase;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(60);

/// Setup: two handles on one file. Through the first, two tasks send batches of 64
/// acquires back to back (a member taking thousands of shards); through the second, a
/// session is kept alive every 50 ms for 3 s. Each keep-alive is answered within a
/// second (a session's TTL is seconds; 22-162 ms seen). SQLite's own busy handler let a
/// waiting writer sleep up to 100 ms between tries while the busy handle took the lock
/// again at once: a keep-alive waited 4.9 s, near the busy timeout, and members lost
/// their sessions in `tenure bench --shards 10000`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_is_not_starved_by_another_handles_stream_of_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("writers.db");
    let busy = SqliteDatabase::open(&path).await.unwrap().lease_store();
    let quiet = SqliteDatabase::open(&path).await.unwrap().lease_store();
    let busy_session = busy.open_session("busy", TTL).await.unwrap().id;
    let session = quiet.open_session("quiet", TTL).await.unwrap().id;

    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..2 {
        let (busy, stop) = (busy.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut batches = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let first = (batches % 100) * 64;
                let roles: Vec<String> = (first..first + 64)
                    .map(|k| format!("g{writer}/{k}"))
                    .collect();
                busy.acquire_many_in_session(&roles, busy_session)
                    .await
                    .unwrap();
                batches += 1;
            }
            batches
        }));
    }

    let mut waits = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let sent = Instant::now();
        let kept = quiet.keep_alive_session(session, TTL).await.unwrap();
        assert!(kept.is_some(), "the session ended");
        waits.push(sent.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut batches = 0;
    for writer in writers {
        batches += writer.await.unwrap();
    }
    let longest = waits.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{} keep-alives, longest {longest:?}; {batches} batches beside them",
        waits.len()
    );
    assert!(
        batches >= 10,
        "the busy handle hardly wrote: {batches} batches"
    );
    assert!(
        longest < Duration::from_secs(1),
        "a keep-alive waited {longest:?} ({} keep-alives: {waits:?})",
        waits.len()
    );
}
