//! The run's report: a table for people, JSON for machines.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::checker::{Analysis, Recovery};
use crate::timeline::{self, Timeline};
use crate::ChaosError;

/// What a chaos run did and found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The seed that replays the fault plan.
    pub seed: u64,
    /// The store kind (never its URL).
    pub store: String,
    /// Worker slots.
    pub workers: usize,
    /// Shard mode: the shards of the group the workers are members of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// Fault injection time, ms.
    pub duration_ms: u64,
    /// Lease TTL, ms.
    pub ttl_ms: u64,
    /// The elector's retry interval, ms.
    pub retry_ms: u64,
    /// Whether this was the negative control (workers wrote without the fence).
    pub unsafe_skip_fence: bool,
    /// Faults injected.
    pub faults_total: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Planned faults not injected (no eligible target, or a server restart too soon
    /// after the last one).
    pub faults_skipped: u64,
    /// Workers that exited without being killed (restarted, counted here).
    pub unexpected_exits: u64,
    /// Requested fault kinds this store cannot take, and why.
    pub unavailable: Vec<String>,
    /// The checker's findings.
    #[serde(flatten)]
    pub analysis: Analysis,
    /// Where the histories and worker logs are (kept for a failed run or `--dir`).
    pub run_dir: Option<String>,
    /// Wall time of the whole run, ms.
    pub elapsed_ms: u64,
    /// The run as lanes, terms and faults, for `--report` (not in the JSON).
    #[serde(skip)]
    pub timeline: Timeline,
}

impl Report {
    /// True when the checker found no violation.
    pub fn passed(&self) -> bool {
        self.analysis.violation_count() == 0
    }

    /// Writes the run's pictures into `dir` (which must exist): `timeline.html`,
    /// `recovery-KIND.svg` per fault kind injected, and `report.json` (what `--json`
    /// prints). Returns the files written.
    pub fn write_dir(&self, dir: &Path) -> Result<Vec<PathBuf>, ChaosError> {
        let io = |source| ChaosError::Io {
            what: "cannot write the report",
            source,
        };
        let json = |error: serde_json::Error| io(std::io::Error::other(error));
        let mut files = vec![
            (
                "report.json".to_owned(),
                serde_json::to_string_pretty(self).map_err(json)? + "\n",
            ),
            (
                "timeline.html".to_owned(),
                timeline::html(self).map_err(json)?,
            ),
        ];
        for (name, chart) in self.timeline.recovery_charts(self) {
            files.push((name, chart.to_svg()));
        }
        let mut written = Vec::new();
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(io)?;
            written.push(path);
        }
        Ok(written)
    }

    /// The human report.
    pub fn render(&self) -> String {
        let a = &self.analysis;
        let w = &a.writes;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "tenure chaos: {} store, {} workers, ttl {}ms, {:.1}s of faults, seed {}{}",
            self.store,
            self.workers,
            self.ttl_ms,
            self.duration_ms as f64 / 1000.0,
            self.seed,
            if self.unsafe_skip_fence {
                " (UNSAFE: fence skipped)"
            } else {
                ""
            }
        );
        let _ = writeln!(out);
        recovery_table(&mut out, "FAULT", &a.recovery);
        let _ = writeln!(out, "{:<16} {:>6}", "total", self.faults_total);
        let _ = writeln!(
            out,
            "recovery = fault (restart, cut: its heal) -> next admitted write, expected \
             around ttl + retry = {}ms; isolated = no other fault struck before that write",
            self.ttl_ms + self.retry_ms
        );
        if let (Some(shards), Some(moves)) = (self.shards, &a.shard_moves) {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "shards: {shards} over {} members; {} shard moves in total",
                self.workers, moves.moved
            );
            recovery_table(&mut out, "RE-OWN", &moves.reown);
            let _ = writeln!(
                out,
                "re-own = fault -> every shard the victim held has a new term, expected \
                 within ttl = {}ms plus a takeover; not sampled: {} faults that struck a worker \
                 holding no shard or already paused",
                self.ttl_ms, moves.not_sampled
            );
        }
        if let Some(m) = &a.membership {
            let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}ms"));
            let _ = writeln!(
                out,
                "membership: {} readings; {} killed or stopped members judged ({} not: never \
                 seen live, resumed within the bound, or the clock stepped), still listed after their last call for p50 \
                 {}, max {} (bound: ttl + {}ms); {} readings missed a running member \
                 (longest {})",
                m.readings,
                m.judged,
                m.not_judged,
                ms(m.listed_p50_ms),
                ms(m.listed_max_ms),
                crate::checker::membership::GHOST_SLACK_MS,
                m.missed,
                ms(m.missed_longest_ms)
            );
        }
        for note in &self.unavailable {
            let _ = writeln!(out, "not injected: {note}");
        }
        if self.faults_skipped > 0 {
            let _ = writeln!(
                out,
                "skipped: {} planned faults (no eligible target, or a server restart \
                 within two TTLs of the last one)",
                self.faults_skipped
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "writes: {} invoked, {} admitted, {} refused by the fence, {} failed, {} unknown ({} of them committed); {} log rows",
            w.invoked, w.admitted, w.refused, w.errors, w.unknown, w.unknown_committed, w.log_rows
        );
        let _ = writeln!(
            out,
            "terms: {}; workers believed they led at the same time for {:.0}ms in total",
            a.terms, a.overlap_ms
        );
        if self.unexpected_exits > 0 {
            let _ = writeln!(
                out,
                "workers that exited on their own: {}",
                self.unexpected_exits
            );
        }
        let _ = writeln!(out);
        if self.passed() {
            let _ = writeln!(out, "violations: 0");
        } else {
            let _ = writeln!(out, "violations: {}", a.violation_count());
            for v in &a.violations {
                let _ = writeln!(out, "  {}: {}", v.kind, v.count);
                for example in &v.examples {
                    let _ = writeln!(out, "    {example}");
                }
            }
            let _ = writeln!(out, "replay the fault plan with --seed {}", self.seed);
        }
        if let Some(dir) = &self.run_dir {
            let _ = writeln!(out, "histories and worker logs: {dir}");
        }
        out
    }
}

/// One row per fault label: count, p50, p99, max, isolated samples, their p99, and
/// unrecovered faults.
fn recovery_table(out: &mut String, title: &str, rows: &BTreeMap<String, Recovery>) {
    let _ = writeln!(
        out,
        "{title:<16} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9} {:>11}",
        "COUNT", "P50", "P99", "MAX", "ISOLATED", "ISO P99", "UNRECOVERED"
    );
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}ms"));
    for (label, r) in rows {
        let _ = writeln!(
            out,
            "{label:<16} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9} {:>11}",
            r.recovered + r.unrecovered,
            ms(r.p50_ms),
            ms(r.p99_ms),
            ms(r.max_ms),
            r.isolated,
            ms(r.isolated_p99_ms),
            r.unrecovered
        );
    }
}
