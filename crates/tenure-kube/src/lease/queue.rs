//! The queue of candidates (see [`tenure::LeaseStore::try_acquire_or_queue`]): one Lease
//! object per owner queued for a role.
//!
//! The API server keeps no timers and no queue, so a candidacy is judged as a term is:
//! by observation, from the namespace watch. Each is its own object, so candidates
//! never write the same object (no 409s between them), and every store watching the
//! namespace judges each one the same way a contender judges a holder:
//!
//! - **Object**: `tenure.candidate-<role>.by-<owner>` ([`crate::names::candidacy_name`]),
//!   labelled with the role's hash (`tenure.dev/role`) so one list or the watch finds a
//!   role's candidacies; the role in `tenure.dev/name`, the owner in `holderIdentity`,
//!   its TTL in `leaseDurationSeconds`, the value it will advertise in `tenure.dev/value`
//!   (fields in [`crate::record`]).
//! - **Place**: `acquireTime`, written when the owner joins and kept by every refresh;
//!   the queue is ordered by it (ties by object name). It is the candidate's wall clock,
//!   so candidates that joined within the clocks' skew of each other may be served in
//!   either order; only the order, never a token, depends on it. A place belongs to
//!   the incarnation of the role's object it joined under (its `metadata.uid`, in
//!   [`JOINED_UNDER`]): the list of spent places goes with a deleted object, so once
//!   the object is created again every earlier place counts as spent, and its owner's
//!   next refresh joins again at the back.
//! - **Refresh**: one `PUT` of the candidacy, conditional on the version this store last
//!   wrote or read (a create the first time). A live place keeps its `acquireTime`; a
//!   lapsed, withdrawn or spent one joins again at the back with a new one.
//! - **Live**: unchanged for less than `leaseDurationSeconds` since this process first
//!   saw its version (its own writes count from when they were sent), as for terms.
//! - **Spent**: a place whose turn came is listed in the role's
//!   `tenure.dev/used-candidacies` by the same write that began its owner's term (a
//!   handover, or the owner acquiring any other way), so no release hands the role to it
//!   again, whether or not its object was touched since. An entry goes when the object
//!   shows another place (its owner joined again) or none (withdrawn or cleared); at most
//!   [`MAX_USED`] are kept.
//! - **Withdraw**: one conditional `PUT` clearing `holderIdentity`.
//! - **Housekeeping**: tenure's Role may not delete objects, so a candidacy that lapsed
//!   unspent (its owner died in the queue) is cleared by the next release that sees it
//!   lapsed, with one conditional `PUT`, at most [`MAX_CLEARS`] per release, so that a
//!   reader that starts later (and would count it live for one more TTL) never picks it.
//!   A spent place needs no write while the role's list names it (a successor that
//!   stopped refreshing its candidacy costs nothing). One dropped from the full list is
//!   cleared before the write that drops it, not after: in between, a release reading
//!   the new list (the successor's own, a moment later) would find the place neither
//!   listed nor cleared and hand it the role again. Objects stay, one per (role, owner)
//!   that ever queued, as sessions' objects do; deleting a cleared one is always safe,
//!   and deleting a queued one only withdraws it.
//!
//! The release that hands the role over is in [`super::handover`].

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use tenure::lease::validate_release;
use tenure::{Error, Result};
use tokio::time::Instant;

use super::{KubeLeaseStore, ATTEMPTS};
use crate::conn::is_conflict;
use crate::names::{candidacy_name, object_name, role_label, Kind, CANDIDATE};
use crate::record::{
    annotate, label, micro_now, new_object, selector, spec, Record, NAME, ROLE_LABEL, USED, VALUE,
};
use crate::BACKEND;

/// How long a release or `candidates` waits for the store's watch to finish its first
/// list before it lists the role's candidacies itself.
const FIRST_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The most spent places a role's object lists; older ones are dropped first.
pub(crate) const MAX_USED: usize = 32;

/// The most lapsed candidacies one release clears.
pub(crate) const MAX_CLEARS: usize = 8;

/// The annotation naming the `metadata.uid` of the role's object a candidacy's place
/// joined under. A place spent on an object an operator then deleted is listed only on
/// that object; without this, the object created again would let a release hand the
/// role to that place a second time.
pub(crate) const JOINED_UNDER: &str = "tenure.dev/role-uid";

/// One candidacy object of a role, as this store last knew it.
#[derive(Clone, Debug)]
pub(crate) struct Candidacy {
    pub record: Record,
    /// The queued owner; `None` once withdrawn or cleared.
    pub owner: Option<String>,
    /// The place: `acquireTime` in microseconds.
    pub arrival: Option<i64>,
    /// The end of the candidacy on this process's clock, unless refreshed.
    pub until: Instant,
}

impl Candidacy {
    /// `lease`, first seen at `first`, as a candidacy of `role`; `None` for an object
    /// that is not one (another role's, or a name that does not match its owner).
    pub fn of(lease: Lease, first: Instant, role: &str) -> Option<Candidacy> {
        let record = Record::read_any(lease).ok()?;
        if record.kind() != Some(CANDIDATE) || record.annotations.get(NAME)? != role {
            return None;
        }
        let owner = record.holder.clone();
        if owner
            .as_deref()
            .is_some_and(|owner| record.object != candidacy_name(role, owner))
        {
            return None;
        }
        Some(Candidacy {
            arrival: record.acquired_micros(),
            until: first + record.duration,
            owner,
            record,
        })
    }

    /// The place, while the candidacy is queued and live at `now`.
    fn place(&self, now: Instant) -> Option<(&str, i64)> {
        let owner = self.owner.as_deref()?;
        let arrival = self.arrival?;
        (now < self.until).then_some((owner, arrival))
    }

    /// Whether the candidacy names an owner but has lapsed at `now`.
    fn lapsed(&self, now: Instant) -> bool {
        self.owner.is_some() && now >= self.until
    }

    /// The value the owner's term is to advertise.
    pub fn value(&self) -> Option<&str> {
        self.record.annotations.get(VALUE).map(String::as_str)
    }
}

/// The spent places a role's object lists (`tenure.dev/used-candidacies`), and the
/// object's uid: places that joined under another incarnation count as spent too.
#[derive(Clone, Debug, Default)]
pub(crate) struct Used {
    /// The role object's `metadata.uid`, when read from one.
    uid: Option<String>,
    entries: Vec<(String, i64)>,
    /// Entries dropped to keep the list at [`MAX_USED`]: no longer protected by it, so
    /// their candidacies are cleared before the list is written without them
    /// ([`KubeLeaseStore::clear_dropped`]).
    dropped: Vec<(String, i64)>,
}

impl Used {
    /// The list on `record`. An entry that does not parse is dropped: it could only
    /// name a place no candidacy has, and refusing every later write of the role over
    /// it would stop the role.
    pub fn of(record: &Record) -> Used {
        let uid = record.lease.metadata.uid.clone();
        let Some(raw) = record.annotations.get(USED) else {
            return Used {
                uid,
                ..Used::default()
            };
        };
        let entries = raw
            .split_whitespace()
            .filter_map(|entry| {
                let (object, micros) = entry.rsplit_once('=')?;
                Some((object.to_owned(), micros.parse().ok()?))
            })
            .collect();
        Used {
            uid,
            entries,
            dropped: Vec::new(),
        }
    }

    /// Whether `candidacy`'s place was spent: listed, or joined under another
    /// incarnation of the role's object (a place written before the annotation existed
    /// names none and is judged by the list alone).
    pub fn spent(&self, candidacy: &Candidacy) -> bool {
        let joined = candidacy.record.annotations.get(JOINED_UNDER);
        let elsewhere = matches!((&self.uid, joined), (Some(uid), Some(joined)) if uid != joined);
        elsewhere || listed(&self.entries, candidacy)
    }

    /// Drops the entries whose object `view` shows at another place or at none.
    pub fn prune(&mut self, view: &[Candidacy]) {
        self.entries.retain(|(object, at)| {
            view.iter()
                .find(|c| c.record.object == *object)
                .is_none_or(|c| c.owner.is_some() && c.arrival == Some(*at))
        });
    }

    /// Adds `candidacy`'s place, dropping the oldest entries past [`MAX_USED`].
    pub fn spend(&mut self, candidacy: &Candidacy) {
        if let Some(arrival) = candidacy.arrival {
            if !self.spent(candidacy) {
                self.entries
                    .push((candidacy.record.object.clone(), arrival));
            }
        }
        let excess = self.entries.len().saturating_sub(MAX_USED);
        self.dropped.extend(self.entries.drain(..excess));
    }

    /// Takes the dropped entries, to clear their candidacies.
    fn take_dropped(&mut self) -> Vec<(String, i64)> {
        std::mem::take(&mut self.dropped)
    }

    /// Puts back entries whose candidacy could not be cleared: the list names them
    /// until a later write clears them (it then holds more than [`MAX_USED`]).
    fn keep(&mut self, entries: Vec<(String, i64)>) {
        self.entries.splice(0..0, entries);
    }

    /// Writes the list into `lease` (removing the annotation when it is empty).
    pub fn write(&self, lease: &mut Lease) {
        let value = (!self.entries.is_empty()).then(|| {
            self.entries
                .iter()
                .map(|(object, at)| format!("{object}={at}"))
                .collect::<Vec<_>>()
                .join(" ")
        });
        annotate(lease, USED, value);
    }
}

/// Whether `entries` list `candidacy`'s place.
fn listed(entries: &[(String, i64)], candidacy: &Candidacy) -> bool {
    candidacy.arrival.is_some_and(|arrival| {
        entries
            .iter()
            .any(|(object, at)| *object == candidacy.record.object && *at == arrival)
    })
}

/// The queue: the live, unspent candidacies of `view` other than `holder`'s, oldest
/// first (ties by object name).
pub(crate) fn line<'a>(
    view: &'a [Candidacy],
    used: &Used,
    holder: Option<&str>,
    now: Instant,
) -> Vec<&'a Candidacy> {
    let mut line: Vec<&Candidacy> = view
        .iter()
        .filter(|c| c.place(now).is_some_and(|(owner, _)| holder != Some(owner)) && !used.spent(c))
        .collect();
    line.sort_by(|a, b| (a.arrival, &a.record.object).cmp(&(b.arrival, &b.record.object)));
    line
}

/// The candidacy a release by `holder` hands the role to: the first in [`line()`]
/// (`successor`'s, when given).
pub(crate) fn next_in_line<'a>(
    view: &'a [Candidacy],
    used: &Used,
    holder: &str,
    successor: Option<&str>,
    now: Instant,
) -> Option<&'a Candidacy> {
    line(view, used, Some(holder), now)
        .into_iter()
        .find(|c| successor.is_none_or(|s| c.owner.as_deref() == Some(s)))
}

impl KubeLeaseStore {
    /// Every candidacy object of `role`: the watch's copies once it has listed the
    /// namespace (with this store's newer writes in their place), else one list.
    pub(super) async fn candidacies(&self, role: &str) -> Result<Vec<Candidacy>> {
        let hash = role_label(role);
        // A store whose watch is still listing waits for that list (one request it makes
        // anyway) rather than listing the role's candidacies itself on every call meanwhile.
        let synced = self.shared.synced()
            || self
                .shared
                .wait_synced(tokio::time::Instant::now() + FIRST_LIST_WAIT)
                .await;
        let copies = if synced {
            self.shared.labelled(ROLE_LABEL, &hash)
        } else {
            let selector = format!("{},{ROLE_LABEL}={hash}", selector(&[CANDIDATE]));
            let (records, _) = self
                .shared
                .list(&self.api, &self.conn.namespace, &selector)
                .await?;
            records
                .into_iter()
                .map(|(record, first)| (record.lease, first))
                .collect()
        };
        Ok(copies
            .into_iter()
            .filter_map(|(lease, first)| Candidacy::of(lease, first, role))
            .collect())
    }

    /// [`tenure::LeaseStore::candidates`]: the owners a release would hand the role to,
    /// oldest first (live, unspent, not the holder), judged as a release judges them:
    /// from the watch's copies with no request once it has listed the namespace, else
    /// from one list and one read.
    pub(super) async fn queued(&self, role: &str) -> Result<Vec<String>> {
        self.watch.ensure(&self.api, &self.shared);
        let synced = self.shared.synced();
        let view = self.candidacies(role).await?;
        let role_copy = match self.shared.cached(&object_name(Kind::Role, role)) {
            Some((lease, _)) if synced => Some(Record::read(lease, role)?),
            _ => self.read_role(role).await?.map(|seen| seen.record),
        };
        let used = role_copy.as_ref().map(Used::of).unwrap_or_default();
        let holder = role_copy.and_then(|record| record.holder);
        Ok(line(&view, &used, holder.as_deref(), self.instant())
            .into_iter()
            .filter_map(|c| c.owner.clone())
            .collect())
    }

    /// `owner`'s candidacy for `role` as this store knows it (no request): for the
    /// write that begins the owner's term to spend its place.
    pub(super) fn known_candidacy(&self, role: &str, owner: &str) -> Option<Candidacy> {
        let (lease, first) = self.shared.cached(&candidacy_name(role, owner))?;
        Candidacy::of(lease, first, role).filter(|c| c.place(self.instant()).is_some())
    }

    /// Reads a candidacy object, keeping the copy in place of the watch's.
    async fn read_candidacy(&self, object: &str) -> Result<Option<(Lease, Instant)>> {
        let sending = self.shared.sending(object);
        let read = self
            .shared
            .get(&self.api, &self.conn.namespace, object)
            .await?;
        Ok(read.map(|(record, first, _)| {
            self.shared.fresher(&record.lease, first, &sending);
            (record.lease, first)
        }))
    }

    /// The candidacy as this store knows it, read only when the watch cannot say.
    async fn candidacy_copy(&self, object: &str) -> Result<Option<(Lease, Instant)>> {
        match self.shared.cached(object) {
            Some(copy) => Ok(Some(copy)),
            None if self.shared.synced() => Ok(None),
            None => self.read_candidacy(object).await,
        }
    }

    /// A conditional `PUT` of a candidacy; the object as written, `None` when it lost
    /// (409) or the object is gone (404).
    async fn write_candidacy(&self, object: &str, lease: &Lease) -> Result<Option<Lease>> {
        let written = self.put(object, lease).await?;
        Ok(written.map(|(_, lease)| lease))
    }

    /// Queues `owner` for `role` for `secs` (the refresh of a live place keeps it),
    /// advertising `value` once its turn comes; `used` is the role's spent places as the
    /// caller judged the role.
    pub(super) async fn queue_up(
        &self,
        role: &str,
        owner: &str,
        secs: i32,
        value: Option<&str>,
        used: &Used,
    ) -> Result<()> {
        let object = candidacy_name(role, owner);
        let mut known = self.candidacy_copy(&object).await?;
        for _ in 0..ATTEMPTS {
            let Some((lease, first)) = known.take() else {
                if self
                    .create_candidacy(role, owner, secs, value, used)
                    .await?
                {
                    return Ok(());
                }
                known = self.read_candidacy(&object).await?;
                continue;
            };
            let record = Record::read(lease, role)?;
            if record
                .holder
                .as_deref()
                .is_some_and(|holder| holder != owner)
            {
                return Err(not_ours(&record, role, owner));
            }
            let now = self.instant();
            let keep = Candidacy::of(record.lease.clone(), first, role).is_some_and(|c| {
                c.place(now).is_some_and(|(holder, _)| holder == owner) && !used.spent(&c)
            });
            let mut lease = record.to_write();
            fill(
                &mut lease,
                role,
                owner,
                secs,
                value,
                (!keep).then_some(used),
            );
            if self.write_candidacy(&object, &lease).await?.is_some() {
                return Ok(());
            }
            known = self.read_candidacy(&object).await?;
        }
        Err(self.lost_races(role))
    }

    /// Creates `owner`'s candidacy; `false` when it exists already.
    async fn create_candidacy(
        &self,
        role: &str,
        owner: &str,
        secs: i32,
        value: Option<&str>,
        used: &Used,
    ) -> Result<bool> {
        let object = candidacy_name(role, owner);
        let mut lease = new_object(&object, CANDIDATE, Some(role));
        fill(&mut lease, role, owner, secs, value, Some(used));
        let sending = self.shared.sending(&object);
        let sent = self.instant();
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                self.wrote(&object, &created, sent);
                self.shared.fresher(&created, sent, &sending);
                Ok(true)
            }
            Err(error) if is_conflict(&error) => Ok(false),
            Err(error) => Err(self.error("create", &object, error)),
        }
    }

    /// [`tenure::LeaseStore::withdraw`]: clears `owner`'s candidacy; whether it was
    /// queued, live and unspent.
    pub(super) async fn withdraw_candidacy(&self, role: &str, owner: &str) -> Result<bool> {
        validate_release(role, owner)?;
        let object = candidacy_name(role, owner);
        let mut known = self.candidacy_copy(&object).await?;
        for _ in 0..ATTEMPTS {
            let Some((lease, first)) = known.take() else {
                return Ok(false);
            };
            let record = Record::read(lease, role)?;
            if record.holder.as_deref() != Some(owner) {
                return Ok(false);
            }
            let queued = match Candidacy::of(record.lease.clone(), first, role) {
                Some(c) if c.place(self.instant()).is_some() => !self.spent(role, &c).await?,
                _ => false,
            };
            if self.clear(&record).await? {
                return Ok(queued);
            }
            known = self.read_candidacy(&object).await?;
        }
        Err(self.lost_races(role))
    }

    /// Whether the role's object lists `candidacy`'s place as spent (the watch's copy,
    /// else a read).
    async fn spent(&self, role: &str, candidacy: &Candidacy) -> Result<bool> {
        let object = object_name(Kind::Role, role);
        let record = match self.shared.cached(&object) {
            Some((lease, _)) => Some(Record::read(lease, role)?),
            None => self.read_role(role).await?.map(|seen| seen.record),
        };
        Ok(record.is_some_and(|record| Used::of(&record).spent(candidacy)))
    }

    /// Clears a candidacy (no owner, no value) with a write conditional on `record`;
    /// whether it did.
    pub(super) async fn clear(&self, record: &Record) -> Result<bool> {
        let mut lease = record.to_write();
        annotate(&mut lease, VALUE, None);
        let spec = spec(&mut lease);
        spec.holder_identity = None;
        spec.renew_time = Some(micro_now());
        Ok(self
            .write_candidacy(&record.object, &lease)
            .await?
            .is_some())
    }

    /// Clears the candidacies of the places `used` dropped from its list, before the
    /// write of the role that drops them: once the list no longer names a place, only
    /// its cleared candidacy keeps a release from handing it the role again, and a
    /// release that reads the new list (the successor's own, a moment later) must find
    /// it cleared. A place whose candidacy still shows it and could not be cleared goes
    /// back on the list. Costs nothing until more than [`MAX_USED`] places were spent.
    pub(super) async fn clear_dropped(&self, role: &str, used: &mut Used) -> Result<()> {
        let mut kept = Vec::new();
        for (object, at) in used.take_dropped() {
            let Some((lease, first)) = self.candidacy_copy(&object).await? else {
                continue;
            };
            let shows_place = Candidacy::of(lease, first, role)
                .filter(|c| c.owner.is_some() && c.arrival == Some(at));
            let Some(candidacy) = shows_place else {
                continue;
            };
            match self.clear(&candidacy.record).await {
                Ok(true) => {}
                Ok(false) => kept.push((object, at)),
                Err(error) => {
                    tracing::debug!(object, %error, "clearing a spent candidacy failed");
                    kept.push((object, at));
                }
            }
        }
        used.keep(kept);
        Ok(())
    }

    /// Clears, at once, up to [`MAX_CLEARS`] candidacies of `view` that nothing else
    /// keeps a release from picking: lapsed at `now` and not spent in `used`. A spent
    /// place the list still names needs no write, so a successor that stopped
    /// refreshing its candidacy costs nothing here. Housekeeping: a failure is logged,
    /// and the next release tries again.
    pub(super) async fn clear_lapsed(&self, view: &[Candidacy], used: &Used, now: Instant) {
        let clears = view
            .iter()
            .filter(|c| c.owner.is_some() && c.lapsed(now) && !used.spent(c))
            .take(MAX_CLEARS)
            .map(|c| async move { (&c.record.object, self.clear(&c.record).await) });
        for (object, result) in futures_util::future::join_all(clears).await {
            match result {
                Ok(true) => tracing::debug!(object, "cleared a candidacy"),
                Ok(false) => tracing::debug!(object, "a candidacy to clear changed meanwhile"),
                Err(error) => tracing::debug!(object, %error, "clearing a candidacy failed"),
            }
        }
    }
}

/// Writes `owner`'s candidacy into `lease`: labels, owner, TTL, value, refresh time,
/// and, when it joins (`join`: the role as judged), a new place under the role
/// object's incarnation.
fn fill(
    lease: &mut Lease,
    role: &str,
    owner: &str,
    secs: i32,
    value: Option<&str>,
    join: Option<&Used>,
) {
    label(lease, ROLE_LABEL, Some(role_label(role)));
    annotate(lease, VALUE, value.map(str::to_owned));
    if let Some(used) = join {
        annotate(lease, JOINED_UNDER, used.uid.clone());
    }
    let now = micro_now();
    let spec = spec(lease);
    spec.holder_identity = Some(owner.to_owned());
    spec.lease_duration_seconds = Some(secs);
    if join.is_some() || spec.acquire_time.is_none() {
        spec.acquire_time = Some(now.clone());
    }
    spec.renew_time = Some(now);
}

fn not_ours(record: &Record, role: &str, owner: &str) -> Error {
    Error::store_msg(
        BACKEND,
        format!(
            "the Lease object {} is not tenure's candidacy of {owner:?} for {role:?} (it \
             names {:?}); another tool may be using that name",
            record.object, record.holder
        ),
    )
}
