//! The follower's side of the elector: contend for the role, wait in the queue for a
//! push or a timer, and leave the queue when contending stops.

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::term::{Answer, Attempt, AttemptFuture, Term};
use super::{ElectionState, LeaseLeaderElector, EXPIRY_MARGIN};
use crate::{Error, FencingToken, LeaseResult, Result, TermChange};

impl LeaseLeaderElector {
    /// Sends one acquire or renew request.
    pub(super) fn attempt<'a>(&'a self, role: &'a str) -> AttemptFuture<'a> {
        Box::pin(async move {
            let sent = Instant::now();
            // Queued: a release hands the role to the oldest waiting contender, so a
            // handover is one write however many wait.
            let result = self
                .store
                .try_acquire_or_queue(
                    role,
                    &self.options.owner_id,
                    self.options.lease_ttl,
                    self.options.advertise.as_deref(),
                )
                .await;
            Attempt {
                sent,
                received: Instant::now(),
                result,
            }
        })
    }

    /// The term an acquiring answer starts, or `None` (logged) when its deadline has
    /// passed already.
    pub(super) fn begin(&self, role: &str, answer: &Answer) -> Option<Term> {
        let term = Term::begin(&self.options, answer);
        if term.is_none() {
            warn!(role, owner = %self.options.owner_id, token = %answer.result.fencing_token,
                granted = ?answer.result.remaining(), waited = ?answer.sent.elapsed(),
                "the term's local deadline passed before work could start; contending again");
        }
        term
    }

    /// Follower loop: returns the term won, or `None` on shutdown.
    pub(super) async fn contend(
        &self,
        role: &str,
        mut observed: Option<Answer>,
        shutdown: &CancellationToken,
    ) -> Result<Option<Term>> {
        loop {
            if let Some(answer) = observed.take() {
                self.publish_follower(&answer.result);
                if !self.wait_turn(role, &answer, shutdown).await {
                    self.leave_queue(role).await;
                    return Ok(None);
                }
            }
            // An answer arriving after the local window could not start a usable term
            // (its deadline would have passed), so a call that has not answered by then
            // is abandoned; waiting on it could block this contender forever.
            let window = self.options.leadership_window();
            let attempt = tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    self.leave_queue(role).await;
                    return Ok(None);
                }
                attempt = tokio::time::timeout(window, self.attempt(role)) => attempt,
            };
            let Ok(Attempt {
                sent,
                received,
                result,
            }) = attempt
            else {
                warn!(role, owner = %self.options.owner_id, waited = ?window,
                    "acquire got no answer within the local window; retrying");
                continue;
            };
            match result {
                Ok(result) if result.acquired => {
                    let release_may_land = self.release_may_land(role, result.fencing_token);
                    let answer = Answer {
                        result,
                        sent,
                        received,
                    };
                    if release_may_land {
                        // The store still holds the term whose release is on its way:
                        // end it here, then contend for a new term (a new token).
                        warn!(role, owner = %self.options.owner_id, token = %answer.result.fencing_token,
                            "renewed a term whose release may still land; releasing it again first");
                        if let Some(term) = Term::begin(&self.options, &answer) {
                            if self.release(role, &term).await {
                                continue;
                            }
                        }
                    } else if let Some(term) = self.begin(role, &answer) {
                        return Ok(Some(term));
                    }
                }
                Ok(result) => {
                    self.release_may_land(role, result.fencing_token);
                    debug!(role, owner = %self.options.owner_id, holder = %result.holder,
                        token = %result.fencing_token, "lease held by another owner; waiting");
                    observed = Some(Answer {
                        result,
                        sent,
                        received,
                    });
                    continue;
                }
                Err(error) if !error.is_transient() => return Err(error),
                Err(error) => {
                    warn!(role, owner = %self.options.owner_id, %error,
                        "acquire failed; retrying after a store error");
                }
            }
            // A store error, or a term too short to use: try again after a pause.
            let wait = self.jittered(self.options.retry_interval);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(None),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Waits for this contender's turn after `answer` named another holder: a push that
    /// the term ended or was handed to us, the holder's expiry (plus a margin), or the
    /// retry interval (which refreshes our place in the queue), whichever is first.
    /// A push that the term went to another candidate is followed without asking the
    /// store: we keep our place and wait for the next change. Returns `false` on
    /// shutdown.
    pub(super) async fn wait_turn(
        &self,
        role: &str,
        answer: &Answer,
        shutdown: &CancellationToken,
    ) -> bool {
        // The candidacy lasts `lease_ttl`; the renew interval is well inside it.
        let retry = self
            .jittered(self.options.retry_interval)
            .min(self.options.renew_interval);
        let retry = answer.received + retry;
        let expiry = answer.received + answer.result.remaining() + EXPIRY_MARGIN;
        let mut deadline = retry.min(expiry);
        let mut observed = answer.result.fencing_token;
        loop {
            let change = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return false,
                change = self.store.wait_for_successor(role, observed, deadline) => change,
            };
            match change {
                TermChange::Began {
                    holder,
                    fencing_token,
                    ..
                } if holder != self.options.owner_id && Instant::now() < retry => {
                    debug!(role, owner = %self.options.owner_id, %holder, token = %fencing_token,
                        "the term passed to another contender; keeping our place");
                    self.publish_holder(Some((holder, fencing_token)));
                    // The new term's expiry is unknown until our next attempt reads it.
                    observed = fencing_token;
                    deadline = retry;
                }
                _ => return true,
            }
        }
    }

    /// Leaves the queue when this contender stops waiting, so no release hands the role
    /// to it; a term a release handed it meanwhile (nobody would lead it) is released.
    /// Bounded by the leadership window: a store that does not answer by then leaves a
    /// candidacy that lapses on its own.
    pub(super) async fn leave_queue(&self, role: &str) {
        let owner = self.options.owner_id.as_str();
        let left = tokio::time::timeout(self.options.leadership_window(), async {
            self.store.withdraw(role, owner).await?;
            if let Some(info) = self.store.get(role).await? {
                if info.live_holder() == Some(owner) {
                    self.store.release(role, owner, info.fencing_token).await?;
                }
            }
            Ok::<(), Error>(())
        })
        .await;
        match left {
            Ok(Ok(())) => debug!(role, owner, "left the queue"),
            Ok(Err(error)) => {
                warn!(role, owner, %error, "leaving the queue failed; the candidacy lapses on its own")
            }
            Err(_) => {
                warn!(
                    role,
                    owner, "leaving the queue timed out; the candidacy lapses on its own"
                )
            }
        }
    }

    pub(super) fn publish_follower(&self, result: &LeaseResult) {
        self.publish_holder(Some((result.holder.clone(), result.fencing_token)));
    }

    pub(super) fn publish_holder(&self, holder: Option<(String, FencingToken)>) {
        self.state.send_if_modified(|state| {
            let next = ElectionState::Follower {
                holder: holder.clone(),
            };
            if *state == next {
                false
            } else {
                *state = next;
                true
            }
        });
    }

    /// Whether a release of `role`'s term `token` may still land. A pending release of
    /// another term is forgotten: the store has moved past it (tokens only grow), so it
    /// can no longer end anything.
    pub(super) fn release_may_land(&self, role: &str, token: FencingToken) -> bool {
        let mut pending = self.pending_releases.lock();
        match pending.get(role) {
            Some(pending_token) if *pending_token == token => true,
            Some(_) => {
                pending.remove(role);
                false
            }
            None => false,
        }
    }

    pub(super) fn jittered(&self, base: Duration) -> Duration {
        let jitter = self.options.retry_jitter;
        if jitter == 0.0 {
            return base;
        }
        let factor = self.rng.lock().random_range(1.0 - jitter..=1.0 + jitter);
        base.mul_f64(factor)
    }
}
