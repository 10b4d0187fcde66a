//! How a database's waiters wait: woken at once by the writes of this process (change
//! signals per role) and by another process's handover or term of a watched role
//! (wake-ups, see `wake.rs`), and reading the file again on a poll meanwhile.

use std::sync::Arc;
use std::time::Duration;

use tenure::Result;
use tokio::sync::Notify;

use super::SqliteDatabase;
use crate::wake::{notify, RoleWatch};

/// How often a waiter for a successor that hears its wake-ups polls the file (see
/// [`SqliteDatabase::successor_poll`]).
const WOKEN_POLL: Duration = Duration::from_millis(100);

/// How often a wait on a role this process watches polls the file: every write that
/// begins or ends a term of the role announces it, so the poll only catches what no
/// announcement brought (a writer in another network namespace, a full socket buffer).
/// An observer waits for requests from people and scripts for as long as it leads, so
/// this is what such a wait costs the file: a read per 10 s, not per poll interval. A
/// term that lapses writes nothing; the waits that care pass its expiry as deadline.
const WATCHED_POLL: Duration = Duration::from_secs(10);

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
    ///
    /// With `watch`, `key` is a role whose terms the wait is about, and it watches the
    /// role (see `wake.rs`): while this process holds the role's watch, another
    /// process's write of a term of it wakes the wait at once and the file is read
    /// every [`WATCHED_POLL`] (or `poll`, if longer); while another process holds it,
    /// every `poll`, trying to take the watch before each read. After a failed read it
    /// polls every `poll` even while watching: a change written before the watch was
    /// taken is announced to nobody.
    pub(crate) async fn wait_polling<F, Fut>(
        &self,
        key: &str,
        watch: bool,
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
        self.wait_polling_for(key, watch, poll, deadline, changed)
            .await;
    }

    /// [`wait_polling`](Self::wait_polling) that returns what the read found: `changed`
    /// answers `Ok(None)` while nothing changed and `Ok(Some(what))` once something
    /// did; `None` at the deadline.
    pub(crate) async fn wait_polling_for<F, Fut, T>(
        &self,
        key: &str,
        watch: bool,
        poll: Duration,
        deadline: tokio::time::Instant,
        mut changed: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>>>,
    {
        let signal = self.change_signal(key);
        let mut watching: Option<RoleWatch> = None;
        loop {
            let notified = signal.notified();
            tokio::pin!(notified);
            // Subscribe before reading, so a change between the read and the wait wakes
            // us; and watch before reading, so every write after the read is announced.
            notified.as_mut().enable();
            if watch && watching.is_none() {
                watching = self.inner.wakes.as_ref().and_then(|wakes| wakes.watch(key));
            }
            let read = match tokio::time::timeout_at(deadline, changed()).await {
                Ok(Ok(Some(what))) => return Some(what),
                Err(_) => return None,
                Ok(Ok(None)) => true,
                Ok(Err(error)) => {
                    tracing::debug!(key, %error, "cannot poll for a change; retrying");
                    false
                }
            };
            // A change written before the watch was taken is announced to nobody: only
            // a read that succeeded lets the watch stand in for the poll.
            let poll = match watching {
                Some(_) if read => poll.max(WATCHED_POLL),
                _ => poll,
            };
            let next = (tokio::time::Instant::now() + poll).min(deadline);
            let heard = async {
                match &watching {
                    Some(watch) => watch.heard(&self.inner.changes).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(next) => {}
                heard = heard => {
                    if let Err(error) = heard {
                        tracing::debug!(key, %error, "stopped watching the role; polling");
                        watching = None;
                    }
                }
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
    /// The process that watches the role (see `wake.rs`) polls more rarely still.
    pub(crate) fn successor_poll(&self) -> Duration {
        let poll = self.inner.poll_interval;
        match &self.inner.wakes {
            Some(wakes) if wakes.all_listening() => poll.max(WOKEN_POLL),
            _ => poll,
        }
    }

    /// Wakes this process's waiters on `role` (a write through this database changed
    /// the membership).
    pub(crate) fn signal_change(&self, role: &str) {
        notify(&self.inner.changes, role);
    }

    /// A term of `role` began or ended through this database: wakes this process's
    /// waiters on it, and the process watching it, if another.
    pub(crate) fn announce_term(&self, role: &str) {
        self.signal_change(role);
        if let Some(wakes) = &self.inner.wakes {
            wakes.announce(role);
        }
    }

    /// Whether another process's writes of a term are announced to this one's waits
    /// (see `wake.rs`): on Linux, for a database with a file.
    pub(crate) fn hears_announcements(&self) -> bool {
        cfg!(target_os = "linux") && self.inner.wakes.is_some()
    }
}
