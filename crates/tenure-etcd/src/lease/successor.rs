//! [`LeaseStore::wait_for_successor`]: one watch per role and store, shared by its
//! waiters, that says from the events alone what replaced a term.
//!
//! The watch covers the range `[leases/R, leases/R \x01)`: the role's lease key and its
//! handover key (see `schema.rs`). A put of the lease key names the new term's holder
//! (its value) and token (its create revision); a delete with no handover key is a term
//! ended with nobody next; a handover key means the term has ended and the next one is
//! about to begin (see `queue.rs`), so waiters keep waiting for it instead of all
//! contending. etcd sends one revision's events in one response, so the end of a term
//! and the reservation that goes with it are never seen apart.
//!
//! The first waiter of a role reads the range and starts the watch from the revision
//! after the read (two requests); the watch then runs in a task of its own and stays
//! while anyone waits and `LINGER` (`linger.rs`) after, so a waiter that waits again
//! (after a term went to another candidate, or after refreshing its place) costs the
//! store nothing.
//! A watch that breaks is dropped (its waiters sleep to their deadline, never
//! spinning) and the next waiter starts a new one.

use std::sync::{Arc, Weak};

use tenure::lease::wait_out_bad_role;
use tenure::TermChange;
use tokio::sync::watch;
use tokio::time::Instant;

use super::*;
use crate::linger::Linger;

/// A role's term as its watch last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Watched {
    /// The first read has not answered yet.
    Starting,
    /// As of `revision`: the live term (holder, token, etcd lease), if any, and whether
    /// a handover is under way.
    Known {
        revision: i64,
        term: Option<(String, i64, i64)>,
        handing: bool,
    },
    /// The watch failed or ended.
    Broken,
}

/// The watches of one store, by role: each a receiver of the state its task publishes.
pub(super) type Watches = Arc<Mutex<HashMap<String, watch::Receiver<Watched>>>>;

/// The tasks' handle on their store's map: a task whose store was dropped ends (and so
/// lets the client's connection go) at its next tick.
type WeakWatches = Weak<Mutex<HashMap<String, watch::Receiver<Watched>>>>;

impl Watched {
    /// Folds one key of the range (as read, or as an event left it: `present` is its
    /// value, create revision and etcd lease, `None` once deleted) into the state.
    fn apply(
        &mut self,
        keys: &Keys,
        role: &str,
        key: &[u8],
        present: Option<(String, i64, i64)>,
        revision: i64,
    ) {
        let Watched::Known {
            revision: at,
            term,
            handing,
        } = self
        else {
            return;
        };
        *at = (*at).max(revision);
        if key == keys.lease(role).as_bytes() {
            *term = present;
        } else if key == keys.handoff(role).as_bytes() {
            *handing = present.is_some();
        }
    }

    /// What a waiter on term `observed` learns from this state: `None` to wait on.
    fn answer(&self, observed: FencingToken) -> Option<TermChange> {
        let Watched::Known {
            revision,
            term,
            handing,
        } = self
        else {
            return None;
        };
        let observed = i64::try_from(observed.get()).unwrap_or(i64::MAX);
        if observed > *revision {
            // The waiter read a term the watch has not reached yet.
            return None;
        }
        match term {
            Some((holder, token, _)) if *token != observed => Some(TermChange::Began {
                holder: holder.clone(),
                fencing_token: FencingToken::from(u64::try_from(*token).unwrap_or(0)),
                session: None,
            }),
            Some(_) => None,
            None if *handing => None,
            None => Some(TermChange::Ended),
        }
    }
}

impl EtcdLeaseStore {
    /// [`LeaseStore::wait_for_successor`] on the role's shared watch.
    pub(super) async fn successor(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: Instant,
    ) -> TermChange {
        if wait_out_bad_role(role, deadline).await {
            return TermChange::Unknown;
        }
        let mut state = self.role_watch(role);
        loop {
            let seen = state.borrow_and_update().clone();
            if seen == Watched::Broken {
                tokio::time::sleep_until(deadline).await;
                return TermChange::Unknown;
            }
            if let Some(change) = seen.answer(observed) {
                if let (
                    TermChange::Began { holder, .. },
                    Watched::Known {
                        term: Some((_, token, lease)),
                        ..
                    },
                ) = (&change, &seen)
                {
                    self.adopt_handed(role, holder, *token, *lease);
                }
                return change;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return TermChange::Unknown,
                changed = state.changed() => if changed.is_err() {
                    // The task went away with its runtime.
                    tokio::time::sleep_until(deadline).await;
                    return TermChange::Unknown;
                },
            }
        }
    }

    /// A receiver of `role`'s watch state, starting the watch when none runs.
    fn role_watch(&self, role: &str) -> watch::Receiver<Watched> {
        let mut watches = self.watches.lock();
        if let Some(state) = watches.get(role) {
            // A task that ended dropped its sender.
            if state.has_changed().is_ok() {
                return state.clone();
            }
        }
        watches.retain(|_, state| state.has_changed().is_ok());
        let (sender, receiver) = watch::channel(Watched::Starting);
        watches.insert(role.to_owned(), receiver.clone());
        tokio::spawn(run_watch(
            self.conn.clone(),
            self.keys.clone(),
            role.to_owned(),
            sender,
            Arc::downgrade(&self.watches),
        ));
        receiver
    }
}

/// The task of one role's watch: publishes its state until it breaks or nobody has
/// waited for `LINGER`, then leaves the map.
async fn run_watch(
    conn: Conn,
    keys: Keys,
    role: String,
    sender: watch::Sender<Watched>,
    watches: WeakWatches,
) {
    if let Err(error) = follow(&conn, &keys, &role, &sender, &watches).await {
        tracing::debug!(role, %error, "the successor watch failed; its waiters sleep to their deadline");
        if let Some(watches) = watches.upgrade() {
            leave(&mut watches.lock(), &role, &sender);
        }
        sender.send_replace(Watched::Broken);
    }
}

/// A key of the range as [`Watched::apply`] takes it: for the lease key, the holder (its
/// value), the token (its create revision) and its etcd lease.
fn present(kv: &KeyValue) -> (String, i64, i64) {
    let holder = String::from_utf8_lossy(kv.value()).into_owned();
    (holder, kv.create_revision(), kv.lease())
}

/// Removes `role`'s entry from the map when it is this task's.
fn leave(
    map: &mut HashMap<String, watch::Receiver<Watched>>,
    role: &str,
    sender: &watch::Sender<Watched>,
) {
    let ours = sender.subscribe();
    if map.get(role).is_some_and(|state| state.same_channel(&ours)) {
        map.remove(role);
    }
}

/// Reads the role's range, then watches it from the next revision, publishing each
/// state; `Ok` once it went unwaited for `LINGER` or its store was dropped.
async fn follow(
    conn: &Conn,
    keys: &Keys,
    role: &str,
    sender: &watch::Sender<Watched>,
    watches: &WeakWatches,
) -> Result<()> {
    let range_end = keys.lease_range_end(role);
    let read = conn
        .get(
            "reading a lease",
            &keys.lease(role),
            Some(GetOptions::new().with_range(range_end.clone())),
        )
        .await?;
    let revision = read.header().map_or(0, |h| h.revision());
    let mut state = Watched::Known {
        revision,
        term: None,
        handing: false,
    };
    for kv in read.kvs() {
        state.apply(keys, role, kv.key(), Some(present(kv)), revision);
    }
    sender.send_replace(state.clone());
    // Start right after the read: a watch from a past revision joins etcd's live set
    // only on a 100 ms background loop, which would delay the push by that much.
    let options = WatchOptions::new()
        .with_range(range_end)
        .with_start_revision(revision + 1);
    let mut stream = conn
        .watch("watching a lease", &keys.lease(role), options)
        .await?;
    let mut linger = Linger::new();
    loop {
        tokio::select! {
            response = next_response(&mut stream, "lease") => {
                let Some(response) = response? else {
                    return Err(Error::store_msg(BACKEND, "the lease watch ended"));
                };
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let kept = (event.event_type() == EventType::Put).then(|| present(kv));
                    state.apply(keys, role, kv.key(), kept, kv.mod_revision());
                }
                sender.send_if_modified(|published| {
                    let modified = *published != state;
                    *published = state.clone();
                    modified
                });
            }
            _ = linger.tick() => {
                let Some(watches) = watches.upgrade() else {
                    return Ok(());
                };
                let mut map = watches.lock();
                if linger.unwaited(sender.receiver_count()) {
                    leave(&mut map, role, sender);
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(revision: i64, term: Option<(&str, i64)>, handing: bool) -> Watched {
        Watched::Known {
            revision,
            term: term.map(|(holder, token)| (holder.to_owned(), token, 7)),
            handing,
        }
    }

    /// What a waiter is told: a term other than the one it observed began; none is live
    /// and none is about to begin; or nothing yet (its term goes on, a handover is under
    /// way, or the watch has not reached the revision of the term it observed).
    #[test]
    fn answers_from_the_state_alone() {
        let observed = FencingToken::from(10);
        assert_eq!(known(12, Some(("a", 10)), false).answer(observed), None);
        assert_eq!(
            known(12, Some(("b", 12)), false).answer(observed),
            Some(TermChange::Began {
                holder: "b".into(),
                fencing_token: FencingToken::from(12),
                session: None,
            })
        );
        assert_eq!(
            known(12, None, false).answer(observed),
            Some(TermChange::Ended)
        );
        assert_eq!(
            known(12, None, true).answer(observed),
            None,
            "a handover under way"
        );
        // The watch is behind the read that showed term 10: it may still show the term
        // before, or none.
        assert_eq!(known(9, Some(("z", 5)), false).answer(observed), None);
        assert_eq!(known(9, None, false).answer(observed), None);
        assert_eq!(Watched::Starting.answer(observed), None);
        assert_eq!(Watched::Broken.answer(observed), None);
    }

    /// Events fold into the state by key: the lease key's put is the term (holder, token,
    /// etcd lease), its delete none; the handover key's put and delete start and end a
    /// handover; other keys change nothing but the revision.
    #[test]
    fn events_fold_by_key() {
        let keys = Keys::new("/p").unwrap();
        let handoff = keys.handoff("r");
        let lease = keys.lease("r");
        let mut state = known(1, Some(("a", 1)), false);
        state.apply(&keys, "r", lease.as_bytes(), None, 4);
        state.apply(&keys, "r", handoff.as_bytes(), Some(("{}".into(), 4, 0)), 4);
        assert_eq!(
            state,
            known(4, None, true),
            "a release that reserved the role"
        );
        state.apply(&keys, "r", lease.as_bytes(), Some(("b".into(), 5, 7)), 5);
        state.apply(&keys, "r", handoff.as_bytes(), None, 5);
        assert_eq!(
            state,
            known(5, Some(("b", 5)), false),
            "the candidate's term"
        );
        state.apply(&keys, "r", keys.lease("r/x").as_bytes(), None, 6);
        assert_eq!(state, known(6, Some(("b", 5)), false));
    }
}
