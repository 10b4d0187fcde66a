//! [`LeaseCopy`]: a reader's own copy of the leases under a prefix, kept current by
//! reads of what changed ([`LeaseStore::list_prefix_changes`]). A shard member's look at
//! a settled group of a million shards reads the few terms that began or ended since
//! its last look and how long each member's session has left, not every lease.
//!
//! A copy is only ever a view: roles are taken and released through the store, which
//! alone decides. A copy gone stale plans from wrong holders (an acquire refused, an
//! orphan left until a later read), and can never give a role two holders.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::lease::{ChangeMark, ChangesRead, LeaseStore, PrefixChanges};
use crate::{FencingToken, Result, SessionId};

/// One lease as the copy last read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopiedLease<'a> {
    /// The owner of the latest term, or `None` once it was released.
    pub holder: Option<&'a str>,
    /// The latest token handed out for the role.
    pub fencing_token: FencingToken,
    /// The session the term is held under, if the store said.
    pub session: Option<SessionId>,
    /// Time left in the term at the last read (zero: lapsed or released); under a
    /// session, what the session had left.
    pub left: Duration,
}

impl<'a> CopiedLease<'a> {
    /// The live holder, if any: set, and time left at the last read.
    pub fn live_holder(&self) -> Option<&'a str> {
        self.holder.filter(|_| !self.left.is_zero())
    }

    /// The same term, held or not alike: holder, token, session and liveness equal.
    fn same_term(&self, other: &CopiedLease<'_>) -> bool {
        self.holder == other.holder
            && self.fencing_token == other.fencing_token
            && self.session == other.session
            && self.left.is_zero() == other.left.is_zero()
    }
}

/// A lease as stored in the copy: a term under a session takes its time left from the
/// session's (see [`LeaseCopy`]), so a read need not touch it when only time passed.
#[derive(Clone, Debug)]
struct Stored {
    holder: Option<String>,
    fencing_token: FencingToken,
    session: Option<SessionId>,
    /// Time left at the read that listed it; used only when it has no session.
    left: Duration,
}

/// A session that holds leases of the copy.
#[derive(Clone, Copy, Debug)]
struct SessionHolds {
    /// What it had left at the last read.
    left: Duration,
    /// How many of the copy's leases name it with a holder.
    leases: usize,
}

/// The copy's sessions, by id.
type Sessions = HashMap<SessionId, SessionHolds>;

impl Stored {
    fn view<'a>(&'a self, sessions: &Sessions) -> CopiedLease<'a> {
        let left = match (&self.holder, self.session) {
            (None, _) => Duration::ZERO,
            (Some(_), Some(session)) => sessions.get(&session).map_or(Duration::ZERO, |s| s.left),
            (Some(_), None) => self.left,
        };
        CopiedLease {
            holder: self.holder.as_deref(),
            fencing_token: self.fencing_token,
            session: self.session,
            left,
        }
    }

    /// The session it counts for in [`Sessions`]: its own, while it names a holder.
    fn held_under(&self) -> Option<SessionId> {
        self.session.filter(|_| self.holder.is_some())
    }
}

/// The leases under one prefix, keyed by `K` (what a key function makes of a role:
/// the role itself, a shard number), as of the last [`read`](Self::read).
///
/// A read costs what changed, not the number of leases: the copy keeps each holding
/// session's time left once, not each lease's, and the leases held with no session
/// apart (the store lists each of them at every read, or, on a store that cannot,
/// counts the held leases instead: a copy that counts another number reads again
/// completely; see [`PrefixChanges::held`]).
///
/// ```
/// # tokio_test_block_on(async {
/// use std::time::Duration;
/// use tenure::{InMemoryLeaseStore, LeaseCopy, LeaseStore};
///
/// let store = InMemoryLeaseStore::new();
/// let session = store.open_session("a", Duration::from_secs(10)).await.unwrap().id;
/// store.acquire_in_session("jobs/7", session).await.unwrap();
/// let mut copy = LeaseCopy::default();
/// let shard = |role: &str| role.parse::<u32>().ok();
/// copy.read(&store, "jobs/", shard).await.unwrap(); // complete: the first read
/// store.acquire_in_session("jobs/8", session).await.unwrap();
/// copy.read(&store, "jobs/", shard).await.unwrap(); // only jobs/8, and the session
/// assert_eq!(copy.get(&8).and_then(|lease| lease.live_holder()), Some("a"));
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LeaseCopy<K> {
    /// Where the last read left off; `None`: the next read is complete.
    mark: Option<ChangeMark>,
    leases: BTreeMap<K, Stored>,
    /// Every session that holds one of `leases`.
    sessions: Sessions,
    /// The leases held with no session.
    own: BTreeSet<K>,
    /// A read since the last complete one listed a live lease whose role the key
    /// function refused: the store's count of held leases ([`PrefixChanges::held`])
    /// includes it, so the copy cannot check it.
    left_out_held: bool,
}

impl<K> Default for LeaseCopy<K> {
    fn default() -> Self {
        LeaseCopy {
            mark: None,
            leases: BTreeMap::new(),
            sessions: HashMap::new(),
            own: BTreeSet::new(),
            left_out_held: false,
        }
    }
}

impl<K: Ord + Clone> LeaseCopy<K> {
    /// Brings the copy up to what the store holds under `prefix`, reading what changed
    /// since the last read (everything the first time, and after a failed read). `key`
    /// makes a key of each role with `prefix` stripped; roles it refuses are left out.
    ///
    /// Returns whether any lease now differs from the last read in its holder, token,
    /// session, or whether it is live (time left alone does not count): a reader that
    /// planned from the last read and gets `false` may keep that plan, at a cost that
    /// grows with what changed, not with the number of leases.
    pub async fn read(
        &mut self,
        store: &dyn LeaseStore,
        prefix: &str,
        key: impl Fn(&str) -> Option<K>,
    ) -> Result<bool> {
        let sessions: Vec<SessionId> = match self.mark {
            Some(_) => self.sessions.keys().copied().collect(),
            None => Vec::new(),
        };
        let since = self.mark.take();
        let mut read = ChangesRead {
            prefix,
            since,
            sessions: &sessions,
        };
        let mut changed = false;
        loop {
            let changes = store.list_prefix_changes(read).await?;
            let complete = changes.complete;
            let held = changes.held;
            changed |= self.apply(changes, prefix, &key);
            if held.is_none_or(|held| self.counts(held)) {
                return Ok(changed);
            }
            // The store counts otherwise: an end it did not list (a lease of its own
            // that lapsed). Read everything now, and again at the next read if even
            // that disagrees (roles `key` refuses are held).
            self.mark = None;
            if complete {
                return Ok(changed);
            }
            read = ChangesRead::complete(prefix);
        }
    }

    /// Whether the copy holds `held` leases, and none under a role it left out.
    fn counts(&self, held: usize) -> bool {
        let alone = self
            .own
            .iter()
            .filter(|k| self.leases.get(k).is_some_and(|l| !l.left.is_zero()))
            .count();
        let under_sessions: usize = self
            .sessions
            .values()
            .filter(|s| !s.left.is_zero())
            .map(|s| s.leases)
            .sum();
        !self.left_out_held && alone + under_sessions == held
    }

    /// Applies one answer of [`LeaseStore::list_prefix_changes`]; whether any lease
    /// changed (see [`read`](Self::read)).
    fn apply(
        &mut self,
        changes: PrefixChanges,
        prefix: &str,
        key: impl Fn(&str) -> Option<K>,
    ) -> bool {
        let before = changes.complete.then(|| {
            self.own.clear();
            self.left_out_held = false;
            (
                std::mem::take(&mut self.leases),
                std::mem::take(&mut self.sessions),
            )
        });
        let mut changed = false;
        // Sessions asked about: what each has left now (none, once it is gone).
        let left: HashMap<SessionId, Duration> = changes.sessions.into_iter().collect();
        for (id, session) in &mut self.sessions {
            let now = left.get(id).copied().unwrap_or_default();
            changed |= session.left.is_zero() != now.is_zero();
            session.left = now;
        }
        // Held leases of their own are listed at every read while held, unless the
        // store counts what is held instead: one not listed now is no longer held.
        let mut own_unlisted = match changes.held {
            None => std::mem::take(&mut self.own),
            Some(_) => BTreeSet::new(),
        };
        for listed in changes.leases {
            let Some(k) = listed.info.role.strip_prefix(prefix).and_then(&key) else {
                self.left_out_held |= listed.info.live_holder().is_some();
                continue;
            };
            own_unlisted.remove(&k);
            let lease = Stored {
                left: listed.info.remaining(),
                holder: listed.info.holder,
                fencing_token: listed.info.fencing_token,
                session: listed.session,
            };
            if let Some(session) = lease.held_under() {
                let holds = self.sessions.entry(session).or_insert(SessionHolds {
                    left: lease.left,
                    leases: 0,
                });
                holds.leases += 1;
                holds.left = lease.left;
            }
            if lease.holder.is_some() && lease.session.is_none() {
                self.own.insert(k.clone());
            } else {
                self.own.remove(&k);
            }
            // Both sides seen through the sessions as updated: a lapse counted above.
            changed |= self.leases.get(&k).is_none_or(|was| {
                !was.view(&self.sessions)
                    .same_term(&lease.view(&self.sessions))
            });
            let was = self.leases.insert(k, lease);
            if let Some(session) = was.as_ref().and_then(Stored::held_under) {
                if let Some(holds) = self.sessions.get_mut(&session) {
                    holds.leases = holds.leases.saturating_sub(1);
                }
            }
        }
        for k in own_unlisted {
            if let Some(lease) = self.leases.get_mut(&k) {
                changed |= !lease.left.is_zero();
                lease.left = Duration::ZERO;
            }
        }
        self.sessions.retain(|_, holds| holds.leases > 0);
        if let Some((leases, sessions)) = before {
            // A complete read replaced every lease: compare the whole copy.
            changed = leases.len() != self.leases.len()
                || leases
                    .iter()
                    .zip(&self.leases)
                    .any(|((k, was), (key, now))| {
                        k != key || !was.view(&sessions).same_term(&now.view(&self.sessions))
                    });
        }
        self.mark = changes.mark;
        changed
    }

    /// The lease of `key`, as last read.
    pub fn get(&self, key: &K) -> Option<CopiedLease<'_>> {
        self.leases.get(key).map(|lease| lease.view(&self.sessions))
    }

    /// Every lease, in key order, as last read.
    pub fn iter(&self) -> impl Iterator<Item = (&K, CopiedLease<'_>)> {
        self.leases
            .iter()
            .map(|(k, lease)| (k, lease.view(&self.sessions)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::SystemTime;

    use super::*;
    use crate::{InMemoryLeaseStore, ManualClock};

    type Live = BTreeMap<u32, (String, Duration, FencingToken)>;

    fn shard(role: &str) -> Option<u32> {
        role.parse().ok()
    }

    fn live(copy: &LeaseCopy<u32>) -> Live {
        copy.iter()
            .filter_map(|(k, lease)| {
                let holder = lease.live_holder()?.to_owned();
                Some((*k, (holder, lease.left, lease.fencing_token)))
            })
            .collect()
    }

    /// What a complete read shows.
    async fn fresh(store: &dyn LeaseStore) -> Live {
        let mut copy = LeaseCopy::default();
        copy.read(store, "g/", shard).await.unwrap();
        live(&copy)
    }

    /// Reads `copy` again; what it holds now, checked against a complete read, and
    /// whether the read said it changed, checked against what it held before.
    async fn read(copy: &mut LeaseCopy<u32>, store: &dyn LeaseStore) -> (Live, bool) {
        let terms = |copy: &LeaseCopy<u32>| -> Vec<_> {
            copy.iter()
                .map(|(k, lease)| {
                    (
                        *k,
                        lease.live_holder().map(str::to_owned),
                        lease.fencing_token,
                    )
                })
                .collect()
        };
        let before = terms(copy);
        let changed = copy.read(store, "g/", shard).await.unwrap();
        let read = live(copy);
        assert_eq!(read, fresh(store).await);
        assert_eq!(changed, terms(copy) != before, "{before:?} -> {read:?}");
        (read, changed)
    }

    #[tokio::test]
    async fn a_copy_kept_by_changes_matches_a_complete_read() {
        let clock = ManualClock::new(SystemTime::UNIX_EPOCH);
        let store = Arc::new(InMemoryLeaseStore::with_clock(clock.clone()));
        let ttl = Duration::from_secs(10);
        let a = store.open_session("a", ttl).await.unwrap().id;
        let b = store.open_session("b", ttl).await.unwrap().id;
        let mut copy = LeaseCopy::default();
        let roles = |range: std::ops::Range<u32>| -> Vec<String> {
            range.map(|k| format!("g/{k}")).collect()
        };
        store
            .acquire_many_in_session(&roles(0..4), a)
            .await
            .unwrap();
        store
            .acquire_many_in_session(&roles(4..8), b)
            .await
            .unwrap();
        let (now, changed) = read(&mut copy, store.as_ref()).await;
        assert!(changed);
        assert_eq!(now.len(), 8);
        // Nothing changed; then a keep-alive only: time left is not a change.
        assert!(!read(&mut copy, store.as_ref()).await.1);
        clock.advance(Duration::from_secs(1));
        store.keep_alive_session(b, ttl).await.unwrap();
        assert!(!read(&mut copy, store.as_ref()).await.1);

        // A release, a plain lease, time passing and a keep-alive: none of it rewrites
        // the untouched leases, and the copy still matches.
        let token = copy.get(&1).unwrap().fencing_token;
        assert!(store.release("g/1", "a", token).await.unwrap());
        store
            .try_acquire_or_renew("g/1", "c", ttl / 2)
            .await
            .unwrap();
        clock.advance(Duration::from_secs(2));
        store.keep_alive_session(b, ttl).await.unwrap();
        let (now, changed) = read(&mut copy, store.as_ref()).await;
        assert!(changed);
        assert_eq!(now[&1].0, "c");
        assert_eq!(now[&5].1, ttl);

        // a's session lapses, c's own lease too: their shards drop out.
        clock.advance(Duration::from_secs(7));
        let (now, changed) = read(&mut copy, store.as_ref()).await;
        assert!(changed);
        assert_eq!(now.keys().copied().collect::<Vec<_>>(), vec![4, 5, 6, 7]);

        // b closes its session; a new one takes a shard back.
        store.close_session(b).await.unwrap();
        let d = store.open_session("d", ttl).await.unwrap().id;
        store.acquire_in_session("g/6", d).await.unwrap();
        let (now, changed) = read(&mut copy, store.as_ref()).await;
        assert!(changed);
        assert_eq!(now.keys().copied().collect::<Vec<_>>(), vec![6]);
    }

    /// Answers reads of what changed as a store that cannot list the leases of their
    /// own does (etcd): those with a holder left out of every read with a mark (etcd
    /// lists the ones whose record changed; none here after the first read), and the
    /// count of held leases said instead. Counts the reads.
    struct CountsInstead {
        reads: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl crate::intercept::Interceptor for CountsInstead {
        async fn intercept(
            &self,
            call: crate::intercept::Call,
            next: crate::intercept::Next,
        ) -> crate::intercept::Reply {
            let crate::intercept::Call::ListChanges { prefix, .. } = &call else {
                return next.run(call).await;
            };
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let list = crate::intercept::Call::List {
                prefix: prefix.clone(),
            };
            let listed = next.clone().run(list).await.into_list();
            let reply = next.run(call).await;
            let (Ok(listed), Ok(mut changes)) = (listed, reply.into_changes()) else {
                panic!("a read failed");
            };
            changes.held = Some(listed.iter().filter(|l| l.live_holder().is_some()).count());
            if !changes.complete {
                changes
                    .leases
                    .retain(|l| l.session.is_some() || l.info.holder.is_none());
            }
            crate::intercept::Reply::Changes(Ok(changes))
        }
    }

    /// Reads `copy` through `store`; whether the read said it changed, checked against
    /// the holders and tokens it held before; those it holds now, checked against a
    /// complete read of `memory` (the store behind `store`). Time left is not compared:
    /// a lease of its own that was not listed keeps what it had.
    async fn read_holders(
        copy: &mut LeaseCopy<u32>,
        store: &dyn LeaseStore,
        memory: &dyn LeaseStore,
    ) -> (Vec<u32>, bool) {
        let holders = |live: Live| -> Vec<_> {
            live.into_iter()
                .map(|(k, (holder, _, token))| (k, holder, token))
                .collect()
        };
        let before = holders(live(copy));
        let changed = copy.read(store, "g/", shard).await.unwrap();
        let now = holders(live(copy));
        assert_eq!(now, holders(fresh(memory).await));
        assert_eq!(changed, now != before, "{before:?} -> {now:?}");
        (now.into_iter().map(|(k, _, _)| k).collect(), changed)
    }

    #[tokio::test]
    async fn a_count_of_held_leases_that_disagrees_brings_a_complete_read() {
        let clock = ManualClock::new(SystemTime::UNIX_EPOCH);
        let memory = Arc::new(InMemoryLeaseStore::with_clock(clock.clone()));
        let counting = Arc::new(CountsInstead {
            reads: Default::default(),
        });
        let store = crate::intercept::InterceptStore::new(memory.clone()).with(counting.clone());
        let reads = || counting.reads.load(std::sync::atomic::Ordering::SeqCst);
        let ttl = Duration::from_secs(10);
        let a = store.open_session("a", ttl).await.unwrap().id;
        store.acquire_in_session("g/0", a).await.unwrap();
        store.try_acquire_or_renew("g/1", "c", ttl).await.unwrap();
        let mut copy = LeaseCopy::default();
        let (now, changed) = read_holders(&mut copy, &store, memory.as_ref()).await;
        assert!(changed);
        assert_eq!(now, vec![0, 1]);
        // The lease of its own is not listed, but the count agrees: one read.
        clock.advance(Duration::from_secs(2));
        store.keep_alive_session(a, ttl).await.unwrap();
        let before = reads();
        assert!(!read_holders(&mut copy, &store, memory.as_ref()).await.1);
        assert_eq!(reads() - before, 1);
        // It lapses: the count disagrees, and the copy reads everything at once.
        clock.advance(Duration::from_secs(9));
        store.keep_alive_session(a, ttl).await.unwrap();
        let before = reads();
        let (now, changed) = read_holders(&mut copy, &store, memory.as_ref()).await;
        assert!(changed);
        assert_eq!(now, vec![0]);
        assert_eq!(reads() - before, 2, "the read, then a complete one");
        let before = reads();
        assert!(!read_holders(&mut copy, &store, memory.as_ref()).await.1);
        assert_eq!(reads() - before, 1, "the count agrees again");
        // The lapsed lease's role taken under a session: counted once.
        store.acquire_in_session("g/1", a).await.unwrap();
        let before = reads();
        assert!(read_holders(&mut copy, &store, memory.as_ref()).await.1);
        assert_eq!(
            reads() - before,
            1,
            "a term under a session is not one of its own"
        );

        // A held role the key refuses: the count cannot be checked, so the next read
        // is complete, and so is every read after it.
        store.acquire_in_session("g/x", a).await.unwrap();
        assert!(!read_holders(&mut copy, &store, memory.as_ref()).await.1);
        store.acquire_in_session("g/2", a).await.unwrap();
        let before = reads();
        let (now, changed) = read_holders(&mut copy, &store, memory.as_ref()).await;
        assert!(changed);
        assert_eq!(now, vec![0, 1, 2]);
        assert_eq!(reads() - before, 1, "one complete read");
        assert!(copy.mark.is_none(), "the next read is complete too");
    }
}
