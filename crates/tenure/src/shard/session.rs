//! The member's session, kept alive by a task of its own so renewals never wait for the
//! member's loop.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::*;

/// The member's session, kept alive by a task of its own so that renewals never wait
/// for the member's loop (contending for many shards, a shard's work winding down).
pub(super) struct Session {
    pub(super) id: SessionId,
    /// The local deadline of the last successful renewal (or the opening).
    pub(super) deadline: watch::Receiver<Instant>,
    /// Cancelled when the session is over locally: at the deadline without a renewal,
    /// when the store says it ended, or when the member drops it. Every shard's
    /// `leadership` is a child of it.
    pub(super) alive: CancellationToken,
}

impl Session {
    /// Starts keeping session `grant` (opened by a request sent at `sent`) alive.
    /// Each renewal's deadline is also sent on `published` (the member's
    /// [`ShardElector::deadline`]).
    pub(super) fn start(
        store: Arc<dyn LeaseStore>,
        timing: LeaseLeaderOptions,
        sent: Instant,
        grant: &SessionGrant,
        published: watch::Sender<Option<Instant>>,
    ) -> Session {
        let alive = CancellationToken::new();
        let (mut deadline, mut next_renew) = lifetime(&timing, sent, grant);
        let (deadline_tx, deadline_rx) = watch::channel(deadline);
        published.send_replace(Some(deadline));
        let (id, watched) = (grant.id, alive.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = watched.cancelled() => return,
                    _ = tokio::time::sleep_until(deadline) => {
                        warn!(session = %id, "local deadline passed without a session renewal: every shard is lost");
                        break;
                    }
                    _ = tokio::time::sleep_until(next_renew) => {}
                }
                let sent = Instant::now();
                let answer = tokio::time::timeout_at(
                    deadline,
                    store.keep_alive_session(id, timing.lease_ttl),
                )
                .await;
                match answer {
                    Ok(Ok(Some(grant))) => {
                        (deadline, next_renew) = lifetime(&timing, sent, &grant);
                        deadline_tx.send_replace(deadline);
                        if !watched.is_cancelled() {
                            published.send_replace(Some(deadline));
                        }
                        debug!(session = %id, "session renewed");
                    }
                    Ok(Ok(None)) => {
                        warn!(session = %id, "the session ended on the store: every shard is lost");
                        break;
                    }
                    Ok(Err(error)) => {
                        let retry = timing.retry_interval.min(timing.renew_interval);
                        warn!(session = %id, %error, retry_in = ?retry, "session renewal failed; retrying");
                        next_renew = Instant::now() + retry;
                    }
                    // The deadline passed during the call: the select above says so.
                    Err(_) => {}
                }
            }
            watched.cancel();
        });
        Session {
            id,
            deadline: deadline_rx,
            alive,
        }
    }

    pub(super) fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.alive.cancel();
    }
}

/// The local deadline and next renewal a grant answered to a request sent at `sent`
/// allows: `sent + granted * (1 - max_clock_drift) - work_grace`, renewing at the same
/// fraction of what was granted as of the full TTL.
pub(super) fn lifetime(
    timing: &LeaseLeaderOptions,
    sent: Instant,
    grant: &SessionGrant,
) -> (Instant, Instant) {
    let granted = grant.remaining();
    (
        sent + timing.leadership_window_for(granted),
        sent + timing.renew_after(granted),
    )
}
