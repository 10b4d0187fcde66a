//! One LISTEN connection per store (the lease store, the registry), shared by every
//! waiter.
//!
//! Release and every change of term send `NOTIFY` on the schema's lease channel with the
//! role as payload, and a join or leave on its membership channel (inside the same
//! statement, so it is delivered exactly at commit).
//! The listener task is started on the first wait, fans notifications out through a
//! broadcast channel, and publishes whether it is currently listening. When its
//! connection fails it reconnects with a backoff; waiters then fall back to sleeping to
//! their deadline, never spinning.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Whether the listener connection is subscribed right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListenState {
    /// Not (yet, or no longer) subscribed: pushes may be missed.
    Down,
    /// Subscribed; the number grows with every (re)subscription, so a waiter can tell
    /// that a gap (when notifications may have been lost) happened.
    Listening(u64),
}

/// The shared listener of one store.
#[derive(Debug)]
pub(crate) struct Notifier {
    pool: PgPool,
    channel: String,
    events: broadcast::Sender<Arc<str>>,
    state: watch::Sender<ListenState>,
    task: Mutex<Option<JoinHandle<()>>>,
    stop: CancellationToken,
}

impl Notifier {
    pub(crate) fn new(pool: PgPool, channel: String) -> Notifier {
        Notifier {
            pool,
            channel,
            events: broadcast::channel(1024).0,
            state: watch::Sender::new(ListenState::Down),
            task: Mutex::new(None),
            stop: CancellationToken::new(),
        }
    }

    /// Subscribes to notifications and to the listener's state, starting the listener
    /// task if it is not running (first use, or its runtime went away).
    pub(crate) fn subscribe(
        &self,
    ) -> (broadcast::Receiver<Arc<str>>, watch::Receiver<ListenState>) {
        let events = self.events.subscribe();
        let state = self.state.subscribe();
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        let running = task.as_ref().is_some_and(|t| !t.is_finished());
        if !running {
            self.state.send_replace(ListenState::Down);
            *task = Some(tokio::spawn(listen_loop(
                self.pool.clone(),
                self.channel.clone(),
                self.events.clone(),
                self.state.clone(),
                self.stop.clone(),
            )));
        }
        (events, state)
    }
}

impl Notifier {
    /// Waits until a notification whose payload `matches` arrives, or `deadline`.
    ///
    /// Subscribes first, then runs `unchanged` (a read of what the caller observed:
    /// `Ok(true)` while nothing changed), then waits: a change committed between the read
    /// and the wait still arrives as a notification. Returns at once when the read says
    /// something changed. Without a working listener (down, or notifications lost in a
    /// reconnect gap) it never spins: it sleeps until the listener is back or the
    /// deadline, and lets the caller read again.
    pub(crate) async fn wait(
        &self,
        deadline: Instant,
        unchanged: impl std::future::Future<Output = tenure::Result<bool>>,
        matches: impl Fn(&str) -> bool,
    ) {
        let (mut events, mut state) = self.subscribe();
        let generation = loop {
            let current = *state.borrow_and_update();
            match current {
                ListenState::Listening(generation) => break generation,
                ListenState::Down => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => return,
                        changed = state.changed() => if changed.is_err() {
                            tokio::time::sleep_until(deadline).await;
                            return;
                        },
                    }
                }
            }
        };
        match unchanged.await {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                debug!(%error, "could not re-check before waiting; sleeping to the deadline");
                tokio::time::sleep_until(deadline).await;
                return;
            }
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                event = events.recv() => match event {
                    Ok(payload) if matches(&payload) => return,
                    Ok(_) => {}
                    // Missed some: one of them may have been ours.
                    Err(RecvError::Lagged(_)) => return,
                    Err(RecvError::Closed) => {
                        tokio::time::sleep_until(deadline).await;
                        return;
                    }
                },
                changed = state.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep_until(deadline).await;
                        return;
                    }
                    let now = *state.borrow_and_update();
                    if now != ListenState::Listening(generation) {
                        // Notifications may have been lost in the gap: wait until the
                        // listener is back (or the deadline) and let the caller re-check.
                        loop {
                            if matches!(*state.borrow_and_update(), ListenState::Listening(_)) {
                                return;
                            }
                            tokio::select! {
                                _ = tokio::time::sleep_until(deadline) => return,
                                changed = state.changed() => if changed.is_err() {
                                    tokio::time::sleep_until(deadline).await;
                                    return;
                                },
                            }
                        }
                    }
                }
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
    events: broadcast::Sender<Arc<str>>,
    state: watch::Sender<ListenState>,
    stop: CancellationToken,
) {
    let mut generation = 0u64;
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
                generation += 1;
                backoff = BACKOFF_MIN;
                debug!(channel = %channel, generation, "listening for lease changes");
                state.send_replace(ListenState::Listening(generation));
                loop {
                    let received = tokio::select! {
                        _ = stop.cancelled() => return,
                        received = listener.try_recv() => received,
                    };
                    match received {
                        Ok(Some(notification)) => {
                            let _ = events.send(Arc::from(notification.payload()));
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
                state.send_replace(ListenState::Down);
            }
            Err(error) => {
                state.send_replace(ListenState::Down);
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
