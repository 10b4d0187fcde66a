//! The namespace watch: one per store, started by the first waiter.
//!
//! Every event on tenure's Lease objects wakes whoever waits on that object (a
//! contender on a role, or on the session a role is held under), and is also a sighting
//! of the object's new version for the [`Observer`], so a contender's clock for a
//! stalled holder starts when the last renewal reached it, not at its next read.
//! Waiters subscribe before they read, so an event between their read and their wait is
//! not lost. When the watch is broken no event comes and waiters sleep to their deadline,
//! as the store contract asks.

use std::collections::HashMap;
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
use crate::record::Record;

/// What a store and its watch share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub observer: Observer,
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// Woken by every event (membership waiters).
    pub any: Notify,
}

impl Shared {
    pub fn new() -> Arc<Shared> {
        Arc::new(Shared {
            observer: Observer::new(),
            waiters: Mutex::new(HashMap::new()),
            any: Notify::new(),
        })
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
        if deleted {
            self.observer.forget(name);
        } else if let Some(version) = lease.metadata.resource_version.as_deref() {
            self.observer.saw(name, version, self.observer.instant());
        }
        let notify = self.waiters.lock().get(name).cloned();
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
        self.any.notify_waiters();
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
                    Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                    Some(Err(error)) => {
                        tracing::debug!(%error, "lease watch failed; retrying with backoff")
                    }
                }
            }
        });
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
