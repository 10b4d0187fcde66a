//! A look's owners and targets with member names interned: each shard's member as an
//! index into a short list of names. A group of a million shards has a few hundred
//! members; a look that kept a `String` per shard in each of its maps spent most of its
//! time allocating, copying and comparing names.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::placement::{place_indexed, NO_MEMBER};
use crate::LeaseCopy;

/// Each shard's member (its live owner, or its target), as an index into `names`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Assignment {
    /// The members named. Built for a look, its planned members come first, in their
    /// (sorted) order, so an owner and a target with the same index are one member.
    pub(super) names: Vec<String>,
    /// By shard: an index into `names`, or [`NO_MEMBER`].
    pub(super) of: Vec<u32>,
}

impl Assignment {
    /// The live owner of each of the group's `shards` in `view`, named after `planned`
    /// (sorted and distinct) first, then any other holder in the order first met.
    pub(super) fn owners(view: &LeaseCopy<u32>, shards: u32, planned: &[String]) -> Self {
        let mut names = planned.to_vec();
        let mut index: FxHashMap<String, u32> =
            (0..).zip(planned).map(|(i, m)| (m.clone(), i)).collect();
        let mut of = vec![NO_MEMBER; shards as usize];
        for (shard, lease) in view.iter() {
            let (Some(holder), Some(slot)) = (lease.live_holder(), of.get_mut(*shard as usize))
            else {
                continue;
            };
            *slot = match index.get(holder) {
                Some(m) => *m,
                None => {
                    let m = names.len() as u32;
                    names.push(holder.to_owned());
                    index.insert(holder.to_owned(), m);
                    m
                }
            };
        }
        Assignment { names, of }
    }

    /// The target of every shard placed on `planned` (sorted and distinct) from the
    /// owners `owners` (see [`crate::placement::place`]); `owners` named as
    /// [`Assignment::owners`] names them, so owners that are not planned are ignored.
    pub(super) fn placed(group: &str, planned: &[String], owners: &Assignment) -> Self {
        debug_assert!(owners.names.starts_with(planned));
        Assignment {
            names: planned.to_vec(),
            of: place_indexed(group, planned, &owners.of),
        }
    }

    /// The index of shard `shard`'s member, or [`NO_MEMBER`].
    pub(super) fn at(&self, shard: u32) -> u32 {
        self.of.get(shard as usize).copied().unwrap_or(NO_MEMBER)
    }

    /// The name of shard `shard`'s member, if any.
    pub(super) fn get(&self, shard: u32) -> Option<&str> {
        self.names.get(self.at(shard) as usize).map(String::as_str)
    }

    /// The name of shard `shard`'s member unless that is the member of index `me`.
    pub(super) fn elsewhere(&self, shard: u32, me: Option<u32>) -> Option<&str> {
        let m = self.at(shard);
        if Some(m) == me {
            return None;
        }
        self.names.get(m as usize).map(String::as_str)
    }

    /// The index of `name`, if named.
    pub(super) fn index_of(&self, name: &str) -> Option<u32> {
        (0..)
            .zip(&self.names)
            .find(|(_, n)| *n == name)
            .map(|(i, _)| i)
    }

    /// The shards whose member is the one of index `m`, in order.
    pub(super) fn shards_of(&self, m: Option<u32>) -> Vec<u32> {
        let Some(m) = m else {
            return Vec::new();
        };
        (0..)
            .zip(&self.of)
            .filter(|(_, at)| **at == m)
            .map(|(k, _)| k)
            .collect()
    }

    /// The members with at least one shard.
    pub(super) fn members_with_shards(&self) -> BTreeSet<String> {
        let mut has = vec![false; self.names.len()];
        for m in &self.of {
            if let Some(has) = has.get_mut(*m as usize) {
                *has = true;
            }
        }
        self.names
            .iter()
            .zip(has)
            .filter(|(_, has)| *has)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Each shard with a member, and its member's name: what
    /// [`ShardState::target`](super::ShardState) publishes.
    pub(super) fn to_map(&self) -> BTreeMap<u32, String> {
        (0..)
            .zip(&self.of)
            .filter_map(|(k, m)| Some((k, self.names.get(*m as usize)?.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{InMemoryLeaseStore, LeaseStore};

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[tokio::test]
    async fn owners_name_the_planned_first_and_others_after() {
        let store = InMemoryLeaseStore::new();
        let ttl = Duration::from_secs(10);
        for (role, holder) in [("g/0", "x"), ("g/1", "b"), ("g/3", "x"), ("g/9", "a")] {
            store.try_acquire_or_renew(role, holder, ttl).await.unwrap();
        }
        let mut view = LeaseCopy::default();
        let shard = |role: &str| role.parse::<u32>().ok();
        view.read(&store, "g/", shard).await.unwrap();
        let planned = names(&["a", "b"]);
        let owners = Assignment::owners(&view, 4, &planned);
        assert_eq!(owners.names, names(&["a", "b", "x"]));
        assert_eq!(owners.of, vec![2, 1, NO_MEMBER, 2]);
        assert_eq!(owners.get(3), Some("x"));
        assert_eq!(owners.get(2), None);
        assert_eq!(owners.elsewhere(1, Some(1)), None);
        assert_eq!(owners.elsewhere(1, Some(0)), Some("b"));
        assert_eq!(owners.shards_of(owners.index_of("x")), vec![0, 3]);
        assert_eq!(
            owners.members_with_shards(),
            ["b", "x"].map(String::from).into()
        );

        // Placed on the planned members alone, as `place` would from the same owners.
        let target = Assignment::placed("g", &planned, &owners);
        let current = BTreeMap::from([
            (0, "x".to_owned()),
            (1, "b".to_owned()),
            (3, "x".to_owned()),
        ]);
        assert_eq!(
            target.to_map(),
            crate::placement::place("g", 4, &planned, &current)
        );
    }
}
