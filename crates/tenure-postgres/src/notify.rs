//! One LISTEN connection per store (the lease store, the registry), shared by every
//! waiter.
//!
//! Every statement that begins or ends a term sends `NOTIFY` on the schema's lease
//! channel with the role's new state (see `succession.rs` for the payload), and a join
//! or leave on its membership channel (inside the same statement, so it is delivered
//! exactly at commit).
//! The listener task is started on the first wait, fans notifications out through a
//! broadcast channel, and publishes whether it is currently listening. On the lease
//! channel it also keeps what the notifications said of each role ([`Terms`]), so a
//! waiter for a successor needs no read. When its connection fails it reconnects with
//! a backoff; waiters then fall back to sleeping to their deadline, never spinning.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tenure::{FencingToken, LeaseInfo, TermChange};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::succession::{Note, TermState, Terms};

/// Whether the listener connection is subscribed right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListenState {
    /// Not (yet, or no longer) subscribed: pushes may be missed.
    Down,
    /// Subscribed; the number grows with every (re)subscription, so a waiter can tell
    /// that a gap (when notifications may have been lost) happened.
    Listening(u64),
}

/// Where the listener was at some moment: its subscription and how many notifications
/// it had received on it. A read that begins after a mark and a wait that finds the
/// listener still at that mark bracket a stretch in which nothing was notified: the
/// wait needs no read to re-check what the read showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    generation: u64,
    heard: u64,
}

/// The shared listener of one store.
#[derive(Debug)]
pub(crate) struct Notifier {
    pool: PgPool,
    channel: String,
    events: broadcast::Sender<Arc<Note>>,
    state: watch::Sender<ListenState>,
    task: Mutex<Option<JoinHandle<()>>>,
    stop: CancellationToken,
    /// On the lease channel: each role's latest state, as notifications said it.
    terms: Option<Arc<Terms>>,
    /// Kept across listener tasks.
    counts: Arc<Counts>,
}

/// What the listener counts, across its tasks.
#[derive(Debug, Default)]
struct Counts {
    /// The last subscription's number, so a number is never reused.
    generations: AtomicU64,
    /// Notifications received, over every subscription.
    heard: AtomicU64,
}

/// One waiter's subscription, taken while the listener listened as `generation`.
struct Subscription {
    events: broadcast::Receiver<Arc<Note>>,
    state: watch::Receiver<ListenState>,
    generation: u64,
}

/// What [`Subscription::next`] got.
enum Next {
    /// A notification.
    Note(Arc<Note>),
    /// Some notifications were missed (this waiter fell behind); the listener goes on.
    Lagged,
    /// The deadline passed, the listener went away (after sleeping to the deadline), or
    /// it had a gap in which notifications may have been lost (once it is back, or at
    /// the deadline).
    Over,
}

impl Notifier {
    /// A listener of `channel` whose payloads are opaque (the membership channel).
    pub(crate) fn new(pool: PgPool, channel: String) -> Notifier {
        Notifier::with_terms(pool, channel, None)
    }

    /// A listener of the lease channel `channel`, which remembers each role's state.
    pub(crate) fn for_terms(pool: PgPool, channel: String) -> Notifier {
        Notifier::with_terms(pool, channel, Some(Arc::new(Terms::default())))
    }

    fn with_terms(pool: PgPool, channel: String, terms: Option<Arc<Terms>>) -> Notifier {
        Notifier {
            pool,
            channel,
            events: broadcast::channel(1024).0,
            state: watch::Sender::new(ListenState::Down),
            task: Mutex::new(None),
            stop: CancellationToken::new(),
            terms,
            counts: Arc::default(),
        }
    }

    /// Where the listener is now, if it is listening (see [`Mark`]); taken before a read
    /// whose answer a later [`wait`](Self::wait) may trust.
    pub(crate) fn mark(&self) -> Option<Mark> {
        match *self.state.borrow() {
            ListenState::Listening(generation) => Some(Mark {
                generation,
                heard: self.counts.heard.load(Ordering::SeqCst),
            }),
            ListenState::Down => None,
        }
    }

    /// Subscribes to notifications and to the listener's state, starting the listener
    /// task if it is not running (first use, or its runtime went away).
    fn subscribe(&self) -> (broadcast::Receiver<Arc<Note>>, watch::Receiver<ListenState>) {
        let events = self.events.subscribe();
        let state = self.state.subscribe();
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        let running = task.as_ref().is_some_and(|t| !t.is_finished());
        if !running {
            if let Some(terms) = &self.terms {
                terms.restart(0);
            }
            self.state.send_replace(ListenState::Down);
            *task = Some(tokio::spawn(listen_loop(
                self.pool.clone(),
                self.channel.clone(),
                self.events.clone(),
                self.state.clone(),
                self.terms.clone(),
                Arc::clone(&self.counts),
                self.stop.clone(),
            )));
        }
        (events, state)
    }

    /// Subscribes and waits until the listener listens; `None` at the deadline (or once
    /// the listener is gone, after sleeping to it).
    async fn listening(&self, deadline: Instant) -> Option<Subscription> {
        let (events, mut state) = self.subscribe();
        loop {
            let current = *state.borrow_and_update();
            match current {
                ListenState::Listening(generation) => {
                    return Some(Subscription {
                        events,
                        state,
                        generation,
                    })
                }
                ListenState::Down => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => return None,
                        changed = state.changed() => if changed.is_err() {
                            tokio::time::sleep_until(deadline).await;
                            return None;
                        },
                    }
                }
            }
        }
    }

    /// Waits until a notification that `matches` arrives, or `deadline`.
    ///
    /// Subscribes first, then runs `unchanged` (a read of what the caller observed:
    /// `Ok(true)` while nothing changed), then waits: a change committed between the read
    /// and the wait still arrives as a notification. Returns at once when the read says
    /// something changed. With `since`, the mark taken before the read the caller's
    /// observation came from, the re-check is skipped when the listener is still at that
    /// mark once subscribed: nothing committed after that read's snapshot went unheard.
    /// Without a working listener (down, or notifications lost in a reconnect gap) it
    /// never spins: it sleeps until the listener is back or the deadline, and lets the
    /// caller read again.
    pub(crate) async fn wait(
        &self,
        deadline: Instant,
        since: Option<Mark>,
        unchanged: impl Future<Output = tenure::Result<bool>>,
        matches: impl Fn(&Note) -> bool,
    ) {
        let Some(mut subscription) = self.listening(deadline).await else {
            return;
        };
        let now = Mark {
            generation: subscription.generation,
            heard: self.counts.heard.load(Ordering::SeqCst),
        };
        let checked = if since == Some(now) {
            Ok(true)
        } else {
            unchanged.await
        };
        match checked {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                debug!(%error, "could not re-check before waiting; sleeping to the deadline");
                tokio::time::sleep_until(deadline).await;
                return;
            }
        }
        loop {
            match subscription.next(deadline).await {
                Next::Note(note) if matches(&note) => return,
                Next::Note(_) => {}
                // Missed some: one of them may have been ours.
                Next::Lagged | Next::Over => return,
            }
        }
    }

    /// Waits until the term `observed` of `role` is over and says what replaced it
    /// (see [`tenure::LeaseStore::wait_for_successor`]), from the notifications alone.
    ///
    /// The listener's memory of the role answers a term already over at once; `read`
    /// (the role's row) runs only when the listener has learned nothing of the role
    /// since it subscribed, and what it shows is remembered for the next wait. An
    /// earlier tenure's notification, a gap in listening or the deadline is
    /// [`TermChange::Unknown`]; without a working listener it sleeps, never spins.
    pub(crate) async fn wait_for_successor(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: Instant,
        read: impl Future<Output = tenure::Result<Option<LeaseInfo>>>,
    ) -> TermChange {
        let Some(terms) = &self.terms else {
            tokio::time::sleep_until(deadline).await;
            return TermChange::Unknown;
        };
        let Some(mut subscription) = self.listening(deadline).await else {
            return TermChange::Unknown;
        };
        // Subscribed before looking: a state learned after this look is still heard.
        let known = match terms.get(role, subscription.generation) {
            Some(state) => state,
            None => match read.await {
                Ok(info) => terms.seed(
                    role,
                    subscription.generation,
                    TermState::read(info.as_ref()),
                ),
                Err(error) => {
                    debug!(%error, "could not read the term before waiting; sleeping to the deadline");
                    tokio::time::sleep_until(deadline).await;
                    return TermChange::Unknown;
                }
            },
        };
        if let Some(answer) = known.answer(observed) {
            return answer;
        }
        loop {
            let state = match subscription.next(deadline).await {
                Next::Note(note) if *note.role == *role => match &note.state {
                    Some(state) => state.clone(),
                    None => return TermChange::Unknown,
                },
                Next::Note(_) => continue,
                // The listener did not miss them: its memory has the latest state.
                Next::Lagged => match terms.get(role, subscription.generation) {
                    Some(state) => state,
                    None => return TermChange::Unknown,
                },
                Next::Over => return TermChange::Unknown,
            };
            if let Some(answer) = state.answer(observed) {
                return answer;
            }
        }
    }
}

impl Subscription {
    /// The next notification, or why there is none; see [`Next`].
    async fn next(&mut self, deadline: Instant) -> Next {
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return Next::Over,
                event = self.events.recv() => return match event {
                    Ok(note) => Next::Note(note),
                    Err(RecvError::Lagged(_)) => Next::Lagged,
                    Err(RecvError::Closed) => {
                        tokio::time::sleep_until(deadline).await;
                        Next::Over
                    }
                },
                changed = self.state.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep_until(deadline).await;
                        return Next::Over;
                    }
                    if *self.state.borrow_and_update() != ListenState::Listening(self.generation) {
                        return self.gap(deadline).await;
                    }
                }
            }
        }
    }

    /// After a gap in which notifications may have been lost: waits until the listener
    /// is back (or the deadline) and lets the caller re-check.
    async fn gap(&mut self, deadline: Instant) -> Next {
        loop {
            if matches!(*self.state.borrow_and_update(), ListenState::Listening(_)) {
                return Next::Over;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return Next::Over,
                changed = self.state.changed() => if changed.is_err() {
                    tokio::time::sleep_until(deadline).await;
                    return Next::Over;
                },
            }
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

async fn listen_loop(
    pool: PgPool,
    channel: String,
    events: broadcast::Sender<Arc<Note>>,
    state: watch::Sender<ListenState>,
    terms: Option<Arc<Terms>>,
    counts: Arc<Counts>,
    stop: CancellationToken,
) {
    // The memory of the terms follows the subscription: a gap may have lost some.
    let set_state = |new: ListenState| {
        if let Some(terms) = &terms {
            terms.restart(match new {
                ListenState::Listening(generation) => generation,
                ListenState::Down => 0,
            });
        }
        state.send_replace(new);
    };
    let mut backoff = BACKOFF_MIN;
    loop {
        let subscribed = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            // Report a lost connection at once instead of reconnecting silently, so
            // waiters learn about the gap in which notifications may have been lost.
            listener.eager_reconnect(false);
            listener.ignore_pool_close_event(true);
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let result = tokio::select! {
            _ = stop.cancelled() => return,
            result = subscribed => result,
        };
        match result {
            Ok(mut listener) => {
                let generation = counts.generations.fetch_add(1, Ordering::Relaxed) + 1;
                backoff = BACKOFF_MIN;
                debug!(channel = %channel, generation, "listening for lease changes");
                set_state(ListenState::Listening(generation));
                loop {
                    let received = tokio::select! {
                        _ = stop.cancelled() => return,
                        received = listener.try_recv() => received,
                    };
                    match received {
                        Ok(Some(notification)) => {
                            // Counted before it is sent: a waiter that subscribed after
                            // reading the count gets every later one.
                            counts.heard.fetch_add(1, Ordering::SeqCst);
                            let note = Note::parse(notification.payload());
                            let note = match &terms {
                                Some(terms) => terms.take_in(notification.process_id(), note),
                                None => Some(note),
                            };
                            if let Some(note) = note {
                                let _ = events.send(Arc::new(note));
                            }
                        }
                        Ok(None) => {
                            warn!(channel = %channel, "lease listener connection lost; reconnecting");
                            break;
                        }
                        Err(error) => {
                            warn!(channel = %channel, %error, "lease listener failed; reconnecting");
                            break;
                        }
                    }
                }
                set_state(ListenState::Down);
            }
            Err(error) => {
                set_state(ListenState::Down);
                warn!(channel = %channel, %error, retry_in = ?backoff,
                    "could not listen for lease changes; waiters fall back to their retry timers");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}
