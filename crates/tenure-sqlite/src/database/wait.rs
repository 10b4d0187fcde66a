//! How a database's waiters wait: woken at once by the writes of this process (change
//! signals per role) and by another process's handover (wake-ups, see `wake.rs`), and
//! reading the file again on a poll meanwhile.

use std::sync::Arc;
use std::time::Duration;

use tenure::Result;
use tokio::sync::Notify;

use super::SqliteDatabase;
use crate::wake::notify;

/// How often a waiter for a successor that hears its wake-ups polls the file (see
/// [`SqliteDatabase::successor_poll`]).
const WOKEN_POLL: Duration = Duration::from_millis(100);

impl SqliteDatabase {
    pub(crate) fn poll_interval(&self) -> Duration {
        self.inner.poll_interval
    }

    /// The signal for `role`, woken by writes through this database that change a term.
    pub(crate) fn change_signal(&self, role: &str) -> Arc<Notify> {
        let mut changes = self.inner.changes.lock();
        match changes.get(role) {
            Some(signal) => Arc::clone(signal),
            None => {
                let signal = Arc::new(Notify::new());
                changes.insert(role.to_owned(), Arc::clone(&signal));
                signal
            }
        }
    }

    /// Waits until `unchanged` says something changed (`Ok(false)`) or `deadline`:
    /// woken at once by the in-process signal `key`, and reading again every `poll` for
    /// changes other processes wrote. A failing read is not a change: it polls on rather
    /// than return early in a loop.
    pub(crate) async fn wait_polling<F, Fut>(
        &self,
        key: &str,
        poll: Duration,
        deadline: tokio::time::Instant,
        mut unchanged: F,
    ) where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let changed = || {
            let read = unchanged();
            async move { read.await.map(|unchanged| (!unchanged).then_some(())) }
        };
        self.wait_polling_for(key, poll, deadline, changed).await;
    }

    /// [`wait_polling`](Self::wait_polling) that returns what the read found: `changed`
    /// answers `Ok(None)` while nothing changed and `Ok(Some(what))` once something
    /// did; `None` at the deadline.
    pub(crate) async fn wait_polling_for<F, Fut, T>(
        &self,
        key: &str,
        poll: Duration,
        deadline: tokio::time::Instant,
        mut changed: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>>>,
    {
        let signal = self.change_signal(key);
        loop {
            let notified = signal.notified();
            tokio::pin!(notified);
            // Subscribe before reading, so a change between the read and the wait wakes us.
            notified.as_mut().enable();
            match tokio::time::timeout_at(deadline, changed()).await {
                Ok(Ok(Some(what))) => return Some(what),
                Err(_) => return None,
                Ok(Ok(None)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(key, %error, "cannot poll for a change; retrying")
                }
            }
            let next = (tokio::time::Instant::now() + poll).min(deadline);
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(next) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Listens for the wake-ups of `owner` (a candidate queued through this database, a
    /// node heartbeating through it) from the processes that may hand it a role or
    /// change the membership. Whether it hears them: `false` where nothing can listen.
    pub(crate) fn listen_for_wakes(&self, owner: &str) -> bool {
        self.inner
            .wakes
            .as_ref()
            .is_some_and(|wakes| wakes.listen(owner, Arc::downgrade(&self.inner.changes)))
    }

    /// Tells `owner`'s process, whichever it is, that it was handed `role`.
    pub(crate) fn wake(&self, owner: &str, role: &str) {
        if let Some(wakes) = &self.inner.wakes {
            wakes.wake(owner, role);
        }
    }

    /// How often a waiter for a successor polls. A candidate handed the role is woken
    /// by the handing write, whichever process made it, so when every owner queued here
    /// hears its wake-ups the poll only catches what no write announces (a lost wake,
    /// the others' changes of holder): [`WOKEN_POLL`], or the poll interval if longer.
    /// Otherwise the poll interval: 100 processes polling every 10 ms saturate 2 cores.
    pub(crate) fn successor_poll(&self) -> Duration {
        let poll = self.inner.poll_interval;
        match &self.inner.wakes {
            Some(wakes) if wakes.all_listening() => poll.max(WOKEN_POLL),
            _ => poll,
        }
    }

    /// Wakes this process's waiters on `role` (a write through this database changed
    /// its term).
    pub(crate) fn signal_change(&self, role: &str) {
        notify(&self.inner.changes, role);
    }
}
