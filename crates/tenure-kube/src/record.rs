//! What tenure keeps in a Lease object, and the fencing token it derives from it.
//!
//! A role's Lease (see `docs/semantics.md`, "Kubernetes"):
//!
//! | field | meaning |
//! | --- | --- |
//! | `spec.holderIdentity` | the owner; absent once released |
//! | `spec.leaseDurationSeconds` | the term's TTL in whole seconds |
//! | `spec.acquireTime`, `spec.renewTime` | the holder's wall clock at the term's start and last renewal (for people and other tools; tenure never reads them) |
//! | `spec.leaseTransitions` | changes of holder under this object's epoch |
//! | annotation `tenure.dev/epoch` | the object's epoch, from the namespace's epoch counter |
//! | annotation `tenure.dev/name` | the role, checked on every read |
//! | annotation and label `tenure.dev/session` | the session the term is held under, if any |
//! | annotation `tenure.dev/value` | the value the term advertised, if any; removed on release |
//! | annotation `tenure.dev/used-candidacies` | the queue places whose turn came (below) |
//!
//! A candidacy's Lease (`lease::queue`; one per owner queued for a role):
//!
//! | field | meaning |
//! | --- | --- |
//! | `spec.holderIdentity` | the queued owner; absent once withdrawn or cleared as lapsed |
//! | `spec.leaseDurationSeconds` | how long the candidacy lasts unless refreshed (the caller's TTL) |
//! | `spec.acquireTime` | when the owner joined the queue, on its wall clock: the queue's order, kept by every refresh |
//! | `spec.renewTime` | the last refresh (for people; never read) |
//! | annotation `tenure.dev/name` | the role |
//! | label `tenure.dev/role` | the role's hash ([`crate::names::role_label`]), so one list finds a role's candidacies |
//! | annotation `tenure.dev/value` | the value the owner's term is to advertise |
//!
//! A place in the queue is the candidacy object with its `acquireTime`. When a term
//! begins for an owner that has a live place (a release handed it the role, or it
//! acquired otherwise), the same write of the role adds `OBJECT=MICROS` (the object name
//! and `acquireTime` in microseconds since the epoch) to the role's
//! `tenure.dev/used-candidacies`, space-separated: that place is spent, whatever the
//! candidacy object still says, until its owner joins again (a new `acquireTime`).
//!
//! A member's Lease also carries `tenure.dev/metadata` (its metadata) and
//! `tenure.dev/heartbeat-session` (the session whose keep-alives count as its heartbeats,
//! see `links`).
//!
//! The fencing token is `epoch * 2^31 + leaseTransitions + 1`. Within one object it grows
//! by one per change of holder. An object is created empty (no holder, no epoch); its
//! first term takes a fresh epoch from the counter *after* reading the empty object (from
//! a block reserved by a counter write sent after that read, see `lease::epochs`), and
//! starts with a write conditional on that read. Every epoch a deleted incarnation of the
//! object used was taken before it was deleted, so before this one was created: the new
//! epoch is above them all, and so are its tokens. (An epoch taken before a delete can
//! only be written on the incarnation it was read with, which is gone.) When
//! `leaseTransitions` would pass `i32::MAX` the term takes a fresh epoch too and counts
//! from zero again.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use tenure::{Error, FencingToken, Result};

use crate::BACKEND;

/// Label every tenure object carries, so the watch and lists see only tenure's.
pub(crate) const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tenure");
/// Label naming what the object is for.
pub(crate) const KIND_LABEL: &str = "tenure.dev/kind";
/// The name (role, node id, resource) an object stands for.
pub(crate) const NAME: &str = "tenure.dev/name";
/// A role object's epoch.
pub(crate) const EPOCH: &str = "tenure.dev/epoch";
/// The session a role is held under (annotation and label), hex.
pub(crate) const SESSION: &str = "tenure.dev/session";
/// On a role object: the value its term advertised; on a candidacy, the value its
/// owner's term is to advertise.
pub(crate) const VALUE: &str = "tenure.dev/value";
/// On a role object: the queue places whose turn came (see the module docs).
pub(crate) const USED: &str = "tenure.dev/used-candidacies";
/// On a candidacy object: the hash of its role (label).
pub(crate) const ROLE_LABEL: &str = "tenure.dev/role";
/// On a session object: set once the session has ended; it is never revived.
pub(crate) const ENDED: &str = "tenure.dev/ended";
/// On the epoch counter: the next epoch to hand out.
pub(crate) const NEXT_EPOCH: &str = "tenure.dev/next-epoch";
/// On a fence object: the highest admitted token.
pub(crate) const HIGHEST: &str = "tenure.dev/highest-token";
/// On a member object: the session (hex id) whose keep-alives count as the member's
/// heartbeats while it is open and held by the member (see `links`).
pub(crate) const HEARTBEAT_SESSION: &str = "tenure.dev/heartbeat-session";
/// On a member object: its metadata, as a JSON object of strings.
pub(crate) const METADATA: &str = "tenure.dev/metadata";

/// Tokens of one epoch: `leaseTransitions` runs from 0 to `i32::MAX`.
const PER_EPOCH: u64 = 1 << 31;

/// The token of transition `transitions` in `epoch`.
pub(crate) fn token(epoch: u64, transitions: i32) -> Result<FencingToken> {
    let transitions = u64::try_from(transitions)
        .map_err(|_| corrupt(format!("negative leaseTransitions {transitions}")))?;
    epoch
        .checked_mul(PER_EPOCH)
        .and_then(|base| base.checked_add(transitions + 1))
        .map(FencingToken::from)
        .ok_or_else(|| corrupt(format!("epoch {epoch} is past the largest token")))
}

pub(crate) fn corrupt(message: impl std::fmt::Display) -> Error {
    Error::store_msg(BACKEND, format!("corrupt lease object: {message}"))
}

/// The TTL as whole seconds for `leaseDurationSeconds`.
pub(crate) fn ttl_secs(field: &'static str, ttl: Duration) -> Result<i32> {
    if ttl.subsec_nanos() != 0 || ttl.is_zero() {
        return Err(Error::invalid(
            field,
            format!(
                "{ttl:?} is not a whole number of seconds, which Kubernetes Lease objects need \
                 (leaseDurationSeconds); use 1s or more, in whole seconds"
            ),
        ));
    }
    i32::try_from(ttl.as_secs()).map_err(|_| {
        Error::invalid(
            field,
            format!(
                "{ttl:?} is above the largest leaseDurationSeconds, {} s",
                i32::MAX
            ),
        )
    })
}

/// One tenure Lease object as read: the fields every kind shares.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// The object's name.
    pub object: String,
    /// `metadata.resourceVersion`: every write is conditional on it.
    pub version: String,
    pub holder: Option<String>,
    pub duration: Duration,
    pub transitions: i32,
    pub annotations: BTreeMap<String, String>,
    /// The object as read, to write back with changes.
    pub lease: Lease,
}

impl Record {
    /// Reads `lease`, which must stand for `name` (its `tenure.dev/name` annotation).
    pub fn read(lease: Lease, name: &str) -> Result<Record> {
        let record = Record::read_any(lease)?;
        match record.annotations.get(NAME) {
            Some(found) if found == name => Ok(record),
            found => Err(Error::store_msg(
                BACKEND,
                format!(
                    "the Lease object {} is not tenure's object for {name:?} (its {NAME} \
                     annotation is {found:?}); another tool may be using that name",
                    record.object
                ),
            )),
        }
    }

    /// Reads `lease` without checking whose it is.
    pub fn read_any(lease: Lease) -> Result<Record> {
        let object = lease.metadata.name.clone().unwrap_or_default();
        let version = lease
            .metadata
            .resource_version
            .clone()
            .ok_or_else(|| corrupt(format!("{object} has no resourceVersion")))?;
        let spec = lease.spec.clone().unwrap_or_default();
        let secs = spec.lease_duration_seconds.unwrap_or(0);
        let duration = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        Ok(Record {
            object,
            version,
            holder: spec.holder_identity.filter(|holder| !holder.is_empty()),
            duration,
            transitions: spec.lease_transitions.unwrap_or(0),
            annotations: lease.metadata.annotations.clone().unwrap_or_default(),
            lease,
        })
    }

    /// The `tenure.dev/epoch` annotation; `None` on an object just created, which no
    /// term has started on yet.
    pub fn epoch(&self) -> Result<Option<u64>> {
        self.annotations
            .get(EPOCH)
            .map(|raw| {
                raw.parse()
                    .map_err(|_| corrupt(format!("{} has {EPOCH} {raw:?}", self.object)))
            })
            .transpose()
    }

    /// The token of the latest term; `None` before the first.
    pub fn token(&self) -> Result<Option<FencingToken>> {
        self.epoch()?
            .map(|epoch| token(epoch, self.transitions))
            .transpose()
    }

    /// The session the term is held under, if any.
    pub fn session(&self) -> Result<Option<u64>> {
        self.annotations
            .get(SESSION)
            .map(|raw| {
                u64::from_str_radix(raw, 16)
                    .map_err(|_| corrupt(format!("{} has {SESSION} {raw:?}", self.object)))
            })
            .transpose()
    }

    /// The `tenure.dev/kind` label: what the object is for.
    pub fn kind(&self) -> Option<&str> {
        self.lease
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(KIND_LABEL))
            .map(String::as_str)
    }

    /// `spec.acquireTime` in microseconds since the Unix epoch, if set.
    pub fn acquired_micros(&self) -> Option<i64> {
        let time = self.lease.spec.as_ref()?.acquire_time.as_ref()?;
        Some(time.0.as_microsecond())
    }

    /// Whether a session object was marked ended.
    pub fn ended(&self) -> bool {
        self.annotations.contains_key(ENDED)
    }

    /// A copy to write back: same object and `resourceVersion`, so the write is
    /// conditional on nothing having changed since this read.
    pub fn to_write(&self) -> Lease {
        let mut lease = self.lease.clone();
        lease.metadata.managed_fields = None;
        lease
    }
}

/// The label selector for tenure's objects of the given kinds (all of tenure's objects
/// for none).
pub(crate) fn selector(kinds: &[&str]) -> String {
    let managed = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    match kinds {
        [] => managed,
        [kind] => format!("{managed},{KIND_LABEL}={kind}"),
        kinds => format!("{managed},{KIND_LABEL} in ({})", kinds.join(",")),
    }
}

/// A new tenure object of `kind` for `name`.
pub(crate) fn new_object(object: &str, kind: &str, name: Option<&str>) -> Lease {
    let mut annotations = BTreeMap::new();
    if let Some(name) = name {
        annotations.insert(NAME.to_owned(), name.to_owned());
    }
    Lease {
        metadata: ObjectMeta {
            name: Some(object.to_owned()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
                (KIND_LABEL.to_owned(), kind.to_owned()),
            ])),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    }
}

/// The wall clock as a `MicroTime`, for `acquireTime` and `renewTime`.
pub(crate) fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Sets an annotation (`Some`) or removes it (`None`).
pub(crate) fn annotate(lease: &mut Lease, key: &str, value: Option<String>) {
    let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match value {
        Some(value) => annotations.insert(key.to_owned(), value),
        None => annotations.remove(key),
    };
}

/// Sets a label (`Some`) or removes it (`None`).
pub(crate) fn label(lease: &mut Lease, key: &str, value: Option<String>) {
    let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
    match value {
        Some(value) => labels.insert(key.to_owned(), value),
        None => labels.remove(key),
    };
}

/// Writes a new term into `lease`: `holder` since now (`acquireTime` and `renewTime`),
/// for `secs`, and `transitions` when given.
pub(crate) fn begin_term(lease: &mut Lease, holder: &str, secs: i32, transitions: Option<i32>) {
    let now = micro_now();
    let spec = spec(lease);
    spec.holder_identity = Some(holder.to_owned());
    spec.lease_duration_seconds = Some(secs);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    if transitions.is_some() {
        spec.lease_transitions = transitions;
    }
}

/// The spec, created if absent.
pub(crate) fn spec(lease: &mut Lease) -> &mut LeaseSpec {
    lease.spec.get_or_insert_with(LeaseSpec::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grow_across_epochs_and_split_back() {
        let last = token(3, i32::MAX).unwrap();
        let next = token(4, 0).unwrap();
        assert!(next > last);
        assert_eq!(token(0, 0).unwrap().get(), 1);
        assert_eq!(last.get(), 4 << 31);
        assert!(token(0, -1).is_err());
        assert!(token(u64::MAX / 2, 0).is_err());
    }

    #[test]
    fn ttl_must_be_whole_seconds() {
        assert_eq!(ttl_secs("ttl", Duration::from_secs(10)).unwrap(), 10);
        for bad in [
            Duration::from_millis(1500),
            Duration::ZERO,
            Duration::from_millis(300),
        ] {
            let error = ttl_secs("ttl", bad).unwrap_err().to_string();
            assert!(error.contains("whole number of seconds"), "{error}");
        }
        assert!(ttl_secs("ttl", Duration::from_secs(1 << 40)).is_err());
    }
}
