//! A host wall-clock step (an NTP step, `date -s`) under two real `tenure run` processes
//! on one SQLite file must not let both run their command at once; on Kubernetes, neither
//! may a contender's wall clock stepped by minutes.
//!
//! Both processes run under libfaketime reading one offset file, with the monotonic clock
//! left alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`), which is what a real step does: the
//! wall clock jumps, `CLOCK_MONOTONIC` (every local deadline) does not. libfaketime is
//! required: without it this test fails naming the package, it never skips.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use common::{lines, run_sh_with, sqlite_url, tempdir, wait_until, Proc};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tenure_chaos::faketime::FakeTime;

/// The wall clock of every process started through [`Faked::apply`] is the real one
/// plus the offset in one file, re-read on every call; the monotonic clock is untouched.
struct Faked(FakeTime);

impl Faked {
    fn new(dir: &Path) -> Faked {
        match FakeTime::new(dir.join("faketime-offset")) {
            Ok(fake) => Faked(fake),
            // The message names the package `libfaketime`: a missing tool fails the test.
            Err(error) => panic!("{error}"),
        }
    }

    fn set_offset(&self, offset_ms: i64) {
        self.0.set_offset(offset_ms).expect("write the offset file");
    }

    fn apply(&self, command: &mut Command) {
        command.envs(self.0.env());
    }

    /// How far the faked wall clock is ahead of the real one, in whole seconds, as
    /// `date` sees it under the preload (so the test cannot pass with a faketime that
    /// does nothing).
    fn measured_offset(&self) -> i64 {
        let mut date = Command::new("date");
        date.arg("+%s");
        self.apply(&mut date);
        let output = date.output().expect("run date under libfaketime");
        assert!(output.status.success(), "date failed: {output:?}");
        let faked: i64 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("date +%s prints seconds");
        let real = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        faked - i64::try_from(real).unwrap()
    }
}

/// On drop, kills the process group of every command whose pid is in `dir/*.pid`
/// (a `tenure` killed by a failing test would leave its command's group running).
struct KillCommands(PathBuf);

impl Drop for KillCommands {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.0) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.path().extension().is_some_and(|e| e == "pid") {
                if let Ok(Ok(pid)) =
                    std::fs::read_to_string(entry.path()).map(|s| s.trim().parse::<i32>())
                {
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
    }
}

/// One run of the command, from the log lines `start TOKEN UPTIME` and `end TOKEN UPTIME`
/// (uptime from `/proc/uptime`, which libfaketime does not fake).
#[derive(Debug)]
struct Interval {
    token: u64,
    start: f64,
    end: Option<f64>,
}

fn intervals(log: &[String]) -> Vec<Interval> {
    let mut out: Vec<Interval> = Vec::new();
    for line in log {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [what, token, at] = words.as_slice() else {
            panic!("bad log line {line:?} in {log:#?}");
        };
        let token: u64 = token.parse().expect("token");
        let at: f64 = at.parse().expect("uptime");
        match *what {
            "start" => out.push(Interval {
                token,
                start: at,
                end: None,
            }),
            "end" => {
                let run = out
                    .iter_mut()
                    .find(|run| run.token == token && run.end.is_none())
                    .unwrap_or_else(|| panic!("end without start: {log:#?}"));
                run.end = Some(at);
            }
            other => panic!("bad log line {other:?}"),
        }
    }
    out
}

/// The seconds during which two runs overlapped (a run not yet ended counts until `now`).
fn overlap(runs: &[Interval], now: f64) -> f64 {
    let mut total: f64 = 0.0;
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            let start = a.start.max(b.start);
            let end = a.end.unwrap_or(now).min(b.end.unwrap_or(now));
            total += (end - start).max(0.0);
        }
    }
    total
}

fn uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Setup: two `tenure run --ttl 6s --renew-every 2s --retry-every 500ms --kill-after 1s`
/// on one SQLite file, both under libfaketime with one offset file. One second after the
/// first command starts, the wall clock steps forward 20 s (more than three TTLs).
/// Over the next 8 s the second must not start its command while the first's still
/// runs; the first keeps its term (its monotonic deadlines and the store agree). Then
/// both are stopped with SIGTERM (the follower first) and the whole log is checked again.
#[test]
fn wall_clock_step_forward_does_not_overlap_commands() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    steps_change_nothing(&store, dir.path(), Faking::Both, &[(20_000, 8)]);
}

/// On Kubernetes only clock rates matter: the leader's wall clock steps five minutes
/// forward, then ten back (to five minutes behind the other's), while it leads; nothing
/// changes (no overlap, the leader keeps its term). Its renewals write `renewTime` from
/// that clock, so the other contender reads renewal times five minutes in the future,
/// then five minutes in the past: one that compared them with its own clock would take
/// over at once. tenure never reads them.
#[cfg(feature = "kube")]
#[test]
fn kube_contender_wall_clock_steps_by_minutes_change_nothing() {
    let dir = tempdir();
    let server = tenure_testkit::kube::KubeServer::shared().expect("shared kube-apiserver");
    let namespace = server.new_namespace("clock-step").expect("namespace");
    let kubeconfig = server.tenant_kubeconfig(&namespace).expect("kubeconfig");
    let _ = common::KUBECONFIG.set(kubeconfig);
    let store = format!("kube:{namespace}");
    steps_change_nothing(
        &store,
        dir.path(),
        Faking::FirstOnly,
        &[(300_000, 8), (-300_000, 8)],
    );
}

/// Which of the two `tenure run` processes run under libfaketime.
#[derive(Clone, Copy, PartialEq)]
enum Faking {
    Both,
    FirstOnly,
}

/// Two `tenure run --ttl 6s` on `store`; once the first's command runs, the faked wall
/// clock is set to each `(offset_ms, seconds)` in turn and watched that many seconds:
/// the second never starts its command while the first's runs, and the first keeps its
/// term throughout. Then both stop (the follower first) and the whole log is checked.
fn steps_change_nothing(store: &str, dir: &Path, faking: Faking, steps: &[(i64, u64)]) {
    let faked = Faked::new(dir);
    let before = faked.measured_offset();
    assert!(
        before.abs() <= 2,
        "with offset +0s the faked clock is {before} s off"
    );
    let _cleanup = KillCommands(dir.to_owned());
    let log = dir.join("runs.log");
    // A bounded loop (60 s) rather than `sleep infinity`, so nothing outlives a broken run.
    let script = format!(
        "up() {{ cut -d' ' -f1 /proc/uptime; }}; \
         echo $$ > '{dir}/cmd-$TENURE_FENCING_TOKEN.pid'; \
         echo \"start $TENURE_FENCING_TOKEN $(up)\" >> '{log}'; \
         trap 'echo \"end $TENURE_FENCING_TOKEN $(up)\" >> \"{log}\"; exit 0' TERM; \
         i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
        dir = dir.display(),
        log = log.display()
    );
    let flags = [
        "--ttl",
        "6s",
        "--renew-every",
        "2s",
        "--retry-every",
        "500ms",
        "--kill-after",
        "1s",
    ];
    let spawn = |fake: bool| {
        let mut command = run_sh_with(store, "r", &flags, &script);
        if fake {
            faked.apply(&mut command);
        }
        Proc::spawn(&mut command)
    };
    let mut first = spawn(true);
    assert!(
        wait_until(Duration::from_secs(30), || !lines(&log).is_empty()),
        "the first tenure run never started its command; stderr:\n{}",
        first.stderr()
    );
    let mut second = spawn(faking == Faking::Both);
    tracing_phase("the first leads; the second contends");
    thread::sleep(Duration::from_secs(1));
    assert!(
        second.exited().is_none(),
        "the second tenure run exited: {}",
        second.stderr()
    );

    for &(offset_ms, watch_secs) in steps {
        tracing_phase(&format!("the wall clock is set {offset_ms} ms off"));
        faked.set_offset(offset_ms);
        let after = faked.measured_offset();
        let expected = offset_ms / 1000;
        assert!(
            (expected - 2..=expected + 2).contains(&after),
            "libfaketime did not step the clock: {after} s off after writing {offset_ms} ms"
        );
        let stepped_at = Instant::now();
        let mut worst = 0.0_f64;
        while stepped_at.elapsed() < Duration::from_secs(watch_secs) {
            let runs = intervals(&lines(&log));
            worst = worst.max(overlap(&runs, uptime()));
            assert!(
                worst == 0.0,
                "two commands ran at once for {worst:.2} s after the wall clock stepped: \
                 {runs:#?}\nfirst:\n{}\nsecond:\n{}",
                first.stderr(),
                second.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
        let runs = intervals(&lines(&log));
        assert_eq!(
            runs.len(),
            1,
            "the step must not end the first term: {runs:#?}\nfirst:\n{}\nsecond:\n{}",
            first.stderr(),
            second.stderr()
        );
    }

    // The follower first, so no command is starting while its tenure is told to stop.
    tracing_phase("both stop; the log is checked whole");
    for proc in [&mut second, &mut first] {
        proc.signal(Signal::SIGTERM);
        assert!(
            proc.wait_exit(Duration::from_secs(20)).is_some(),
            "tenure did not stop on SIGTERM: {}",
            proc.stderr()
        );
    }
    let runs = intervals(&lines(&log));
    assert!(runs.iter().all(|run| run.end.is_some()), "{runs:#?}");
    assert_eq!(overlap(&runs, uptime()), 0.0, "{runs:#?}");
}

/// Marks a phase in the test output (shown on failure).
fn tracing_phase(phase: &str) {
    eprintln!("--- {phase}");
}
