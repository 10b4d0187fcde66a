//! Recovery times: from each fault to the next acknowledged write, and (shard mode) to the
//! last of a struck member's shards owned again, summarized per fault label.

use std::collections::{BTreeMap, HashMap};

use tenure_bench::stats::nearest_rank;

use super::{FaultRecord, Op, Recovery, ShardAnalysis};
use crate::config::FaultKind;
use crate::history::{Event, EventKind};

/// From `from` to the earliest acknowledgement of a write invoked after it, with
/// `acks` as `(invoked, acknowledged)` pairs sorted by invocation; `None` if there is none.
pub fn recovery_ns(acks: &[(u64, u64)], from: u64) -> Option<u64> {
    let first = acks.partition_point(|&(invoked, _)| invoked <= from);
    acks[first..]
        .iter()
        .map(|&(_, done)| done)
        .min()
        .map(|done| done.saturating_sub(from))
}

pub(super) fn recovery(
    ops: &HashMap<(String, u64), Op>,
    faults: &[FaultRecord],
) -> BTreeMap<String, Recovery> {
    let mut acks: Vec<(u64, u64)> = ops
        .values()
        .filter_map(|op| match op.outcome {
            Some((EventKind::Ok, done)) => Some((op.invoked, done)),
            _ => None,
        })
        .collect();
    acks.sort_unstable();
    let mut samples = Samples::new(faults);
    for fault in faults {
        let from = fault.recovery_from();
        samples.add(
            fault,
            from,
            recovery_ns(&acks, from).map(|took| from + took),
        );
    }
    samples.summarize()
}

/// Recovery samples per fault label, and when every fault struck (to tell isolated
/// samples).
struct Samples {
    by_label: BTreeMap<String, LabelSamples>,
    struck: Vec<u64>,
}

#[derive(Default)]
struct LabelSamples {
    all: Vec<f64>,
    isolated: Vec<f64>,
    unrecovered: u64,
}

impl Samples {
    fn new(faults: &[FaultRecord]) -> Self {
        let mut struck: Vec<u64> = faults.iter().map(|f| f.at).collect();
        struck.sort_unstable();
        Samples {
            by_label: BTreeMap::new(),
            struck,
        }
    }

    /// `fault`, measured from `from`, recovered at `done` (`None`: never).
    fn add(&mut self, fault: &FaultRecord, from: u64, done: Option<u64>) {
        let entry = self.by_label.entry(fault.label()).or_default();
        let Some(done) = done else {
            entry.unrecovered += 1;
            return;
        };
        let ms = done.saturating_sub(from) as f64 / 1e6;
        entry.all.push(ms);
        // Another fault struck in (at, done]: this sample is not this fault's alone.
        let struck = &self.struck;
        let others =
            struck.partition_point(|&t| t <= done) - struck.partition_point(|&t| t <= fault.at);
        if others == 0 {
            entry.isolated.push(ms);
        }
    }

    fn summarize(self) -> BTreeMap<String, Recovery> {
        self.by_label
            .into_iter()
            .map(|(label, mut s)| {
                s.all.sort_by(f64::total_cmp);
                s.isolated.sort_by(f64::total_cmp);
                let recovery = Recovery {
                    recovered: s.all.len() as u64,
                    unrecovered: s.unrecovered,
                    p50_ms: nearest_rank(&s.all, 0.5),
                    p99_ms: nearest_rank(&s.all, 0.99),
                    max_ms: s.all.last().copied(),
                    isolated: s.isolated.len() as u64,
                    isolated_p99_ms: nearest_rank(&s.isolated, 0.99),
                };
                (label, recovery)
            })
            .collect()
    }
}

/// One shard term as the histories tell it.
struct ShardTerm<'a> {
    shard: u32,
    token: u64,
    worker: &'a str,
    /// `Lead` at.
    began: u64,
    /// `Unlead` at; `None` when the worker died holding it.
    ended: Option<u64>,
}

/// Re-own times of the shards of every struck worker, and how many times shards moved.
pub(super) fn shard_analysis(events: &[Event], faults: &[FaultRecord]) -> ShardAnalysis {
    let mut terms: Vec<ShardTerm<'_>> = Vec::new();
    let mut open: HashMap<(&str, u32, u64), usize> = HashMap::new();
    for e in events {
        let Some(shard) = e.shard else { continue };
        match e.ev {
            EventKind::Lead => {
                open.insert((e.worker.as_str(), shard, e.token), terms.len());
                terms.push(ShardTerm {
                    shard,
                    token: e.token,
                    worker: &e.worker,
                    began: e.t,
                    ended: None,
                });
            }
            EventKind::Unlead => {
                if let Some(i) = open.remove(&(e.worker.as_str(), shard, e.token)) {
                    terms[i].ended = Some(e.t);
                }
            }
            _ => {}
        }
    }
    let mut by_shard: BTreeMap<u32, Vec<&ShardTerm<'_>>> = BTreeMap::new();
    for term in &terms {
        by_shard.entry(term.shard).or_default().push(term);
    }
    let mut analysis = ShardAnalysis::default();
    for shard_terms in by_shard.values_mut() {
        shard_terms.sort_by_key(|t| t.token);
        analysis.moved += shard_terms
            .windows(2)
            .filter(|pair| pair[0].worker != pair[1].worker)
            .count() as u64;
    }
    let mut samples = Samples::new(faults);
    for fault in faults {
        let Some(victim) = fault.target.as_deref() else {
            continue;
        };
        let paused = faults.iter().any(|earlier| {
            earlier.kind == FaultKind::Pause
                && earlier.target.as_deref() == Some(victim)
                && earlier.at < fault.at
                && earlier.ended() >= fault.at
        });
        // The victim's terms still open then, and still its shard's latest: a paused
        // member's shards may have been taken before it is killed.
        let held: Vec<&ShardTerm<'_>> = terms
            .iter()
            .filter(|t| t.worker == victim && t.began <= fault.at)
            .filter(|t| t.ended.is_none_or(|ended| ended > fault.at))
            .filter(|t| {
                !by_shard[&t.shard]
                    .iter()
                    .any(|later| later.token > t.token && later.began <= fault.at)
            })
            .collect();
        if held.is_empty() || paused {
            analysis.not_sampled += 1;
            continue;
        }
        // The last of the victim's shards to get a new term; `None` if one never did.
        let reowned = held
            .iter()
            .map(|old| {
                by_shard[&old.shard]
                    .iter()
                    .filter(|t| t.token > old.token && t.began > fault.at)
                    .map(|t| t.began)
                    .min()
            })
            .try_fold(fault.at, |latest, at| at.map(|at| latest.max(at)));
        samples.add(fault, fault.at, reowned);
    }
    analysis.reown = samples.summarize();
    analysis
}
