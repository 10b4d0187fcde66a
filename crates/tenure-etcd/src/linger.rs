//! How long a watch shared by waiters (a role's successor watch, a registry's membership
//! watch) outlives its last waiter: long enough that a waiter that waits again soon (a
//! queued candidate after a refresh, a shard member after each look) costs the store
//! nothing, short enough that a process that stopped waiting lets the stream go.

use std::time::Duration;

use tokio::time::{Instant, Interval};

/// How long a shared watch outlives its last waiter.
pub(crate) const LINGER: Duration = Duration::from_secs(30);

/// A shared watch's account of its waiters: checked on its own ticks, it tells when
/// nobody has waited for [`LINGER`].
pub(crate) struct Linger {
    ticks: Interval,
    waited: Instant,
}

impl Linger {
    /// Starts the account now.
    pub(crate) fn new() -> Self {
        Linger {
            ticks: tokio::time::interval(LINGER / 4),
            waited: Instant::now(),
        }
    }

    /// The next check.
    pub(crate) async fn tick(&mut self) {
        self.ticks.tick().await;
    }

    /// Whether nobody has waited for [`LINGER`], given the watch sender's receiver count,
    /// one of which is the map's or slot's that hands the watch to new waiters. Called
    /// under the lock of that map or slot, so no waiter joins a watch that is going away.
    pub(crate) fn unwaited(&mut self, receivers: usize) -> bool {
        if receivers > 1 {
            self.waited = Instant::now();
            false
        } else {
            self.waited.elapsed() >= LINGER
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch with a waiter besides its map's receiver is waited for, and the count
    /// starts again from there; alone, it is unwaited only once `LINGER` has passed.
    #[tokio::test(start_paused = true)]
    async fn unwaited_only_a_linger_after_the_last_waiter() {
        let mut linger = Linger::new();
        tokio::time::advance(LINGER * 2).await;
        assert!(!linger.unwaited(2), "a waiter");
        tokio::time::advance(LINGER - Duration::from_millis(1)).await;
        assert!(
            !linger.unwaited(1),
            "not yet a linger since the last waiter"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(linger.unwaited(1), "a linger since the last waiter");
    }
}
