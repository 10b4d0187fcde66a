//! Small self-contained SVG charts (points and lines on linear or log axes) for the
//! `--report` pages of `tenure bench` and `tenure chaos`.
//!
//! The output has no scripts, fonts or links to fetch: a report directory opens the
//! same offline as on the machine that wrote it. Text is escaped, so a label can hold
//! any string.

use std::fmt::Write as _;

/// How an axis maps values to positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Evenly spaced values.
    Linear,
    /// Powers of ten evenly spaced (values must be positive; others are clamped to the
    /// axis minimum).
    Log10,
}

/// One axis: its range, scale, title and (optionally) its own tick labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The axis title, with its unit.
    pub label: String,
    /// Smallest value shown.
    pub min: f64,
    /// Largest value shown.
    pub max: f64,
    /// The mapping.
    pub scale: Scale,
    /// Ticks to draw instead of the computed ones: `(value, label)`.
    pub ticks: Option<Vec<(f64, String)>>,
}

impl Axis {
    /// A linear axis over `min..max` with computed ticks.
    pub fn linear(label: impl Into<String>, min: f64, max: f64) -> Self {
        let max = if max > min { max } else { min + 1.0 };
        Axis {
            label: label.into(),
            min,
            max,
            scale: Scale::Linear,
            ticks: None,
        }
    }

    /// A log axis widened to whole powers of ten around `min..max`.
    pub fn log10(label: impl Into<String>, min: f64, max: f64) -> Self {
        let lo = min.max(f64::MIN_POSITIVE).log10().floor();
        let hi = max
            .max(min)
            .max(f64::MIN_POSITIVE)
            .log10()
            .ceil()
            .max(lo + 1.0);
        Axis {
            label: label.into(),
            min: 10f64.powf(lo),
            max: 10f64.powf(hi),
            scale: Scale::Log10,
            ticks: None,
        }
    }

    /// Where `v` falls, from 0 (min) to 1 (max).
    fn fraction(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear => (v - self.min) / (self.max - self.min),
            Scale::Log10 => {
                let v = v.max(self.min);
                (v.log10() - self.min.log10()) / (self.max.log10() - self.min.log10())
            }
        }
    }

    /// The ticks drawn: the given ones, or round values over the range (1, 2 and 5 per
    /// decade on a log axis).
    pub fn tick_marks(&self) -> Vec<(f64, String)> {
        if let Some(ticks) = &self.ticks {
            return ticks.clone();
        }
        match self.scale {
            Scale::Linear => {
                let step = nice_step((self.max - self.min) / 6.0);
                let mut v = (self.min / step).ceil() * step;
                let mut out = Vec::new();
                while v <= self.max + step * 1e-9 {
                    out.push((v, number(v)));
                    v += step;
                }
                out
            }
            Scale::Log10 => {
                let mut out = Vec::new();
                let mut decade = self.min;
                while decade <= self.max * (1.0 + 1e-9) {
                    for m in [1.0, 2.0, 5.0] {
                        let v = decade * m;
                        if v <= self.max * (1.0 + 1e-9) {
                            out.push((v, number(v)));
                        }
                    }
                    decade *= 10.0;
                }
                out
            }
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * power)
}

/// A tick label without trailing zeros.
pub fn number(v: f64) -> String {
    if v.abs() >= 1e6 && v.fract().abs() < 1e-9 {
        format!("{}M", number(v / 1e6))
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// A solid line through the points.
    Line,
    /// A dashed line through the points.
    Dashed,
    /// A dot per point.
    Dots,
    /// A cross per point.
    Crosses,
}

/// One named set of points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Its legend entry.
    pub name: String,
    /// A CSS colour.
    pub colour: String,
    /// How it is drawn.
    pub style: Style,
    /// `(x, y)` in axis units.
    pub points: Vec<(f64, f64)>,
    /// A tooltip per point (same length as `points`, or empty).
    pub titles: Vec<String>,
}

/// A chart: two axes, series, and horizontal reference lines.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// The heading.
    pub title: String,
    /// Lines under the heading (settings, what the figure means), split at `\n`.
    pub subtitle: String,
    /// The horizontal axis.
    pub x: Axis,
    /// The vertical axis.
    pub y: Axis,
    /// What is plotted.
    pub series: Vec<Series>,
    /// Dotted horizontal lines: `(y, label)`.
    pub rules: Vec<(f64, String)>,
}

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 210.0;
/// Characters of 12 px text that fit across the chart.
const LINE_CHARS: usize = 120;
const BOTTOM: f64 = 60.0;

/// Escapes text for SVG/HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

impl Chart {
    /// The chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let subtitle = wrap(&self.subtitle, LINE_CHARS);
        let top = 58.0 + 16.0 * subtitle.len() as f64;
        let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - top - BOTTOM);
        let px = |v: f64| LEFT + self.x.fraction(v).clamp(0.0, 1.0) * pw;
        let py = |v: f64| top + (1.0 - self.y.fraction(v).clamp(0.0, 1.0)) * ph;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            s,
            r##"<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{}</text>"#,
            escape(&self.title)
        );
        for (i, line) in subtitle.iter().enumerate() {
            let _ = writeln!(
                s,
                r##"<text x="{LEFT}" y="{}" fill="#555">{}</text>"##,
                44 + 16 * i,
                escape(line)
            );
        }
        // Grid and ticks.
        for (v, label) in self.x.tick_marks() {
            let x = px(v);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#e4e4e4"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                top + ph,
                top + ph + 18.0,
                escape(&label)
            );
        }
        for (v, label) in self.y.tick_marks() {
            let y = py(v);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                escape(&label)
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            HEIGHT - 14.0,
            escape(&self.x.label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            top + ph / 2.0,
            escape(&self.y.label)
        );
        for (v, label) in &self.rules {
            let y = py(*v);
            let _ = writeln!(
                s,
                r##"<line class="rule" x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#444" stroke-dasharray="2 3"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{}</text>"##,
                LEFT + pw,
                LEFT + pw - 4.0,
                y - 4.0,
                escape(label)
            );
        }
        for series in &self.series {
            let colour = escape(&series.colour);
            match series.style {
                Style::Line | Style::Dashed => {
                    let path: Vec<String> = series
                        .points
                        .iter()
                        .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                        .collect();
                    let dash = if series.style == Style::Dashed {
                        r#" stroke-dasharray="6 4""#
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        s,
                        r#"<polyline class="series" fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"><title>{}</title></polyline>"#,
                        path.join(" "),
                        escape(&series.name)
                    );
                }
                Style::Dots | Style::Crosses => {
                    for (i, &(x, y)) in series.points.iter().enumerate() {
                        let title = series.titles.get(i).unwrap_or(&series.name);
                        let (x, y) = (px(x), py(y));
                        let shape = if series.style == Style::Dots {
                            format!(
                                r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{colour}" fill-opacity="0.8"/>"#
                            )
                        } else {
                            format!(
                                r#"<path d="M{:.1} {:.1}l10 10m0 -10l-10 10" stroke="{colour}" stroke-width="2"/>"#,
                                x - 5.0,
                                y - 5.0
                            )
                        };
                        let _ = writeln!(
                            s,
                            r#"<g class="point">{shape}<title>{}</title></g>"#,
                            escape(title)
                        );
                    }
                }
            }
        }
        // Legend, right of the plot.
        let lx = LEFT + pw + 16.0;
        for (i, series) in self.series.iter().enumerate() {
            let y = top + 10.0 + i as f64 * 20.0;
            let colour = escape(&series.colour);
            let mark = match series.style {
                Style::Line => format!(
                    r#"<line x1="{lx}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="2"/>"#,
                    lx + 24.0
                ),
                Style::Dashed => format!(
                    r#"<line x1="{lx}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="2" stroke-dasharray="6 4"/>"#,
                    lx + 24.0
                ),
                Style::Dots => format!(
                    r#"<circle cx="{}" cy="{y}" r="4" fill="{colour}"/>"#,
                    lx + 12.0
                ),
                Style::Crosses => format!(
                    r#"<path d="M{} {}l10 10m0 -10l-10 10" stroke="{colour}" stroke-width="2"/>"#,
                    lx + 7.0,
                    y - 5.0
                ),
            };
            let _ = writeln!(
                s,
                r#"{mark}<text x="{}" y="{}">{}</text>"#,
                lx + 30.0,
                y + 4.0,
                escape(&series.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Splits `text` at its newlines, then at spaces so no line is longer than `width`
/// characters (a longer word stays whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for paragraph in text.lines() {
        let mut line = String::new();
        for word in paragraph.split(' ') {
            if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(series: Vec<Series>) -> Chart {
        Chart {
            title: "t <&>".to_owned(),
            subtitle: String::new(),
            x: Axis::linear("x (s)", 0.0, 10.0),
            y: Axis::log10("y (ms)", 3.0, 700.0),
            series,
            rules: vec![(100.0, "ttl".to_owned())],
        }
    }

    #[test]
    fn log_axes_widen_to_decades_and_map_monotonically() {
        let y = Axis::log10("y", 3.0, 700.0);
        assert_eq!((y.min, y.max), (1.0, 1000.0));
        assert_eq!(y.fraction(1.0), 0.0);
        assert!((y.fraction(1000.0) - 1.0).abs() < 1e-12);
        assert!((y.fraction(10.0) - 1.0 / 3.0).abs() < 1e-12);
        // Non-positive values sit on the floor instead of producing NaN.
        assert_eq!(y.fraction(0.0), 0.0);
        let labels: Vec<String> = y.tick_marks().into_iter().map(|t| t.1).collect();
        assert_eq!(labels[..4], ["1", "2", "5", "10"]);
        assert_eq!(labels.last().map(String::as_str), Some("1000"));
    }

    #[test]
    fn subtitles_wrap_at_spaces() {
        assert_eq!(wrap("ab cd ef\ngh", 5), ["ab cd", "ef", "gh"]);
        assert_eq!(wrap("abcdefgh ij", 4), ["abcdefgh", "ij"]);
        assert_eq!(number(2e6), "2M");
        assert_eq!(number(0.25), "0.25");
    }

    #[test]
    fn linear_ticks_are_round_numbers() {
        let ticks: Vec<String> = Axis::linear("x", 0.0, 23.0)
            .tick_marks()
            .into_iter()
            .map(|t| t.1)
            .collect();
        assert_eq!(ticks, ["0", "5", "10", "15", "20"]);
        assert_eq!(nice_step(0.13), 0.2);
        // A degenerate range still has a width.
        let flat = Axis::linear("x", 4.0, 4.0);
        assert!(flat.max > flat.min);
    }

    #[test]
    fn svg_escapes_text_and_draws_every_point() {
        let svg = chart(vec![
            Series {
                name: "a</title><script>".to_owned(),
                colour: "#c00".to_owned(),
                style: Style::Dots,
                points: vec![(1.0, 5.0), (2.0, 50.0), (3.0, 500.0)],
                titles: vec![],
            },
            Series {
                name: "b".to_owned(),
                colour: "#00c".to_owned(),
                style: Style::Dashed,
                points: vec![(1.0, 5.0), (9.0, 9.0)],
                titles: vec![],
            },
        ])
        .to_svg();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(!svg.contains("<script>"), "{svg}");
        assert!(svg.contains("t &lt;&amp;&gt;"));
        assert_eq!(svg.matches("class=\"point\"").count(), 3);
        assert_eq!(svg.matches("class=\"series\"").count(), 1);
        assert_eq!(svg.matches("class=\"rule\"").count(), 1);
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
