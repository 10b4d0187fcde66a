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
//! nothing. A relist (after the watch lost its place) replaces every copy, and an
//! object the relist no longer lists is handled as deleted.

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
    /// The objects a relist in progress has listed so far (`None` outside one).
    relisted: Mutex<Option<HashSet<String>>>,
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
            relisted: Mutex::new(None),
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

    /// Keeps `lease`, a version of a candidacy this process just wrote or read and first
    /// saw at `first`, in place of the watch's older copy until the watch delivers it.
    pub fn fresher(&self, lease: &Lease, first: Instant) {
        if let Some(name) = lease.metadata.name.as_deref() {
            self.fresh
                .lock()
                .insert(name.to_owned(), (lease.clone(), first));
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

    /// The end of a (re)list: an object it did not list was deleted meanwhile.
    fn end_relist(&self) {
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
        self.synced.store(true, Ordering::Release);
        self.synced_notify.notify_waiters();
    }

    /// Whether an event for `lease` is older than the copy this process holds of that
    /// object (see [`fresher`](Self::fresher)), and so changes nothing; forgets the copy
    /// once the watch delivered its version (or anything after a relist, or the object's
    /// deletion).
    fn older_than_fresh(&self, lease: &Lease, name: &str, deleted: bool) -> bool {
        let mut fresh = self.fresh.lock();
        let Some((copy, _)) = fresh.get(name) else {
            return false;
        };
        let same = |a: &Option<String>, b: &Option<String>| a.is_some() && a == b;
        let relisting = self.relisted.lock().is_some();
        let older = if deleted {
            // A delete of an earlier incarnation than the one this process created.
            !same(&copy.metadata.uid, &lease.metadata.uid)
        } else {
            !relisting
                && !same(
                    &copy.metadata.resource_version,
                    &lease.metadata.resource_version,
                )
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
        if self.older_than_fresh(lease, name, deleted) {
            return;
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
            self.latest.lock().remove(name);
        } else if let Some(version) = lease.metadata.resource_version.as_deref() {
            self.observer.saw(name, version, now);
            self.latest.lock().insert(name.to_owned(), lease.clone());
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
        let shared = Arc::clone(shared);
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
                    Some(Ok(watcher::Event::InitDone)) => shared.end_relist(),
                    Some(Err(error)) => {
                        tracing::debug!(%error, "lease watch failed; retrying with backoff")
                    }
                }
            }
        });
    }
}

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
