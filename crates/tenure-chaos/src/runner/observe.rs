//! The orchestrator's own readings of the watched leases, the observations the checker
//! compares with the workers' histories.
//!
//! Beside each complete reading, the orchestrator keeps a [`LeaseCopy`] of the same
//! leases by reads of what changed (as a shard member's looks do), and checks it against
//! the complete reading that follows it: a copy that still disagrees after several
//! readings in which the store showed the same thing is stale, a violation. Under the
//! nemesis that is every way a read of changes can miss one: leases of their own that
//! lapse with their paused or killed holders (on etcd, found only by the count of held
//! leases), sessions that lapse, servers restarted between two reads. A lease whose
//! holder vanishes is soon taken by another worker, a change the copy reads anyway, so
//! on one role the observer also takes a role of its own under the watched prefix now
//! and then and abandons it: nobody takes it after, and the copy must see it lapse
//! without any write announcing it.
//!
//! In shard mode it also reads the live members each time, for the checker's
//! [`membership`](crate::checker::membership) check.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{CopiedLease, LeaseCopy, LeaseInfo, LeaseStore, NodeRegistry};
use tokio_util::sync::CancellationToken;

use crate::checker::{MemberReading, Observation};
use crate::history::mono_ns;

/// How often the orchestrator reads the role's lease.
const OBSERVE_EVERY: Duration = Duration::from_millis(50);

/// Readings in a row, each showing the same term, that a copy may disagree with before
/// it is called stale: one for a change between the copy's read and the complete one,
/// the rest slack for a read of changes that answered an instant early.
const STALE_AFTER: u32 = 4;

/// The role beside the watched one (its name plus this) that the observer takes and
/// abandons, and the owner it takes it as.
const ABANDONED: &str = "/abandoned";
const ABANDONER: &str = "tenure-chaos-observer";

/// What the observer saw.
#[derive(Debug, Default)]
pub(super) struct Observed {
    /// Every change of the watched leases, per role.
    pub(super) by_role: BTreeMap<String, Vec<Observation>>,
    /// Each time the copy kept by reads of changes stayed stale, in words.
    pub(super) stale_copies: Vec<String>,
    /// Every reading of the live members (shard mode).
    pub(super) members: Vec<MemberReading>,
}

/// What the orchestrator watches on the store.
#[derive(Clone, Debug)]
pub(super) enum Watched {
    /// One role (read with the leases under its name: it and the observer's abandoned
    /// role).
    Role(String),
    /// Every shard of a group, read with one `list`.
    Group(String),
}

impl Watched {
    /// The prefix both of the observer's reads list: the role's name (it and the
    /// abandoned role), or the group's shards.
    fn prefix(&self) -> String {
        match self {
            Watched::Role(role) => role.clone(),
            Watched::Group(group) => format!("{group}/"),
        }
    }
}

/// Reads the watched leases (and the live members of `registry`) every
/// [`OBSERVE_EVERY`]; publishes the worker names of their live holders for the nemesis
/// and returns every change seen, per role, the checks of its copy (see the module
/// docs) and the readings of the members.
pub(super) async fn observe(
    leases: Arc<dyn LeaseStore>,
    registry: Option<Arc<dyn NodeRegistry>>,
    watched: Watched,
    holders: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
    ttl: Duration,
) -> Observed {
    let mut seen: BTreeMap<String, Vec<Observation>> = BTreeMap::new();
    let mut members = Vec::new();
    let mut copy = CopyCheck {
        copy: LeaseCopy::default(),
        grace: grace(ttl),
        staleness: Staleness::default(),
    };
    if let Watched::Role(role) = &watched {
        tokio::spawn(abandon_leases(
            leases.clone(),
            format!("{role}{ABANDONED}"),
            ttl,
            stop.clone(),
        ));
    }
    let prefix = watched.prefix();
    let mut tick = tokio::time::interval(OBSERVE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Observed {
                by_role: seen,
                stale_copies: copy.staleness.stale,
                members,
            },
            _ = tick.tick() => {}
        }
        if let Some(registry) = &registry {
            let sent = mono_ns();
            // A failed reading says nothing either way; the next tick reads again.
            if let Ok(Ok(live)) = tokio::time::timeout(ttl, registry.live_nodes()).await {
                members.push(MemberReading {
                    sent,
                    answered: mono_ns(),
                    live,
                });
            }
        }
        let copied = tokio::time::timeout(ttl, copy.read(leases.as_ref(), &prefix, &watched))
            .await
            .is_ok_and(|read| read.is_ok());
        let read = tokio::time::timeout(ttl, leases.list_prefix(&prefix)).await;
        // Errors while the server restarts are expected; the next tick retries.
        let Ok(Ok(mut read)) = read else { continue };
        let t = mono_ns();
        if copied {
            copy.check(&read);
        }
        if let Watched::Role(role) = &watched {
            read.retain(|lease| lease.role == *role);
        }
        // A role's owner is `<worker>-<pid>`; a shard member's, the worker's name.
        let mut live: Vec<String> = read
            .iter()
            .filter_map(|lease| lease.live_holder())
            .map(|owner| {
                owner
                    .rsplit_once('-')
                    .map_or(owner, |(name, _)| name)
                    .to_owned()
            })
            .collect();
        live.sort_unstable();
        live.dedup();
        *holders.lock().unwrap_or_else(|e| e.into_inner()) = live;
        for lease in read {
            let observation = Observation {
                t,
                token: lease.fencing_token.get(),
                holder: lease.holder.clone(),
            };
            let history = seen.entry(lease.role).or_default();
            let changed = history.last().is_none_or(|last| {
                (last.token, &last.holder) != (observation.token, &observation.holder)
            });
            if changed {
                history.push(observation);
            }
        }
    }
}

/// How long after a lease's expiry a copy may still show it live: etcd ends a lapsed
/// lease's key on its own schedule (whole-second TTLs of at least 2 s on a default
/// server, expiry checked every half second, the revoke itself a write that a loaded
/// server may queue), and until then the copy's count of held leases agrees.
fn grace(ttl: Duration) -> Duration {
    ttl * 2 + Duration::from_secs(3)
}

/// Takes `role` as a holder of its own and never renews it: it lapses a TTL later with
/// nobody to take it, and is taken again once a copy has had a TTL past the
/// [`grace`] to see it lapse (see the module docs).
async fn abandon_leases(
    leases: Arc<dyn LeaseStore>,
    role: String,
    ttl: Duration,
    stop: CancellationToken,
) {
    let mut every = tokio::time::interval(ttl * 2 + grace(ttl) * 2);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        // Refused while the last one lives on, or failed while the server restarts:
        // the next tick tries again.
        let _ = tokio::time::timeout(ttl, leases.try_acquire_or_renew(&role, ABANDONER, ttl)).await;
    }
}

/// One lease's term as a reading shows it: what a copy must agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shown {
    holder: Option<String>,
    token: u64,
    live: bool,
}

impl Shown {
    fn of_copy(lease: CopiedLease<'_>) -> Shown {
        Shown {
            holder: lease.holder.map(str::to_owned),
            token: lease.fencing_token.get(),
            live: lease.live_holder().is_some(),
        }
    }

    fn of_read(lease: &LeaseInfo) -> Shown {
        Shown {
            holder: lease.holder.clone(),
            token: lease.fencing_token.get(),
            live: lease.live_holder().is_some(),
        }
    }
}

/// The observer's copy of the watched leases, kept by reads of what changed, and the
/// disagreements with the complete readings (see the module docs).
struct CopyCheck {
    copy: LeaseCopy<String>,
    /// How long after a lease's expiry the copy may still show it live.
    grace: Duration,
    staleness: Staleness,
}

/// The disagreements of a copy with the complete readings.
#[derive(Default)]
struct Staleness {
    /// Per role the copy disagrees on: what the complete readings showed, in how many
    /// readings in a row.
    disagreeing: BTreeMap<String, (Option<Shown>, u32)>,
    /// Each disagreement that lasted [`STALE_AFTER`] readings, in words.
    stale: Vec<String>,
}

impl CopyCheck {
    /// Brings the copy of the leases under `prefix` ([`Watched::prefix`]) up to date:
    /// the watched role and the abandoned one, or the group's shards.
    async fn read(
        &mut self,
        store: &dyn LeaseStore,
        prefix: &str,
        watched: &Watched,
    ) -> tenure::Result<()> {
        let group = matches!(watched, Watched::Group(_));
        let key = |rest: &str| {
            (group || matches!(rest, "" | ABANDONED)).then(|| format!("{prefix}{rest}"))
        };
        self.copy.read(store, prefix, key).await?;
        Ok(())
    }

    /// Compares the copy with `read`, a complete reading made after the copy's. A lease
    /// that lapsed less than the grace ago may still show live in the copy.
    fn check(&mut self, read: &[LeaseInfo]) {
        let shown: BTreeMap<&str, Shown> = read
            .iter()
            .map(|lease| (lease.role.as_str(), Shown::of_read(lease)))
            .collect();
        let copied: BTreeMap<&str, Shown> = self
            .copy
            .iter()
            .map(|(role, lease)| (role.as_str(), Shown::of_copy(lease)))
            .collect();
        let lapsing: BTreeSet<&str> = read
            .iter()
            .filter(|lease| {
                lease.holder.is_some()
                    && lease
                        .now
                        .duration_since(lease.expires_at)
                        .is_ok_and(|ago| ago < self.grace)
            })
            .map(|lease| lease.role.as_str())
            .collect();
        self.staleness.compare(&copied, &shown, &lapsing);
    }
}

impl Staleness {
    /// Counts, per role, the readings in a row in which `copied` and `shown` differ while
    /// `shown` stays the same; a role reaching [`STALE_AFTER`] is reported once. The
    /// roles `lapsing` (lapsed a moment ago) are not counted while the copy shows them
    /// live with the same term.
    fn compare(
        &mut self,
        copied: &BTreeMap<&str, Shown>,
        shown: &BTreeMap<&str, Shown>,
        lapsing: &BTreeSet<&str>,
    ) {
        let roles: BTreeSet<&str> = copied.keys().chain(shown.keys()).copied().collect();
        for role in roles {
            let (copy, store) = (copied.get(role), shown.get(role));
            if copy == store {
                self.disagreeing.remove(role);
                continue;
            }
            // The same term, which the copy still shows live.
            let still_live =
                |c: &Shown, s: &Shown| c.live && (&c.holder, c.token) == (&s.holder, s.token);
            if lapsing.contains(role) && copy.zip(store).is_some_and(|(c, s)| still_live(c, s)) {
                continue;
            }
            let entry = self
                .disagreeing
                .entry(role.to_owned())
                .or_insert((store.cloned(), 0));
            if entry.0.as_ref() != store {
                *entry = (store.cloned(), 0);
            }
            entry.1 += 1;
            if entry.1 == STALE_AFTER {
                self.stale.push(format!(
                    "{role}: the copy kept by reads of changes shows {copy:?}, \
                     {STALE_AFTER} complete readings in a row show {store:?}"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holder: &str, token: u64, live: bool) -> Shown {
        Shown {
            holder: Some(holder.to_owned()),
            token,
            live,
        }
    }

    #[test]
    fn a_copy_that_stays_behind_the_store_is_stale_once() {
        let mut check = Staleness::default();
        let copy = BTreeMap::from([("r", held("a", 1, true))]);
        let lapsed = BTreeMap::from([("r", held("a", 1, false))]);
        for _ in 0..STALE_AFTER - 1 {
            check.compare(&copy, &lapsed, &BTreeSet::new());
        }
        assert!(check.stale.is_empty(), "a few readings may disagree");
        for _ in 0..10 {
            check.compare(&copy, &lapsed, &BTreeSet::new());
        }
        assert_eq!(check.stale.len(), 1, "{:?}", check.stale);
        assert!(check.stale[0].contains("live: false"), "{}", check.stale[0]);
    }

    #[test]
    fn a_lease_that_lapsed_a_moment_ago_may_show_live_in_the_copy() {
        let mut check = Staleness::default();
        let copy = BTreeMap::from([("r", held("a", 1, true))]);
        let lapsed = BTreeMap::from([("r", held("a", 1, false))]);
        let lapsing = BTreeSet::from(["r"]);
        for _ in 0..3 * STALE_AFTER {
            check.compare(&copy, &lapsed, &lapsing);
        }
        assert!(check.stale.is_empty(), "{:?}", check.stale);
        let taken = BTreeMap::from([("r", held("b", 2, true))]);
        for _ in 0..STALE_AFTER {
            check.compare(&copy, &taken, &lapsing);
        }
        assert_eq!(
            check.stale.len(),
            1,
            "another term is no lapse: {:?}",
            check.stale
        );
    }

    #[test]
    fn a_store_that_moves_on_each_reading_or_a_copy_that_catches_up_is_not_stale() {
        let mut check = Staleness::default();
        for token in 1..20 {
            let copy = BTreeMap::from([("r", held("a", token, true))]);
            let store = BTreeMap::from([("r", held("b", token + 1, true))]);
            check.compare(&copy, &store, &BTreeSet::new());
        }
        let store = BTreeMap::from([("r", held("b", 30, true))]);
        for _ in 0..STALE_AFTER - 1 {
            check.compare(&BTreeMap::new(), &store, &BTreeSet::new());
        }
        check.compare(&store, &store, &BTreeSet::new());
        for _ in 0..STALE_AFTER - 1 {
            check.compare(&BTreeMap::new(), &store, &BTreeSet::new());
        }
        assert!(check.stale.is_empty(), "{:?}", check.stale);
        assert!(
            check.disagreeing.len() == 1,
            "the last disagreement is counted anew"
        );
    }
}
