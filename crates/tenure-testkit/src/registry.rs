//! Registry wrappers for tests: [`CountedReads`] counts how often members read the
//! membership, so a member that reads in a loop shows as a count, not as a test that
//! hangs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure::intercept::{FilteredRegistry, RegistryFilter};
use tenure::NodeRegistry;
use tokio::time::Instant;

/// A [`RegistryFilter`] that counts the reads of the membership. Past `cap` reads each
/// further read first waits an hour: on paused tokio time a member reading in a loop
/// would stop the clock, and the test could never report the count.
pub struct ReadCount {
    reads: AtomicUsize,
    cap: usize,
}

/// A registry whose reads of the membership are counted: see [`ReadCount`].
pub type CountedReads = FilteredRegistry<ReadCount>;

/// `inner` with its reads of the membership counted, every read past `cap` held back.
pub fn counting_reads(inner: Arc<dyn NodeRegistry>, cap: usize) -> CountedReads {
    let reads = AtomicUsize::new(0);
    FilteredRegistry::new(inner, ReadCount { reads, cap })
}

impl ReadCount {
    /// Reads of the membership so far.
    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    /// Whether the reads reached the cap (and are being held back).
    pub fn capped(&self) -> bool {
        self.reads() >= self.cap
    }
}

#[async_trait::async_trait]
impl RegistryFilter for ReadCount {
    async fn before_read(&self) {
        if self.reads.fetch_add(1, Ordering::SeqCst) >= self.cap {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
}

/// How long `registry.wait_for_members_change(observed, ..)` waited, given `limit`
/// from now as its deadline.
pub async fn waited_for_change(
    registry: &dyn NodeRegistry,
    observed: &[String],
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    registry
        .wait_for_members_change(observed, started + limit)
        .await;
    started.elapsed()
}
