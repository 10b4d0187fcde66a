//! The namespace watch: one per store, started by the first waiter.
//!
//! Every event on tenure's Lease objects wakes whoever waits on that object (a
//! contender on a role, or on the session a role is held under), and is also a sighting
//! of the object's new version for the [`Observer`], so a contender's clock for a
//! stalled holder starts when the last renewal reached it, not at its next read.
//! Waiters subscribe before they read, so an event between their read and their wait is
//! not lost. When the watch is broken no event comes and waiters sleep to their deadline,
//! as the store contract asks.
//!
//! The copies the watch keeps are also a cache the queue judges candidacies by
//! (`lease::queue`), so they must not go back: a copy of a candidacy this process wrote
//! or read itself (newer than every event the watch delivered before that version) is
//! kept until the watch delivers that version, and an event older than it changes
//! nothing. A (re)list replaces the watch's copies, and an object it no longer lists is
//! handled as deleted; but it may be older than this process's own copy (the API
//! server answers the watch's list from its cache, which may lag a write this process
//! already made), and versions are opaque, so an object it lists at another version
//! than this process's copy is read once more before the list counts as done: the read
//! is newer than both, and tells which one the watch will still deliver.
//!
//! The watch and a request's answer come on different streams, so the watch may deliver
//! a version before the answer that carries it arrives. Such an answer is no newer than
//! the watch's copy, and kept as the own copy it would hide every later event of the
//! object (no event of that version comes again to drop it). So a request registers
//! before it is sent ([`Shared::sending`]); the versions the watch delivers meanwhile are
//! recorded, and an answer carrying one of them is not kept.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use kube::runtime::{watcher, WatchStreamExt};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use tenure::Result;
use tokio::time::Instant;

use crate::conn::api_error;
use crate::observe::Observer;
use crate::record::{Record, ENDED, METADATA};

/// What a store and its watch share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub observer: Observer,
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// Woken when an object appears, goes, or changes what membership reads of it
    /// (holder, `acquireTime`, metadata, ended), or comes back after this process judged
    /// it lapsed: membership waiters. A heartbeat or keep-alive that only moves
    /// `renewTime` wakes nobody here.
    pub any: Notify,
    /// What membership reads of each object as the watch last delivered it.
    marks: Mutex<HashMap<String, Mark>>,
    /// Each object as the watch last delivered it: a contender woken by an event writes
    /// on the event's version instead of reading the object again.
    latest: Mutex<HashMap<String, Lease>>,
    /// Candidacies this process wrote or read, newer than the watch's copy, with when
    /// their version was first seen; dropped when the watch delivers that version.
    fresh: Mutex<HashMap<String, (Lease, Instant)>>,
    /// Objects with a request of this process on its way (see [`Shared::sending`]).
    in_flight: Mutex<HashMap<String, InFlight>>,
    /// The objects a relist in progress has listed so far (`None` outside one).
    relisted: Mutex<Option<HashSet<String>>>,
    /// Objects the relist in progress listed at another version than this process's
    /// own copy: settled by a read when it ends.
    contested: Mutex<Vec<Contested>>,
    /// Whether the watch has delivered one complete list (its copies are the namespace's
    /// objects, give or take the events still on their way).
    synced: AtomicBool,
    /// Woken when the first complete list has been delivered.
    synced_notify: Notify,
}

impl Shared {
    pub fn new() -> Arc<Shared> {
        Arc::new(Shared {
            observer: Observer::new(),
            waiters: Mutex::new(HashMap::new()),
            any: Notify::new(),
            marks: Mutex::new(HashMap::new()),
            latest: Mutex::new(HashMap::new()),
            fresh: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            relisted: Mutex::new(None),
            contested: Mutex::new(Vec::new()),
            synced: AtomicBool::new(false),
            synced_notify: Notify::new(),
        })
    }

    /// Whether the watch has delivered one complete list.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Waits until the watch has delivered one complete list, or until `deadline`;
    /// whether it has.
    pub async fn wait_synced(&self, deadline: Instant) -> bool {
        let notified = self.synced_notify.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        if self.synced() {
            return true;
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
        self.synced()
    }

    /// Registers a request about `object` about to be sent: until the returned guard
    /// drops, the versions of it the watch delivers are recorded, beside the one it had
    /// delivered last, so [`fresher`](Self::fresher) can tell an answer the watch
    /// already delivered.
    pub fn sending(&self, object: &str) -> Sending<'_> {
        // Under `fresh`, as events are applied: no event falls between the two.
        let _fresh = self.fresh.lock();
        let delivered = self
            .latest
            .lock()
            .get(object)
            .and_then(|lease| lease.metadata.resource_version.clone());
        let mut in_flight = self.in_flight.lock();
        let entry = in_flight.entry(object.to_owned()).or_default();
        entry.requests += 1;
        entry.delivered.extend(delivered);
        Sending {
            shared: self,
            object: object.to_owned(),
        }
    }

    /// Keeps `lease`, a version of an object this process just wrote or read (the
    /// answer to the request `sent` registered) and first saw at `first`, in place of
    /// the watch's copy until the watch delivers it; not if the watch delivered that
    /// version already.
    pub fn fresher(&self, lease: &Lease, first: Instant, sent: &Sending<'_>) {
        let (Some(name), Some(version)) = (
            lease.metadata.name.as_deref(),
            lease.metadata.resource_version.as_deref(),
        ) else {
            return;
        };
        let mut fresh = self.fresh.lock();
        let delivered = self
            .in_flight
            .lock()
            .get(&sent.object)
            .is_some_and(|entry| entry.delivered.iter().any(|v| v == version));
        if !delivered {
            fresh.insert(name.to_owned(), (lease.clone(), first));
        }
    }

    /// The newest copy of `object` this process has (its own or the watch's), with
    /// when its version was first seen.
    pub fn cached(&self, object: &str) -> Option<(Lease, Instant)> {
        if let Some(fresh) = self.fresh.lock().get(object) {
            return Some(fresh.clone());
        }
        let lease = self.latest.lock().get(object).cloned()?;
        let first = self.first_of(&lease);
        Some((lease, first))
    }

    /// The newest copies (as [`cached`](Self::cached)) of the objects labelled
    /// `key=value`.
    pub fn labelled(&self, key: &str, value: &str) -> Vec<(Lease, Instant)> {
        let has_label = |lease: &Lease| {
            lease
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(key))
                .is_some_and(|found| found == value)
        };
        let mut copies: Vec<(Lease, Instant)> = self
            .fresh
            .lock()
            .values()
            .filter(|(lease, _)| has_label(lease))
            .cloned()
            .collect();
        let own: HashSet<String> = copies
            .iter()
            .filter_map(|(lease, _)| lease.metadata.name.clone())
            .collect();
        let watched: Vec<Lease> = self
            .latest
            .lock()
            .iter()
            .filter(|(name, lease)| has_label(lease) && !own.contains(*name))
            .map(|(_, lease)| lease.clone())
            .collect();
        copies.extend(watched.into_iter().map(|lease| {
            let first = self.first_of(&lease);
            (lease, first)
        }));
        copies
    }

    /// When the version of the watch's copy `lease` was first seen here; now when this
    /// process knows another version (its judgement then starts over, as for a read).
    fn first_of(&self, lease: &Lease) -> Instant {
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        let version = lease
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default();
        self.observer
            .first_sighting(name, version)
            .unwrap_or_else(|| self.observer.instant())
    }

    /// The start of a (re)list: every copy is replaced by what it lists.
    fn begin_relist(&self) {
        *self.relisted.lock() = Some(HashSet::new());
    }

    /// The end of a (re)list: an object it did not list was deleted meanwhile. Returns
    /// the objects it listed at another version than this process's own copy; the list
    /// counts as done ([`mark_synced`](Self::mark_synced)) once each is
    /// [`settle`](Self::settle)d.
    fn end_relist(&self) -> Vec<Contested> {
        let listed = self.relisted.lock().take().unwrap_or_default();
        let gone: Vec<Lease> = self
            .latest
            .lock()
            .iter()
            .filter(|(name, _)| !listed.contains(*name))
            .map(|(_, lease)| lease.clone())
            .collect();
        for lease in gone {
            self.event(&lease, true);
        }
        std::mem::take(&mut *self.contested.lock())
    }

    /// The watch's copies are the namespace's objects, give or take the events on
    /// their way.
    fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
        self.synced_notify.notify_waiters();
    }

    /// Settles `contested` with `read`, the object read after the relist ended (`None`:
    /// deleted; `Err`: the read failed, and the listed copy is taken, as the watch
    /// delivers whatever came after it). Nothing changes if this process has since
    /// seen its own copy delivered or written a newer one.
    fn settle(&self, contested: Contested, read: std::result::Result<Option<Lease>, ()>) {
        let Contested { name, listed, own } = contested;
        {
            let mut fresh = self.fresh.lock();
            let version = fresh
                .get(&name)
                .map(|(copy, _)| copy.metadata.resource_version.clone());
            if version != Some(own) {
                return;
            }
            match &read {
                // Newer than the list (it is newer than both copies and differs from the
                // listed one): the watch, going on from the list, delivers it.
                Ok(Some(lease))
                    if lease.metadata.resource_version != listed.metadata.resource_version =>
                {
                    let version = lease.metadata.resource_version.as_deref();
                    let now = self.observer.instant();
                    let first = self.observer.saw(&name, version.unwrap_or_default(), now);
                    fresh.insert(name, (lease.clone(), first));
                    return;
                }
                _ => {
                    fresh.remove(&name);
                }
            }
        }
        match read {
            Ok(Some(lease)) => self.event(&lease, false),
            Ok(None) => self.event(&listed, true),
            Err(()) => self.event(&listed, false),
        }
    }

    /// Whether an event for `lease` is older than the copy this process holds of that
    /// object (see [`fresher`](Self::fresher)), and so changes nothing; forgets the copy
    /// once the watch delivered its version (or the object's deletion). A relist's event
    /// of another version is left for [`settle`](Self::settle), as it may be older.
    fn older_than_fresh(
        &self,
        fresh: &mut HashMap<String, (Lease, Instant)>,
        lease: &Lease,
        name: &str,
        deleted: bool,
    ) -> bool {
        let Some((copy, _)) = fresh.get(name) else {
            return false;
        };
        let same = |a: &Option<String>, b: &Option<String>| a.is_some() && a == b;
        let older = if deleted {
            // A delete of an earlier incarnation than the one this process created.
            !same(&copy.metadata.uid, &lease.metadata.uid)
        } else if same(
            &copy.metadata.resource_version,
            &lease.metadata.resource_version,
        ) {
            false
        } else {
            if self.relisted.lock().is_some() {
                self.contested.lock().push(Contested {
                    name: name.to_owned(),
                    listed: lease.clone(),
                    own: copy.metadata.resource_version.clone(),
                });
            }
            true
        };
        if !older {
            fresh.remove(name);
        }
        older
    }

    /// Reads `object`, recording the sighting of its version: the record, when its
    /// version was first seen, and when this answer arrived.
    pub async fn get(
        &self,
        api: &Api<Lease>,
        namespace: &str,
        object: &str,
    ) -> Result<Option<(Record, Instant, Instant)>> {
        let lease = api
            .get_opt(object)
            .await
            .map_err(|error| api_error(namespace, "get", object, error))?;
        let arrived = self.observer.instant();
        let Some(lease) = lease else {
            self.observer.forget(object);
            return Ok(None);
        };
        let record = Record::read_any(lease)?;
        let first = self.observer.saw(object, &record.version, arrived);
        Ok(Some((record, first, arrived)))
    }

    /// Lists the objects `selector` picks, recording each sighting: each record with when
    /// its version was first seen, and when the answer arrived.
    pub async fn list(
        &self,
        api: &Api<Lease>,
        namespace: &str,
        selector: &str,
    ) -> Result<(Vec<(Record, Instant)>, Instant)> {
        let list = api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|error| api_error(namespace, "list", "*", error))?;
        let arrived = self.observer.instant();
        let mut records = Vec::new();
        for lease in list {
            let record = Record::read_any(lease)?;
            let first = self.observer.saw(&record.object, &record.version, arrived);
            records.push((record, first));
        }
        Ok((records, arrived))
    }

    /// `object` as the watch last delivered it, with when its version was first seen,
    /// if that is still the newest version this process knows of (no read or write of
    /// it since). Only good for a conditional write: the object may have changed since,
    /// and then the write loses with 409 Conflict.
    pub fn watched(&self, object: &str) -> Option<(Record, Instant)> {
        let lease = self.latest.lock().get(object).cloned()?;
        let record = Record::read_any(lease).ok()?;
        let first = self.observer.first_sighting(object, &record.version)?;
        Some((record, first))
    }

    /// The wake-up of `object`'s waiters.
    pub fn notify_of(&self, object: &str) -> Arc<Notify> {
        self.waiters
            .lock()
            .entry(object.to_owned())
            .or_default()
            .clone()
    }

    fn event(&self, lease: &Lease, deleted: bool) {
        let Some(name) = lease.metadata.name.as_deref() else {
            return;
        };
        if let Some(listed) = self.relisted.lock().as_mut() {
            if !deleted {
                listed.insert(name.to_owned());
            }
        }
        {
            let mut fresh = self.fresh.lock();
            if self.older_than_fresh(&mut fresh, lease, name, deleted) {
                return;
            }
            // Applied under `fresh`, so a request's answer is judged against it whole
            // (see `sending`).
            if deleted {
                self.latest.lock().remove(name);
            } else {
                self.latest.lock().insert(name.to_owned(), lease.clone());
                let version = lease.metadata.resource_version.clone();
                if let Some(entry) = self.in_flight.lock().get_mut(name) {
                    entry.delivered.extend(version);
                }
            }
        }
        let now = self.observer.instant();
        let mark = Mark::of(lease);
        let previous = if deleted {
            self.marks.lock().remove(name)
        } else {
            self.marks.lock().insert(name.to_owned(), mark.clone())
        };
        // Back after this process last saw it longer ago than its duration: a member
        // (or session) judged gone here has come back.
        let lapsed = match (&previous, self.observer.latest(name)) {
            (Some(previous), Some((_, first))) => now >= first + previous.duration,
            _ => false,
        };
        let membership_changed =
            deleted || lapsed || previous.is_none_or(|previous| previous != mark);
        if deleted {
            self.observer.forget(name);
        } else if let Some(version) = lease.metadata.resource_version.as_deref() {
            self.observer.saw(name, version, now);
        }
        let notify = self.waiters.lock().get(name).cloned();
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
        if membership_changed {
            self.any.notify_waiters();
        }
    }
}

/// This process's requests on their way about one object, and the versions of it the
/// watch delivered since the first was sent (and the one before).
#[derive(Debug, Default)]
struct InFlight {
    requests: usize,
    delivered: Vec<String>,
}

/// A request about an object on its way (see [`Shared::sending`]); dropped when its
/// answer was handled, or it failed.
pub(crate) struct Sending<'a> {
    shared: &'a Shared,
    object: String,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.shared.in_flight.lock();
        if let Some(entry) = in_flight.get_mut(&self.object) {
            entry.requests -= 1;
            if entry.requests == 0 {
                in_flight.remove(&self.object);
            }
        }
    }
}

/// An object a relist listed at another version than this process's own copy.
#[derive(Debug)]
struct Contested {
    name: String,
    /// The object as listed.
    listed: Lease,
    /// The version of this process's copy when it was listed.
    own: Option<String>,
}

/// What membership reads of an object, beyond its version.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mark {
    holder: Option<String>,
    acquired: Option<String>,
    metadata: Option<String>,
    ended: bool,
    duration: std::time::Duration,
}

impl Mark {
    fn of(lease: &Lease) -> Mark {
        let spec = lease.spec.as_ref();
        let annotations = lease.metadata.annotations.as_ref();
        let secs = spec.and_then(|s| s.lease_duration_seconds).unwrap_or(0);
        Mark {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            acquired: spec
                .and_then(|s| s.acquire_time.as_ref())
                .map(|t| t.0.to_string()),
            metadata: annotations.and_then(|a| a.get(METADATA).cloned()),
            ended: annotations.is_some_and(|a| a.contains_key(ENDED)),
            duration: std::time::Duration::from_secs(u64::try_from(secs).unwrap_or(0)),
        }
    }
}

/// The watch task of one store: started once, stopped when the store is dropped.
#[derive(Debug)]
pub(crate) struct Watch {
    selector: String,
    started: OnceLock<()>,
    stop: CancellationToken,
}

impl Watch {
    pub fn new(selector: String) -> Watch {
        Watch {
            selector,
            started: OnceLock::new(),
            stop: CancellationToken::new(),
        }
    }

    /// Starts the watch unless it runs already.
    pub fn ensure(&self, api: &Api<Lease>, shared: &Arc<Shared>) {
        if self.started.set(()).is_err() {
            return;
        }
        let config = watcher::Config::default().labels(&self.selector);
        let stream = watcher(api.clone(), config).default_backoff();
        let (api, shared) = (api.clone(), Arc::clone(shared));
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                let next = tokio::select! {
                    _ = stop.cancelled() => return,
                    next = stream.next() => next,
                };
                match next {
                    None => return,
                    Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) => {
                        shared.event(&lease, false)
                    }
                    Some(Ok(watcher::Event::Delete(lease))) => shared.event(&lease, true),
                    Some(Ok(watcher::Event::Init)) => shared.begin_relist(),
                    Some(Ok(watcher::Event::InitDone)) => {
                        for contested in shared.end_relist() {
                            let read = tokio::select! {
                                _ = stop.cancelled() => return,
                                read = read_again(&api, &contested.name) => read,
                            };
                            shared.settle(contested, read);
                        }
                        shared.mark_synced();
                    }
                    Some(Err(error)) => {
                        tracing::debug!(%error, "lease watch failed; retrying with backoff")
                    }
                }
            }
        });
    }
}

/// `object` read for [`Shared::settle`]: a few tries, a moment apart.
async fn read_again(api: &Api<Lease>, object: &str) -> std::result::Result<Option<Lease>, ()> {
    let mut pause = std::time::Duration::from_millis(50);
    for _ in 0..READ_AGAIN_TRIES {
        match api.get_opt(object).await {
            Ok(read) => return Ok(read),
            Err(error) => tracing::debug!(%error, object, "reading a relisted object again failed"),
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
    Err(())
}

/// How often [`read_again`] tries.
const READ_AGAIN_TRIES: u32 = 4;

impl Watch {
    /// Whether the watch was started (it may be between reconnects).
    pub fn running(&self) -> bool {
        self.started.get().is_some()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests;
