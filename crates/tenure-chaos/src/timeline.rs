//! The run as pictures (`tenure chaos --report DIR`): the data of `timeline.html` (one
//! lane per worker incarnation with its terms, the fence's refusals and the faults) and
//! the recovery-latency chart of each fault kind, computed from the histories and the
//! fault records the checker already reads.
//!
//! The page is one self-contained file: the data sits in a
//! `<script type="application/json">` block and a small inline script draws it as SVG,
//! so nothing is fetched when it is opened.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tenure_bench::plot::{Axis, Chart, Series, Style};

use crate::checker::{recovery_ns, FaultRecord};
use crate::config::FaultKind;
use crate::history::{Event, EventKind};
use crate::report::Report;

/// The page template; `{{TITLE}}` and `{{DATA}}` are filled in by [`html`].
const TEMPLATE: &str = include_str!("timeline.html");

/// A term within one lane: (shard, token); tokens are per shard in shard mode.
type TermKey = (Option<u32>, u64);

/// One term as one incarnation held it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Term {
    /// The fencing token.
    pub token: u64,
    /// The shard (`tenure chaos --shards`); tokens are per shard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// When the elector called work, ms from the run's start.
    pub start_ms: f64,
    /// When the work ended, or the incarnation's last event when it died leading, ms.
    pub end_ms: f64,
    /// False when the term had no end in the history (the worker was killed).
    pub ended: bool,
    /// Writes acknowledged under this term by this incarnation.
    pub admitted: u64,
}

/// One worker incarnation's lane.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Lane {
    /// The incarnation, e.g. `w3.2` (slot 3, third incarnation).
    pub worker: String,
    /// Its first recorded event (if it recorded none: the first fault that hit it), ms
    /// from the run's start.
    pub start_ms: f64,
    /// Its last recorded event, ms from the run's start.
    pub last_event_ms: f64,
    /// When it ended: the fault that killed it, or else the run's end, ms.
    pub end_ms: f64,
    /// Whether a fault killed it (else it ran until the run stopped it).
    pub killed: bool,
    /// The terms it led, in order.
    pub terms: Vec<Term>,
    /// When a write of its was refused by the fence, ms from the run's start.
    pub refused_ms: Vec<f64>,
}

/// One fault as a marker.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fault {
    /// The kind.
    pub kind: FaultKind,
    /// The report row: kind and flavour (`cut/blackhole`).
    pub label: String,
    /// The incarnation hit, if any.
    pub target: Option<String>,
    /// Injected at, ms from the run's start.
    pub at_ms: f64,
    /// Healed at, ms from the run's start (`None` if it never healed).
    pub healed_ms: Option<f64>,
    /// From the fault (restart, cut: its heal) to the next admitted write, as the
    /// checker measures it; `None` when no write was admitted after it.
    pub recovery_ms: Option<f64>,
}

/// Everything the timeline page draws.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// From the run's start to its last event, ms.
    pub span_ms: f64,
    /// One per worker incarnation, by slot then incarnation.
    pub lanes: Vec<Lane>,
    /// Every injected fault, in order.
    pub faults: Vec<Fault>,
}

/// Orders `w3.10` after `w3.2` and `w10.0` after `w9.0`; other names by text.
fn lane_order(name: &str) -> (u64, u64, String) {
    let parsed = name
        .strip_prefix('w')
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(slot, inc)| Some((slot.parse().ok()?, inc.parse().ok()?)));
    let (slot, inc) = parsed.unwrap_or((u64::MAX, u64::MAX));
    (slot, inc, name.to_owned())
}

impl Timeline {
    /// Builds the timeline from the histories (`events`, in time order), the faults, and
    /// the run's start on the same monotonic clock (earlier events move it back).
    pub fn build(events: &[Event], faults: &[FaultRecord], origin_ns: u64) -> Self {
        let origin = events
            .iter()
            .map(|e| e.t)
            .min()
            .unwrap_or(origin_ns)
            .min(origin_ns);
        let ms = |t: u64| t.saturating_sub(origin) as f64 / 1e6;
        let mut lanes: BTreeMap<(u64, u64, String), Lane> = BTreeMap::new();
        // Terms still open, per lane: (term, index in that lane's terms).
        let mut open: HashMap<String, Vec<(TermKey, usize)>> = HashMap::new();
        let mut invoked: HashMap<(&str, u64), u64> = HashMap::new();
        let mut acks: Vec<(u64, u64)> = Vec::new();
        for e in events {
            let lane = lanes.entry(lane_order(&e.worker)).or_insert_with(|| Lane {
                worker: e.worker.clone(),
                start_ms: ms(e.t),
                last_event_ms: ms(e.t),
                end_ms: ms(e.t),
                killed: false,
                terms: Vec::new(),
                refused_ms: Vec::new(),
            });
            lane.last_event_ms = ms(e.t);
            let open = open.entry(e.worker.clone()).or_default();
            let term = (e.shard, e.token);
            match e.ev {
                EventKind::Lead if !open.iter().any(|&(t, _)| t == term) => {
                    open.push((term, lane.terms.len()));
                    lane.terms.push(Term {
                        token: e.token,
                        shard: e.shard,
                        start_ms: ms(e.t),
                        end_ms: ms(e.t),
                        ended: false,
                        admitted: 0,
                    });
                }
                EventKind::Unlead => {
                    if let Some(pos) = open.iter().position(|&(t, _)| t == term) {
                        let (_, i) = open.remove(pos);
                        lane.terms[i].end_ms = ms(e.t);
                        lane.terms[i].ended = true;
                    }
                }
                EventKind::Invoke => {
                    invoked.insert((e.worker.as_str(), e.seq), e.t);
                }
                EventKind::Ok => {
                    if let Some(&(_, i)) = open.iter().find(|&&(t, _)| t == term) {
                        lane.terms[i].admitted += 1;
                    }
                    if let Some(&at) = invoked.get(&(e.worker.as_str(), e.seq)) {
                        acks.push((at, e.t));
                    }
                }
                EventKind::Fenced => lane.refused_ms.push(ms(e.t)),
                _ => {}
            }
        }
        // A term its worker never ended (killed while leading) lasts to its last event.
        for (worker, open) in open {
            if let Some(lane) = lanes.values_mut().find(|l| l.worker == worker) {
                for (_, i) in open {
                    lane.terms[i].end_ms = lane.last_event_ms;
                }
            }
        }
        acks.sort_unstable();
        let faults: Vec<Fault> = faults
            .iter()
            .map(|f| Fault {
                kind: f.kind,
                label: f.label(),
                target: f.target.clone(),
                at_ms: ms(f.at),
                healed_ms: (f.healed > 0).then(|| ms(f.healed)),
                recovery_ms: recovery_ns(&acks, f.recovery_from()).map(|ns| ns as f64 / 1e6),
            })
            .collect();
        let last = events
            .iter()
            .map(|e| e.t)
            .chain(faults_end(&faults, origin))
            .max();
        let span_ms = last.map_or(0.0, ms);
        // An incarnation killed before it recorded anything still gets its lane.
        for f in &faults {
            let Some(target) = &f.target else { continue };
            lanes.entry(lane_order(target)).or_insert_with(|| Lane {
                worker: target.clone(),
                start_ms: f.at_ms,
                last_event_ms: f.at_ms,
                end_ms: f.at_ms,
                killed: false,
                terms: Vec::new(),
                refused_ms: Vec::new(),
            });
        }
        let mut lanes: Vec<Lane> = lanes.into_values().collect();
        for lane in &mut lanes {
            // A kill (and a restart on SQLite, which kills the leader) names its target.
            let killed_at = faults
                .iter()
                .filter(|f| matches!(f.kind, FaultKind::Kill | FaultKind::Restart))
                .filter(|f| f.target.as_deref() == Some(lane.worker.as_str()))
                .map(|f| f.at_ms)
                .next();
            lane.killed = killed_at.is_some();
            lane.end_ms = killed_at.unwrap_or(span_ms).max(lane.last_event_ms);
        }
        Timeline {
            span_ms,
            lanes,
            faults,
        }
    }

    /// Terms drawn, over all lanes.
    pub fn term_count(&self) -> usize {
        self.lanes.iter().map(|l| l.terms.len()).sum()
    }

    /// The recovery chart of each fault kind, as `(file name, chart)`: one point per
    /// recovered fault (x: when it struck, y: its recovery), a cross at the top for each
    /// fault never recovered from, and the expected bound TTL + retry as a rule.
    pub fn recovery_charts(&self, report: &Report) -> Vec<(String, Chart)> {
        let mut kinds: BTreeMap<FaultKind, Vec<&Fault>> = BTreeMap::new();
        for fault in &self.faults {
            kinds.entry(fault.kind).or_default().push(fault);
        }
        let bound = (report.ttl_ms + report.retry_ms) as f64;
        kinds
            .into_iter()
            .map(|(kind, faults)| {
                let top = faults
                    .iter()
                    .filter_map(|f| f.recovery_ms)
                    .fold(bound, f64::max)
                    * 1.1;
                let mut labels: Vec<&str> = faults.iter().map(|f| f.label.as_str()).collect();
                labels.sort_unstable();
                labels.dedup();
                let mut series: Vec<Series> = labels
                    .iter()
                    .enumerate()
                    .map(|(i, label)| {
                        let of_label = faults.iter().filter(|f| f.label == *label);
                        let recovered: Vec<_> =
                            of_label.filter_map(|f| Some((f, f.recovery_ms?))).collect();
                        Series {
                            name: format!("{label} ({})", recovered.len()),
                            colour: SERIES_COLOURS[i % SERIES_COLOURS.len()].to_owned(),
                            style: Style::Dots,
                            points: recovered.iter().map(|(f, r)| (f.at_ms / 1e3, *r)).collect(),
                            titles: recovered
                                .iter()
                                .map(|(f, r)| fault_title(f, Some(*r)))
                                .collect(),
                        }
                    })
                    .collect();
                let lost: Vec<&&Fault> =
                    faults.iter().filter(|f| f.recovery_ms.is_none()).collect();
                if !lost.is_empty() {
                    series.push(Series {
                        name: format!("not recovered ({})", lost.len()),
                        colour: "#d00".to_owned(),
                        style: Style::Crosses,
                        points: lost.iter().map(|f| (f.at_ms / 1e3, top)).collect(),
                        titles: lost.iter().map(|f| fault_title(f, None)).collect(),
                    });
                }
                let chart = Chart {
                    title: format!("tenure chaos: recovery after {kind}"),
                    subtitle: format!(
                        "{}, {} workers, ttl {} ms, seed {}: fault{} -> next admitted write",
                        report.store,
                        report.workers,
                        report.ttl_ms,
                        report.seed,
                        match kind {
                            FaultKind::Restart | FaultKind::Lock => " healed",
                            FaultKind::Cut => " healed (a wedge: struck)",
                            _ => "",
                        }
                    ),
                    x: Axis::linear(
                        "fault injected at (s from the run's start)",
                        0.0,
                        self.span_ms / 1e3,
                    ),
                    y: Axis::linear("recovery (ms)", 0.0, top),
                    series,
                    rules: vec![(bound, format!("ttl + retry = {bound:.0} ms"))],
                };
                (format!("recovery-{kind}.svg"), chart)
            })
            .collect()
    }
}

const SERIES_COLOURS: [&str; 4] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"];

fn fault_title(f: &Fault, recovery: Option<f64>) -> String {
    let target = f
        .target
        .as_deref()
        .map(|t| format!(" on {t}"))
        .unwrap_or_default();
    let recovery = recovery.map_or("not recovered".to_owned(), |r| format!("{r:.0} ms"));
    format!("{}{target} at {:.2}s: {recovery}", f.label, f.at_ms / 1e3)
}

/// The latest fault time, so a heal after the last event still fits the axis.
fn faults_end(faults: &[Fault], origin: u64) -> Option<u64> {
    faults
        .iter()
        .map(|f| f.healed_ms.unwrap_or(f.at_ms))
        .map(|ms| origin + (ms * 1e6) as u64)
        .max()
}

/// JSON that can sit inside a `<script>` element: `<`, `>` and `&` are written as
/// `\u` escapes, so no string can close the element or open a comment.
pub fn script_json<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    let json = serde_json::to_string(value)?;
    Ok(json
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026"))
}

/// The page's data: the report beside the timeline.
#[derive(Serialize)]
struct PageData<'a> {
    report: &'a Report,
    /// The seed as text: a page's numbers are doubles, which cannot hold every u64.
    seed: String,
    timeline: &'a Timeline,
    passed: bool,
}

/// `timeline.html` for a finished run.
pub fn html(report: &Report) -> Result<String, serde_json::Error> {
    let data = script_json(&PageData {
        report,
        seed: report.seed.to_string(),
        timeline: &report.timeline,
        passed: report.passed(),
    })?;
    let title = tenure_bench::plot::escape(&format!(
        "tenure chaos: {}, {} workers, seed {}",
        report.store, report.workers, report.seed
    ));
    Ok(TEMPLATE
        .replacen("{{TITLE}}", &title, 1)
        .replacen("{{DATA}}", &data, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history line `t_ms` ms after the run's start at 1 s.
    fn ev(t_ms: u64, worker: &str, ev: EventKind, token: u64, seq: u64) -> Event {
        crate::checker::tests::ev(1_000_000_000 + t_ms * 1_000_000, worker, ev, token, seq)
    }

    /// w0.0 leads token 1 and is killed while leading; w0.1 (its slot's next
    /// incarnation) starts; w1.0 takes over with token 2, and w0.0's late write is fenced
    /// before the kill.
    fn run() -> (Vec<Event>, Vec<FaultRecord>) {
        use EventKind::*;
        let events = vec![
            ev(0, "w0.0", Start, 0, 0),
            ev(1, "w1.0", Start, 0, 0),
            ev(10, "w0.0", Lead, 1, 0),
            ev(11, "w0.0", Invoke, 1, 1),
            ev(12, "w0.0", Ok, 1, 1),
            ev(20, "w0.0", Invoke, 1, 2),
            ev(21, "w0.0", Ok, 1, 2),
            ev(600, "w1.0", Lead, 2, 0),
            ev(610, "w1.0", Invoke, 2, 1),
            ev(615, "w1.0", Ok, 2, 1),
            ev(700, "w0.0", Invoke, 1, 3),
            ev(705, "w0.0", Fenced, 1, 3),
            ev(800, "w0.1", Start, 0, 0),
            ev(900, "w1.0", Unlead, 2, 0),
            ev(1000, "w1.0", Lead, 3, 0),
            ev(1010, "w1.0", Invoke, 3, 1),
        ];
        let faults = vec![
            FaultRecord {
                kind: FaultKind::Pause,
                flavour: None,
                target: Some("w0.0".to_owned()),
                at: 1_000_000_000 + 30_000_000,
                healed: 1_000_000_000 + 690_000_000,
            },
            FaultRecord {
                kind: FaultKind::Kill,
                flavour: None,
                target: Some("w0.0".to_owned()),
                at: 1_000_000_000 + 790_000_000,
                healed: 1_000_000_000 + 800_000_000,
            },
            // Killed before its first history line.
            FaultRecord {
                kind: FaultKind::Kill,
                flavour: None,
                target: Some("w2.0".to_owned()),
                at: 1_000_000_000 + 950_000_000,
                healed: 1_000_000_000 + 960_000_000,
            },
        ];
        (events, faults)
    }

    #[test]
    fn one_lane_per_incarnation_in_slot_order() {
        let (events, faults) = run();
        let t = Timeline::build(&events, &faults, 1_000_000_000);
        let names: Vec<&str> = t.lanes.iter().map(|l| l.worker.as_str()).collect();
        assert_eq!(names, ["w0.0", "w0.1", "w1.0", "w2.0"]);
        assert_eq!((t.lanes[3].start_ms, t.lanes[3].killed), (950.0, true));
        assert!(t.lanes[3].terms.is_empty());
        assert_eq!(t.lanes[0].start_ms, 0.0);
        assert_eq!(t.lanes[0].last_event_ms, 705.0);
        // Killed at 790 ms; the others live to the end of the run.
        assert_eq!((t.lanes[0].end_ms, t.lanes[0].killed), (790.0, true));
        assert_eq!((t.lanes[1].end_ms, t.lanes[1].killed), (1010.0, false));
        assert_eq!(t.span_ms, 1010.0);
        assert!(lane_order("w10.0") > lane_order("w9.3"));
        assert!(lane_order("w3.10") > lane_order("w3.2"));
    }

    #[test]
    fn terms_come_from_lead_and_unlead_and_a_killed_leader_ends_at_its_last_event() {
        let (events, faults) = run();
        let t = Timeline::build(&events, &faults, 1_000_000_000);
        let w0 = &t.lanes[0];
        assert_eq!(w0.terms.len(), 1);
        assert_eq!(
            (w0.terms[0].token, w0.terms[0].start_ms, w0.terms[0].end_ms),
            (1, 10.0, 705.0)
        );
        assert!(!w0.terms[0].ended);
        assert_eq!(w0.terms[0].admitted, 2);
        assert_eq!(w0.refused_ms, [705.0]);
        let w1 = &t.lanes[2];
        let terms: Vec<(u64, f64, f64, bool)> = w1
            .terms
            .iter()
            .map(|x| (x.token, x.start_ms, x.end_ms, x.ended))
            .collect();
        assert_eq!(terms, [(2, 600.0, 900.0, true), (3, 1000.0, 1010.0, false)]);
        assert!(t.lanes[1].terms.is_empty());
        assert_eq!(t.term_count(), 3);
    }

    #[test]
    fn faults_carry_their_recovery_as_the_checker_measures_it() {
        let (events, faults) = run();
        let t = Timeline::build(&events, &faults, 1_000_000_000);
        assert_eq!(t.faults.len(), 3);
        let pause = &t.faults[0];
        assert_eq!((pause.kind, pause.at_ms), (FaultKind::Pause, 30.0));
        assert_eq!(pause.healed_ms, Some(690.0));
        // From the pause (30 ms) to w1.0's first acknowledged write (615 ms).
        assert_eq!(pause.recovery_ms, Some(585.0));
        // After the kill no write was acknowledged.
        assert_eq!(t.faults[1].recovery_ms, None);
    }

    #[test]
    fn a_worker_name_cannot_close_the_script_element() {
        let json = script_json(&vec!["</script><script>alert(1)</script>", "a&b"]).unwrap();
        assert!(!json.contains('<') && !json.contains('&'), "{json}");
        let back: Vec<String> = serde_json::from_str(&json).unwrap();
        assert_eq!(back[0], "</script><script>alert(1)</script>");
        assert_eq!(back[1], "a&b");
    }
}
