//! Taking shards: a member contends for those a look or a push found free, in batches
//! under its session, acts on each answer (starts the term's work, waits for a push
//! about the term that refused it, or gives up for now), and starts a term's work.

use std::future::Future;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::member::{Contended, Term, Wake};
use super::session::Session;
use super::*;

/// A deadline no wait reaches.
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

impl Member<'_> {
    /// Contends for `wanted` (shard, taken as a rescue) in batches of up to the store's
    /// [`LeaseStore::acquire_batch_size`], one [`LeaseStore::acquire_many_in_session`]
    /// call each, up to [`BATCHES_IN_FLIGHT`] at once: a member winning many shards at
    /// once (a join, a cold start) waits a round trip per batch, not one per shard.
    /// Answers are acted on as they come.
    ///
    /// With `planned_for` (the registry's live nodes when the look planned: see
    /// [`MembersSeen::registry`]), no further batch is sent once the registry's live set
    /// differs from it: the plan may be stale, and the next look replans (a join or leave
    /// of another group sharing the registry costs that look too). Without it, a member
    /// that planned alone at a cold start would go on contending for every shard of a
    /// large group, batch after batch, while the others join and it looks at nothing.
    ///
    /// Returns when the latest term that refused one of them ends (on this process's
    /// clock), if one did.
    pub(super) async fn contend<W, Fut>(
        &mut self,
        wanted: Vec<(u32, bool)>,
        work: &mut W,
        wake_tx: &mpsc::UnboundedSender<Wake>,
        planned_for: Option<&[String]>,
    ) -> Option<Instant>
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let Some(session) = &self.session else {
            return None;
        };
        let (id, alive) = (session.id, session.alive.clone());
        let (store, group) = (self.elector.store.clone(), self.options().group.clone());
        let mut queue = wanted
            .chunks(store.acquire_batch_size().max(1))
            .map(<[(u32, bool)]>::to_vec)
            .collect::<Vec<_>>()
            .into_iter();
        let mut calls = JoinSet::new();
        let send = |calls: &mut JoinSet<_>, shards: Vec<(u32, bool)>| {
            let (store, alive) = (store.clone(), alive.clone());
            let roles: Vec<String> = shards.iter().map(|(k, _)| role(&group, *k)).collect();
            calls.spawn(async move {
                // Waits as long as the session lives, not to the deadline in force when
                // the call was sent: a renewal may have moved it, and giving up on an
                // answer that then grants the shards would leave them held by a live
                // session with no work on them.
                let answer = tokio::select! {
                    biased;
                    answer = store.acquire_many_in_session(&roles, id) => Some(answer),
                    _ = alive.cancelled() => None,
                };
                (shards, roles, answer)
            });
        };
        for batch in queue.by_ref().take(BATCHES_IN_FLIGHT) {
            send(&mut calls, batch);
        }
        let registry = self.elector.registry.clone();
        let unsent = queue.len() > 0;
        let members_changed = async {
            match planned_for {
                Some(members) if unsent => {
                    registry
                        .wait_for_members_change(members, Instant::now() + NEVER)
                        .await
                }
                _ => std::future::pending().await,
            }
        };
        tokio::pin!(members_changed);
        let mut stale = false;
        let mut refused_until = None;
        loop {
            let joined = tokio::select! {
                biased;
                joined = calls.join_next() => match joined {
                    Some(joined) => joined,
                    None => break,
                },
                () = &mut members_changed, if !stale => {
                    debug!(unsent = queue.len(), "membership changed while contending; looking again first");
                    stale = true;
                    continue;
                }
            };
            if let Some(batch) = queue.next().filter(|_| !stale) {
                send(&mut calls, batch);
            }
            let Ok((shards, roles, answer)) = joined else {
                continue;
            };
            match answer {
                Some(Ok(results)) if results.len() == shards.len() => {
                    for (((shard, rescued), role), result) in
                        shards.into_iter().zip(roles).zip(results)
                    {
                        let contended = Contended {
                            shard,
                            rescued,
                            role,
                            result,
                        };
                        let ends = self.answered(contended, &alive, work, wake_tx).await;
                        refused_until = refused_until.max(ends);
                    }
                    // Once per batch: the view is rebuilt from every term held, so once
                    // per shard made a cold start quadratic in the shards won.
                    self.publish_owned();
                }
                Some(Ok(results)) => {
                    warn!(
                        asked = shards.len(),
                        answered = results.len(),
                        "the store answered a batch of acquires with a wrong count; retrying"
                    );
                    self.record_lost_acquires(shards.iter().map(|(k, _)| *k));
                }
                Some(Err(Error::SessionEnded(_))) => {
                    if self.session.is_some() {
                        warn!("the session ended while contending");
                        self.lose_everything().await;
                    }
                }
                Some(Err(error)) => {
                    warn!(shards = shards.len(), %error, "could not contend for the shards; retrying");
                    // Any of them may have been granted all the same, now or later (the
                    // request may still be on its way).
                    self.record_lost_acquires(shards.iter().map(|(k, _)| *k));
                }
                None => debug!(shards = shards.len(), "the session ended while contending"),
            }
        }
        refused_until
    }

    /// Records acquires of `shards` whose answers were lost (see
    /// [`Member::lost_acquires`]).
    fn record_lost_acquires(&mut self, shards: impl IntoIterator<Item = u32>) {
        self.lost_acquires.extend(shards);
        self.lost_acquire_at = Some(Instant::now());
    }

    /// Acts on the answer to contending for a shard: start its term, wait for it, or
    /// give up for now. `alive` is that of the session the call was sent under. Returns
    /// when the term that refused it ends (on this process's clock), if one did.
    pub(super) async fn answered<W, Fut>(
        &mut self,
        contended: Contended,
        alive: &CancellationToken,
        work: &mut W,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> Option<Instant>
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let Contended {
            shard,
            rescued,
            role,
            result,
        } = contended;
        match result {
            result if result.acquired => {
                // One term's work at a time here: a second answer for a shard already
                // worked on starts nothing. (Under a newer token, the store may hold the
                // shard for this session with no work on it: a look takes care of it.)
                if let Some(term) = self.terms.get(&shard) {
                    if term.token != result.fencing_token {
                        self.record_lost_acquires([shard]);
                    }
                    debug!(shard, token = %result.fencing_token, "already worked on here");
                    return None;
                }
                self.start_term(shard, result.fencing_token, rescued, alive, work, wake_tx);
                None
            }
            result => {
                // Held elsewhere (a handover in progress): wake on the store's push. A
                // bounded number of waiters: each costs the store a read before it
                // waits, and thousands at once (a member joining a large group) would
                // starve the session's own renewals; the rest wait for the next look.
                self.wait_for_push(shard, role, result.fencing_token, wake_tx);
                Some(Instant::now() + result.remaining())
            }
        }
    }

    /// Starts the work of `shard`'s term `token`, held under the session whose `alive`
    /// is given (acquired, or handed here), unless that session is past its deadline or
    /// a release of the same term may still land.
    pub(super) fn start_term<W, Fut>(
        &mut self,
        shard: u32,
        token: FencingToken,
        rescued: bool,
        alive: &CancellationToken,
        work: &mut W,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        // Never start work for a term whose deadline has passed.
        let deadline = self.session.as_ref().map(Session::deadline);
        if alive.is_cancelled() || deadline.is_none_or(|d| Instant::now() >= d) {
            return;
        }
        match self.pending_releases.get(&shard) {
            // The session still holds the term whose release may yet land and end it:
            // released again at the next look, then taken under a new token.
            Some(pending) if *pending == token => {
                debug!(shard, token = %token,
                    "not working under a token whose release may still land");
                return;
            }
            // A newer term: the late release of an older one cannot end it.
            Some(_) => {
                self.pending_releases.remove(&shard);
            }
            None => {}
        }
        self.saw_term(shard, token);
        let leadership = alive.child_token();
        let future = work(shard, token, leadership.clone());
        let wake = wake_tx.clone();
        let task = tokio::spawn(async move {
            let outcome = work_outcome(tokio::spawn(future).await);
            let _ = wake.send(Wake::WorkEnded(shard, token));
            outcome
        });
        info!(shard, token = %token, "shard term started");
        self.orphaned_since.remove(&shard);
        self.owned_changes.insert(shard);
        self.terms.insert(
            shard,
            Term {
                token,
                leadership,
                task,
                handing_over: false,
                rescued,
                started: Instant::now(),
                probe: false,
            },
        );
    }

    /// Waits (for at most a TTL) for the store to push a change of `shard`, held
    /// elsewhere under `observed`; the push wakes this member with
    /// [`Wake::ShardChanged`]. Not when [`MAX_WAITERS`] shards are waited on already,
    /// or this one is.
    pub(super) fn wait_for_push(
        &mut self,
        shard: u32,
        role: String,
        observed: FencingToken,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) {
        if self.waiting.len() >= MAX_WAITERS || !self.waiting.insert(shard) {
            return;
        }
        let store = self.elector.store.clone();
        let wake = wake_tx.clone();
        let until = Instant::now() + self.options().lease_ttl;
        tokio::spawn(async move {
            let change = store.wait_for_successor(&role, observed, until).await;
            let _ = wake.send(Wake::ShardChanged(shard, change));
        });
    }
}
