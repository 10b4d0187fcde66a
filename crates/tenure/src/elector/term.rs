//! The elector's plain records of one term: a request in flight and its answer, how a
//! term ended, and the term as its leader sees it on the local monotonic clock (its
//! deadline and renew schedule).

use std::future::Future;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::LeaseLeaderOptions;
use crate::{FencingToken, LeaseResult, Result};

/// One acquire or renew request, boxed so the leader loop can keep it in flight.
pub(super) type AttemptFuture<'a> = std::pin::Pin<Box<dyn Future<Output = Attempt> + Send + 'a>>;

/// One acquire or renew request: the store's answer and the instants around it.
pub(super) struct Attempt {
    pub(super) sent: Instant,
    pub(super) received: Instant,
    pub(super) result: Result<LeaseResult>,
}

/// A store answer and the instants around it.
pub(super) struct Answer {
    pub(super) result: LeaseResult,
    pub(super) sent: Instant,
    pub(super) received: Instant,
}

/// A request from [`LeaseLeaderElector::hand_off`] to the leader loop.
pub(super) struct HandoffRequest {
    /// The term the caller saw leading; a request for another term is refused.
    pub(super) token: FencingToken,
    /// The candidate to hand to; `None` for the oldest waiting one.
    pub(super) successor: Option<String>,
    /// Whether the term passed to a successor.
    pub(super) answer: oneshot::Sender<Result<bool>>,
}

/// How one term ended.
pub(super) enum TermEnd {
    Shutdown,
    /// Work was stopped for a planned handoff; the term goes on until handed over.
    HandOff(HandoffRequest),
    WorkReturned(Result<()>),
    /// Lost; the answer that told us so (if any) decides what to do next.
    Lost(Option<Answer>),
}

/// One term as its leader sees it, on the local monotonic clock.
#[derive(Clone, Debug)]
pub(super) struct Term {
    pub(super) token: FencingToken,
    /// Just before the last successful acquire or renew of this term was sent.
    pub(super) sent: Instant,
    /// How long after `sent` `leadership` lasts: what the store granted, less drift and
    /// `work_grace`.
    pub(super) window: Duration,
    /// How long after `sent` the next renewal is due.
    pub(super) renew_after: Duration,
    /// When the next renewal is due (later than `sent + renew_after` after a failure).
    pub(super) next_renew: Instant,
}

impl Term {
    /// The term an acquiring answer starts, or `None` when its deadline has passed
    /// already: work must never run for such a term.
    pub(super) fn begin(options: &LeaseLeaderOptions, answer: &Answer) -> Option<Term> {
        let mut term = Term {
            token: answer.result.fencing_token,
            sent: answer.sent,
            window: Duration::ZERO,
            renew_after: Duration::ZERO,
            next_renew: answer.sent,
        };
        term.renewed(options, answer.sent, &answer.result);
        (Instant::now() < term.deadline()).then_some(term)
    }

    /// When `leadership` is cancelled unless a renewal moves it:
    /// `sent + min(lease_ttl, expires_at - now) * (1 - max_clock_drift) - work_grace`.
    pub(super) fn deadline(&self) -> Instant {
        self.sent + self.window
    }

    /// A request sent at `sent` was answered with `result` holding the lease: the term
    /// (under `result`'s token) now runs from that answer.
    pub(super) fn renewed(
        &mut self,
        options: &LeaseLeaderOptions,
        sent: Instant,
        result: &LeaseResult,
    ) {
        let granted = result.remaining();
        self.token = result.fencing_token;
        self.sent = sent;
        self.window = options.leadership_window_for(granted);
        self.renew_after = options.renew_after(granted);
        self.next_renew = sent + self.renew_after;
    }

    /// Whether a renewal answered at `received` was late: it (retries included) used
    /// more than half the slack between the renew schedule and the deadline.
    pub(super) fn is_late(&self, received: Instant) -> bool {
        let spare = self.deadline().saturating_duration_since(received);
        let slack = self.window.saturating_sub(self.renew_after);
        spare < slack / 2
    }
}

/// The answer of the renewal in flight; never ready while there is none.
pub(super) async fn in_flight(renewal: &mut Option<AttemptFuture<'_>>) -> Attempt {
    match renewal {
        Some(attempt) => attempt.await,
        None => std::future::pending().await,
    }
}
