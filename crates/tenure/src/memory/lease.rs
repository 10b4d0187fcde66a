//! [`InMemoryLeaseStore`]: the lease contract on a sharded hash map.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use rustc_hash::{FxBuildHasher, FxHashMap};
use tokio::sync::Notify;

use crate::lease::{validate_acquire, validate_name, validate_release, validate_ttl};
use crate::{Clock, FencingToken, LeaseInfo, LeaseResult, LeaseStore, Result, SystemClock};

const SHARDS: usize = 16;

#[derive(Debug)]
struct Slot {
    holder: Option<String>,
    token: FencingToken,
    expires_at: SystemTime,
    /// Woken on every change of term (release or a new token), never on renewal.
    changed: Arc<Notify>,
}

impl Slot {
    fn is_live_term(&self, token: FencingToken, now: SystemTime) -> bool {
        self.holder.is_some() && self.token == token && now < self.expires_at
    }

    fn info(&self, role: &str, now: SystemTime) -> LeaseInfo {
        LeaseInfo {
            role: role.to_owned(),
            holder: self.holder.clone(),
            fencing_token: self.token,
            expires_at: self.expires_at,
            now,
        }
    }
}

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
        }
    }

    fn shard(&self, role: &str) -> &Mutex<FxHashMap<String, Slot>> {
        // The map hashes with the same function; use the high bits here so the two
        // choices stay independent.
        let index = (FxBuildHasher.hash_one(role) >> 58) as usize % SHARDS;
        &self.shards[index]
    }
}

#[async_trait]
impl LeaseStore for InMemoryLeaseStore {
    async fn try_acquire_or_renew(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<LeaseResult> {
        let now = self.clock.now();
        let expires_at = validate_ttl(ttl, Duration::from_nanos(1), now)?;
        let mut shard = self.shard(role).lock();
        // Renewal fast path: a stored role and holder were validated when they were
        // stored, so a live holder equal to `owner` needs no further checks.
        if let Some(slot) = shard.get_mut(role) {
            if now < slot.expires_at && slot.holder.as_deref() == Some(owner) {
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
        validate_acquire(role, owner, ttl, Duration::from_nanos(1), now)?;
        let Some(slot) = shard.get_mut(role) else {
            shard.insert(
                role.to_owned(),
                Slot {
                    holder: Some(owner.to_owned()),
                    token: FencingToken::from(1),
                    expires_at,
                    changed: Arc::new(Notify::new()),
                },
            );
            return Ok(LeaseResult {
                acquired: true,
                fencing_token: FencingToken::from(1),
                expires_at,
                now,
                holder: owner.to_owned(),
            });
        };
        let live = now < slot.expires_at;
        match slot.holder.as_deref() {
            Some(holder) if live && holder == owner => {
                slot.expires_at = expires_at;
            }
            Some(holder) if live => {
                return Ok(LeaseResult {
                    acquired: false,
                    fencing_token: slot.token,
                    expires_at: slot.expires_at,
                    now,
                    holder: holder.to_owned(),
                });
            }
            _ => {
                slot.token = slot.token.next();
                slot.expires_at = expires_at;
                match &mut slot.holder {
                    Some(holder) => {
                        holder.clear();
                        holder.push_str(owner);
                    }
                    None => slot.holder = Some(owner.to_owned()),
                }
                slot.changed.notify_waiters();
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

    async fn release(&self, role: &str, owner: &str, token: FencingToken) -> Result<bool> {
        validate_release(role, owner)?;
        let now = self.clock.now();
        let mut shard = self.shard(role).lock();
        let Some(slot) = shard.get_mut(role) else {
            return Ok(false);
        };
        if !slot.is_live_term(token, now) || slot.holder.as_deref() != Some(owner) {
            return Ok(false);
        }
        slot.holder = None;
        slot.expires_at = now;
        slot.changed.notify_waiters();
        Ok(true)
    }

    async fn get(&self, role: &str) -> Result<Option<LeaseInfo>> {
        validate_name("role", role)?;
        let now = self.clock.now();
        let shard = self.shard(role).lock();
        Ok(shard.get(role).map(|slot| slot.info(role, now)))
    }

    async fn list(&self) -> Result<Vec<LeaseInfo>> {
        let now = self.clock.now();
        let mut leases: Vec<LeaseInfo> = self
            .shards
            .iter()
            .flat_map(|shard| {
                let shard = shard.lock();
                shard
                    .iter()
                    .map(|(role, slot)| slot.info(role, now))
                    .collect::<Vec<_>>()
            })
            .collect();
        leases.sort_by(|a, b| a.role.cmp(&b.role));
        Ok(leases)
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
                Some(slot) if slot.is_live_term(observed, self.clock.now()) => {
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
                Some(slot) if slot.is_live_term(observed, self.clock.now()) => {}
                _ => return,
            }
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}
