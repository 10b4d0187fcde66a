//! Properties of `place` over thousands of random memberships and current owners: it is
//! deterministic, balanced, and moves few shards when members come and go.
//!
//! Each case is seeded, so a failure names the seed that reproduces it.

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tenure::place;

/// Cases per property (`TENURE_PLACEMENT_CASES` overrides).
fn cases() -> u64 {
    std::env::var("TENURE_PLACEMENT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

struct Case {
    group: String,
    shards: u32,
    members: Vec<String>,
}

fn random_case(rng: &mut SmallRng) -> Case {
    let count = rng.random_range(1..=12);
    let members = (0..count)
        .map(|i| format!("node-{i}-{:x}", rng.random::<u16>()))
        .collect();
    Case {
        group: format!("g{}", rng.random::<u8>()),
        shards: rng.random_range(0..=300),
        members,
    }
}

/// Cases `0..count`, each with the current owners it draws after its members: the
/// seed (for messages), the generator (for what a property draws next), the case and
/// the owners.
fn drawn_cases(count: u64) -> impl Iterator<Item = (u64, SmallRng, Case, BTreeMap<u32, String>)> {
    (0..count).map(|seed| {
        let mut rng = SmallRng::seed_from_u64(seed);
        let case = random_case(&mut rng);
        let owners = random_owners(&mut rng, &case);
        (seed, rng, case, owners)
    })
}

impl Case {
    /// `place` over this case's group, shards and members, from `owners`.
    fn place(&self, owners: &BTreeMap<u32, String>) -> BTreeMap<u32, String> {
        place(&self.group, self.shards, &self.members, owners)
    }
}

/// Any current assignment: some shards owned by members, some by strangers, some free.
fn random_owners(rng: &mut SmallRng, case: &Case) -> BTreeMap<u32, String> {
    (0..case.shards)
        .filter_map(|shard| match rng.random_range(0..4) {
            0 => None,
            1 => Some((shard, "stranger".to_owned())),
            _ => {
                let m = rng.random_range(0..case.members.len());
                Some((shard, case.members[m].clone()))
            }
        })
        .collect()
}

fn per_member(placed: &BTreeMap<u32, String>) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for owner in placed.values() {
        *counts.entry(owner.as_str()).or_default() += 1;
    }
    counts
}

fn assert_balanced(seed: u64, case: &Case, placed: &BTreeMap<u32, String>) {
    let shards = case.shards as usize;
    let m = case.members.len();
    assert_eq!(placed.len(), shards, "seed {seed}: every shard placed");
    assert!(
        placed.keys().all(|&k| k < case.shards),
        "seed {seed}: only shards of the group"
    );
    let counts = per_member(placed);
    for member in &case.members {
        let n = counts.get(member.as_str()).copied().unwrap_or(0);
        assert!(
            n == shards / m || n == shards.div_ceil(m),
            "seed {seed}: {member} owns {n} of {shards} shards over {m} members"
        );
    }
    assert!(
        counts.keys().all(|k| case.members.iter().any(|m| m == k)),
        "seed {seed}: only live members own shards"
    );
}

#[test]
fn deterministic_and_independent_of_member_order() {
    for (seed, _, case, owners) in drawn_cases(cases()) {
        let first = case.place(&owners);
        let mut shuffled = case.members.clone();
        shuffled.reverse();
        shuffled.push(case.members[0].clone());
        assert_eq!(
            first,
            place(&case.group, case.shards, &shuffled, &owners),
            "seed {seed}"
        );
    }
}

#[test]
fn balanced_from_any_current_assignment() {
    for (seed, _, case, owners) in drawn_cases(cases()) {
        let placed = case.place(&owners);
        assert_balanced(seed, &case, &placed);
    }
}

#[test]
fn a_settled_placement_is_a_fixed_point() {
    for (seed, _, case, owners) in drawn_cases(cases()) {
        let settled = case.place(&owners);
        assert_eq!(
            case.place(&settled),
            settled,
            "seed {seed}: placing again moves nothing"
        );
    }
}

#[test]
fn a_join_moves_only_shards_to_the_newcomer() {
    for (seed, _, case, owners) in drawn_cases(cases()) {
        let before = case.place(&owners);
        let mut grown = Case {
            members: case.members.clone(),
            ..case
        };
        grown.members.push("newcomer".to_owned());
        let after = grown.place(&before);
        assert_balanced(seed, &grown, &after);
        let moved: Vec<u32> = after
            .iter()
            .filter(|(k, m)| before.get(k) != Some(m))
            .map(|(k, _)| *k)
            .collect();
        assert!(
            moved.iter().all(|k| after[k] == "newcomer"),
            "seed {seed}: a shard moved between old members: {moved:?}"
        );
        let taken = per_member(&after).get("newcomer").copied().unwrap_or(0);
        let m = grown.members.len();
        let shards = grown.shards as usize;
        assert!(
            taken == shards / m || taken == shards.div_ceil(m),
            "seed {seed}: the newcomer took {taken} of {shards} over {m} members"
        );
    }
}

#[test]
fn a_leave_moves_only_the_leavers_shards() {
    for (seed, mut rng, case, owners) in drawn_cases(cases()) {
        if case.members.len() < 2 {
            continue;
        }
        let before = case.place(&owners);
        let leaver = case.members[rng.random_range(0..case.members.len())].clone();
        let shrunk = Case {
            members: case
                .members
                .iter()
                .filter(|m| **m != leaver)
                .cloned()
                .collect(),
            ..case
        };
        let after = shrunk.place(&before);
        assert_balanced(seed, &shrunk, &after);
        for (shard, owner) in &before {
            if *owner != leaver {
                assert_eq!(
                    &after[shard], owner,
                    "seed {seed}: shard {shard} moved though its owner stayed"
                );
            }
        }
    }
}

#[test]
fn a_cold_start_spreads_64_shards_over_4_members_evenly() {
    let members: Vec<String> = (1..=4).map(|i| format!("node-{i}")).collect();
    let placed = place("jobs", 64, &members, &BTreeMap::new());
    assert!(per_member(&placed).values().all(|&n| n == 16), "{placed:?}");
}

/// Members agree while shards move: after one member takes exactly the free shards
/// targeted at it, or releases the shards targeted elsewhere, every other member's view
/// computes the same targets. Otherwise two members could each leave a shard to the
/// other until their next periodic look.
#[test]
fn partial_progress_leaves_every_target_unchanged() {
    for (seed, mut rng, case, owners) in drawn_cases(cases()) {
        let owners: BTreeMap<u32, String> = owners
            .into_iter()
            .filter(|(_, owner)| case.members.contains(owner))
            .collect();
        let target = case.place(&owners);
        let mover = &case.members[rng.random_range(0..case.members.len())];
        let mut took = owners.clone();
        let mut released = owners.clone();
        for (shard, to) in &target {
            if to == mover && !owners.contains_key(shard) {
                took.insert(*shard, mover.clone());
            }
            if owners.get(shard) == Some(mover) && to != mover {
                released.remove(shard);
            }
        }
        for (what, state) in [
            ("took its shards", &took),
            ("released the others", &released),
        ] {
            assert_eq!(
                case.place(state),
                target,
                "seed {seed}: targets changed after {mover} {what}"
            );
        }
    }
}

/// FNV-1a over every (shard, owner) of a placement.
fn digest(placed: &BTreeMap<u32, String>) -> u64 {
    let bytes = placed.iter().flat_map(|(shard, owner)| {
        let shard = shard.to_le_bytes();
        shard.into_iter().chain(owner.bytes()).chain([0])
    });
    bytes.fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Members of different tenure releases must agree on every target: the placements of
/// 500 seeded cases (random members and owners, cold and from those owners), digested
/// together, are pinned to what the first release placed.
#[test]
fn placements_are_pinned_across_releases() {
    let mut all = 0u64;
    for (_, _, case, current) in drawn_cases(500) {
        for from in [BTreeMap::new(), current] {
            let placed = case.place(&from);
            all = all.rotate_left(7) ^ digest(&placed);
        }
    }
    assert_eq!(all, 16_451_715_363_207_832_653, "the placements changed");
}
