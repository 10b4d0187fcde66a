//! Human output: aligned tables and durations in human units, and a report printed as
//! a table or (`--json`) as JSON.

use std::time::Duration;

/// Prints a report on stdout: pretty JSON with `--json`, otherwise `render()`'s table.
pub fn print_report(
    report: &impl serde::Serialize,
    json: bool,
    render: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", render());
    }
    Ok(())
}

/// `850ms`, `12.3s`, `4m05s`, `2h01m`, `3d04h`.
pub fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    let secs = duration.as_secs();
    match secs {
        _ if ms < 1_000 => format!("{ms}ms"),
        0..=59 => format!("{:.1}s", duration.as_secs_f64()),
        60..=3_599 => format!("{}m{:02}s", secs / 60, secs % 60),
        3_600..=86_399 => format!("{}h{:02}m", secs / 3_600, (secs % 3_600) / 60),
        _ => format!("{}d{:02}h", secs / 86_400, (secs % 86_400) / 3_600),
    }
}

/// Prints rows under a header, each column as wide as its widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(human(Duration::from_secs(245)), "4m05s");
        assert_eq!(human(Duration::from_secs(7_260)), "2h01m");
        assert_eq!(human(Duration::from_secs(3 * 86_400 + 4 * 3_600)), "3d04h");
    }

    #[test]
    fn tables_align() {
        let out = table(
            &["ROLE", "HOLDER"],
            &[
                vec!["a".into(), "node-1".into()],
                vec!["longer".into(), "x".into()],
            ],
        );
        assert_eq!(out, "ROLE    HOLDER\na       node-1\nlonger  x\n");
    }
}
