//! Handing shards to a member that works on none yet: one shard first (a *probe*), the
//! rest once the store shows it working on that one.
//!
//! A member that heartbeats into the group but never takes a shard (its loop is wedged,
//! its store calls hang) is still a target of its share. Handing it all of them at once
//! would leave each free until some member rescues it a TTL later, and handing them back
//! after every rescue would repeat that for as long as it stays wedged. So a target that
//! works on nothing gets one probe; a probe it does not take within [`PROBE_WAIT`]
//! retry intervals is taken back by the member that handed it over, and the next probe
//! to that target waits [`RESCUE_HOLD`](super::RESCUE_HOLD) TTLs, then twice as long
//! each time, up to [`MAX_BACKOFF`] TTLs. A healthy newcomer takes its probe at once
//! (it waits on the shards it wants by the store's push), the member that handed it
//! over looks again on that push, sees it working, and hands it the rest.
//! A probe that another member takes before it is due back (members that join together
//! plan apart for a moment) tested nothing: its target may be probed again at the next
//! look.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

/// How many retry intervals a probe may stay untaken before it is taken back: a target
/// without a waiter on the shard takes it at its next look, a retry interval later.
pub(super) const PROBE_WAIT: u32 = 2;

/// The longest wait between two probes of one target, in TTLs.
const MAX_BACKOFF: u32 = 64;

/// One target that works on no shard, as this member probed it.
struct Probe {
    /// No probe to it before then.
    next_at: Instant,
    /// The wait after the next probe.
    backoff: Duration,
}

/// This member's probes, by target, and the probe shards it released and may take back.
#[derive(Default)]
pub(super) struct Probes {
    targets: HashMap<String, Probe>,
    /// Released probe shards: when each is taken back if still free, and its target
    /// (none if the plan no longer targeted it elsewhere when it was released).
    released: HashMap<u32, (Instant, Option<String>)>,
}

impl Probes {
    /// Whether a shard may be handed to `to`, which works on no shard, as a probe now;
    /// if so the probe is counted.
    pub(super) fn try_probe(&mut self, to: &str, now: Instant, ttl: Duration) -> bool {
        let first_wait = ttl * super::RESCUE_HOLD;
        match self.targets.get_mut(to) {
            Some(probe) if now < probe.next_at => false,
            Some(probe) => {
                probe.next_at = now + probe.backoff;
                probe.backoff = (probe.backoff * 2).min(ttl * MAX_BACKOFF);
                true
            }
            None => {
                let probe = Probe {
                    next_at: now + first_wait,
                    backoff: first_wait * 2,
                };
                self.targets.insert(to.to_owned(), probe);
                true
            }
        }
    }

    /// The look saw `working` among the `planned` members: targets working on some
    /// shard need no probe any more, and targets no longer planned are forgotten (a
    /// group that many members passed through keeps no state for them; one that comes
    /// back starts over with the first wait).
    pub(super) fn seen(&mut self, working: &BTreeSet<String>, planned: &[String]) {
        self.targets
            .retain(|target, _| !working.contains(target) && planned.binary_search(target).is_ok());
    }

    /// Probe `shard` was released to `target`: taken back at `until` unless it is taken.
    pub(super) fn released(&mut self, shard: u32, until: Instant, target: Option<String>) {
        self.released.insert(shard, (until, target));
    }

    /// Whether the probe `shard`, free at this look, is due to be taken back; a due
    /// probe is forgotten either way (its shard is free or taken by now).
    pub(super) fn take_back(&mut self, shard: u32, now: Instant) -> bool {
        match self.released.get(&shard) {
            Some((until, _)) if now >= *until => {
                self.released.remove(&shard);
                true
            }
            _ => false,
        }
    }

    /// Forgets the probes whose shards have an owner at `now` (`owner_of`, from a look).
    /// One taken by a member other than its target before it was due back tested
    /// nothing: the target may be probed again at once, not after a backoff it did not
    /// earn (members joining together plan apart for a moment, and one may take
    /// another's probe: that target then got no shard for `RESCUE_HOLD` TTLs). One
    /// taken later was rescued from a target that did not take it: the backoff stands.
    pub(super) fn settle<'a>(&mut self, owner_of: impl Fn(u32) -> Option<&'a str>, now: Instant) {
        let targets = &mut self.targets;
        self.released
            .retain(|shard, (until, target)| match owner_of(*shard) {
                None => true,
                Some(owner) => {
                    match target {
                        Some(target) if *target != owner && now < *until => {
                            targets.remove(target.as_str());
                        }
                        _ => {}
                    }
                    false
                }
            });
    }

    /// When the first released probe is due to be taken back.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.released.values().map(|(until, _)| *until).min()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const TTL: Duration = Duration::from_secs(1);

    fn planned(members: &[&str]) -> Vec<String> {
        members.iter().map(|m| (*m).to_owned()).collect()
    }

    #[test]
    fn a_target_is_probed_once_then_waits_longer_each_time() {
        let mut probes = Probes::default();
        let start = Instant::now();
        assert!(probes.try_probe("b", start, TTL));
        assert!(!probes.try_probe("b", start + TTL, TTL));
        let first = start + TTL * super::super::RESCUE_HOLD;
        assert!(probes.try_probe("b", first, TTL));
        assert!(!probes.try_probe("b", first + TTL * 7, TTL));
        assert!(probes.try_probe("b", first + TTL * 8, TTL));
    }

    #[test]
    fn targets_that_work_or_left_the_plan_are_forgotten() {
        let mut probes = Probes::default();
        let now = Instant::now();
        for target in ["b", "c", "d"] {
            assert!(probes.try_probe(target, now, TTL));
        }
        let working = BTreeSet::from(["b".to_owned()]);
        probes.seen(&working, &planned(&["a", "b", "c"]));
        assert_eq!(
            probes.targets.len(),
            1,
            "only c is still a wedged member of the plan"
        );
        assert!(!probes.try_probe("c", now, TTL), "c still waits");
        // d left and came back: it is probed as a newcomer would be.
        assert!(probes.try_probe("d", now, TTL));
    }

    #[test]
    fn a_probe_taken_by_another_member_lets_its_target_be_probed_again() {
        let mut probes = Probes::default();
        let now = Instant::now();
        let until = now + TTL;
        for (shard, target) in [(1, "b"), (2, "c"), (4, "e")] {
            assert!(probes.try_probe(target, now, TTL));
            probes.released(shard, until, Some(target.to_owned()));
        }
        probes.released(3, until, Some("d".to_owned()));
        // b's probe was taken by d (planning apart for a moment), c took its own, and
        // d's is still free.
        let owners = BTreeMap::from([(1, "d".to_owned()), (2, "c".to_owned())]);
        probes.settle(|k| owners.get(&k).map(String::as_str), now);
        assert!(
            probes.try_probe("b", now, TTL),
            "b was not tested: probed again"
        );
        assert!(
            !probes.try_probe("c", now, TTL),
            "c took its probe: no second one"
        );
        // e's probe, still free when due, was rescued by a: e's backoff stands.
        probes.settle(|k| (k == 4).then_some("a"), until);
        assert!(
            !probes.try_probe("e", until, TTL),
            "e did not take its probe"
        );
        assert_eq!(probes.next_due(), Some(until), "d's probe is still out");
        assert!(!probes.take_back(1, until), "a settled probe is forgotten");
        assert!(probes.take_back(3, until));
    }
}
