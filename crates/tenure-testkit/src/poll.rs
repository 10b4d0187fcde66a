//! Waiting for a condition, a task or a call that another task, process or server
//! brings about, with a bound, so a test that would otherwise hang fails and says what
//! it was waiting for.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Runs `check` every `every` until it answers `Ok`, and returns that value; a check
/// answering `Err` once `within` has passed fails the test with that message (what was
/// still wrong).
pub async fn eventually<T, F, Fut>(within: Duration, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(wrong) => assert!(Instant::now() < deadline, "{wrong}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// Awaits `task` (a spawned task's handle, or a call answering a `Result`) for `limit` at
/// most and returns its answer: no answer in time fails the test with `what` (what should
/// have happened by then), and an `Err` answer (a panicked task, a failed call) fails it
/// too.
pub async fn in_time<T, E: std::fmt::Debug>(
    limit: Duration,
    task: impl Future<Output = Result<T, E>>,
    what: &str,
) -> T {
    tokio::time::timeout(limit, task)
        .await
        .expect(what)
        .unwrap()
}
