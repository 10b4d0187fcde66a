//! The checker: the invariants of `docs/semantics.md` over the recorded histories, the
//! store's log and the orchestrator's observations of the lease.
//!
//! Violations (any one fails the run):
//! - `token_reused`: one token led by two worker incarnations, or held by two owners as
//!   observed on the store;
//! - `token_regressed`: the role's token observed going down over time, or one worker
//!   leading with a lower token than it led with before;
//! - `log_order`: a log row (commit order) with a token lower than an earlier row's, i.e.
//!   the fence admitted a token lower than one it admitted before;
//! - `stale_ack`: a write acknowledged under token T that was invoked after a write under
//!   a higher token had already been acknowledged (two leaders' acknowledged writes
//!   interleaving with decreasing tokens: more than one live term);
//! - `lost_write`: an acknowledged write missing from the log (or logged under another
//!   token);
//! - `refused_committed`: a write its worker saw refused or failed before commit, present
//!   in the log;
//! - `phantom_write`: a log row no worker ever invoked;
//! - `token_shared`: log rows of one token written by two worker incarnations (two
//!   leaders' accepted entries within one term);
//! - `unknown_shard` (shard mode): events about a shard the group does not have;
//! - `stale_copy`: the orchestrator's copy of the leases, kept by reads of what changed,
//!   stayed behind its complete readings (found by the orchestrator, added with
//!   [`Analysis::add_stale_copies`]);
//! - `ghost_member` (shard mode): a killed or stopped member still listed live well
//!   after its TTL ([`membership`], added with [`Analysis::add_membership`]).
//!
//! In shard mode ([`check_shards`]) every shard is checked on its own as one role is:
//! tokens, terms, fence and log are per shard (shard `k` is the role `G/k`).
//!
//! Reported, not violations: writes refused by the fence, unknown outcomes, wall-clock
//! overlap of workers that believed they led, recovery time after each fault and, in
//! shard mode, the time to re-own a struck member's shards, how long a dead member
//! stayed listed and how often a running one was missing.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::backend::LogRow;
use crate::config::{CutFlavour, FaultKind};
use crate::history::{Event, EventKind};
use serde::Serialize;

pub mod membership;
mod recovery;

pub use membership::{MemberReading, MembershipAnalysis, MembershipRun};
pub use recovery::recovery_ns;
use recovery::{recovery, shard_analysis};

/// How many examples each violation kind keeps.
const EXAMPLES: usize = 5;

/// One reading of the role's lease by the orchestrator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// Host monotonic time, nanoseconds.
    pub t: u64,
    /// The role's latest token.
    pub token: u64,
    /// The holder of the latest term (`None` once released).
    pub holder: Option<String>,
}

/// One injected fault, as done.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultRecord {
    /// The kind.
    pub kind: FaultKind,
    /// How it was done, when a kind has several ways (`cut`: drop, blackhole,
    /// terminate; `restart`: stop, kill; `clock`: forward, back).
    pub flavour: Option<&'static str>,
    /// The worker incarnation hit, if any.
    pub target: Option<String>,
    /// Injected at (host monotonic ns).
    pub at: u64,
    /// Healed at (SIGCONT, server back, proxy forwarding again, new incarnation
    /// started).
    pub healed: u64,
}

impl FaultRecord {
    /// The row it is reported in: the kind, and the flavour when there is one
    /// (`cut/blackhole`).
    pub fn label(&self) -> String {
        match self.flavour {
            Some(flavour) => format!("{}/{flavour}", self.kind.name()),
            None => self.kind.name().to_owned(),
        }
    }

    /// When it healed, `u64::MAX` while it never did.
    pub fn ended(&self) -> u64 {
        if self.healed == 0 {
            u64::MAX
        } else {
            self.healed
        }
    }

    /// Whether it was under way at `t` (struck, not yet healed).
    pub fn under_way_at(&self, t: u64) -> bool {
        self.at <= t && t <= self.ended()
    }

    /// Where recovery is measured from. A fault of the store or the network (restart,
    /// cut) is measured from its heal: until then nobody can reach the store, and that
    /// time is the fault's, not tenure's. A stalled or dead worker, or one worker cut
    /// off (a wedge), is measured from the moment it struck: the others must take over
    /// within a term.
    pub fn recovery_from(&self) -> u64 {
        match self.kind {
            FaultKind::Cut if self.flavour == Some(CutFlavour::Wedge.name()) => self.at,
            FaultKind::Restart | FaultKind::Cut | FaultKind::Lock => self.healed,
            FaultKind::Pause | FaultKind::Kill | FaultKind::Clock | FaultKind::Handoff => self.at,
        }
    }
}

/// Violations of one kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ViolationSummary {
    /// The kind, e.g. `log_order`.
    pub kind: String,
    /// How many.
    pub count: u64,
    /// The first few, in words.
    pub examples: Vec<String>,
}

/// Write outcomes as the workers saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WriteCounts {
    /// Writes invoked.
    pub invoked: u64,
    /// Acknowledged (committed).
    pub admitted: u64,
    /// Refused by the fence.
    pub refused: u64,
    /// Failed before commit.
    pub errors: u64,
    /// Outcome unknown (commit error, timeout, or killed mid-write).
    pub unknown: u64,
    /// Of the unknown ones, how many are in the log.
    pub unknown_committed: u64,
    /// Rows in the log.
    pub log_rows: u64,
}

/// Recovery times of one fault kind, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Recovery {
    /// Faults of this kind followed by an admitted write.
    pub recovered: u64,
    /// Faults after which no write was admitted before the run ended.
    pub unrecovered: u64,
    /// Median.
    pub p50_ms: Option<f64>,
    /// 99th percentile.
    pub p99_ms: Option<f64>,
    /// Worst.
    pub max_ms: Option<f64>,
    /// Recovered faults with no other fault injected between this one's start and its
    /// recovery. With a fault every fraction of a TTL most windows hold another fault
    /// (a server restart alone takes 0.2-1 s), which then stretches this one's sample.
    pub isolated: u64,
    /// 99th percentile of the isolated samples: the recovery of this fault alone. It
    /// leans optimistic (a long recovery is more likely to be overlapped); compare it
    /// with `p99_ms` and mind `isolated`.
    pub isolated_p99_ms: Option<f64>,
}

/// Everything the checker found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Analysis {
    /// Write outcomes.
    pub writes: WriteCounts,
    /// Distinct terms (tokens) that workers led.
    pub terms: u64,
    /// Wall-clock time during which two or more workers believed they led, ms.
    pub overlap_ms: f64,
    /// Per fault label ([`FaultRecord::label`]): from the fault (restart and cut: from
    /// its heal) to the first admitted write invoked after it.
    pub recovery: BTreeMap<String, Recovery>,
    /// Violations by kind (empty when the run passed).
    pub violations: Vec<ViolationSummary>,
    /// Shard mode only: how the shards moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_moves: Option<ShardAnalysis>,
    /// Shard mode only: how the live members followed the workers' lives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub membership: Option<MembershipAnalysis>,
}

/// How the shards of a shard-mode run moved.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ShardAnalysis {
    /// Per fault label, for every fault that struck a worker (kill, pause, and on SQLite
    /// the restart that kills one): the time from the fault until every shard the
    /// victim held then had a new term started (by another member, or by a paused
    /// victim that won it back after waking, with a new token). `unrecovered` counts
    /// faults after which some shard never got a new term before the run ended.
    pub reown: BTreeMap<String, Recovery>,
    /// Faults that struck a worker but are no samples: it held no shard at that moment,
    /// or it was paused then (a kill of a paused member; its shards were lost at the
    /// pause, which is that sample).
    pub not_sampled: u64,
    /// Terms that began on another worker than the shard's previous term: every move,
    /// handover or takeover, of every shard.
    pub moved: u64,
}

impl Analysis {
    /// Total violations.
    pub fn violation_count(&self) -> u64 {
        self.violations.iter().map(|v| v.count).sum()
    }
}

#[derive(Default)]
struct Violations {
    by_kind: BTreeMap<&'static str, ViolationSummary>,
    /// Put in front of every example (shard mode: which shard).
    prefix: String,
}

impl Violations {
    fn add(&mut self, kind: &'static str, detail: impl FnOnce() -> String) {
        let entry = self
            .by_kind
            .entry(kind)
            .or_insert_with(|| ViolationSummary {
                kind: kind.to_owned(),
                ..Default::default()
            });
        entry.count += 1;
        if entry.examples.len() < EXAMPLES {
            entry.examples.push(format!("{}{}", self.prefix, detail()));
        }
    }
}

/// One write as the history tells it.
struct Op {
    worker: String,
    seq: u64,
    token: u64,
    invoked: u64,
    outcome: Option<(EventKind, u64)>,
}

/// Checks a run on one role.
pub fn check(
    events: &[Event],
    log: &[LogRow],
    observations: &[Observation],
    faults: &[FaultRecord],
) -> Analysis {
    let mut violations = Violations::default();
    let mut analysis = Analysis::default();
    let ops = check_role(events, log, observations, &mut violations, &mut analysis);
    analysis.overlap_ms = overlap_ns(events) as f64 / 1e6;
    analysis.recovery = recovery(&ops, faults);
    analysis.violations = violations.by_kind.into_values().collect();
    analysis
}

impl Analysis {
    /// Adds the orchestrator's findings of a copy of the leases kept by reads of changes
    /// that stayed behind the complete readings (`stale_copy`), each in words.
    pub fn add_stale_copies(&mut self, stale: Vec<String>) {
        if stale.is_empty() {
            return;
        }
        self.violations.push(ViolationSummary {
            kind: "stale_copy".to_owned(),
            count: stale.len() as u64,
            examples: stale.into_iter().take(EXAMPLES).collect(),
        });
    }
}

impl Analysis {
    /// Checks the orchestrator's readings of the live members against the workers'
    /// lives ([`membership`]) and adds what it found, `ghost_member` violations
    /// included.
    pub fn add_membership(&mut self, run: MembershipRun<'_>) {
        let (membership, ghosts) = membership::check_membership(run);
        self.membership = Some(membership);
        self.violations.extend(ghosts);
    }
}

/// What the store holds about one shard: its log and the orchestrator's readings of
/// its lease.
#[derive(Clone, Debug, Default)]
pub struct ShardRecord {
    /// The shard's log, in commit order.
    pub log: Vec<LogRow>,
    /// The shard's lease as observed.
    pub observations: Vec<Observation>,
}

/// Checks a shard-mode run: every shard is checked as one role is by [`check`] (its
/// own log, fence, tokens and terms; examples name the shard), recovery runs to the
/// next admitted write on any shard, and [`ShardAnalysis`] says how fast the shards of
/// a killed or paused member were owned again.
pub fn check_shards(
    events: &[Event],
    shards: &BTreeMap<u32, ShardRecord>,
    faults: &[FaultRecord],
) -> Analysis {
    let mut violations = Violations::default();
    let mut analysis = Analysis::default();
    let mut by_shard: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
    for e in events {
        if let Some(shard) = e.shard {
            by_shard.entry(shard).or_default().push(e.clone());
        }
    }
    let mut ops = HashMap::new();
    let mut overlap = 0;
    for (&shard, record) in shards {
        let events = by_shard.remove(&shard).unwrap_or_default();
        violations.prefix = format!("shard {shard}: ");
        ops.extend(check_role(
            &events,
            &record.log,
            &record.observations,
            &mut violations,
            &mut analysis,
        ));
        overlap += overlap_ns(&events);
    }
    violations.prefix.clear();
    for (shard, events) in &by_shard {
        violations.add("unknown_shard", || {
            format!(
                "{} events about shard {shard}, which the group does not have",
                events.len()
            )
        });
    }
    analysis.overlap_ms = overlap as f64 / 1e6;
    analysis.recovery = recovery(&ops, faults);
    analysis.shard_moves = Some(shard_analysis(events, faults));
    analysis.violations = violations.by_kind.into_values().collect();
    analysis
}

/// Checks one role's (or one shard's) histories, log and observations, adding to
/// `analysis`'s counts; returns its writes.
fn check_role(
    events: &[Event],
    log: &[LogRow],
    observations: &[Observation],
    violations: &mut Violations,
    analysis: &mut Analysis,
) -> HashMap<(String, u64), Op> {
    // Writes, keyed by (worker, seq).
    let mut ops: HashMap<(String, u64), Op> = HashMap::new();
    for e in events {
        let key = (e.worker.clone(), e.seq);
        match e.ev {
            EventKind::Invoke => {
                ops.insert(
                    key,
                    Op {
                        worker: e.worker.clone(),
                        seq: e.seq,
                        token: e.token,
                        invoked: e.t,
                        outcome: None,
                    },
                );
            }
            EventKind::Ok | EventKind::Fenced | EventKind::Error | EventKind::Unknown => {
                if let Some(op) = ops.get_mut(&key) {
                    op.outcome = Some((e.ev, e.t));
                }
            }
            _ => {}
        }
    }
    let logged: HashMap<(&str, u64), &LogRow> = log
        .iter()
        .map(|r| ((r.worker.as_str(), r.seq), r))
        .collect();

    let w = &mut analysis.writes;
    w.invoked += ops.len() as u64;
    w.log_rows += log.len() as u64;
    for op in ops.values() {
        let row = logged.get(&(op.worker.as_str(), op.seq));
        match op.outcome.map(|(kind, _)| kind) {
            Some(EventKind::Ok) => {
                w.admitted += 1;
                match row {
                    None => violations.add("lost_write", || {
                        format!(
                            "{} seq {} (token {}) acknowledged but not in the log",
                            op.worker, op.seq, op.token
                        )
                    }),
                    Some(row) if row.token != op.token => violations.add("lost_write", || {
                        format!(
                            "{} seq {} acknowledged under token {} but logged under {}",
                            op.worker, op.seq, op.token, row.token
                        )
                    }),
                    Some(_) => {}
                }
            }
            Some(kind @ (EventKind::Fenced | EventKind::Error)) => {
                if kind == EventKind::Fenced {
                    w.refused += 1;
                } else {
                    w.errors += 1;
                }
                if row.is_some() {
                    violations.add("refused_committed", || {
                        format!(
                            "{} seq {} (token {}) was {kind:?} yet is in the log",
                            op.worker, op.seq, op.token
                        )
                    });
                }
            }
            _ => {
                w.unknown += 1;
                if row.is_some() {
                    w.unknown_committed += 1;
                }
            }
        }
    }
    for row in log {
        if !ops.contains_key(&(row.worker.clone(), row.seq)) {
            violations.add("phantom_write", || {
                format!(
                    "log row {} ({} seq {}) was never invoked",
                    row.id, row.worker, row.seq
                )
            });
        }
    }

    // The fence's order: commit order never goes down in token, and one token's rows
    // are one incarnation's.
    let mut highest: Option<&LogRow> = None;
    let mut writer: HashMap<u64, &LogRow> = HashMap::new();
    for row in log {
        let first = *writer.entry(row.token).or_insert(row);
        if first.worker != row.worker {
            violations.add("token_shared", || {
                format!(
                    "row {} by {} has token {}, as row {} by {}",
                    row.id, row.worker, row.token, first.id, first.worker
                )
            });
        }
        match highest {
            Some(top) if row.token < top.token => violations.add("log_order", || {
                format!(
                    "row {} by {} has token {} after row {} by {} with token {}",
                    row.id, row.worker, row.token, top.id, top.worker, top.token
                )
            }),
            Some(top) if row.token == top.token => {}
            _ => highest = Some(row),
        }
    }

    // Acknowledged writes in real time: once a token's write is acknowledged, no write
    // invoked later may be acknowledged under a lower token.
    let mut marks: Vec<(u64, bool, u64, &Op)> = Vec::new();
    for op in ops.values() {
        if let Some((EventKind::Ok, done)) = op.outcome {
            marks.push((op.invoked, false, op.token, op));
            marks.push((done, true, op.token, op));
        }
    }
    // At equal times a start sorts before an acknowledgement: only strictly earlier
    // acknowledgements count.
    marks.sort_by_key(|m| (m.0, m.1));
    let mut acked: Option<&Op> = None;
    for (_, is_ack, token, op) in marks {
        if is_ack {
            if acked.is_none_or(|top| token > top.token) {
                acked = Some(op);
            }
        } else if let Some(top) = acked.filter(|top| top.token > token) {
            violations.add("stale_ack", || {
                format!(
                    "{} seq {} acknowledged under token {} though invoked after {} seq {} was acknowledged under token {}",
                    op.worker, op.seq, token, top.worker, top.seq, top.token
                )
            });
        }
    }

    // Terms: a token belongs to one incarnation; each incarnation's tokens never go down.
    let mut leaders: BTreeMap<u64, HashSet<&str>> = BTreeMap::new();
    let mut last_led: HashMap<&str, u64> = HashMap::new();
    for e in events.iter().filter(|e| e.ev == EventKind::Lead) {
        leaders
            .entry(e.token)
            .or_default()
            .insert(e.worker.as_str());
        if let Some(&previous) = last_led.get(e.worker.as_str()) {
            if e.token < previous {
                violations.add("token_regressed", || {
                    format!(
                        "{} led with token {} after leading with {previous}",
                        e.worker, e.token
                    )
                });
            }
        }
        last_led.insert(e.worker.as_str(), e.token);
    }
    analysis.terms += leaders.len() as u64;
    for (token, workers) in &leaders {
        if workers.len() > 1 {
            violations.add("token_reused", || {
                let mut names: Vec<_> = workers.iter().copied().collect();
                names.sort_unstable();
                format!("token {token} led by {}", names.join(", "))
            });
        }
    }
    let mut holders: HashMap<u64, &str> = HashMap::new();
    let mut previous: Option<&Observation> = None;
    for o in observations {
        if let Some(p) = previous {
            if o.token < p.token {
                violations.add("token_regressed", || {
                    format!("the store's token went from {} to {}", p.token, o.token)
                });
            }
        }
        previous = Some(o);
        if let Some(holder) = &o.holder {
            match holders.get(&o.token) {
                Some(&first) if first != holder => violations.add("token_reused", || {
                    format!("token {} held by {first} and by {holder}", o.token)
                }),
                Some(_) => {}
                None => {
                    holders.insert(o.token, holder);
                }
            }
        }
    }

    ops
}

/// Total time during which two or more incarnations believed they led. A term with no
/// `Unlead` (the worker was killed) ends at its worker's last recorded event.
fn overlap_ns(events: &[Event]) -> u64 {
    let mut last: HashMap<&str, u64> = HashMap::new();
    for e in events {
        last.insert(e.worker.as_str(), e.t);
    }
    let mut open: HashMap<(&str, u64), u64> = HashMap::new();
    let mut intervals: Vec<(u64, u64)> = Vec::new();
    for e in events {
        match e.ev {
            EventKind::Lead => {
                open.insert((e.worker.as_str(), e.token), e.t);
            }
            EventKind::Unlead => {
                if let Some(start) = open.remove(&(e.worker.as_str(), e.token)) {
                    intervals.push((start, e.t));
                }
            }
            _ => {}
        }
    }
    for ((worker, _), start) in open {
        intervals.push((start, last.get(worker).copied().unwrap_or(start)));
    }
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for (start, end) in intervals {
        if end > start {
            edges.push((start, 1));
            edges.push((end, -1));
        }
    }
    edges.sort_by_key(|&(t, d)| (t, d));
    let (mut depth, mut since, mut total) = (0i32, 0u64, 0u64);
    for (t, d) in edges {
        if depth >= 2 {
            total += t - since;
        }
        depth += d;
        since = t;
    }
    total
}

#[cfg(test)]
pub(crate) mod tests;
