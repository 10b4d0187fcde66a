//! Draining a member of a shard group: moving every shard away from it before it stops.
//!
//! Most moves are planned (a deploy, a host going for maintenance). Stopping a member
//! moves its shards too, but only once it is gone, and each shard's work starts again
//! elsewhere after the push of its release. A drain moves them while the member still
//! runs, a few at a time, each handed over as on a graceful leave; the member is then
//! idle and can stop without moving anything.
//!
//! A drain is asked in process ([`ShardElector::set_draining`]) or from anywhere with
//! the store alone ([`request_drain`]: `tenure drain`), which leaves a request there: a
//! term on the member's *drain role* ([`drain_role`]: `tenure.drain/GROUP/NODE`) held by
//! the requester for a hold time. A member watches its own drain role by the store's
//! push. While it is draining it leaves the group's membership (the others retarget
//! its shards at once), contends for nothing, and hands every shard over, at most
//! `max_moves_in_flight` at once. When the request ends (cancelled, or lapsed after its
//! hold) it joins again and takes its share back, so a drained member left running is
//! not lost to the group for good.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::debug;

use crate::lease::validate_name;
use crate::{ChangeMark, Error, FencingToken, LeaseStore, Result};

/// The prefix of drain roles: `tenure.drain/GROUP/NODE` carries requests to drain
/// member `NODE` of group `GROUP`. Roles of one's own should not start with it.
pub const DRAIN_ROLE_PREFIX: &str = "tenure.drain/";

/// How often a member reads its drain role without a push (a missed push); a request
/// that lapses is read again at its expiry. On a store whose keep-alives tell the
/// latest lease change ([`crate::SessionGrant::latest_change`]) the read is skipped
/// while no lease changed since the last one, up to [`DRAIN_POLL_TOLD`].
const DRAIN_POLL: Duration = Duration::from_secs(60);

/// How long a member waits on its drain role's push alone while its keep-alives tell
/// that no lease changed (a drain request is a change): a net under the net.
const DRAIN_POLL_TOLD: Duration = Duration::from_secs(3600);

/// How often a member reads its drain role on a store whose waits poll
/// ([`LeaseStore::change_poll`]; SQLite where another process's writes are not
/// announced): a drain asked there is seen within this, and the watch costs one read
/// per this instead of one per poll of the store (a read every 10 ms: half the CPU of a
/// settled group).
const DRAIN_POLL_SLOW_STORE: Duration = Duration::from_secs(1);

/// How often [`request_drain`] counts the member's shards without a push of one of them.
const COUNT_POLL: Duration = Duration::from_millis(250);

/// The drain role of member `node` of `group`; an error naming the field too long once
/// the prefix is added, or not a valid name.
pub fn drain_role(group: &str, node: &str) -> Result<String> {
    validate_name("group", group)?;
    validate_name("node", node)?;
    let drain = format!("{DRAIN_ROLE_PREFIX}{group}/{node}");
    validate_name("node", &drain).map_err(|_| {
        Error::invalid(
            "node",
            format!(
                "group and node together are {} bytes long; a member that can be drained \
                 has at most {} (its drain role adds {DRAIN_ROLE_PREFIX:?} and a '/')",
                group.len() + node.len(),
                crate::lease::MAX_NAME_LEN - DRAIN_ROLE_PREFIX.len() - 1
            ),
        )
    })?;
    Ok(drain)
}

/// How a [`request_drain`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every shard the member held is held by another member now, and it holds none.
    Drained {
        /// Shards the member held when asked.
        held: usize,
        /// From the request to the last of them held elsewhere.
        took: Duration,
    },
    /// A drain of this member is already asked, by `by`; nothing was asked.
    AlreadyAsked {
        /// The requester of the drain in force.
        by: String,
    },
    /// The member still held `left` shards (of `held`) when the timeout passed: it is
    /// not running, runs a tenure without drains, or its shards' work does not stop.
    /// The request stays in force for its hold.
    NotDrained {
        /// Shards the member held when asked.
        held: usize,
        /// Shards it still held.
        left: usize,
    },
}

/// Asks member `node` of `group` to drain, and waits up to `timeout` until the store
/// shows every shard it held taken by another member, and none held by it. The request stays in force for `hold`
/// (whole seconds, at least one), so the member stays drained while it is stopped; end
/// it sooner with [`cancel_drain`]. `requester` names the asker.
pub async fn request_drain(
    store: Arc<dyn LeaseStore>,
    group: &str,
    node: &str,
    requester: &str,
    hold: Duration,
    timeout: Duration,
) -> Result<DrainOutcome> {
    let drain = drain_role(group, node)?;
    validate_name("requester", requester)?;
    if timeout.is_zero() {
        return Err(Error::invalid("timeout", "must be greater than zero"));
    }
    if hold < timeout {
        return Err(Error::invalid(
            "hold",
            format!("{hold:?} is shorter than the timeout ({timeout:?}): the member would join again while still being drained"),
        ));
    }
    let ttl = Duration::from_secs(hold.as_secs().max(1)).max(store.min_ttl());
    let started = Instant::now();
    let held: Vec<String> = unmoved(store.as_ref(), group, node, &[])
        .await?
        .into_iter()
        .map(|(role, ..)| role)
        .collect();
    let asked = store
        .try_acquire_or_renew_with_value(&drain, requester, ttl, None)
        .await?;
    if !asked.acquired {
        return Ok(DrainOutcome::AlreadyAsked { by: asked.holder });
    }
    let deadline = started + timeout;
    loop {
        let left = unmoved(store.as_ref(), group, node, &held).await?;
        if left.is_empty() {
            return Ok(DrainOutcome::Drained {
                held: held.len(),
                took: started.elapsed(),
            });
        }
        if Instant::now() >= deadline {
            return Ok(DrainOutcome::NotDrained {
                held: held.len(),
                left: left.len(),
            });
        }
        // One of its shards moving is the push to count again: the end of the
        // member's term, or a new term of a shard it released.
        let (shard, token, free) = left[0].clone();
        let until = deadline.min(Instant::now() + COUNT_POLL);
        if free {
            store.wait_for_term(&shard, token, until).await;
        } else {
            store.wait_for_change(&shard, token, until).await;
        }
    }
}

/// Ends the drain of member `node` of `group` in force, if any: the member joins again.
/// Returns whether a request was in force.
pub async fn cancel_drain(store: &dyn LeaseStore, group: &str, node: &str) -> Result<bool> {
    let drain = drain_role(group, node)?;
    let Some(info) = store.get(&drain).await? else {
        return Ok(false);
    };
    let Some(holder) = info.live_holder() else {
        return Ok(false);
    };
    store.release(&drain, holder, info.fencing_token).await
}

/// The shards of `group` (role, token, free) the store shows held by `node`, or of
/// those in `held` free: not yet running elsewhere.
async fn unmoved(
    store: &dyn LeaseStore,
    group: &str,
    node: &str,
    held: &[String],
) -> Result<Vec<(String, FencingToken, bool)>> {
    Ok(store
        .list_prefix(&format!("{group}/"))
        .await?
        .into_iter()
        .filter(|lease| match lease.live_holder() {
            Some(holder) => holder == node,
            None => held.contains(&lease.role),
        })
        .map(|lease| {
            let free = lease.live_holder().is_none();
            (lease.role, lease.fencing_token, free)
        })
        .collect())
}

/// Keeps `draining` set while a drain request for the member lives in the store (see
/// the [module](self) docs); runs until every receiver is gone. `told` is the store's
/// latest lease change as the member's keep-alives tell it (`None` on a store that does
/// not): while it does not move, nothing the push could have missed happened.
pub(super) async fn watch_requests(
    store: Arc<dyn LeaseStore>,
    drain: String,
    draining: watch::Sender<bool>,
    mut told: watch::Receiver<Option<ChangeMark>>,
) {
    loop {
        if draining.is_closed() {
            return;
        }
        let now = Instant::now();
        // Before the read: a change it may not show moves the number past this.
        let told_at_read = *told.borrow_and_update();
        let (asked, wait) = match store.get(&drain).await {
            Ok(Some(info)) if info.live_holder().is_some() => {
                let left = info.remaining();
                (true, Some((info.fencing_token, left.min(DRAIN_POLL))))
            }
            Ok(Some(info)) => (false, Some((info.fencing_token, DRAIN_POLL))),
            Ok(None) => (false, None),
            Err(error) => {
                debug!(%error, drain, "reading drain requests failed; trying again");
                tokio::time::sleep(DRAIN_POLL.min(Duration::from_secs(1))).await;
                continue;
            }
        };
        draining.send_if_modified(|now_draining| {
            let changed = *now_draining != asked;
            *now_draining = asked;
            changed
        });
        if store.change_poll().is_some() {
            let wait = wait.map_or(DRAIN_POLL, |(_, wait)| wait + LAPSE_NUDGE);
            tokio::time::sleep(wait.min(DRAIN_POLL_SLOW_STORE)).await;
            continue;
        }
        match wait {
            // A live request: wake when it changes or lapses.
            Some((token, wait)) if asked => {
                store
                    .wait_for_change(&drain, token, now + wait + LAPSE_NUDGE)
                    .await
            }
            // No live request: wake on a new term's push, or when a minute passed and a
            // lease changed since the read, or at the deadline.
            Some((token, _)) => {
                await_request(&store, &drain, token, now, &mut told, told_at_read).await
            }
            None => {
                let none = FencingToken::from(0);
                await_request(&store, &drain, none, now, &mut told, told_at_read).await
            }
        }
    }
}

/// Waits for a term of `drain` after `after` (read at `now`): its push, or
/// [`DRAIN_POLL`] if the store's keep-alives do not tell changes. Where they do, up to
/// [`DRAIN_POLL_TOLD`], or until [`DRAIN_POLL`] passed and `told` moved past
/// `told_at_read`: a settled member then reads nothing while nothing changes.
async fn await_request(
    store: &Arc<dyn LeaseStore>,
    drain: &str,
    after: FencingToken,
    now: Instant,
    told: &mut watch::Receiver<Option<ChangeMark>>,
    told_at_read: Option<ChangeMark>,
) {
    if told_at_read.is_none() {
        store.wait_for_term(drain, after, now + DRAIN_POLL).await;
        return;
    }
    let changed_since_read = async {
        tokio::time::sleep_until(now + DRAIN_POLL).await;
        if told
            .wait_for(|latest| *latest > told_at_read)
            .await
            .is_err()
        {
            // The member is gone: the deadline ends the wait.
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        biased;
        _ = store.wait_for_term(drain, after, now + DRAIN_POLL_TOLD) => {}
        _ = changed_since_read => {}
    }
}

/// How long after a request's expiry it is read again: store and local clocks tick at
/// about the same rate, and a read a moment early finds it still live.
const LAPSE_NUDGE: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use parking_lot::Mutex;

    use super::*;
    use crate::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
    use crate::{InMemoryLeaseStore, TokioClock};

    /// Counts the calls by method, and says the store polls every `poll` if given.
    /// With `no_push`, a wait for a term returns only at its deadline (every push lost).
    #[derive(Default)]
    struct Calls {
        poll: Option<Duration>,
        no_push: bool,
        made: Mutex<BTreeMap<&'static str, usize>>,
    }

    #[async_trait::async_trait]
    impl Interceptor for Calls {
        async fn intercept(&self, call: Call, next: Next) -> Reply {
            *self.made.lock().entry(call.method()).or_default() += 1;
            match call {
                Call::WaitForTerm { deadline, .. } if self.no_push => {
                    tokio::time::sleep_until(deadline).await;
                    Reply::Changed
                }
                call => next.run(call).await,
            }
        }

        fn change_poll(&self, _below: Option<Duration>) -> Option<Duration> {
            self.poll
        }
    }

    /// Watches `node`'s drain requests for `during` on a store that polls every
    /// `poll` (or pushes: every push lost with `no_push`), asking a drain after
    /// `asked_after`, the member's keep-alives telling the latest change on `told`
    /// (moved on at the ask): the calls the watch made, and how long after the ask it
    /// saw the drain.
    async fn watch_for(
        calls: Calls,
        told: Option<ChangeMark>,
        during: Duration,
        asked_after: Duration,
    ) -> (BTreeMap<&'static str, usize>, Option<Duration>) {
        let memory: Arc<dyn LeaseStore> =
            Arc::new(InMemoryLeaseStore::with_clock(TokioClock::new()));
        let calls = Arc::new(calls);
        let store = InterceptStore::new(memory.clone()).with(calls.clone());
        let drain = drain_role("jobs", "a").unwrap();
        let (draining, mut seen) = watch::channel(false);
        let (latest, latest_rx) = watch::channel(told);
        tokio::spawn(watch_requests(
            Arc::new(store),
            drain.clone(),
            draining,
            latest_rx,
        ));
        tokio::time::sleep(asked_after).await;
        let asked = Instant::now();
        let ask = memory.try_acquire_or_renew(&drain, "ops", 10 * during);
        assert!(ask.await.unwrap().acquired);
        latest.send_modify(|told| *told = told.map(|mark| ChangeMark::new(mark.get() + 1)));
        let saw = tokio::time::timeout(during, seen.wait_for(|draining| *draining)).await;
        let saw = saw.is_ok().then(|| asked.elapsed());
        let made = calls.made.lock().clone();
        (made, saw)
    }

    /// On a store whose waits poll, the watch reads once a second rather than waiting
    /// (a wait there reads every poll: 100 reads a second on SQLite), and sees a drain
    /// within that second; on a store that pushes it waits, and sees the drain at once.
    #[tokio::test(start_paused = true)]
    async fn the_watch_reads_once_a_second_on_a_store_that_polls() {
        let minute = Duration::from_secs(60);
        let polls = Calls {
            poll: Some(Duration::from_millis(10)),
            ..Calls::default()
        };
        let (calls, saw) = watch_for(polls, None, minute, Duration::from_millis(30_500)).await;
        assert_eq!(calls.get("wait_for_term"), None, "{calls:?}");
        let gets = calls.get("get").copied().unwrap_or_default();
        assert!((30..=33).contains(&gets), "{gets} reads in 31 s: {calls:?}");
        let saw = saw.expect("the drain is seen");
        assert!(saw <= DRAIN_POLL_SLOW_STORE, "seen after {saw:?}");

        let pushes = Calls::default();
        let (calls, saw) = watch_for(pushes, None, minute, Duration::from_millis(30_500)).await;
        assert_eq!(calls.get("get"), Some(&2), "{calls:?}");
        assert_eq!(saw, Some(Duration::ZERO), "pushed at once");
    }

    /// Where the member's keep-alives tell the latest lease change, the watch reads its
    /// role only after a change: nothing in ten minutes while nothing changes (the
    /// first read and wait aside; ten of each when it read every minute), and a drain
    /// whose push is lost is seen a minute after the last read, as before (asked 30 s
    /// after it: seen 30 s later, not at the hour's net).
    #[tokio::test(start_paused = true)]
    async fn the_watch_reads_nothing_while_no_lease_changes() {
        let told = Some(ChangeMark::new(7));
        let ten_minutes = Duration::from_secs(600);
        let (calls, saw) =
            watch_for(Calls::default(), told, Duration::from_secs(1), ten_minutes).await;
        assert_eq!(calls.get("get"), Some(&2), "{calls:?}");
        assert_eq!(saw, Some(Duration::ZERO), "pushed at once");

        let lost = Calls {
            no_push: true,
            ..Calls::default()
        };
        let asked_after = Duration::from_secs(30);
        let (calls, saw) = watch_for(lost, told, 2 * DRAIN_POLL, asked_after).await;
        let saw = saw.expect("a drain whose push is lost is seen once the number moved");
        assert_eq!(
            saw,
            Duration::from_secs(30),
            "seen at the minute's end: {calls:?}"
        );
    }
}
