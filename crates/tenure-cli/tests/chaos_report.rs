//! `--report DIR` of `tenure chaos` and `tenure bench`, checked in a real browser: a
//! short real chaos run on SQLite writes `timeline.html`, headless Chromium loads it from
//! disk and the rendered DOM must hold one lane per worker incarnation, one rectangle
//! per term, one marker per fault and one red tick per refused write, with no script
//! error; a screenshot is kept in the target directory's test scratch space. The bench's latency plots must
//! open as SVG. A bad DIR is a usage error before anything runs.
//!
//! Chromium is the Debian `chromium` package, installed by `scripts/test`; without it
//! these tests fail (they are never skipped).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{output_within, tempdir, tenure, Proc};
use serde_json::Value;

/// How long one headless Chromium run may take before it is killed.
const BROWSER_LIMIT: Duration = Duration::from_secs(90);

/// The browser, or a failure that says how to get it.
fn chromium() -> PathBuf {
    let fixed = Path::new("/usr/bin/chromium");
    if fixed.is_file() {
        return fixed.to_owned();
    }
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("chromium"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "chromium not found (/usr/bin/chromium or on PATH): run scripts/test, which \
             installs the Debian chromium package, or apt-get install chromium"
        )
    })
}

/// Runs headless Chromium on `url` with `extra` flags (as root, on a closed network: no
/// sandbox, no background fetches, a fresh profile); returns its stdout. Killed, with
/// every process it started, if it runs past [`BROWSER_LIMIT`].
fn headless(url: &str, extra: &[String], scratch: &Path) -> String {
    let profile = tempfile::Builder::new()
        .prefix("chromium-profile-")
        .tempdir_in(scratch)
        .expect("profile dir");
    let mut command = Command::new(chromium());
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdin(std::process::Stdio::null());
    let started = Instant::now();
    let proc = Proc::spawn_in_own_group(&mut command);
    let output = proc.finish(BROWSER_LIMIT);
    assert!(
        output.status.success(),
        "chromium {extra:?} {url} failed ({:?} after {:?}): {}",
        output.status,
        started.elapsed(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The data the page renders, read back from its `<script type="application/json">`.
fn page_data(html: &str) -> Value {
    let open = r#"<script type="application/json" id="timeline-data">"#;
    let start = html.find(open).expect("the page embeds its data") + open.len();
    let end = start + html[start..].find("</script>").expect("data block ends");
    serde_json::from_str(&html[start..end]).expect("the embedded data is JSON")
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

fn array_len(v: &Value, path: &str) -> usize {
    v.pointer(path)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{path} missing"))
        .len()
}

/// The length of every lane's `key` array, summed over the timeline's lanes.
fn per_lane_total(timeline: &Value, key: &str) -> usize {
    timeline["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l[key].as_array().unwrap().len())
        .sum()
}

fn num(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

/// Runs `tenure ARGS... --report DIR` (ARGS with `--json`; DIR named `name` in a fresh
/// scratch directory, which is also its `TMPDIR`) to a successful end within `within`,
/// and checks that DIR's report.json is the report printed. Returns the scratch
/// directory, DIR, stderr and the report.
fn run_with_report(
    args: &[&[&str]],
    name: &str,
    within: Duration,
) -> (tempfile::TempDir, PathBuf, String, Value) {
    let scratch = tempdir();
    let dir = scratch.path().join(name);
    let mut command = tenure();
    command
        .args(args.concat())
        .arg("--report")
        .arg(&dir)
        .env("TMPDIR", scratch.path());
    let output = output_within(&mut command, within);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let printed: Value = serde_json::from_slice(&output.stdout).expect("--json report");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap())
            .expect("report.json is JSON");
    assert_eq!(report, printed, "report.json is what --json prints");
    (scratch, dir, stderr, report)
}

/// A 4-second SQLite run with pauses and kills; Chromium renders its timeline.
#[test]
fn chaos_timeline_renders_every_incarnation_term_and_fault_in_chromium() {
    let (scratch, dir, stderr, report) = run_with_report(
        &[
            &["chaos", "--json", "--store", "sqlite:throwaway"],
            &["--workers", "4", "--duration", "4s", "--ttl", "1s"],
            &["--faults", "pause,kill", "--fault-every", "300ms"],
            &["--seed", "15"],
        ],
        "report",
        Duration::from_secs(120),
    );
    assert!(stderr.contains("report written to"), "{stderr}");
    for kind in ["pause", "kill"] {
        assert!(
            num(&report, &format!("/faults/{kind}")) > 0,
            "no {kind} injected"
        );
        let svg = std::fs::read_to_string(dir.join(format!("recovery-{kind}.svg")))
            .unwrap_or_else(|e| panic!("recovery-{kind}.svg: {e}"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }

    let html = std::fs::read_to_string(dir.join("timeline.html")).unwrap();
    // Self-contained: nothing to fetch from anywhere.
    for remote in ["http://", "https://", "//cdn", "@import", "<link"] {
        let outside_svg_ns = html.replace("http://www.w3.org/2000/svg", "");
        assert!(
            !outside_svg_ns.contains(remote),
            "the page refers to {remote}"
        );
    }
    let data = page_data(&html);
    let timeline = &data["timeline"];
    let lanes = array_len(timeline, "/lanes");
    let terms = per_lane_total(timeline, "terms");
    let refused = per_lane_total(timeline, "refused_ms");
    let faults = array_len(timeline, "/faults");
    // Every slot's first incarnation, plus at most one more per kill.
    let workers = num(&report, "/workers") as usize;
    let kills = num(&report, "/faults/kill") as usize;
    assert!(
        (workers..=workers + kills + num(&report, "/unexpected_exits") as usize).contains(&lanes),
        "{lanes} lanes for {workers} workers and {kills} kills"
    );
    assert_eq!(faults as u64, num(&report, "/faults_total"));
    assert_eq!(refused as u64, num(&report, "/writes/refused"));
    let mut tokens: Vec<u64> = timeline["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["terms"].as_array().unwrap())
        .map(|t| t["token"].as_u64().unwrap())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len() as u64, num(&report, "/terms"));
    assert!(terms > 0, "no term in {timeline}");

    let url = format!("file://{}", dir.join("timeline.html").display());
    let dom = headless(&url, &["--dump-dom".to_owned()], scratch.path());
    let body = dom
        .find("<body")
        .map(|at| &dom[at..at + dom[at..].find('>').unwrap_or(0)])
        .unwrap_or_else(|| panic!("no body in the dumped DOM: {dom}"));
    assert!(!body.contains("data-error"), "script error: {body}");
    assert!(
        body.contains(r#"data-rendered="ok""#),
        "not rendered: {body}"
    );
    assert_eq!(count(&dom, r#"class="lane""#), lanes, "lanes");
    assert_eq!(count(&dom, r#"class="term""#), terms, "term rectangles");
    assert_eq!(count(&dom, r#"class="fault""#), faults, "fault markers");
    assert_eq!(count(&dom, r#"class="refused""#), refused, "refused ticks");

    // Under the target directory's scratch space, so the picture outlives the test.
    let png = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chaos-timeline.png");
    let _ = std::fs::remove_file(&png);
    headless(
        &url,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1400,900".to_owned(),
        ],
        scratch.path(),
    );
    let bytes = std::fs::read(&png).expect("the screenshot was written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // A blank 1400x900 page compresses to a few kilobytes; lanes and text do not.
    assert!(bytes.len() > 20_000, "screenshot of {} bytes", bytes.len());
    println!("screenshot kept at {}", png.display());
}

/// `tenure bench --report` on the in-memory store: one latency plot per operation,
/// store against raw at each client count, valid enough for Chromium to render.
#[test]
fn bench_report_plots_store_against_raw_per_operation() {
    let (scratch, dir, _, _) = run_with_report(
        &[
            &["bench", "--store", "memory:", "--json"],
            &["--duration", "100ms", "--trials", "5", "--clients", "1,3"],
        ],
        "bench-report",
        Duration::from_secs(240),
    );
    for op in ["acquire", "renew", "release", "heartbeat"] {
        let path = dir.join(format!("latency-{op}.svg"));
        let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{op}: {e}"));
        // Store and raw at each of the two client counts.
        assert_eq!(count(&svg, r#"class="series""#), 4, "{op}: {svg}");
        for legend in ["store, 1 clients", "raw, 1 clients", "store, 3 clients"] {
            assert!(svg.contains(legend), "{op}: no {legend:?}");
        }
        let dom = headless(
            &format!("file://{}", path.display()),
            &["--dump-dom".to_owned()],
            scratch.path(),
        );
        assert!(!dom.contains("parsererror"), "{op}: {dom}");
        assert_eq!(count(&dom, r#"class="series""#), 4, "{op} rendered: {dom}");
    }
}

/// A DIR that is a file, or cannot be created, is exit 2 naming `--report`, before the
/// run starts (nothing else is created).
#[test]
fn a_report_dir_that_cannot_be_one_is_a_usage_error() {
    let scratch = tempdir();
    let file = scratch.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under_file = file.join("sub");
    let runs: [&[&str]; 2] = [
        &["chaos", "--store", "sqlite:throwaway", "--duration", "30s"],
        &["bench", "--store", "memory:"],
    ];
    for run in runs {
        for dir in [&file, &under_file] {
            let mut command = tenure();
            command
                .args(run)
                .arg("--report")
                .arg(dir)
                .env("TMPDIR", scratch.path());
            let started = Instant::now();
            let output = common::assert_usage_error(
                &mut command,
                &(run, dir),
                "--report",
                Duration::from_secs(30),
            );
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(stderr.contains(&*dir.to_string_lossy()), "{stderr}");
            assert!(output.stdout.is_empty());
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the run started"
            );
        }
    }
    assert_eq!(common::tree(scratch.path()), [PathBuf::from("a-file")]);
}
