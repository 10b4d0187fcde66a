//! Placement of a shard group's shards on its live members: a pure function.
//!
//! [`place`] is rendezvous (highest-random-weight) hashing with bounded loads: each
//! member may own `floor(N/M)` or `ceil(N/M)` of the `N` shards, and a shard keeps its
//! current owner whenever that owner is live and within its bound. Every member computes
//! the placement from its own view of the membership; views may differ for a moment, and
//! the per-shard leases keep that safe. Because no I/O happens here, the properties that
//! matter (deterministic, balanced, few moves when members come and go) are tested over
//! thousands of random memberships.
//!
//! The weights come from a fixed hash (FNV-1a and a SplitMix64 finalizer), not from
//! `std`'s hasher, whose algorithm may change between Rust releases: members built by
//! different compilers must agree on every weight.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

/// The target owner of each shard `0..shards` of `group`, given the live `members` and the
/// `current` owners (shard -> member; owners that are not live members are ignored).
///
/// With `M` distinct live members, each gets `floor(shards / M)` or `ceil(shards / M)`
/// shards; which members get the larger share depends on the members alone (a hash of
/// each), never on who owns what. Each member keeps, of its current shards, as many as
/// its share allows (those it weighs highest), and the rest of the shards go, in shard
/// order, to the highest-weighing member with room left. So a member joining takes only
/// shards it wins (about `N / (M + 1)`), a member leaving frees only its own, and a cold
/// start spreads shards by weight alone. With no members every shard is untargeted (an
/// empty map).
///
/// Because the shares do not follow current ownership, members that see the same
/// membership agree on every target while shards move: a member that has taken the
/// shards targeted at it, or released the ones targeted elsewhere, leaves every other
/// member's placement unchanged, so no shard is left with two members each deferring to
/// the other.
///
/// ```
/// use std::collections::BTreeMap;
/// use tenure::placement::place;
///
/// let members = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
/// let start = place("jobs", 64, &members, &BTreeMap::new());
/// assert_eq!(start.len(), 64);
/// // A fourth member takes only shards of its own winning; nobody else's shards move
/// // between the first three.
/// let grown = place("jobs", 64, &[members.to_vec(), vec!["d".to_owned()]].concat(), &start);
/// assert_eq!(grown.values().filter(|m| *m == "d").count(), 16);
/// assert!(grown.iter().all(|(k, m)| m == "d" || start[k] == *m));
/// ```
pub fn place(
    group: &str,
    shards: u32,
    members: &[String],
    current: &BTreeMap<u32, String>,
) -> BTreeMap<u32, String> {
    let members: Vec<String> = members
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .cloned()
        .collect();
    let index: FxHashMap<&str, u32> = (0..).zip(&members).map(|(i, m)| (m.as_str(), i)).collect();
    let mut owners = vec![NO_MEMBER; shards as usize];
    for (&shard, owner) in current.range(..shards) {
        if let Some(&m) = index.get(owner.as_str()) {
            owners[shard as usize] = m;
        }
    }
    (0..shards)
        .zip(place_indexed(group, &members, &owners))
        .filter(|(_, m)| *m != NO_MEMBER)
        .map(|(shard, m)| (shard, members[m as usize].clone()))
        .collect()
}

/// What [`place_indexed`] takes and gives for a shard with no member.
pub(crate) const NO_MEMBER: u32 = u32::MAX;

/// [`place`] on member indices: `members` sorted and distinct, `owners[k]` the index
/// in `members` of shard `k`'s current owner (any index past the end, such as
/// [`NO_MEMBER`], for none), one entry per shard. Returns each shard's target as an
/// index in `members` ([`NO_MEMBER`] for every shard when there are no members). A
/// shard group's look plans a million shards with no `String` per shard this way.
pub(crate) fn place_indexed(group: &str, members: &[String], owners: &[u32]) -> Vec<u32> {
    let shards = owners.len() as u32;
    if members.is_empty() || shards == 0 {
        return vec![NO_MEMBER; owners.len()];
    }
    debug_assert!(members.windows(2).all(|pair| pair[0] < pair[1]));
    let seeds: Vec<u64> = members.iter().map(|m| member_seed(group, m)).collect();
    // `mix(shard)` once per shard, not once per shard and member.
    let weight = |mixed_shard: u64, member: usize| mix(seeds[member] ^ mixed_shard);

    // Each live member's current shards, with its weight of each.
    let mut held: Vec<Vec<(u64, u32)>> = vec![Vec::new(); members.len()];
    for (shard, &m) in (0..shards).zip(owners) {
        if let Some(shards_held) = held.get_mut(m as usize) {
            shards_held.push((weight(mix(u64::from(shard)), m as usize), shard));
        }
    }

    let quotas = quotas(shards, &seeds);
    let mut target = vec![NO_MEMBER; owners.len()];
    let mut load = vec![0u32; members.len()];
    for (m, shards_held) in held.iter_mut().enumerate() {
        // Keep the shards this member weighs highest (ties: the higher shard), up to its
        // share: a selection, not a sort, and none at all for a member within its share
        // (every member of a settled group).
        let quota = quotas[m] as usize;
        if shards_held.len() > quota {
            shards_held.select_nth_unstable_by(quota, |a, b| b.cmp(a));
            shards_held.truncate(quota);
        }
        for &(_, shard) in shards_held.iter() {
            target[shard as usize] = m as u32;
        }
        load[m] = shards_held.len() as u32;
    }
    for (shard, slot) in (0..shards).zip(target.iter_mut()) {
        if *slot == NO_MEMBER {
            let mixed = mix(u64::from(shard));
            // The quotas add up to `shards`, so some member always has room.
            let best = (0..members.len())
                .filter(|&m| load[m] < quotas[m])
                .max_by_key(|&m| (weight(mixed, m), std::cmp::Reverse(m)));
            if let Some(m) = best {
                *slot = m as u32;
                load[m] += 1;
            }
        }
    }
    target
}

/// Each member's share: `floor(N/M)`, plus one for the `N mod M` members with the
/// highest hashes (ties by name order). Independent of current ownership on purpose
/// (see [`place`]).
fn quotas(shards: u32, seeds: &[u64]) -> Vec<u32> {
    let count = seeds.len() as u32;
    let (base, extra) = (shards / count, shards % count);
    let mut order: Vec<usize> = (0..seeds.len()).collect();
    order.sort_by_key(|&m| std::cmp::Reverse((seeds[m], std::cmp::Reverse(m))));
    let mut quotas = vec![base; seeds.len()];
    for &m in order.iter().take(extra as usize) {
        quotas[m] += 1;
    }
    quotas
}

/// A member's hash within a group: FNV-1a over `group`, a NUL, and `member`.
fn member_seed(group: &str, member: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let bytes = group.bytes().chain([0]).chain(member.bytes());
    mix(bytes.fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    }))
}

/// SplitMix64's finalizer: spreads every input bit over the output.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn weights_are_fixed_across_builds() {
        // Members built by different compilers must agree: pin a few values.
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(member_seed("g", "a"), member_seed("g", "a"));
        assert_ne!(member_seed("g", "a"), member_seed("ga", ""));
    }

    #[test]
    fn no_members_or_no_shards_place_nothing() {
        assert!(place("g", 8, &[], &BTreeMap::new()).is_empty());
        assert!(place("g", 0, &names(&["a"]), &BTreeMap::new()).is_empty());
    }

    #[test]
    fn duplicates_and_order_of_members_do_not_matter() {
        let one = place("g", 10, &names(&["b", "a", "c"]), &BTreeMap::new());
        let two = place("g", 10, &names(&["c", "a", "b", "a"]), &BTreeMap::new());
        assert_eq!(one, two);
    }

    #[test]
    fn owners_that_are_not_members_and_shards_out_of_range_are_ignored() {
        let current: BTreeMap<u32, String> = [(0, "gone".to_owned()), (99, "a".to_owned())].into();
        let placed = place("g", 4, &names(&["a", "b"]), &current);
        assert_eq!(placed.len(), 4);
        assert_eq!(placed.values().filter(|m| *m == "a").count(), 2);
    }
}
