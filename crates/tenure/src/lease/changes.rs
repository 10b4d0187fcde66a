//! The change feed of a prefix: where a read of [`LeaseStore::list_prefix_changes`]
//! left off, and what it returns (what changed since, or everything when the store
//! cannot say).

use std::time::Duration;

use super::LeaseInfo;
#[cfg(doc)]
use super::LeaseStore;
use crate::session::SessionId;
use crate::{Error, Result};

/// Where a [`LeaseStore::list_prefix_changes`] read left off: the next read given it
/// returns what changed after it. Opaque outside the store that made it, and meaningful
/// only to that store (and prefix).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct ChangeMark(u64);

impl ChangeMark {
    /// A mark from a store's own counter (a change number, a transaction id).
    pub const fn new(mark: u64) -> Self {
        ChangeMark(mark)
    }

    /// The store's counter value.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// A mark from a store's signed counter (SQL integers are signed). A negative one is
    /// an error of store `backend`: read as zero it would say that nothing ever changed.
    pub fn from_stored(backend: &'static str, number: i64) -> Result<Self> {
        u64::try_from(number)
            .map(ChangeMark)
            .map_err(|_| Error::store_msg(backend, format!("a negative change number, {number}")))
    }
}

/// One call of [`LeaseStore::list_prefix_changes`]: which leases, from where, and the
/// sessions the caller asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangesRead<'a> {
    /// The roles' prefix.
    pub prefix: &'a str,
    /// Where the caller's last read left off; `None` for a complete read.
    pub since: Option<ChangeMark>,
    /// The sessions whose time left the caller asks (those its copy holds leases under).
    pub sessions: &'a [SessionId],
}

impl<'a> ChangesRead<'a> {
    /// A complete read of `prefix`.
    pub fn complete(prefix: &'a str) -> Self {
        ChangesRead {
            prefix,
            since: None,
            sessions: &[],
        }
    }

    /// A read of what changed under `prefix` since `mark`, asking after `sessions`.
    pub fn since(prefix: &'a str, mark: ChangeMark, sessions: &'a [SessionId]) -> Self {
        ChangesRead {
            prefix,
            since: Some(mark),
            sessions,
        }
    }
}

/// `since` as the signed 64-bit integer SQL stores keep marks in: above `i64::MAX` is
/// [`Error::InvalidArgument`] (no such store made it). For backends.
pub fn mark_to_i64(since: Option<ChangeMark>) -> Result<Option<i64>> {
    since
        .map(|mark| i64::try_from(mark.get()))
        .transpose()
        .map_err(|_| Error::invalid("since", "not a mark this store made"))
}

/// One row of an SQL backend's read of changes, decoded (see
/// [`PrefixChanges::from_rows`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeRow {
    /// A lease the read returns.
    Lease(ListedLease),
    /// A session asked about, and its time left.
    Session(SessionId, Duration),
    /// The mark the next read starts from, as the store keeps it (a negative one is
    /// no mark: the next read is complete).
    Mark(i64),
}

/// One lease of a [`PrefixChanges`]: its view, and the session its term is held under
/// (`None` for a lease of its own, a released one, or a store that does not say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedLease {
    /// The lease as [`LeaseStore::list_prefix`] shows it.
    pub info: LeaseInfo,
    /// The session its term is held under, if any.
    pub session: Option<SessionId>,
}

/// The answer of [`LeaseStore::list_prefix_changes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixChanges {
    /// The leases read, sorted by role: every lease of the prefix when `complete`,
    /// else those the read's rules name.
    pub leases: Vec<ListedLease>,
    /// Whether `leases` is every lease of the prefix: the reader replaces its copy
    /// rather than updating it.
    pub complete: bool,
    /// How long each session asked about had left at the read (store time); one that
    /// ended and was forgotten is missing, and its leases lapsed.
    pub sessions: Vec<(SessionId, Duration)>,
    /// Where the next read starts; `None` when the store reads only completely (the
    /// next read is then complete too).
    pub mark: Option<ChangeMark>,
    /// How many leases of the prefix were held at the read, for a store that lists
    /// leases held without a session only when their term changed (etcd: a lapse of
    /// one writes nothing it can read by revision). A reader whose copy counts another
    /// number missed an end and reads completely (see [`LeaseCopy`](crate::LeaseCopy)).
    /// `None`: every lease held without a session is listed at every read.
    pub held: Option<usize>,
}

impl PrefixChanges {
    /// The answer built from `rows` (each decoded, or the error that decoding met), the
    /// leases sorted by role: `complete` when the read had no mark. For backends whose
    /// read is one statement returning leases, sessions and the mark as rows.
    pub fn from_rows(
        complete: bool,
        rows: impl IntoIterator<Item = Result<ChangeRow>>,
    ) -> Result<Self> {
        let mut changes = PrefixChanges {
            leases: Vec::new(),
            complete,
            sessions: Vec::new(),
            mark: None,
            held: None,
        };
        for row in rows {
            match row? {
                ChangeRow::Lease(lease) => changes.leases.push(lease),
                ChangeRow::Session(id, left) => changes.sessions.push((id, left)),
                ChangeRow::Mark(mark) => {
                    changes.mark = u64::try_from(mark).ok().map(ChangeMark::new);
                }
            }
        }
        changes
            .leases
            .sort_unstable_by(|a, b| a.info.role.cmp(&b.info.role));
        Ok(changes)
    }
}
