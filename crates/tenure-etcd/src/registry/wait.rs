//! [`NodeRegistry::wait_for_members_change`] on one watch of the nodes' keys per
//! registry (shared by its clones and all their waiters).
//!
//! A shard member waits for a change of the members again and again: after each look,
//! and each time its timer for a peer's lapse fires, about once a TTL while nothing
//! changes. A watch opened per wait was a gRPC stream per wait; the shared one is opened
//! by the first waiter and stays while anyone waits and `LINGER` (`linger.rs`)
//! after.
//!
//! The watch starts at the store's revision when it opens and publishes the revision of
//! the last join or leave it saw. A waiter whose observed members are what a read at
//! revision `r` showed (the registry's [`LastRead`](tenure::registry::LastRead)) needs
//! only that: a join or leave past `r` ends its wait. A read older than the watch (made
//! before it opened) tells nothing the watch can vouch for, so the waiter reads again
//! once; that read comes after the watch opened, so the watch covers everything after it.
//! A watch that breaks is dropped: its waiters sleep to their deadline (never spinning),
//! and the next waiter opens a new one.

use std::sync::{Arc, Weak};

use etcd_client::WatchOptions;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{membership_change, EtcdNodeRegistry};
use crate::conn::{next_response, Conn, BACKEND};
use crate::linger::Linger;
use tenure::{Error, NodeRegistry, Result};

/// What the shared watch has seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Watched {
    /// Not open yet.
    Starting,
    /// Open since revision `from` (it sees every change after it); `changed` is the
    /// revision of the last join or leave it saw (0: none).
    Known { from: i64, changed: i64 },
    /// The watch failed or ended.
    Broken,
}

/// A registry's slot for its watch: the receiver of the state the watch's task
/// publishes, while one runs.
pub(super) type Slot = Arc<Mutex<Option<watch::Receiver<Watched>>>>;

/// The task's handle on its registry's slot: a task whose registry was dropped ends (and
/// so lets the client's connection go) at its next tick.
type WeakSlot = Weak<Mutex<Option<watch::Receiver<Watched>>>>;

/// What a waiter learns from the watch's state.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// The members changed after the waiter's read.
    Changed,
    /// Nothing changed yet: wait for the watch.
    Wait,
    /// The watch cannot say (not open yet, or opened after the read).
    Unknown,
}

impl Watched {
    /// What a waiter whose observed members a read at revision `read_at` showed learns.
    fn answer(self, read_at: i64) -> Answer {
        match self {
            Watched::Known { from, changed } if read_at >= from => {
                if changed > read_at {
                    Answer::Changed
                } else {
                    Answer::Wait
                }
            }
            _ => Answer::Unknown,
        }
    }
}

impl EtcdNodeRegistry {
    /// [`NodeRegistry::wait_for_members_change`] on the registry's shared watch.
    pub(super) async fn wait_members(&self, observed: &[String], deadline: Instant) {
        let changed = async {
            let mut state = self.members_watch();
            let mut read = false;
            loop {
                let seen = *state.borrow_and_update();
                if seen == Watched::Broken {
                    return Err(Error::store_msg(BACKEND, "the membership watch broke"));
                }
                if seen != Watched::Starting {
                    let answer = match self.last_read.since(observed) {
                        Some(read_at) => seen.answer(read_at),
                        None => Answer::Unknown,
                    };
                    match answer {
                        Answer::Changed => return Ok(()),
                        Answer::Wait => {}
                        // A read made after the watch opened decides: it shows other
                        // members (changed), or the observed ones at a revision the
                        // watch covers. A second unknown (another read of this
                        // registry raced it) ends the wait: the caller reads again.
                        Answer::Unknown if read => return Ok(()),
                        Answer::Unknown => {
                            read = true;
                            if self.live_nodes().await? != observed {
                                return Ok(());
                            }
                            continue;
                        }
                    }
                }
                if state.changed().await.is_err() {
                    return Err(Error::store_msg(BACKEND, "the membership watch ended"));
                }
            }
        };
        match tokio::time::timeout_at(deadline, changed).await {
            Ok(Ok(())) | Err(_) => {}
            // No push channel: sleep to the deadline rather than return in a loop.
            Ok(Err(error)) => {
                tracing::debug!(%error, "cannot watch the membership; sleeping to the deadline");
                tokio::time::sleep_until(deadline).await;
            }
        }
    }

    /// A receiver of the shared watch's state, opening the watch when none runs.
    fn members_watch(&self) -> watch::Receiver<Watched> {
        let mut slot = self.members_watch.lock();
        if let Some(state) = slot.as_ref() {
            // A task that ended dropped its sender.
            if state.has_changed().is_ok() {
                return state.clone();
            }
        }
        let (sender, receiver) = watch::channel(Watched::Starting);
        *slot = Some(receiver.clone());
        tokio::spawn(run_watch(
            self.conn.clone(),
            self.keys.nodes_dir(),
            sender,
            Arc::downgrade(&self.members_watch),
        ));
        receiver
    }
}

/// The watch's task: publishes its state until it breaks, or nobody waited for
/// `LINGER`, or its registry was dropped; then leaves the slot.
async fn run_watch(conn: Conn, dir: String, sender: watch::Sender<Watched>, slot: WeakSlot) {
    let ended = follow(&conn, &dir, &sender, &slot).await;
    if let Some(slot) = slot.upgrade() {
        leave(&mut slot.lock(), &sender);
    }
    if let Err(error) = ended {
        tracing::debug!(%error, "the membership watch failed; its waiters sleep to their deadline");
        sender.send_replace(Watched::Broken);
    }
}

/// Empties the slot when it holds this task's receiver.
fn leave(slot: &mut Option<watch::Receiver<Watched>>, sender: &watch::Sender<Watched>) {
    let ours = sender.subscribe();
    if slot.as_ref().is_some_and(|state| state.same_channel(&ours)) {
        *slot = None;
    }
}

/// Watches the nodes' keys from the current revision, publishing each join and leave;
/// `Ok` once it went unwaited for `LINGER` or its registry was dropped.
async fn follow(
    conn: &Conn,
    dir: &str,
    sender: &watch::Sender<Watched>,
    slot: &WeakSlot,
) -> Result<()> {
    let mut stream = conn
        .watch(
            "watching membership",
            dir,
            WatchOptions::new().with_prefix(),
        )
        .await?;
    let mut linger = Linger::new();
    loop {
        tokio::select! {
            response = next_response(&mut stream, "membership") => {
                let Some(response) = response? else {
                    return Err(Error::store_msg(BACKEND, "the membership watch ended"));
                };
                let revision = response.header().map_or(0, |h| h.revision());
                let changed = response
                    .events()
                    .iter()
                    .filter(|event| membership_change(event, dir).is_some())
                    .filter_map(|event| event.kv().map(|kv| kv.mod_revision()))
                    .max();
                sender.send_if_modified(|state| {
                    let next = match (*state, changed) {
                        // The first answer is the watch's creation: its header is the
                        // revision it starts after.
                        (Watched::Starting, changed) => Watched::Known {
                            from: revision,
                            changed: changed.unwrap_or(0),
                        },
                        (Watched::Known { from, changed: before }, Some(changed)) => {
                            Watched::Known { from, changed: before.max(changed) }
                        }
                        (unchanged, _) => unchanged,
                    };
                    let modified = next != *state;
                    *state = next;
                    modified
                });
            }
            _ = linger.tick() => {
                let Some(slot) = slot.upgrade() else {
                    return Ok(());
                };
                let mut slot = slot.lock();
                if linger.unwaited(sender.receiver_count()) {
                    leave(&mut slot, sender);
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter is told of a join or leave past its read; waits while the watch has
    /// seen none; and cannot be told by a watch that opened after its read, or that has
    /// not opened or broke.
    #[test]
    fn answers_from_the_state_alone() {
        let known = |from, changed| Watched::Known { from, changed };
        assert_eq!(known(10, 0).answer(12), Answer::Wait);
        assert_eq!(known(10, 12).answer(12), Answer::Wait, "the read saw it");
        assert_eq!(known(10, 13).answer(12), Answer::Changed);
        assert_eq!(known(10, 13).answer(10), Answer::Changed);
        assert_eq!(known(10, 0).answer(10), Answer::Wait, "opened at the read");
        assert_eq!(
            known(10, 0).answer(9),
            Answer::Unknown,
            "opened after the read"
        );
        assert_eq!(Watched::Starting.answer(12), Answer::Unknown);
        assert_eq!(Watched::Broken.answer(12), Answer::Unknown);
    }
}
