//! The human report of `tenure bench --shards`: one table per scenario.

use super::ShardReport;

impl ShardReport {
    /// The human report: one table per scenario.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "holding {} roles, renew every {:.0}ms, ttl {:.0}ms, measured over {:.1}s",
            s.shards,
            s.renew_ms,
            s.hold_ttl_ms,
            s.window_ms / 1e3
        );
        let _ = writeln!(
            out,
            "  {:<18} {:>8} {:>9} {:>12} {:>12} {:>8} {:>9}  store calls per interval",
            "holder", "settle", "restarted", "stmts/intvl", "rows/intvl", "cpu", "intervals"
        );
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        for row in &self.hold {
            let calls: Vec<String> = row
                .calls_per_interval
                .iter()
                .map(|(method, n)| format!("{method} {n:.1}"))
                .collect();
            let _ = writeln!(
                out,
                "  {:<18} {:>6.0}ms {:>9} {:>12} {:>12} {:>7.1}% {:>9.1}  {}",
                format!("{} ({})", row.holder, row.contenders),
                row.settle_ms,
                row.terms_restarted,
                opt(row.statements_per_interval),
                opt(row.rows_written_per_interval),
                row.cpu_percent,
                row.intervals,
                calls.join(", ")
            );
            if let Some(again) = row.restart_settle_ms {
                let _ = writeln!(
                    out,
                    "  ({} started again, its objects in place: settled in {again:.0}ms)",
                    row.holder
                );
            }
            if let Some(kill) = &row.kill {
                let _ = writeln!(
                    out,
                    "  (then a member with {} shards killed: all owned again after {:.0}ms, ttl {:.0}ms; its session lapsed after {:.0}ms, the others took {:.0}ms more)",
                    kill.shards, kill.reowned_ms, s.hold_ttl_ms, kill.lapse_ms, kill.reowned_ms - kill.lapse_ms
                );
            }
            if let Some(per_role) = row.per_role_settle_ms {
                let _ = writeln!(
                    out,
                    "  ({} cold again, one acquire per shard: settled in {per_role:.0}ms, {:.1}x the batched {:.0}ms)",
                    row.holder,
                    per_role / row.settle_ms.max(1.0),
                    row.settle_ms
                );
            }
        }
        let _ = writeln!(out, "  stmts: {}", self.statements_counted);
        let _ = writeln!(out, "  rows: {}", self.rows_counted);
        if let Some(q) = &self.quiet {
            let _ = writeln!(
                out,
                "  quiet window ({:.1}s, nothing of the bench running): stmts/intvl {}, \
                 rows/intvl {} (the server's own, counted in the rows above too)",
                q.window_ms / 1e3,
                opt(q.statements_per_interval),
                opt(q.rows_written_per_interval),
            );
        }
        if let Some(w) = &self.wedged {
            let _ = writeln!(
                out,
                "wedged: {} members and one wedged on {} shards (ttl {:.0}ms): every shard ran \
                 after {:.0}ms; then over {:.1}s ({} samples) the least-run shard ran {:.2}% \
                 of the time, the mean {:.2}%; {} shards under 99%; a plan targeted the wedged \
                 member in {:.2}% of the samples",
                w.members,
                w.shards,
                s.hold_ttl_ms,
                w.all_ran_ms,
                w.measured_ms / 1e3,
                w.samples,
                w.least_running_share * 100.0,
                w.mean_running_share * 100.0,
                w.shards_under_99_percent,
                w.targeted_at_wedged_share * 100.0,
            );
        }
        if let Some(c) = &self.churn {
            let _ = writeln!(out, "churn: {} shards, ttl {:.0}ms", c.shards, c.ttl_ms);
            let _ = writeln!(
                out,
                "  4 members, cold start: settled in {:.0}ms ({:.1} renew intervals), shares {:?}",
                c.cold_settle_ms, c.cold_settle_intervals, c.cold_shares
            );
            let _ = writeln!(
                out,
                "  a 5th joins: {} shards moved, {} of them to the newcomer; settled in {:.0}ms; \
                 handover p50 {:.2}ms p99 {:.2}ms max {:.2}ms",
                c.join_moved,
                c.join_moved_to_newcomer,
                c.join_settle_ms,
                c.handover.p50_us / 1e3,
                c.handover.p99_us / 1e3,
                c.handover.max_us / 1e3
            );
            let _ = writeln!(
                out,
                "    before the newcomer worked (probes): {} handovers, p50 {:.2}ms max {:.2}ms; \
                 to it working: {}, p50 {:.2}ms p99 {:.2}ms max {:.2}ms",
                c.handover_before_working.count,
                c.handover_before_working.p50_us / 1e3,
                c.handover_before_working.max_us / 1e3,
                c.handover_to_working.count,
                c.handover_to_working.p50_us / 1e3,
                c.handover_to_working.p99_us / 1e3,
                c.handover_to_working.max_us / 1e3
            );
            let _ = writeln!(
                out,
                "  a member with {} shards killed: all owned again after {:.0}ms (ttl {:.0}ms; its session lapsed after {:.0}ms)",
                c.kill.shards, c.kill.reowned_ms, c.ttl_ms, c.kill.lapse_ms
            );
        }
        if let Some(l) = &self.leave {
            let e = &l.electors;
            let _ = writeln!(
                out,
                "leave: {} members, {} shards; one with {} shards leaves: {} moved; per moved \
                 shard {:.1} acquires, {:.1} calls on its role; handover p50 {:.2}ms p99 {:.2}ms; \
                 statements {} (quiet window of the same length: {})",
                l.members,
                l.shards,
                l.leaver_shards,
                l.moved,
                l.acquires_per_moved,
                l.role_calls_per_moved,
                l.handover.p50_us / 1e3,
                l.handover.p99_us / 1e3,
                opt(l.statements),
                opt(l.background_statements),
            );
            let _ = writeln!(
                out,
                "  beside {} electors on one role, the leader leaves: {:.1} calls on the role, \
                 handover {:.2}ms; statements {} (quiet: {})",
                e.electors,
                e.role_calls,
                e.handover_ms,
                opt(e.statements),
                opt(e.background_statements),
            );
        }
        for failure in &self.failed {
            let _ = writeln!(out, "failed: {failure}");
        }
        out
    }
}
