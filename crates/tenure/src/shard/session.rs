//! The member's session, kept alive by a task of its own so renewals never wait for the
//! member's loop; and the member's side of it: opening one, losing it, closing it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::*;

/// The member's session, kept alive by a task of its own so that renewals never wait
/// for the member's loop (contending for many shards, a shard's work winding down).
pub(super) struct Session {
    pub(super) id: SessionId,
    /// The local deadline of the last successful renewal (or the opening).
    pub(super) deadline: watch::Receiver<Instant>,
    /// When the other members lapse, as the last keep-alive that told it said.
    peers_lapse: watch::Receiver<Option<PeersLapseSeen>>,
    /// How many terms were handed to the session, as keep-alives tell it (see
    /// [`SessionGrant::terms_handed`]). Seen: the ones the member heard of through their
    /// pushes, and all that the store counted before its last look read the group.
    pub(super) terms_handed: Told<u64>,
    /// Where the store's numbering of lease changes stood, as keep-alives tell it (see
    /// [`SessionGrant::latest_change`]). Seen: what was told before the member's last
    /// read of the group began.
    pub(super) latest_change: Told<ChangeMark>,
    /// Cancelled when the session is over locally: at the deadline without a renewal,
    /// when the store says it ended, or when the member drops it. Every shard's
    /// `leadership` is a child of it.
    pub(super) alive: CancellationToken,
}

impl Session {
    /// Starts keeping session `grant` (opened by a request sent at `sent`) alive.
    /// Each renewal's deadline is also sent on `published` (the member's
    /// [`ShardElector::deadline`]), and the latest change each tells on `latest` (the
    /// member's, across its sessions: the store numbers changes, not sessions).
    pub(super) fn start(
        store: Arc<dyn LeaseStore>,
        timing: LeaseLeaderOptions,
        sent: Instant,
        grant: &SessionGrant,
        published: watch::Sender<Option<Instant>>,
        latest: watch::Sender<Option<ChangeMark>>,
    ) -> Session {
        let alive = CancellationToken::new();
        let (mut deadline, mut next_renew) = lifetime(&timing, sent, grant);
        let (deadline_tx, deadline_rx) = watch::channel(deadline);
        let (peers_lapse_tx, peers_lapse_rx) = watch::channel(None);
        let (handed_tx, handed_rx) = watch::channel(grant.terms_handed);
        raise(&latest, grant.latest_change);
        let latest_rx = latest.subscribe();
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
                        // An account past the clock's range tells nothing usable.
                        let told = grant.peers_lapse.and_then(|told| {
                            let at = sent.checked_add(told.after)?.checked_add(LAPSE_NUDGE)?;
                            Some(PeersLapseSeen {
                                at,
                                answered: Instant::now(),
                                live: told.live,
                                ttl: told.ttl,
                            })
                        });
                        if told.is_some() {
                            peers_lapse_tx.send_replace(told);
                        }
                        raise(&handed_tx, grant.terms_handed);
                        raise(&latest, grant.latest_change);
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
            peers_lapse: peers_lapse_rx,
            terms_handed: Told {
                told: handed_rx,
                seen: Some(grant.terms_handed.unwrap_or(0)),
            },
            latest_change: Told {
                told: latest_rx,
                seen: None,
            },
            alive,
        }
    }

    pub(super) fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// Takes every term the store counted as handed to the session, and every change it
    /// numbered, up to the last keep-alive that told, as seen: a read of the group that
    /// begins now sees them.
    pub(super) fn see_what_was_told(&mut self) {
        self.terms_handed.see();
        self.latest_change.see();
    }

    /// A term handed to the session was heard of through its push.
    pub(super) fn heard_term_handed(&mut self) {
        let seen = &mut self.terms_handed.seen;
        *seen = Some(seen.unwrap_or(0).saturating_add(1));
    }

    /// When the other members lapse, if the store's keep-alives tell.
    pub(super) fn peers_lapse(&self) -> Option<PeersLapseSeen> {
        *self.peers_lapse.borrow()
    }
}

/// A number keep-alives tell (kept as the largest told), and how much of it the member
/// has seen: told more than seen brings the member a look.
pub(super) struct Told<T> {
    told: watch::Receiver<Option<T>>,
    seen: Option<T>,
}

impl<T: Copy + Ord + Send + Sync + 'static> Told<T> {
    /// Takes all that was told so far as seen.
    fn see(&mut self) {
        self.seen = self.seen.max(*self.told.borrow());
    }

    /// Whether the store tells this number at all.
    pub(super) fn is_told(&self) -> bool {
        self.told.borrow().is_some()
    }

    /// Returns once a keep-alive tells more than was seen (at once if the last one did);
    /// never on a store that does not tell.
    pub(super) fn unseen(&self) -> impl std::future::Future<Output = ()> + 'static {
        let (mut told, seen) = (self.told.clone(), self.seen);
        async move {
            let more = told.wait_for(|told| told.is_some() && *told > seen);
            if more.await.is_err() {
                // The keep-alive task ended: so did the session, which `alive` tells.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A keep-alive's [`PeersLapse`](crate::PeersLapse), on the local clock.
#[derive(Clone, Copy, Debug)]
pub(super) struct PeersLapseSeen {
    /// When the first other member lapses unless heard from again: the keep-alive's
    /// answer counted from when it was sent, so never later than the store's account
    /// (but for [`LAPSE_NUDGE`], as after a read of the members).
    pub(super) at: Instant,
    /// When the answer came, so no later than when the store judged.
    pub(super) answered: Instant,
    /// How many other nodes of the registry were live.
    pub(super) live: usize,
    /// The registry TTL it was judged by.
    pub(super) ttl: Duration,
}

impl PeersLapseSeen {
    /// A time before which no member of the group lapses, given `known`, one such time
    /// by an earlier account that saw `live` other nodes of the registry (joins, leaves
    /// and closed sessions are pushed, so no member came since), for a registry of TTL
    /// `ttl`. The keep-alive's account covers every node that lapsed less than a TTL
    /// before it was judged; it adds to `known` only when that reaches back to `known`,
    /// so a member that lapsed between the two accounts cannot be missed, and when it
    /// counts as many other nodes live, so none lapsed (even one whose session is gone).
    pub(super) fn bound(&self, known: Instant, live: usize, ttl: Duration) -> Instant {
        // `known` carries a read's nudge too.
        if self.ttl == ttl && self.live == live && self.answered + LAPSE_NUDGE < known + ttl {
            known.max(self.at)
        } else {
            known
        }
    }
}

/// Sends `value` on `told` if it is more than what was told: counts and change numbers
/// only grow, and an answer overtaken by a later one (keep-alives are sent one at a
/// time, but kept as a maximum all the same) must not take them back.
fn raise<T: PartialOrd>(told: &watch::Sender<T>, value: T) {
    told.send_if_modified(|known| {
        let more = value > *known;
        if more {
            *known = value;
        }
        more
    });
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

/// The member's side of its session: opening one, losing it, closing it at shutdown.
impl Member<'_> {
    /// Opens a session, retrying on store errors until shutdown.
    pub(super) async fn open_session(&mut self, shutdown: &CancellationToken) {
        let options = self.options().clone();
        loop {
            let sent = Instant::now();
            let attempt = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                attempt = self.elector.store.open_session(&options.node_id, options.lease_ttl) => attempt,
            };
            match attempt {
                Ok(grant) => {
                    info!(group = %options.group, node = %options.node_id, session = %grant.id,
                        "session opened");
                    let (store, timing) = (self.elector.store.clone(), options.timing());
                    let published = self.elector.deadline.clone();
                    let told = self.elector.latest_change.clone();
                    self.session =
                        Some(Session::start(store, timing, sent, &grant, published, told));
                    return;
                }
                Err(error) if !error.is_transient() => {
                    warn!(%error, "cannot open a session; retrying");
                }
                Err(error) => warn!(%error, "opening a session failed; retrying"),
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(options.retry_interval) => {}
            }
        }
    }

    /// The session is gone: stop every shard's work, forget the session. (Its heartbeats
    /// stopped with it, see `Membership::join`; the member joins again once a new
    /// session is open.)
    pub(super) async fn lose_everything(&mut self) {
        self.stop_work().await;
        // Whatever the session held frees as it ends, and a release still on its way
        // cannot end a later term: those take new tokens.
        self.pending_releases.clear();
        // A push about a term of the ended session is refused on that account.
        self.latest_terms.clear();
        self.lost_acquires.clear();
        self.lost_acquire_at = None;
        self.look_put_off = None;
        self.session = None;
        self.elector.deadline.send_replace(None);
    }

    /// Shutdown, after the member left the group: close the session, releasing every
    /// shard at once (the others, having seen the leave, wait on them by now).
    pub(super) async fn close_session(&mut self) {
        if let Some(session) = self.session.take() {
            self.elector.deadline.send_replace(None);
            let close = self.elector.store.close_session(session.id);
            match tokio::time::timeout_at(session.deadline(), close).await {
                Ok(Ok(_)) => info!(session = %session.id, "session closed; every shard released"),
                Ok(Err(error)) => {
                    warn!(%error, "closing the session failed; it expires on its own")
                }
                Err(_) => warn!("closing the session timed out; it expires on its own"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
    use crate::{InMemoryLeaseStore, TokioClock};

    const TTL: Duration = Duration::from_secs(3);

    fn seen(at: Instant, answered: Instant, live: usize, ttl: Duration) -> PeersLapseSeen {
        PeersLapseSeen {
            at,
            answered,
            live,
            ttl,
        }
    }

    /// A keep-alive's account puts the next read off only when it covers every member
    /// that may have lapsed since the last bound, counts as many live, and was judged by
    /// the registry's TTL.
    #[test]
    fn a_keep_alive_puts_the_read_off_only_when_its_account_reaches_back() {
        let known = Instant::now();
        let later = known + 2 * TTL;
        let answered = known + TTL / 3;
        assert_eq!(seen(later, answered, 3, TTL).bound(known, 3, TTL), later);
        // Never sooner than what is known.
        assert_eq!(
            seen(known - TTL, answered, 3, TTL).bound(known, 3, TTL),
            known
        );
        // Answered a TTL or more after the known bound: a member that lapsed right at it
        // may have dropped out of the keep-alive's account.
        let late = known + TTL;
        assert_eq!(seen(later, late, 3, TTL).bound(known, 3, TTL), known);
        // One fewer live: one lapsed, whatever the lapse says.
        assert_eq!(seen(later, answered, 2, TTL).bound(known, 3, TTL), known);
        // Judged by another registry's TTL.
        assert_eq!(
            seen(later, answered, 3, TTL * 2).bound(known, 3, TTL),
            known
        );
    }

    /// A store that tells the other members lapse further ahead than the clock reaches.
    struct BeyondTheClock;

    #[async_trait::async_trait]
    impl Interceptor for BeyondTheClock {
        async fn intercept(&self, call: Call, next: Next) -> Reply {
            match next.run(call).await {
                Reply::KeptAlive(Ok(Some(mut grant))) => {
                    if let Some(told) = grant.peers_lapse.as_mut() {
                        told.after = Duration::MAX;
                    }
                    Reply::KeptAlive(Ok(Some(grant)))
                }
                other => other,
            }
        }
    }

    /// An account of the peers past the clock's range is dropped: the session goes on
    /// being kept alive (the task adding it to the clock once panicked, and the member's
    /// shards lapsed with its renewals).
    #[tokio::test(start_paused = true)]
    async fn an_account_past_the_clocks_range_is_dropped() {
        let memory = InMemoryLeaseStore::with_clock(TokioClock::new());
        let _registry = memory.registry(TTL).unwrap();
        let store = InterceptStore::new(Arc::new(memory)).with(Arc::new(BeyondTheClock));
        let store: Arc<dyn LeaseStore> = Arc::new(store);
        let sent = Instant::now();
        let grant = store.open_session("m", TTL).await.unwrap();
        let timing = LeaseLeaderOptions {
            lease_ttl: TTL,
            renew_interval: TTL / 3,
            ..LeaseLeaderOptions::default()
        };
        let (published, _) = watch::channel(None);
        let (told, _) = watch::channel(None);
        let session = Session::start(store, timing, sent, &grant, published, told);
        tokio::time::sleep(3 * TTL).await;
        assert!(
            *session.deadline.borrow() > sent + 2 * TTL,
            "renewals went on"
        );
        assert!(session.peers_lapse().is_none());
        assert!(!session.alive.is_cancelled());
    }
}
