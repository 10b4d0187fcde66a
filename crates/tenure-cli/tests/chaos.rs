//! `tenure chaos` end to end: real worker processes, a seeded nemesis and the checker,
//! on SQLite and on a throwaway PostgreSQL server, plus the negative control that proves
//! the checker can fail.
//!
//! Sized for CI: TTL 1 s, a fault every 250 ms on average; the passing rounds inject
//! well over 200 faults between them. Each run prints its report (visible with
//! `--nocapture`).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tenure");

/// Runs `tenure chaos --json ARGS`; returns the exit code and the report. Kills the run
/// if it overstays its duration by far (a hang is a failure, not a wait).
fn chaos(args: &[&str], limit: Duration) -> (i32, Value) {
    let mut child = Command::new(BIN)
        .arg("chaos")
        .arg("--json")
        .args(args)
        .env_remove("TENURE_STORE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        out
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tenure chaos {args:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = reader.join().unwrap();
    let report: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not a JSON report ({e}): {out}"));
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    (status.code().unwrap_or(-1), report)
}

fn violations(report: &Value) -> u64 {
    report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["count"].as_u64().unwrap())
        .sum()
}

fn violation_kinds(report: &Value) -> Vec<String> {
    report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// Every injected fault kind was followed by an admitted write before the run ended.
fn assert_recovered(report: &Value) {
    for (kind, recovery) in report["recovery"].as_object().unwrap() {
        assert_eq!(
            recovery["unrecovered"].as_u64(),
            Some(0),
            "after some {kind} faults no write was ever admitted again: {recovery}"
        );
    }
}

/// SQLite, 5 workers, 25 s of pauses, kills and kills-mid-transaction (a fault every
/// 200 ms): no violation, fenced writes flow, and a write is admitted after every fault
/// (the store never wedges: see `tenure_chaos::backend::DetachedLeases`).
#[test]
fn sqlite_round_passes() {
    let (code, report) = chaos(
        &[
            "--store",
            "sqlite:throwaway",
            "--workers",
            "5",
            "--duration",
            "25s",
            "--ttl",
            "1s",
            "--fault-every",
            "200ms",
            "--faults",
            "pause,kill,restart",
            "--seed",
            "11",
        ],
        Duration::from_secs(90),
    );
    assert_eq!(violations(&report), 0, "{:?}", violation_kinds(&report));
    assert_eq!(code, 0);
    assert!(
        report["faults_total"].as_u64().unwrap() >= 80,
        "too few faults"
    );
    for kind in ["pause", "kill", "restart"] {
        assert!(
            report["faults"][kind].as_u64().unwrap() > 0,
            "no {kind} fault"
        );
    }
    assert!(report["writes"]["admitted"].as_u64().unwrap() >= 50);
    assert!(
        report["terms"].as_u64().unwrap() >= 3,
        "leadership never moved"
    );
    assert_eq!(
        report["writes"]["log_rows"].as_u64().unwrap(),
        report["writes"]["admitted"].as_u64().unwrap()
            + report["writes"]["unknown_committed"].as_u64().unwrap()
    );
    assert_recovered(&report);
}

/// Pauses only, one every 800 ms, so most hit the current leader.
const PAUSES_SQLITE: [&str; 14] = [
    "--store",
    "sqlite:throwaway",
    "--workers",
    "4",
    "--duration",
    "15s",
    "--ttl",
    "1s",
    "--fault-every",
    "800ms",
    "--faults",
    "pause",
    "--seed",
    "9",
];

/// The negative control: the same plan with workers writing without the fence. The
/// stalled leaders' late writes land after their successors' and the run must fail
/// (exit 1) with log-order violations, naming the seed and keeping its histories.
#[test]
fn sqlite_without_the_fence_is_caught() {
    let mut args = PAUSES_SQLITE.to_vec();
    args.push("--unsafe-skip-fence");
    let (code, report) = chaos(&args, Duration::from_secs(60));
    assert_eq!(code, 1);
    assert!(violations(&report) > 0);
    assert!(violation_kinds(&report).contains(&"log_order".to_owned()));
    assert_eq!(report["seed"].as_u64(), Some(9));
    assert!(
        report["run_dir"].is_string(),
        "a failed run keeps its histories"
    );
    let _ = std::fs::remove_dir_all(report["run_dir"].as_str().unwrap());
}

/// A throwaway PostgreSQL server owned by the run: pauses, kills, server restarts and
/// `pg_terminate_backend` cuts, with no violation, and a write admitted after every
/// fault.
#[test]
fn postgres_round_passes() {
    let (code, report) = chaos(
        &[
            "--store",
            "postgres:throwaway",
            "--workers",
            "5",
            "--duration",
            "25s",
            "--ttl",
            "1s",
            "--fault-every",
            "200ms",
            "--seed",
            "13",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(violations(&report), 0, "{:?}", violation_kinds(&report));
    assert_eq!(code, 0);
    assert!(
        report["faults_total"].as_u64().unwrap() >= 80,
        "too few faults"
    );
    for kind in ["pause", "kill", "restart", "cut"] {
        assert!(
            report["faults"][kind].as_u64().unwrap() > 0,
            "no {kind} fault"
        );
    }
    assert!(report["writes"]["admitted"].as_u64().unwrap() >= 100);
    assert_recovered(&report);
}

/// The stalled-leader plan of the PostgreSQL negative control, with the fence: paused
/// leaders wake and write with their old token, the fence refuses them, and the run
/// passes.
#[test]
fn postgres_paused_leaders_are_fenced_out() {
    let (code, report) = chaos(&PAUSES_POSTGRES, Duration::from_secs(60));
    assert_eq!(violations(&report), 0, "{:?}", violation_kinds(&report));
    assert_eq!(code, 0);
    assert!(
        report["writes"]["refused"].as_u64().unwrap() >= 1,
        "no stale write ever reached the fence"
    );
}

/// Pauses only on a throwaway PostgreSQL server, one every 800 ms.
const PAUSES_POSTGRES: [&str; 14] = [
    "--store",
    "postgres:throwaway",
    "--workers",
    "4",
    "--duration",
    "12s",
    "--ttl",
    "1s",
    "--fault-every",
    "800ms",
    "--faults",
    "pause",
    "--seed",
    "5",
];

/// The negative control on PostgreSQL, where unfenced writers do not even serialise.
#[test]
fn postgres_without_the_fence_is_caught() {
    let mut args = PAUSES_POSTGRES.to_vec();
    args.push("--unsafe-skip-fence");
    let (code, report) = chaos(&args, Duration::from_secs(60));
    assert_eq!(code, 1);
    assert!(violations(&report) > 0);
    assert!(violation_kinds(&report).contains(&"log_order".to_owned()));
    let _ = std::fs::remove_dir_all(report["run_dir"].as_str().unwrap());
}

/// Stores and faults it cannot drive are usage errors (exit 2), before anything starts.
#[test]
fn bad_chaos_flags_are_usage_errors() {
    for args in [
        &["--store", "etcd:throwaway"][..],
        &["--store", "sqlite:throwaway", "--faults", "pause,bogus"],
        &["--store", "sqlite:throwaway", "--faults", "cut"],
        &["--store", "sqlite:throwaway", "--workers", "1"],
        &["--store", "mysql://x"],
    ] {
        let output = Command::new(BIN)
            .arg("chaos")
            .args(args)
            .args(["--duration", "1s"])
            .env_remove("TENURE_STORE")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(!output.stderr.is_empty());
    }
}
