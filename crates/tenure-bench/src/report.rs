//! The report of one run: plain serde data (`--json`) and a table per section.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::machine::Machine;
use crate::plot::{number, Axis, Chart, Series, Style};
use crate::stats::{Histogram, Latency};

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The store kind (never its URL).
    pub store: String,
    /// Where it ran.
    pub machine: Machine,
    /// The settings in effect.
    pub settings: Settings,
    /// What the raw baseline is for this store.
    pub raw_baseline: String,
    /// One row per operation and client count.
    pub throughput: Vec<ThroughputRow>,
    /// Server requests per operation.
    pub round_trips: RoundTrips,
    /// Release and stall takeover.
    pub failover: Failover,
}

/// The settings of the run.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    /// Client counts.
    pub clients: Vec<usize>,
    /// Measuring time per operation and client count.
    pub duration_ms: f64,
    /// Store/raw round pairs per cell.
    pub rounds: usize,
    /// Roles the renewing clients spread over (`null`: one per client).
    pub roles: Option<usize>,
    /// Failover trials of each kind.
    pub trials: usize,
    /// Failover lease TTL.
    pub ttl_ms: f64,
}

/// One operation at one client count, store beside raw.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputRow {
    /// `acquire`, `renew`, `release` or `heartbeat`.
    pub op: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Distinct roles renewed (renew only).
    pub roles: Option<usize>,
    /// Median ops/s of the store's rounds.
    pub store_ops_per_sec: f64,
    /// Median ops/s of the raw rounds.
    pub raw_ops_per_sec: f64,
    /// Median over rounds of store ops/s / raw ops/s in the same round.
    pub ratio: f64,
    /// Store latency per operation.
    pub store: Latency,
    /// Raw latency per operation.
    pub raw: Latency,
    /// Every store latency sample, for the `--report` plot (not in the JSON).
    #[serde(skip)]
    pub store_histogram: Histogram,
    /// Every raw latency sample, for the `--report` plot (not in the JSON).
    #[serde(skip)]
    pub raw_histogram: Histogram,
    /// The raw side of this row when it is not the report's `raw_baseline` (a backend's
    /// extra comparison); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
}

/// Server requests per operation.
#[derive(Clone, Debug, Serialize)]
pub struct RoundTrips {
    /// What was counted, or why nothing was.
    pub method: String,
    /// Whether counts were taken.
    pub measured: bool,
    /// Per operation (empty when not measured).
    pub ops: Vec<RoundTripRow>,
}

/// Requests per operation of one kind.
#[derive(Clone, Debug, Serialize)]
pub struct RoundTripRow {
    /// The operation.
    pub op: String,
    /// Operations performed.
    pub ops: u64,
    /// Requests the server counted, per operation.
    pub per_op: f64,
}

/// Both failover measurements.
#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    /// Release -> successor's work running.
    pub release: ReleaseFailover,
    /// Stall -> successor's work running.
    pub stall: StallFailover,
}

/// Release -> successor's work running.
#[derive(Clone, Debug, Serialize)]
pub struct ReleaseFailover {
    /// Trials attempted.
    pub trials: usize,
    /// Trials where the successor ran.
    pub completed: usize,
    /// From the leader's work returning to the successor's work starting.
    pub latency: Latency,
    /// The floor (or bound) measured in the same run.
    pub floor: Floor,
    /// The p99 goal, in milliseconds.
    pub goal_p99_ms: Option<f64>,
    /// The first few failures, if any.
    pub failures: Vec<String>,
}

/// The floor (measured) or bound (known) of a release handover.
#[derive(Clone, Debug, Serialize)]
pub struct Floor {
    /// What it is.
    pub label: String,
    /// Its measured latency, when measured.
    pub latency: Option<Latency>,
    /// A known bound, when not measured, in milliseconds.
    pub bound_ms: Option<f64>,
}

/// Stall -> successor's work running.
#[derive(Clone, Debug, Serialize)]
pub struct StallFailover {
    /// Trials attempted.
    pub trials: usize,
    /// Trials where the successor ran.
    pub completed: usize,
    /// Trials where the successor ran before the stalled term could have expired (a
    /// violation; must be 0).
    pub early: usize,
    /// The lease TTL.
    pub ttl_ms: f64,
    /// The successor's retry interval.
    pub retry_ms: f64,
    /// Time from the stalled leader's acquire being sent to the successor's work
    /// starting, less the TTL.
    pub excess_over_ttl: Latency,
    /// TTL + retry interval: where a successor that only polled would start at worst.
    pub bound_ms: f64,
    /// The goal for the p99 excess, in milliseconds.
    pub goal_excess_ms: f64,
    /// On stores that judge expiry by observation (Kubernetes): from the stalled leader's
    /// acquire being sent until a read of the role through the successor's store
    /// returned. The TTL counts from that store's first sighting of the term, which came
    /// no later (a watch event may bring it before the read's answer), so this is an
    /// upper bound of the excess's floor; absent on other stores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_sighting: Option<Latency>,
    /// On those stores: the successor's start, less the first sighting plus the TTL (the
    /// excess over the floor, at least; 0 where the store had sighted the term before the
    /// read returned and so started sooner).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub excess_over_sighting: Option<Latency>,
    /// The first few failures, if any.
    pub failures: Vec<String>,
}

fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}ms", v / 1e3)
    } else if v >= 1_000.0 {
        format!("{:.2}ms", v / 1e3)
    } else {
        format!("{v:.1}us")
    }
}

/// `trials p50 p99 max` columns of a failover line.
fn latency_columns(trials: String, l: &Latency) -> String {
    format!(
        "{:>9} {:>9} {:>9} {:>9}",
        trials,
        us(l.p50_us),
        us(l.p99_us),
        us(l.max_us)
    )
}

fn rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else {
        format!("{v:.0}")
    }
}

fn met(value: f64, goal: Option<f64>) -> &'static str {
    match goal {
        Some(goal) if value <= goal => "met",
        Some(_) => "missed",
        None => "-",
    }
}

impl Report {
    /// The report as text tables.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let _ = writeln!(out, "tenure bench: {}", self.store);
        let _ = writeln!(
            out,
            "machine: nproc {}, load {} -> {}, {}{}",
            m.nproc,
            m.load_before.as_deref().unwrap_or("?"),
            m.load_after.as_deref().unwrap_or("?"),
            m.kernel.as_deref().unwrap_or("unknown kernel"),
            m.backend_version
                .as_deref()
                .map(|v| format!(", backend {v}"))
                .unwrap_or_default()
        );
        let s = &self.settings;
        let _ = writeln!(
            out,
            "settings: clients {:?}, {:.0} ms per cell in {} store/raw round pairs, roles {}, \
             {} failover trials, ttl {:.0} ms",
            s.clients,
            s.duration_ms,
            s.rounds,
            s.roles
                .map_or("one per client".to_owned(), |r| r.to_string()),
            s.trials,
            s.ttl_ms
        );
        let _ = writeln!(out, "raw baseline: {}", self.raw_baseline);
        let _ = writeln!(out, "\n== throughput (medians of interleaved rounds) ==");
        let _ = writeln!(
            out,
            "{:<10} {:>7} {:>10} {:>10} {:>6}   {:>9} {:>9} {:>9}   {:>9} {:>9} {:>9}",
            "op",
            "clients",
            "store/s",
            "raw/s",
            "ratio",
            "store p50",
            "p99",
            "max",
            "raw p50",
            "p99",
            "max"
        );
        for r in &self.throughput {
            let clients = match r.roles {
                Some(roles) if roles != r.clients => format!("{}/{}r", r.clients, roles),
                _ => r.clients.to_string(),
            };
            let _ = writeln!(
                out,
                "{:<10} {:>7} {:>10} {:>10} {:>6.2}   {:>9} {:>9} {:>9}   {:>9} {:>9} {:>9}",
                r.op,
                clients,
                rate(r.store_ops_per_sec),
                rate(r.raw_ops_per_sec),
                r.ratio,
                us(r.store.p50_us),
                us(r.store.p99_us),
                us(r.store.max_us),
                us(r.raw.p50_us),
                us(r.raw.p99_us),
                us(r.raw.max_us)
            );
        }
        for r in self.throughput.iter().filter(|r| r.baseline.is_some()) {
            let _ = writeln!(
                out,
                "  {} ({} clients): raw = {}",
                r.op,
                r.clients,
                r.baseline.as_deref().unwrap_or_default()
            );
        }
        let rt = &self.round_trips;
        let _ = writeln!(out, "\n== round trips per operation: {} ==", rt.method);
        for row in &rt.ops {
            let _ = writeln!(
                out,
                "{:<24} {:>6.2} per op ({} ops)",
                row.op, row.per_op, row.ops
            );
        }
        let f = &self.failover;
        let _ = writeln!(out, "\n== failover ==");
        let _ = writeln!(
            out,
            "{:<44} {:>9} {:>9} {:>9} {:>9}  goal",
            "", "trials", "p50", "p99", "max"
        );
        let r = &f.release;
        let _ = writeln!(
            out,
            "{:<44} {}  {}",
            "release -> successor running",
            latency_columns(format!("{}/{}", r.completed, r.trials), &r.latency),
            match r.goal_p99_ms {
                Some(goal) => format!(
                    "p99 <= {goal} ms: {}",
                    met(r.latency.p99_us / 1e3, Some(goal))
                ),
                None => "-".to_owned(),
            }
        );
        match (&r.floor.latency, r.floor.bound_ms) {
            (Some(l), _) => {
                let _ = writeln!(
                    out,
                    "{:<44} {}",
                    format!("  floor: {}", r.floor.label),
                    latency_columns(l.count.to_string(), l)
                );
            }
            (None, Some(bound)) => {
                let _ = writeln!(out, "  bound: {} = {bound:.1} ms", r.floor.label);
            }
            (None, None) => {
                let _ = writeln!(out, "  floor: {}", r.floor.label);
            }
        }
        let st = &f.stall;
        let _ = writeln!(
            out,
            "{:<44} {}  p99 <= ttl + {} ms: {}",
            "stall -> successor running, excess over ttl",
            latency_columns(
                format!("{}/{}", st.completed, st.trials),
                &st.excess_over_ttl
            ),
            st.goal_excess_ms,
            met(st.excess_over_ttl.p99_us / 1e3, Some(st.goal_excess_ms))
        );
        let _ = writeln!(
            out,
            "  bound: ttl {:.0} ms + retry interval {:.0} ms = {:.0} ms; started before expiry: {}",
            st.ttl_ms, st.retry_ms, st.bound_ms, st.early
        );
        if let (Some(seen), Some(over)) = (&st.first_sighting, &st.excess_over_sighting) {
            let _ = writeln!(
                out,
                "{:<44} {}",
                "  floor: acquire sent -> successor's first read",
                latency_columns(seen.count.to_string(), seen)
            );
            let _ = writeln!(
                out,
                "{:<44} {}",
                "  excess over first read + ttl",
                latency_columns(over.count.to_string(), over)
            );
        }
        for failure in r.failures.iter().chain(&st.failures) {
            let _ = writeln!(out, "  failed trial: {failure}");
        }
        out
    }
}

/// Colours for client counts, in the order the counts were measured.
const PALETTE: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];

/// A microsecond tick as `200µs`, `5ms` or `1s`.
fn duration_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{}s", number(us / 1e6))
    } else if us >= 1e3 {
        format!("{}ms", number(us / 1e3))
    } else {
        format!("{}µs", number(us))
    }
}

/// Percentile as "nines": `p = 1 - 10^-x`, so p90, p99 and p99.9 are evenly spaced.
fn nines(x: f64) -> f64 {
    1.0 - 10f64.powf(-x)
}

/// The percentile curve of one histogram: `(nines, microseconds)`, as far into the tail
/// as its sample count reaches, then its maximum.
fn curve(histogram: &Histogram, max_nines: f64) -> Vec<(f64, f64)> {
    let reach = (histogram.count() as f64).log10().min(max_nines);
    let mut points = Vec::new();
    let mut x = 0.0;
    while x < reach {
        if let Some(d) = histogram.percentile(nines(x)) {
            points.push((x, d.as_secs_f64() * 1e6));
        }
        x += 0.05;
    }
    if let Some(d) = histogram.percentile(1.0) {
        points.push((reach.max(0.0), d.as_secs_f64() * 1e6));
    }
    points
}

impl Report {
    /// One latency percentile chart per operation: store (solid) and raw (dashed) at each
    /// client count on the same axes.
    pub fn latency_charts(&self) -> Vec<(String, Chart)> {
        let mut ops: Vec<&str> = Vec::new();
        for row in &self.throughput {
            if !ops.contains(&row.op.as_str()) {
                ops.push(&row.op);
            }
        }
        // As far into the tail as the largest sample count reaches (p99.99 at most).
        let most = self
            .throughput
            .iter()
            .flat_map(|r| [r.store_histogram.count(), r.raw_histogram.count()])
            .max()
            .unwrap_or(0);
        let max_nines = (most.max(10) as f64).log10().ceil().min(4.0);
        ops.into_iter()
            .map(|op| {
                let mut series = Vec::new();
                let raw_label = self
                    .throughput
                    .iter()
                    .find_map(|r| (r.op == op).then_some(r.baseline.as_ref()).flatten())
                    .unwrap_or(&self.raw_baseline);
                let (mut lo, mut hi) = (f64::MAX, f64::MIN_POSITIVE);
                for (i, row) in self.throughput.iter().filter(|r| r.op == op).enumerate() {
                    let colour = PALETTE[i % PALETTE.len()].to_owned();
                    for (side, histogram, style) in [
                        ("store", &row.store_histogram, Style::Line),
                        ("raw", &row.raw_histogram, Style::Dashed),
                    ] {
                        let points = curve(histogram, max_nines);
                        for &(_, us) in &points {
                            lo = lo.min(us);
                            hi = hi.max(us);
                        }
                        series.push(Series {
                            name: format!("{side}, {} clients", row.clients),
                            colour: colour.clone(),
                            style,
                            points,
                            titles: Vec::new(),
                        });
                    }
                }
                let ticks = [(0.0, "p0"), (1.0, "p90"), (2.0, "p99"), (3.0, "p99.9")]
                    .into_iter()
                    .chain([(4.0, "p99.99")])
                    .filter(|&(x, _)| x <= max_nines)
                    .map(|(x, l)| (x, l.to_owned()))
                    .collect();
                let mut y = Axis::log10("latency (log scale)", lo.min(hi), hi);
                y.ticks = Some(
                    y.tick_marks()
                        .into_iter()
                        .map(|(v, _)| (v, duration_label(v)))
                        .collect(),
                );
                let chart = Chart {
                    title: format!("tenure bench: {op} latency, {}", self.store),
                    subtitle: format!(
                        "solid: the store, dashed: raw; every sample of {} rounds of {:.0} ms\n\
                         raw: {}",
                        self.settings.rounds, self.settings.duration_ms, raw_label
                    ),
                    x: Axis {
                        ticks: Some(ticks),
                        ..Axis::linear("percentile (each step ten times rarer)", 0.0, max_nines)
                    },
                    y,
                    series,
                    rules: Vec::new(),
                };
                (format!("latency-{op}.svg"), chart)
            })
            .collect()
    }

    /// Writes `report.json` (what `--json` prints) and `latency-OP.svg` per operation into
    /// `dir`, which must exist; returns the files written.
    pub fn write_dir(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        let mut written = Vec::new();
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let path = dir.join("report.json");
        std::fs::write(&path, json + "\n")?;
        written.push(path);
        for (name, chart) in self.latency_charts() {
            let path = dir.join(name);
            std::fs::write(&path, chart.to_svg())?;
            written.push(path);
        }
        Ok(written)
    }
}
