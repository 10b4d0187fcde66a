//! [`InMemoryLeaseStore`]: the lease contract on a sharded hash map.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};
use tokio::sync::Notify;

use super::registry::NodeTable;
use super::slot::{first_slot, new_term, Session, Sessions, Slot};
use crate::lease::{
    validate_name, validate_release, validate_ttl, validate_value, AcquireRequest, ChangeMark,
    ChangesRead, EndRequest, Handover, ListedLease, PrefixChanges,
};
use crate::session::validate_open;
use crate::{
    Clock, Error, FencingToken, InMemoryNodeRegistry, LeaseInfo, LeaseResult, LeaseStore, Result,
    SessionGrant, SessionId, SystemClock, TermChange,
};

const SHARDS: usize = 16;

/// The lease store for one process, on an injected [`Clock`].
///
/// Roles are spread over 16 mutex-guarded shards, so contenders for different roles
/// rarely meet; renewing an existing term updates its entry in place. Waiting contenders are
/// woken through a per-role [`Notify`] the moment a term is released or replaced.
///
/// # Examples
///
/// ```
/// # tokio_test_block_on(async {
/// use std::time::{Duration, SystemTime};
/// use tenure::{InMemoryLeaseStore, LeaseStore, ManualClock};
///
/// let clock = ManualClock::new(SystemTime::UNIX_EPOCH);
/// let store = InMemoryLeaseStore::with_clock(clock.clone());
/// let ttl = Duration::from_secs(10);
/// let a = store.try_acquire_or_renew("reports", "node-a", ttl).await.unwrap();
/// assert!(a.acquired);
/// assert_eq!(a.fencing_token.get(), 1);
///
/// clock.advance(ttl); // node-a stalls past its TTL
/// let b = store.try_acquire_or_renew("reports", "node-b", ttl).await.unwrap();
/// assert!(b.acquired);
/// assert_eq!(b.fencing_token.get(), 2);
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug)]
pub struct InMemoryLeaseStore {
    clock: Arc<dyn Clock>,
    shards: Box<[Mutex<FxHashMap<String, Slot>>]>,
    /// Locked after a shard, never before one.
    sessions: Mutex<Sessions>,
    next_session: AtomicU64,
    /// Woken when a role gets its first term, for [`LeaseStore::wait_for_term`] on a
    /// role that has no slot yet.
    created: Notify,
    /// The nodes of the registries made by [`InMemoryLeaseStore::registry`].
    nodes: Arc<NodeTable>,
    /// The last change number handed out ([`Slot::changed_at`]). Taken under the
    /// changed slot's lock, and read before a read of changes locks any: so a change
    /// numbered at or below a read's mark is visible to that read.
    changes: AtomicU64,
}

impl Default for InMemoryLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryLeaseStore {
    /// A store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A store whose time comes from `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        let shards = (0..SHARDS)
            .map(|_| Mutex::new(FxHashMap::default()))
            .collect();
        InMemoryLeaseStore {
            clock: Arc::new(clock),
            shards,
            sessions: Mutex::new(Sessions::default()),
            next_session: AtomicU64::new(1),
            created: Notify::new(),
            nodes: Arc::default(),
            changes: AtomicU64::new(0),
        }
    }

    /// A registry on this store's clock, where a node is live for `ttl` after its last
    /// heartbeat, whose nodes this store's session keep-alives account for: each
    /// [`SessionGrant::peers_lapse`] tells when the first node other than the session's
    /// owner lapses, while every registry made here has the same TTL. A shard member
    /// then reads its group's members only when one is due to lapse, as on the durable
    /// backends.
    pub fn registry(&self, ttl: Duration) -> Result<InMemoryNodeRegistry> {
        InMemoryNodeRegistry::on_table(ttl, self.clock.clone(), self.nodes.clone())
    }

    fn shard(&self, role: &str) -> &Mutex<FxHashMap<String, Slot>> {
        // The map hashes with the same function; use the high bits here so the two
        // choices stay independent.
        let index = (FxBuildHasher.hash_one(role) >> 58) as usize % SHARDS;
        &self.shards[index]
    }
}

impl InMemoryLeaseStore {
    /// When `slot`'s term ends, locking the sessions only for a term held under one.
    fn expiry(&self, slot: &Slot) -> SystemTime {
        match slot.session {
            None => slot.expires_at,
            Some(_) => self.sessions.lock().expiry(slot),
        }
    }

    /// The last change number handed out, as a mark: a read whose mark is at or past it
    /// saw every change numbered so far (see [`SessionGrant::latest_change`]).
    fn latest_change(&self) -> ChangeMark {
        ChangeMark::new(self.changes.load(Ordering::SeqCst))
    }

    /// The next change number, for a slot whose term changes under its shard's lock.
    fn stamp(&self) -> u64 {
        self.changes.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn is_live_term(&self, slot: &Slot, token: FencingToken, now: SystemTime) -> bool {
        slot.holder.is_some() && slot.token == token && now < self.expiry(slot)
    }
}

impl InMemoryLeaseStore {
    /// [`LeaseStore::contend`].
    fn acquire(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        let (role, owner, ttl) = (request.role, request.owner, request.ttl);
        let (value, queue) = (request.value, request.queue);
        let now = self.clock.now();
        let expires_at = validate_ttl(ttl, Duration::from_nanos(1), now)?;
        validate_value("value", value)?;
        let mut shard = self.shard(role).lock();
        // Renewal fast path: a stored role and holder were validated when they were
        // stored, so a live holder equal to `owner` needs no further checks.
        if let Some(slot) = shard.get_mut(role) {
            if slot.session.is_none()
                && now < slot.expires_at
                && slot.holder.as_deref() == Some(owner)
            {
                slot.expires_at = expires_at;
                return Ok(LeaseResult {
                    acquired: true,
                    fencing_token: slot.token,
                    expires_at,
                    now,
                    holder: owner.to_owned(),
                });
            }
        }
        validate_name("role", role)?;
        validate_name("owner", owner)?;
        let Some(slot) = shard.get_mut(role) else {
            let slot = first_slot(owner, expires_at, None, value, self.stamp());
            shard.insert(role.to_owned(), slot);
            self.created.notify_waiters();
            return Ok(LeaseResult {
                acquired: true,
                fencing_token: FencingToken::from(1),
                expires_at,
                now,
                holder: owner.to_owned(),
            });
        };
        let current_expiry = self.expiry(slot);
        let live = now < current_expiry;
        match slot.holder.as_deref() {
            Some(holder) if live && holder == owner => {
                // The holder renews on its own from here: a session's term becomes a
                // plain lease, same token.
                if slot.session.take().is_some() {
                    slot.changed_at = self.stamp();
                }
                slot.expires_at = expires_at;
            }
            Some(holder) if live => {
                let holder = holder.to_owned();
                if queue {
                    slot.enqueue(owner, expires_at, value, now);
                }
                return Ok(LeaseResult {
                    acquired: false,
                    fencing_token: slot.token,
                    expires_at: current_expiry,
                    now,
                    holder,
                });
            }
            _ => {
                slot.dequeue(owner, now);
                new_term(slot, owner, expires_at, None, value);
                slot.changed_at = self.stamp();
            }
        }
        Ok(LeaseResult {
            acquired: true,
            fencing_token: slot.token,
            expires_at: slot.expires_at,
            now,
            holder: owner.to_owned(),
        })
    }

    /// [`LeaseStore::end_term`].
    fn close_term(&self, end: EndRequest<'_>) -> Result<bool> {
        end.validate()?;
        let (role, owner, token, how) = (end.role, end.owner, end.token, end.how);
        let now = self.clock.now();
        let mut shard = self.shard(role).lock();
        let Some(slot) = shard.get_mut(role) else {
            return Ok(false);
        };
        if !self.is_live_term(slot, token, now) || slot.holder.as_deref() != Some(owner) {
            return Ok(false);
        }
        let next = match how {
            Handover::Release => slot.take_candidate(None, now),
            Handover::To(successor) => match slot.take_candidate(successor, now) {
                Some(next) => Some(next),
                None => return Ok(false),
            },
            Handover::ToSessionOf(to) => {
                let mut sessions = self.sessions.lock();
                match sessions.newest_live(to, now) {
                    Some((id, session)) => {
                        session.roles.insert(role.to_owned());
                        session.terms_handed += 1;
                        slot.dequeue(to, now);
                        new_term(slot, to, session.expires_at, Some(id), None);
                        slot.changed_at = self.stamp();
                        return Ok(true);
                    }
                    None => slot.take_candidate(None, now),
                }
            }
        };
        slot.hand_to(next, now);
        slot.changed_at = self.stamp();
        Ok(true)
    }
}

#[async_trait]
impl LeaseStore for InMemoryLeaseStore {
    async fn contend(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        self.acquire(request)
    }

    async fn withdraw(&self, role: &str, owner: &str) -> Result<bool> {
        validate_release(role, owner)?;
        let now = self.clock.now();
        let mut shard = self.shard(role).lock();
        Ok(shard
            .get_mut(role)
            .is_some_and(|slot| slot.dequeue(owner, now)))
    }

    async fn candidates(&self, role: &str) -> Result<Vec<String>> {
        validate_name("role", role)?;
        let now = self.clock.now();
        let shard = self.shard(role).lock();
        Ok(shard.get(role).map_or_else(Vec::new, |slot| {
            slot.queue
                .iter()
                .filter(|c| now < c.expires_at)
                .map(|c| c.owner.clone())
                .collect()
        }))
    }

    async fn end_term(&self, end: EndRequest<'_>) -> Result<bool> {
        self.close_term(end)
    }

    async fn get(&self, role: &str) -> Result<Option<LeaseInfo>> {
        validate_name("role", role)?;
        let now = self.clock.now();
        let shard = self.shard(role).lock();
        let sessions = self.sessions.lock();
        Ok(shard.get(role).map(|slot| sessions.info(slot, role, now)))
    }

    async fn list_prefix(&self, prefix: &str) -> Result<Vec<LeaseInfo>> {
        let complete = self
            .list_prefix_changes(ChangesRead::complete(prefix))
            .await?;
        Ok(complete.leases.into_iter().map(|l| l.info).collect())
    }

    /// Scans every slot (one process: the work saved is the caller's, which applies
    /// only what changed), returning those changed after `since`.
    async fn list_prefix_changes(&self, read: ChangesRead<'_>) -> Result<PrefixChanges> {
        let ChangesRead {
            prefix,
            since,
            sessions,
        } = read;
        // Before any slot is locked: see `changes`.
        let mark = self.changes.load(Ordering::SeqCst);
        let now = self.clock.now();
        let mut leases: Vec<ListedLease> = self
            .shards
            .iter()
            .flat_map(|shard| {
                let shard = shard.lock();
                let known = self.sessions.lock();
                shard
                    .iter()
                    .filter(|(role, slot)| {
                        role.starts_with(prefix)
                            && (since.is_none_or(|since| slot.changed_at > since.get())
                                || (slot.session.is_none() && slot.holder.is_some()))
                    })
                    .map(|(role, slot)| ListedLease {
                        info: known.info(slot, role, now),
                        session: slot.session,
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        // Roles are distinct (the keys of the slots): an unstable sort gives the same
        // order as a stable one, without its merges of a million leases.
        leases.sort_unstable_by(|a, b| a.info.role.cmp(&b.info.role));
        let known = self.sessions.lock();
        let sessions = sessions
            .iter()
            .filter_map(|id| {
                let session = known.by_id.get(id)?;
                Some((
                    *id,
                    session.expires_at.duration_since(now).unwrap_or_default(),
                ))
            })
            .collect();
        Ok(PrefixChanges {
            leases,
            complete: since.is_none(),
            sessions,
            mark: Some(ChangeMark::new(mark)),
            held: None,
        })
    }

    async fn wait_for_change(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: tokio::time::Instant,
    ) {
        let changed = {
            let shard = self.shard(role).lock();
            match shard.get(role) {
                Some(slot) if self.is_live_term(slot, observed, self.clock.now()) => {
                    Arc::clone(&slot.changed)
                }
                _ => return,
            }
        };
        let notified = changed.notified();
        tokio::pin!(notified);
        // Register before re-checking, so a change between the check above and this
        // point is not missed.
        notified.as_mut().enable();
        {
            let shard = self.shard(role).lock();
            match shard.get(role) {
                Some(slot) if self.is_live_term(slot, observed, self.clock.now()) => {}
                _ => return,
            }
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }

    async fn wait_for_successor(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: tokio::time::Instant,
    ) -> TermChange {
        self.wait_for_change(role, observed, deadline).await;
        // In one process the store is the push: read what the change left.
        let now = self.clock.now();
        let shard = self.shard(role).lock();
        let Some(slot) = shard.get(role) else {
            return TermChange::Ended;
        };
        match &slot.holder {
            _ if self.is_live_term(slot, observed, now) => TermChange::Unknown,
            Some(holder) if now < self.expiry(slot) => TermChange::Began {
                holder: holder.clone(),
                fencing_token: slot.token,
                session: slot.session,
            },
            _ => TermChange::Ended,
        }
    }

    async fn wait_for_term(&self, role: &str, after: FencingToken, deadline: tokio::time::Instant) {
        // The notify to wait on: the slot's once it exists, else the store's `created`.
        let begun = |shard: &FxHashMap<String, Slot>| match shard.get(role) {
            Some(slot) if slot.token > after => Err(()),
            Some(slot) => Ok(Some(Arc::clone(&slot.changed))),
            None => Ok(None),
        };
        let Ok(slot_changed) = begun(&self.shard(role).lock()) else {
            return;
        };
        let notified = match &slot_changed {
            Some(changed) => changed.notified(),
            None => self.created.notified(),
        };
        tokio::pin!(notified);
        // Register before re-checking, so a term begun in between is not missed.
        notified.as_mut().enable();
        match begun(&self.shard(role).lock()) {
            Ok(now) if now.is_some() == slot_changed.is_some() => {}
            // A term began, or the slot appeared in between: let the caller look.
            _ => return,
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }

    async fn open_session(&self, owner: &str, ttl: Duration) -> Result<SessionGrant> {
        let now = self.clock.now();
        let expires_at = validate_open(owner, ttl, Duration::from_nanos(1), now)?;
        let id = SessionId::from(self.next_session.fetch_add(1, Ordering::Relaxed));
        let session = Session {
            owner: owner.to_owned(),
            expires_at,
            roles: FxHashSet::default(),
            terms_handed: 0,
        };
        self.sessions.lock().by_id.insert(id, session);
        Ok(SessionGrant {
            id,
            owner: owner.to_owned(),
            expires_at,
            now,
            peers_lapse: None,
            terms_handed: Some(0),
            latest_change: Some(self.latest_change()),
        })
    }

    async fn keep_alive_session(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> Result<Option<SessionGrant>> {
        let now = self.clock.now();
        let renewed_until = validate_ttl(ttl, Duration::from_nanos(1), now)?;
        let mut sessions = self.sessions.lock();
        let Some(entry) = sessions.by_id.get_mut(&session) else {
            return Ok(None);
        };
        if now >= entry.expires_at {
            // Ended: never revived. Forgetting it keeps memory bounded; its roles read
            // as expired either way.
            sessions.by_id.remove(&session);
            return Ok(None);
        }
        entry.expires_at = entry.expires_at.max(renewed_until);
        let (owner, expires_at, handed) =
            (entry.owner.clone(), entry.expires_at, entry.terms_handed);
        // Outside the sessions' lock: the account reads every node.
        drop(sessions);
        let peers_lapse = self
            .nodes
            .peers_ttl()
            .map(|ttl| self.nodes.peers_lapse(&owner, ttl, now));
        Ok(Some(SessionGrant {
            id: session,
            owner,
            expires_at,
            now,
            peers_lapse,
            terms_handed: Some(handed),
            latest_change: Some(self.latest_change()),
        }))
    }

    async fn acquire_in_session(&self, role: &str, session: SessionId) -> Result<LeaseResult> {
        validate_name("role", role)?;
        let now = self.clock.now();
        let mut shard = self.shard(role).lock();
        let mut sessions = self.sessions.lock();
        let (owner, session_expiry) = match sessions.by_id.get(&session) {
            Some(s) if now < s.expires_at => (s.owner.clone(), s.expires_at),
            _ => return Err(Error::SessionEnded(session)),
        };
        let held = |token| LeaseResult {
            acquired: true,
            fencing_token: token,
            expires_at: session_expiry,
            now,
            holder: owner.clone(),
        };
        let token = match shard.get_mut(role) {
            None => {
                let slot = first_slot(&owner, session_expiry, Some(session), None, self.stamp());
                shard.insert(role.to_owned(), slot);
                self.created.notify_waiters();
                FencingToken::from(1)
            }
            Some(slot) => {
                let current_expiry = sessions.expiry(slot);
                let live = slot.holder.is_some() && now < current_expiry;
                if live && slot.session == Some(session) {
                    return Ok(held(slot.token));
                }
                if live {
                    return Ok(LeaseResult {
                        acquired: false,
                        fencing_token: slot.token,
                        expires_at: current_expiry,
                        now,
                        holder: slot.holder.clone().unwrap_or_default(),
                    });
                }
                // A term begun for a queued owner ends its candidacy, as every acquire.
                slot.dequeue(&owner, now);
                new_term(slot, &owner, session_expiry, Some(session), None);
                slot.changed_at = self.stamp();
                slot.token
            }
        };
        if let Some(entry) = sessions.by_id.get_mut(&session) {
            entry.roles.insert(role.to_owned());
        }
        Ok(held(token))
    }

    async fn close_session(&self, session: SessionId) -> Result<bool> {
        let now = self.clock.now();
        let Some(entry) = self.sessions.lock().by_id.remove(&session) else {
            return Ok(false);
        };
        for role in &entry.roles {
            let mut shard = self.shard(role).lock();
            if let Some(slot) = shard.get_mut(role.as_str()) {
                if slot.session == Some(session) {
                    slot.holder = None;
                    slot.session = None;
                    slot.expires_at = now.min(entry.expires_at);
                    slot.changed_at = self.stamp();
                    slot.changed.notify_waiters();
                }
            }
        }
        Ok(now < entry.expires_at)
    }
}
