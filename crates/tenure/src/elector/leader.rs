//! The leader's side of the elector: run the work for one term, renew on schedule,
//! and end the term (lost, shutdown, work returned, planned handoff) with the work
//! awaited before the store is told.

use std::future::Future;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::handoff::Asked;

use super::term::{in_flight, Answer, Attempt, AttemptFuture, HandoffRequest, Term, TermEnd};
use super::{work_outcome, ElectionState, LeaseLeaderElector, WorkOutcome};
use crate::{Error, FencingToken, Result};

impl LeaseLeaderElector {
    /// Leader loop for one term: run work, renew on schedule, and stop at the first of
    /// shutdown, work returning, the local deadline, or a renewal that lost the term.
    pub(super) async fn lead<W, Fut>(
        &self,
        role: &str,
        mut term: Term,
        work: &mut W,
        shutdown: &CancellationToken,
    ) -> TermEnd
    where
        W: FnMut(FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let owner = self.options.owner_id.as_str();
        info!(role, owner, token = %term.token, window = ?term.window, "elected");
        metrics::counter!("tenure_terms_started_total", "role" => role.to_owned()).increment(1);
        metrics::gauge!("tenure_is_leader", "role" => role.to_owned()).set(1.0);
        metrics::gauge!("tenure_fencing_token", "role" => role.to_owned())
            .set(term.token.get() as f64);
        self.state.send_replace(ElectionState::Leader {
            fencing_token: term.token,
        });
        self.deadline.send_replace(Some(term.deadline()));

        let leadership = CancellationToken::new();
        // Work runs on its own task: if this future is dropped mid-term (the caller's
        // select! moved on, its task was aborted), nothing renews any more, so the work
        // must be told it no longer leads.
        let _cancel_on_drop = leadership.clone().drop_guard();
        let mut task: JoinHandle<Fut::Output> = tokio::spawn(work(term.token, leadership.clone()));
        let mut renewal: Option<AttemptFuture<'_>> = None;
        let mut requests = Box::pin(self.handoff_requests(role, term.token));
        // A handoff asked, while the leader reads whether its successor waits: beside
        // the renewals, not instead of them (a slow read must not end a healthy term).
        let mut checking: Option<(AskedOf, SuccessorCheck<'_>)> = None;
        let end = loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break TermEnd::Shutdown,
                joined = &mut task => break TermEnd::WorkReturned(work_outcome(joined)),
                asked = &mut requests, if checking.is_none() => {
                    let successor = asked.successor;
                    self.handoffs_acted.lock().insert(role.to_owned(), asked.request_token);
                    info!(role, owner, token = %term.token, ?successor, "handoff asked through the store");
                    let check = self.successor_waits(role, successor.clone(), term.deadline());
                    checking = Some((AskedOf::Store(successor), Box::pin(check)));
                }
                _ = self.handoff_requested.notified(), if checking.is_none() => {
                    if let Some(request) = self.take_handoff(term.token) {
                        let check =
                            self.successor_waits(role, request.successor.clone(), term.deadline());
                        checking = Some((AskedOf::InProcess(request), Box::pin(check)));
                    }
                }
                waits = checked(&mut checking), if checking.is_some() => {
                    // The arm runs only while a check is in flight.
                    let Some((asked, _)) = checking.take() else { continue };
                    match asked {
                        AskedOf::Store(successor) if waits => {
                            break TermEnd::HandOff(HandoffRequest {
                                token: term.token,
                                successor,
                                // Nobody in this process waits for the answer.
                                answer: oneshot::channel().0,
                            });
                        }
                        AskedOf::Store(_) => {
                            requests = Box::pin(self.handoff_requests(role, term.token));
                        }
                        AskedOf::InProcess(request) if waits => {
                            break TermEnd::HandOff(request);
                        }
                        AskedOf::InProcess(request) => {
                            let _ = request.answer.send(Ok(false));
                        }
                    }
                }
                _ = tokio::time::sleep_until(term.deadline()) => {
                    warn!(role, owner, token = %term.token,
                        reason = "local deadline passed without a successful renewal", "leadership lost");
                    break TermEnd::Lost(None);
                }
                attempt = in_flight(&mut renewal), if renewal.is_some() => {
                    renewal = None;
                    if let Some(lost) = self.renewal_answered(role, &mut term, attempt) {
                        break lost;
                    }
                    let deadline = Some(term.deadline());
                    self.deadline.send_if_modified(|published| {
                        let moved = *published != deadline;
                        *published = deadline;
                        moved
                    });
                }
                _ = tokio::time::sleep_until(term.next_renew), if renewal.is_none() => {
                    renewal = Some(self.attempt(role));
                }
            }
        };
        self.end_term(role, &term, &leadership, task, renewal, end)
            .await
    }

    /// Applies a renewal's answer to the term; returns how the term ended if it did.
    pub(super) fn renewal_answered(
        &self,
        role: &str,
        term: &mut Term,
        attempt: Attempt,
    ) -> Option<TermEnd> {
        let owner = self.options.owner_id.as_str();
        let token = term.token;
        let Attempt {
            sent,
            received,
            result,
        } = attempt;
        metrics::histogram!("tenure_renew_latency_seconds", "role" => role.to_owned())
            .record((received - sent).as_secs_f64());
        let outcome = |outcome: &'static str| {
            metrics::counter!("tenure_renewals_total", "role" => role.to_owned(), "outcome" => outcome)
                .increment(1);
        };
        match result {
            Ok(result) if result.acquired && result.fencing_token == token => {
                outcome("ok");
                if term.is_late(received) {
                    warn!(role, owner, token = %token, latency = ?(received - sent),
                        spare = ?term.deadline().saturating_duration_since(received),
                        "renewed late: the local deadline was close");
                } else {
                    debug!(role, owner, token = %token, "renewed");
                }
                term.renewed(&self.options, sent, &result);
                None
            }
            Ok(result) => {
                outcome("lost");
                if result.acquired {
                    warn!(role, owner, token = %token, new_token = %result.fencing_token,
                        reason = "the term lapsed and a new one began", "leadership lost");
                } else {
                    warn!(role, owner, token = %token, holder = %result.holder,
                        holder_token = %result.fencing_token,
                        reason = "another owner holds the lease", "leadership lost");
                }
                Some(TermEnd::Lost(Some(Answer {
                    result,
                    sent,
                    received,
                })))
            }
            Err(error) => {
                outcome("failed");
                let retry =
                    self.jittered(self.options.retry_interval.min(self.options.renew_interval));
                warn!(role, owner, token = %token, %error, retry_in = ?retry,
                    deadline_in = ?term.deadline().saturating_duration_since(received),
                    "renewal failed; retrying after a store error");
                term.next_renew = received + retry;
                None
            }
        }
    }

    /// Ends a term: cancels `leadership` and says so once, waits for the work, and on
    /// shutdown or work returning lets a renewal in flight answer, then releases.
    pub(super) async fn end_term<T: WorkOutcome>(
        &self,
        role: &str,
        term: &Term,
        leadership: &CancellationToken,
        task: JoinHandle<T>,
        renewal: Option<AttemptFuture<'_>>,
        end: TermEnd,
    ) -> TermEnd {
        leadership.cancel();
        self.deadline.send_replace(None);
        // Watchers learn of the loss now, not when the work gets round to returning.
        match &end {
            TermEnd::Lost(Some(answer)) if !answer.result.acquired => {
                self.publish_follower(&answer.result)
            }
            _ => {
                self.state
                    .send_replace(ElectionState::Follower { holder: None });
            }
        }
        metrics::gauge!("tenure_is_leader", "role" => role.to_owned()).set(0.0);
        match end {
            TermEnd::Lost(answer) => {
                // The term is over whatever a renewal in flight answers.
                drop(renewal);
                self.await_work(role, term.token, task).await;
                TermEnd::Lost(answer)
            }
            TermEnd::Shutdown => {
                let ((), held) = tokio::join!(
                    self.await_work(role, term.token, task),
                    self.settle(term, renewal)
                );
                self.give_up(role, held).await;
                TermEnd::Shutdown
            }
            TermEnd::WorkReturned(outcome) => {
                // The work has returned: `task` is finished, nothing to wait for.
                let held = self.settle(term, renewal).await;
                self.give_up(role, held).await;
                TermEnd::WorkReturned(outcome)
            }
            TermEnd::HandOff(request) => {
                let ((), held) = tokio::join!(
                    self.await_work(role, term.token, task),
                    self.settle(term, renewal)
                );
                let handed = match held {
                    Some(held) => {
                        self.hand_over(role, &held, request.successor.as_deref())
                            .await
                    }
                    None => Ok(false),
                };
                let _ = request.answer.send(handed);
                // Contend again: queued behind the successor, or renewing the term when
                // nobody took it.
                TermEnd::Lost(None)
            }
        }
    }

    /// Waits for the work of an ended term; a failure or panic there is logged, since
    /// the term is over anyway.
    pub(super) async fn await_work<T: WorkOutcome>(
        &self,
        role: &str,
        token: FencingToken,
        task: JoinHandle<T>,
    ) {
        if let Err(error) = work_outcome(task.await) {
            error!(role, owner = %self.options.owner_id, token = %token, %error,
                "leader work failed after leadership ended");
        }
    }

    /// Lets a renewal still in flight answer (bounded by the term's deadline) before the
    /// term is released, and returns the term to release, if the store may still hold
    /// one for us. Until it answers, the renewal may hold the store (SQLite's writer slot
    /// and the file's write lock, which the release would queue behind), and one that
    /// reached the store after the release would start a new term nobody leads.
    pub(super) async fn settle(
        &self,
        term: &Term,
        renewal: Option<AttemptFuture<'_>>,
    ) -> Option<Term> {
        let mut held = term.clone();
        let Some(renewal) = renewal else {
            return Some(held);
        };
        match tokio::time::timeout_at(term.deadline(), renewal).await {
            Ok(Attempt {
                sent,
                result: Ok(result),
                ..
            }) => {
                if !result.acquired {
                    // Another owner holds the lease: there is nothing of ours to release.
                    return None;
                }
                // Renewed, or a new term began: either way it is ours to release.
                held.renewed(&self.options, sent, &result);
            }
            // Failed or unanswered: release what we held, as far as we know.
            Ok(Attempt { result: Err(_), .. }) | Err(_) => {}
        }
        Some(held)
    }

    /// Gives up for good what `settle` left: releases the term, or, when the store
    /// answered that another owner holds it (and so queued us), leaves the queue.
    pub(super) async fn give_up(&self, role: &str, held: Option<Term>) {
        match held {
            Some(held) => {
                self.release(role, &held).await;
            }
            None => self.leave_queue(role).await,
        }
    }

    /// Whether `successor` (any contender for `None`) waits in the role's queue, so a
    /// handoff would find it: asked before the work is stopped, so a handoff with nobody
    /// to take over leaves the work running. Bounded by the term's deadline; a store
    /// that cannot answer counts as nobody waiting.
    async fn successor_waits(
        &self,
        role: &str,
        successor: Option<String>,
        deadline: Instant,
    ) -> bool {
        let owner = self.options.owner_id.as_str();
        match tokio::time::timeout_at(deadline, self.store.candidates(role)).await {
            Ok(Ok(candidates)) => {
                let waits = match successor.as_deref() {
                    Some(successor) => candidates.iter().any(|c| c == successor),
                    None => !candidates.is_empty(),
                };
                if !waits {
                    info!(
                        role,
                        owner,
                        ?successor,
                        "no such contender waits; leading on"
                    );
                }
                waits
            }
            Ok(Err(error)) => {
                warn!(role, owner, %error, "cannot read who waits; leading on");
                false
            }
            Err(_) => false,
        }
    }

    /// The first handoff request left in the store for the term `token` and not yet
    /// acted on (see [`crate::handoff`]); pending forever when requests are not accepted
    /// or the role has no request role (it is too long for one).
    async fn handoff_requests(&self, role: &str, token: FencingToken) -> Asked {
        let request = match crate::handoff::request_role(role) {
            Ok(request) if self.options.accept_handoff_requests => request,
            _ => return std::future::pending().await,
        };
        // A request refused (nobody to hand to) is not acted on again when this
        // elector leads on.
        let acted = self
            .handoffs_acted
            .lock()
            .get(role)
            .copied()
            .unwrap_or(FencingToken::from(0));
        // Requests come from people and scripts, not within milliseconds: looking only
        // from the first renewal on spares a term that ends sooner (a handover in a
        // crowd) the read, so a handover stays a release and a renewal.
        tokio::time::sleep(self.options.renew_interval).await;
        // Pushes wake the watch; the read a minute is the fallback should one be lost.
        let poll = std::time::Duration::from_secs(60);
        crate::handoff::next_request(self.store.as_ref(), &request, token, acted, poll).await
    }

    /// Takes the waiting handoff request if it is for the term `token`; one for another
    /// term (the caller saw an earlier one) is answered `false`.
    pub(super) fn take_handoff(&self, token: FencingToken) -> Option<HandoffRequest> {
        let request = self.handoff.lock().take()?;
        if request.token == token {
            return Some(request);
        }
        let _ = request.answer.send(Ok(false));
        None
    }

    /// Ends the term in one store step that begins the successor's: the named one, or
    /// the oldest waiting. Bounded by the term's local deadline. Whether it
    /// passed; when it did not, the term is still ours and contending renews it.
    pub(super) async fn hand_over(
        &self,
        role: &str,
        term: &Term,
        successor: Option<&str>,
    ) -> Result<bool> {
        let owner = self.options.owner_id.as_str();
        let token = term.token;
        let step = self.store.hand_over(role, owner, token, successor);
        match tokio::time::timeout_at(term.deadline(), step).await {
            Ok(Ok(handed)) => {
                if handed {
                    info!(role, owner, token = %token, ?successor, "handed over");
                } else {
                    info!(role, owner, token = %token, ?successor, "no successor waiting; leading on");
                }
                Ok(handed)
            }
            Ok(Err(error)) => {
                self.pending_releases.lock().insert(role.to_owned(), token);
                Err(error)
            }
            Err(_) => {
                self.pending_releases.lock().insert(role.to_owned(), token);
                Err(Error::store_msg(
                    "elector",
                    "the handoff got no answer before the term's local deadline",
                ))
            }
        }
    }

    /// Releases the term, giving up at its local deadline (the lease is gone by then).
    /// Returns whether the store answered; a release that failed or timed out may still
    /// land, so its token is remembered as pending until the store shows another.
    pub(super) async fn release(&self, role: &str, term: &Term) -> bool {
        let owner = self.options.owner_id.as_str();
        let token = term.token;
        let answered =
            tokio::time::timeout_at(term.deadline(), self.store.release(role, owner, token)).await;
        match answered {
            Ok(Ok(released)) => {
                if released {
                    info!(role, owner, token = %token, "released");
                } else {
                    debug!(role, owner, token = %token, "release found the term already over");
                }
                self.pending_releases.lock().remove(role);
                return true;
            }
            Ok(Err(error)) => {
                warn!(role, owner, token = %token, %error,
                    "release failed and may still land; the lease expires on its own")
            }
            Err(_) => {
                warn!(role, owner, token = %token,
                    "release timed out and may still land; the lease expires on its own")
            }
        }
        self.pending_releases.lock().insert(role.to_owned(), token);
        false
    }
}

/// A handoff asked of the term: through the store (to `successor`, any contender for
/// `None`), or in process (answered on the request's channel).
enum AskedOf {
    Store(Option<String>),
    InProcess(HandoffRequest),
}

/// The read of whether a handoff's successor waits (see `successor_waits`).
type SuccessorCheck<'a> = std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// The answer of the check in `checking`; pending while there is none.
async fn checked(checking: &mut Option<(AskedOf, SuccessorCheck<'_>)>) -> bool {
    match checking {
        Some((_, check)) => check.await,
        None => std::future::pending().await,
    }
}
