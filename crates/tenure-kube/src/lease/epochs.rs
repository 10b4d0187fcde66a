//! The epoch allocator: fresh epochs (and session ids) from the namespace's counter
//! object `tenure.epochs`, one conditional write serving every caller waiting at once.
//!
//! Each store has one allocation in flight at most. A caller joins the queue and waits
//! for an allocation that *starts after it joined*: that allocation takes everyone
//! queued, reserves a block of as many epochs with one `PUT` of the counter (conditional
//! on the counter's version, so no two writers reserve the same block), and hands each
//! caller its own epoch from the block, in the order they joined. Nothing is cached for
//! later callers; an epoch whose caller went away is simply never used (tokens need only
//! grow, not be consecutive).
//!
//! Why a caller may not take an epoch from a block reserved before it joined: a term's
//! first epoch must be taken *after* reading the empty object it is written into (see
//! [`crate::record`]), so that it passes every epoch an earlier, deleted incarnation of
//! the object used. A caller joins only after that read, and the block it is served from
//! is written after it joined: every epoch in it is above every epoch any block reserved
//! before the read handed out. A block reserved earlier (an allocation already in flight
//! when the caller joined) could hold epochs below one an operator's deleted incarnation
//! used.
//!
//! The first try of an allocation is a `PUT` on the counter as this store last wrote it,
//! with no read first; only a 409 (another store moved it on) or a 404 (deleted) costs a
//! `GET`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tenure::{Error, Result};
use tokio::sync::oneshot;

use crate::conn::{api_error, is_conflict};
use crate::names::EPOCHS;
use crate::record::{annotate, corrupt, new_object, selector, Record, NAME, NEXT_EPOCH};
use crate::watch::Shared;
use crate::BACKEND;

/// How many conditional writes of the counter one allocation may lose before it
/// reports an error to the callers it serves.
const ATTEMPTS: usize = 64;

/// What a test may await inside an allocation: given how many callers it serves,
/// awaited after it took them and before its first write.
pub type AllocationHook =
    Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// One store's epoch allocator.
pub(crate) struct Epochs {
    api: Api<Lease>,
    namespace: String,
    shared: Arc<Shared>,
    state: Mutex<State>,
    hook: Option<AllocationHook>,
}

#[derive(Default)]
struct State {
    /// Callers that joined since the allocation in flight (if any) took its callers.
    waiting: Vec<oneshot::Sender<Result<u64>>>,
    /// An allocation is in flight (its task serves `waiting` next, until it is empty).
    running: bool,
    /// The counter as this store last wrote or read it: the next write is conditional
    /// on it, with no read first.
    last: Option<Record>,
}

impl std::fmt::Debug for Epochs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epochs")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Epochs {
    pub fn new(
        api: Api<Lease>,
        namespace: String,
        shared: Arc<Shared>,
        hook: Option<AllocationHook>,
    ) -> Arc<Epochs> {
        Arc::new(Epochs {
            api,
            namespace,
            shared,
            state: Mutex::new(State::default()),
            hook,
        })
    }

    /// An epoch no object of the namespace had before, reserved by a counter write sent
    /// after this call began (so after whatever the caller read before calling).
    pub async fn take(self: &Arc<Self>) -> Result<u64> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = self.state.lock();
            state.waiting.push(tx);
            !std::mem::replace(&mut state.running, true)
        };
        if start {
            // A task of its own, so a caller that gives up (a timeout dropping its
            // future) does not strand the callers queued behind it.
            let epochs = Arc::clone(self);
            tokio::spawn(async move { epochs.serve().await });
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::store_msg(
                BACKEND,
                "the epoch allocation was stopped before it answered (runtime shutting down)",
            ))
        })
    }

    /// Runs allocations until nobody waits.
    async fn serve(&self) {
        loop {
            let batch = {
                let mut state = self.state.lock();
                if state.waiting.is_empty() {
                    state.running = false;
                    return;
                }
                std::mem::take(&mut state.waiting)
            };
            if let Some(hook) = &self.hook {
                hook(batch.len()).await;
            }
            self.allocate(batch).await;
        }
    }

    /// Reserves a block for `batch` and answers each caller. Callers that join while a
    /// write of this allocation is lost are added before the next try: that write is
    /// sent after they joined, which is all they need.
    async fn allocate(&self, mut batch: Vec<oneshot::Sender<Result<u64>>>) {
        let mut known = self.state.lock().last.take();
        for _ in 0..ATTEMPTS {
            batch.retain(|tx| !tx.is_closed());
            if batch.is_empty() {
                // Everyone gave up; keep what we know of the counter for the next one.
                self.state.lock().last = known;
                return;
            }
            let wanted = u64::try_from(batch.len()).unwrap_or(u64::MAX);
            match self.reserve(known.take(), wanted).await {
                Ok(Reserved::Block(first, written)) => {
                    self.state.lock().last = Some(*written);
                    for (tx, epoch) in batch.into_iter().zip(first..) {
                        // A caller that went away leaves its epoch unused.
                        let _ = tx.send(Ok(epoch));
                    }
                    return;
                }
                Ok(Reserved::Lost) => {
                    batch.append(&mut self.state.lock().waiting);
                }
                Err(error) => {
                    let message = error.to_string();
                    for tx in batch {
                        let _ = tx.send(Err(Error::store_msg(BACKEND, message.clone())));
                    }
                    return;
                }
            }
        }
        for tx in batch {
            let _ = tx.send(Err(Error::store_msg(
                BACKEND,
                format!("the epoch counter {EPOCHS} kept changing under {ATTEMPTS} tries"),
            )));
        }
    }

    /// One try: moves the counter on by `count` with a write conditional on `known` (the
    /// counter as last written or read; read now when `None`).
    async fn reserve(&self, known: Option<Record>, count: u64) -> Result<Reserved> {
        let known = match known {
            Some(record) => Some(record),
            None => self
                .shared
                .get(&self.api, &self.namespace, EPOCHS)
                .await?
                .map(|(record, ..)| record),
        };
        let Some(record) = known else {
            return self.create(count).await;
        };
        let raw = record.annotations.get(NEXT_EPOCH).cloned();
        let next: u64 = raw
            .as_deref()
            .and_then(|raw| raw.parse().ok())
            .ok_or_else(|| corrupt(format!("{EPOCHS} has {NEXT_EPOCH} {raw:?}")))?;
        let after = next
            .checked_add(count)
            .ok_or_else(|| corrupt(format!("{EPOCHS} is at {next}, past the largest epoch")))?;
        let mut lease = record.to_write();
        annotate(&mut lease, NEXT_EPOCH, Some(after.to_string()));
        match self
            .api
            .replace(EPOCHS, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => Ok(Reserved::Block(next, Box::new(Record::read_any(written)?))),
            // Moved on by another store, or deleted: read it again.
            Err(error) if is_conflict(&error) || is_gone(&error) => Ok(Reserved::Lost),
            Err(error) => Err(api_error(&self.namespace, "update", EPOCHS, error)),
        }
    }

    /// Creates a missing counter above every epoch and session id still in the
    /// namespace, reserving the first `count` epochs.
    async fn create(&self, count: u64) -> Result<Reserved> {
        let floor = self.highest_in_use().await?.map_or(0, |e| e + 1);
        let after = floor
            .checked_add(count)
            .ok_or_else(|| corrupt(format!("epoch {floor} is past the largest epoch")))?;
        let mut lease = new_object(EPOCHS, "epochs", None);
        annotate(&mut lease, NEXT_EPOCH, Some(after.to_string()));
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(written) => Ok(Reserved::Block(floor, Box::new(Record::read_any(written)?))),
            Err(error) if is_conflict(&error) => Ok(Reserved::Lost),
            Err(error) => Err(api_error(&self.namespace, "create", EPOCHS, error)),
        }
    }

    async fn highest_in_use(&self) -> Result<Option<u64>> {
        let (records, _) = self
            .shared
            .list(&self.api, &self.namespace, &selector(&[]))
            .await?;
        let mut highest = None;
        for (record, _) in records {
            let value = match record.kind() {
                Some("role") => record.epoch()?,
                Some("session") => record
                    .annotations
                    .get(NAME)
                    .and_then(|id| u64::from_str_radix(id, 16).ok()),
                _ => None,
            };
            highest = highest.max(value);
        }
        Ok(highest)
    }
}

/// What one try of an allocation came to.
enum Reserved {
    /// Epochs `first..` are ours; the counter as written.
    Block(u64, Box<Record>),
    /// The write lost (the counter moved on, or was deleted or created meanwhile): read
    /// it again.
    Lost,
}

fn is_gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}
