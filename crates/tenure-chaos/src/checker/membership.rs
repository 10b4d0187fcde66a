//! Membership against the workers' lives (shard mode): the orchestrator's readings of
//! the live members, checked against what the nemesis did to each member.
//!
//! A member that was killed or stopped (SIGKILL, SIGSTOP) must leave the live set a TTL
//! after its last heartbeat could have landed. That is its death, or later when a fault
//! held its calls then (a cut, a blackhole or wedge whose calls land on the heal, a held
//! lock, a server restart): a call sent before the death may be applied at the heal.
//! Listed live later than that plus [`GHOST_SLACK_MS`] is a `ghost_member` violation: the
//! other members would go on planning shards onto a member that cannot take them.
//!
//! The other direction is reported, not judged: a member running with nothing in the
//! way of its calls that is missing from a reading (`missed`). On a loaded machine a
//! heartbeat can come late with tenure doing nothing wrong, and the members' answer to
//! a missing member (moving its shards) is churn, never two holders.

use std::collections::BTreeMap;

use serde::Serialize;
use tenure_bench::stats::nearest_rank;

use crate::config::FaultKind;
use crate::history::{Event, EventKind};

use super::{FaultRecord, ViolationSummary, EXAMPLES};

/// What a reading may show beyond a dead member's TTL: the reading's own way to the
/// store and back, and a loaded server's delay in applying the call that carried the
/// last heartbeat.
pub const GHOST_SLACK_MS: u64 = 500;
const GHOST_SLACK: u64 = GHOST_SLACK_MS * 1_000_000;

/// One reading of the live members by the orchestrator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemberReading {
    /// When the read was sent (host monotonic ns).
    pub sent: u64,
    /// When it was answered.
    pub answered: u64,
    /// The node ids it showed live.
    pub live: Vec<String>,
}

impl MemberReading {
    /// Whether it showed `member` live.
    fn lists(&self, member: &str) -> bool {
        self.live.iter().any(|m| m == member)
    }
}

/// How the live members followed the workers' lives.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MembershipAnalysis {
    /// Readings of the live members.
    pub readings: u64,
    /// Members killed or stopped whose leaving was judged.
    pub judged: u64,
    /// Members killed or stopped that were not judged: never seen live before, resumed
    /// before a TTL and [`GHOST_SLACK_MS`] passed since their last call could land, or
    /// the workers' wall clock had been stepped (their heartbeats carry its time).
    pub not_judged: u64,
    /// From when a judged member's last call could have landed to the last reading
    /// (sent) that still listed it while dead or stopped, 0 when none did: median, ms
    /// (expected below the TTL; above the TTL and [`GHOST_SLACK_MS`] is a ghost).
    pub listed_p50_ms: Option<f64>,
    /// The worst of the same.
    pub listed_max_ms: Option<f64>,
    /// Readings that did not list a member while it ran with nothing in the way of its
    /// calls for a TTL and more (see the module docs: reported, not a violation).
    pub missed: u64,
    /// The longest such absence, ms (first missing reading to the next listing).
    pub missed_longest_ms: Option<f64>,
}

/// When a member stopped answering: killed (`until` is `None`), or stopped until
/// `until`.
struct Silence<'a> {
    member: &'a str,
    from: u64,
    until: Option<u64>,
    label: &'static str,
}

/// The run as the membership check needs it.
#[derive(Clone, Copy, Debug)]
pub struct MembershipRun<'a> {
    /// The workers' histories (their `Start` events name the members).
    pub events: &'a [Event],
    /// The orchestrator's readings, in time order.
    pub readings: &'a [MemberReading],
    /// What the nemesis did.
    pub faults: &'a [FaultRecord],
    /// The members' TTL, ns.
    pub ttl_ns: u64,
    /// When the orchestrator began stopping the workers (they leave then).
    pub stopping: u64,
    /// Whether the members' writes share one lock (SQLite), so that any member's pause
    /// or stalled disk holds everyone's heartbeats.
    pub shared_writer: bool,
}

/// Checks the readings against the faults; returns the analysis and the
/// `ghost_member` violations, if any.
pub fn check_membership(run: MembershipRun<'_>) -> (MembershipAnalysis, Option<ViolationSummary>) {
    let MembershipRun {
        readings,
        faults,
        ttl_ns,
        ..
    } = run;
    let mut analysis = MembershipAnalysis {
        readings: readings.len() as u64,
        ..Default::default()
    };
    let mut ghosts = ViolationSummary {
        kind: "ghost_member".to_owned(),
        ..Default::default()
    };
    let first_step = faults
        .iter()
        .filter(|f| f.kind == FaultKind::Clock)
        .map(|f| f.at)
        .min()
        .unwrap_or(u64::MAX);
    let mut listed_for = Vec::new();
    for silence in silences(faults) {
        let held_until = faults
            .iter()
            .filter(|f| holds_calls(f, silence.member) && f.under_way_at(silence.from))
            .map(FaultRecord::ended)
            .fold(silence.from, u64::max);
        let seen_before = readings
            .iter()
            .any(|r| r.answered <= silence.from && r.lists(silence.member));
        let judged_until = silence.until.unwrap_or(u64::MAX);
        let bound = held_until.saturating_add(ttl_ns + GHOST_SLACK);
        // A stop that ends before the bound leaves nothing to judge: the member may be
        // listed until it resumes.
        if !seen_before || bound >= judged_until || held_until + ttl_ns >= first_step {
            analysis.not_judged += 1;
            continue;
        }
        analysis.judged += 1;
        // The last reading that still listed it: what the bound is checked on.
        let last_listed = readings
            .iter()
            .rev()
            .filter(|r| r.sent >= held_until && r.answered <= judged_until)
            .find(|r| r.lists(silence.member))
            .map(|r| r.sent - held_until);
        listed_for.push(last_listed.unwrap_or(0));
        let Some(late) = last_listed.filter(|&late| held_until + late > bound) else {
            continue;
        };
        ghosts.count += 1;
        if ghosts.examples.len() < EXAMPLES {
            ghosts.examples.push(format!(
                "{} ({}) still listed live {:.0}ms after its last call could have landed \
                 (TTL {:.0}ms)",
                silence.member,
                silence.label,
                late as f64 / 1e6,
                ttl_ns as f64 / 1e6
            ));
        }
    }
    listed_for.sort_unstable();
    let ms = |ns: u64| ns as f64 / 1e6;
    analysis.listed_p50_ms = nearest_rank(&listed_for, 0.5).map(ms);
    analysis.listed_max_ms = listed_for.last().copied().map(ms);
    let (missed, longest) = missed(run);
    analysis.missed = missed;
    analysis.missed_longest_ms = longest.map(ms);
    let ghosts = (ghosts.count > 0).then_some(ghosts);
    (analysis, ghosts)
}

/// Every kill (a `restart` on SQLite kills a worker too) and stop of a member.
fn silences(faults: &[FaultRecord]) -> Vec<Silence<'_>> {
    faults
        .iter()
        .filter_map(|f| {
            let member = f.target.as_deref()?;
            match f.kind {
                FaultKind::Kill | FaultKind::Restart => Some(Silence {
                    member,
                    from: f.at,
                    until: None,
                    label: "killed",
                }),
                FaultKind::Pause => Some(Silence {
                    member,
                    from: f.at,
                    until: (f.healed != 0).then_some(f.healed),
                    label: "stopped",
                }),
                _ => None,
            }
        })
        .collect()
}

/// Whether `fault` may hold `member`'s calls, to be applied when it heals: a cut of
/// every worker or of this one, a held lock (a call waiting on it is applied once it is
/// released, whatever became of its caller), a server restart.
fn holds_calls(fault: &FaultRecord, member: &str) -> bool {
    match fault.kind {
        FaultKind::Cut => fault.target.as_deref().is_none_or(|t| t == member),
        FaultKind::Lock => true,
        // A restart with a target is SQLite's: a worker killed, no server stopped.
        FaultKind::Restart => fault.target.is_none(),
        FaultKind::Pause | FaultKind::Kill | FaultKind::Clock | FaultKind::Handoff => false,
    }
}

/// Readings that missed a member running with nothing in the way of its calls for the
/// TTL and [`GHOST_SLACK_MS`] before them, and the longest such absence. A member is
/// judged only after it was first listed, until it was killed or the run stopped.
fn missed(run: MembershipRun<'_>) -> (u64, Option<u64>) {
    let MembershipRun {
        events,
        readings,
        faults,
        ttl_ns,
        stopping,
        shared_writer,
    } = run;
    let window = ttl_ns + GHOST_SLACK;
    // What may keep a member's heartbeats from the store: its own pause or wedge, a
    // cut, a held lock, a restart, a clock step; on SQLite, whose writers share one
    // lock, any member's pause or stalled disk.
    let hindered = |member: &str, from: u64, to: u64| {
        faults.iter().any(|f| {
            let overlaps = f.at <= to && f.ended() >= from;
            let touches = match f.kind {
                FaultKind::Pause => shared_writer || f.target.as_deref() == Some(member),
                FaultKind::Kill | FaultKind::Handoff => false,
                FaultKind::Restart => f.target.is_none() || f.target.as_deref() == Some(member),
                FaultKind::Cut | FaultKind::Lock | FaultKind::Clock => true,
            };
            overlaps && touches
        })
    };
    let died: BTreeMap<&str, u64> = silences(faults)
        .into_iter()
        .filter(|s| s.until.is_none())
        .map(|s| (s.member, s.from))
        .collect();
    let members: Vec<&str> = events
        .iter()
        .filter(|e| e.ev == EventKind::Start)
        .map(|e| e.worker.as_str())
        .collect();
    let (mut count, mut longest) = (0, None::<u64>);
    for member in members {
        let dies = died.get(member).copied().unwrap_or(u64::MAX).min(stopping);
        let Some(first) = readings.iter().position(|r| r.lists(member)) else {
            continue;
        };
        let mut absent_since = None;
        for r in &readings[first..] {
            if r.answered >= dies {
                break;
            }
            if r.lists(member) {
                if let Some(since) = absent_since.take() {
                    longest = longest.max(Some(r.sent.saturating_sub(since)));
                }
                continue;
            }
            let from = r.sent.saturating_sub(window);
            if !hindered(member, from, r.answered) {
                count += 1;
                absent_since.get_or_insert(r.sent);
            }
        }
    }
    (count, longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const TTL: u64 = 1_000 * MS;

    fn fault(kind: FaultKind, target: Option<&str>, at_ms: u64, healed_ms: u64) -> FaultRecord {
        FaultRecord {
            kind,
            flavour: None,
            target: target.map(str::to_owned),
            at: at_ms * MS,
            healed: healed_ms * MS,
        }
    }

    fn start(worker: &str) -> Event {
        Event {
            t: 0,
            worker: worker.to_owned(),
            ev: EventKind::Start,
            token: 0,
            seq: 0,
            shard: None,
            note: None,
        }
    }

    /// A reading every 50 ms from 0 to `end_ms`, listing `a` while `a_live(t_ms)` and
    /// `b` always.
    fn readings(end_ms: u64, a_live: impl Fn(u64) -> bool) -> Vec<MemberReading> {
        (0..=end_ms / 50)
            .map(|i| {
                let t = i * 50;
                let mut live = vec!["b".to_owned()];
                if a_live(t) {
                    live.insert(0, "a".to_owned());
                }
                MemberReading {
                    sent: t * MS,
                    answered: (t + 5) * MS,
                    live,
                }
            })
            .collect()
    }

    fn check(readings: &[MemberReading], faults: &[FaultRecord]) -> MembershipOutcome {
        let events = [start("a"), start("b")];
        check_membership(MembershipRun {
            events: &events,
            readings,
            faults,
            ttl_ns: TTL,
            stopping: u64::MAX,
            shared_writer: false,
        })
    }

    type MembershipOutcome = (MembershipAnalysis, Option<ViolationSummary>);

    #[test]
    fn a_killed_member_listed_within_its_ttl_passes_and_beyond_it_is_a_ghost() {
        let kill = [fault(FaultKind::Kill, Some("a"), 2_000, 2_001)];
        let (analysis, ghosts) = check(&readings(6_000, |t| t < 2_950), &kill);
        assert_eq!((analysis.judged, ghosts), (1, None));
        assert_eq!(analysis.listed_max_ms, Some(900.0));
        let (_, ghosts) = check(&readings(6_000, |t| t < 3_600), &kill);
        let ghosts = ghosts.expect("listed 1.55 s after its death");
        assert_eq!(ghosts.count, 1);
        assert!(
            ghosts.examples[0].contains("a (killed)"),
            "{:?}",
            ghosts.examples
        );
    }

    #[test]
    fn a_call_held_by_a_cut_may_keep_a_dead_member_until_the_heal_and_a_ttl() {
        let faults = [
            fault(FaultKind::Cut, None, 1_500, 3_000),
            fault(FaultKind::Kill, Some("a"), 2_000, 2_001),
        ];
        let (analysis, ghosts) = check(&readings(6_000, |t| t < 3_900), &faults);
        assert_eq!((analysis.judged, ghosts), (1, None));
        // A cut of another member holds none of this one's calls.
        let faults = [
            fault(FaultKind::Cut, Some("b"), 1_500, 3_000),
            fault(FaultKind::Kill, Some("a"), 2_000, 2_001),
        ];
        assert!(check(&readings(6_000, |t| t < 3_900), &faults).1.is_some());
    }

    #[test]
    fn a_stopped_member_is_judged_until_it_resumes() {
        let pause = [fault(FaultKind::Pause, Some("a"), 2_000, 4_000)];
        let back = |t| !(2_900..4_100).contains(&t);
        let (analysis, ghosts) = check(&readings(6_000, back), &pause);
        assert_eq!((analysis.judged, ghosts), (1, None));
        let stays = |t| !(3_800..4_100).contains(&t);
        assert!(check(&readings(6_000, stays), &pause).1.is_some());
        // Resumed before the bound: listed throughout, and nothing to judge.
        let short = [fault(FaultKind::Pause, Some("a"), 2_000, 3_200)];
        let (analysis, ghosts) = check(&readings(6_000, |_| true), &short);
        assert_eq!((analysis.judged, analysis.not_judged, ghosts), (0, 1, None));
    }

    #[test]
    fn after_a_clock_step_or_before_it_was_seen_a_member_is_not_judged() {
        let faults = [
            fault(FaultKind::Clock, None, 1_000, 1_000),
            fault(FaultKind::Kill, Some("a"), 2_000, 2_001),
        ];
        let (analysis, ghosts) = check(&readings(6_000, |_| true), &faults);
        assert_eq!((analysis.judged, analysis.not_judged, ghosts), (0, 1, None));
        let kill = [fault(FaultKind::Kill, Some("a"), 2_000, 2_001)];
        let (analysis, ghosts) = check(&readings(6_000, |t| t > 5_000), &kill);
        assert_eq!((analysis.judged, analysis.not_judged, ghosts), (0, 1, None));
    }

    #[test]
    fn a_running_member_missing_from_a_reading_is_counted_unless_something_held_its_calls() {
        let gap = |t| !(3_000..3_200).contains(&t);
        let (analysis, ghosts) = check(&readings(6_000, gap), &[]);
        assert_eq!((analysis.missed, ghosts), (4, None));
        assert_eq!(analysis.missed_longest_ms, Some(200.0));
        let restart = [fault(FaultKind::Restart, None, 2_000, 2_500)];
        assert_eq!(check(&readings(6_000, gap), &restart).0.missed, 0);
        // Another member's pause holds nobody's calls, but on SQLite it may.
        let pause = [fault(FaultKind::Pause, Some("b"), 2_000, 2_500)];
        assert_eq!(check(&readings(6_000, gap), &pause).0.missed, 4);
        let events = [start("a"), start("b")];
        let readings = readings(6_000, gap);
        let (sqlite, _) = check_membership(MembershipRun {
            events: &events,
            readings: &readings,
            faults: &pause,
            ttl_ns: TTL,
            stopping: u64::MAX,
            shared_writer: true,
        });
        assert_eq!(sqlite.missed, 0);
    }
}
