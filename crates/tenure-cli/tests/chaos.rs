//! `tenure chaos` end to end: real worker processes, a seeded nemesis and the checker,
//! on SQLite, on a throwaway PostgreSQL server, (feature `etcd`) on a throwaway etcd
//! server and (feature `kube`) on a throwaway Kubernetes API server, plus the negative
//! controls that prove the checker can fail.
//!
//! Sized for CI: TTL 1 s, a fault every 140-180 ms on average; each backend's passing
//! round injects at least 200 faults (and the SQLite clock-step round 30 more). Each run
//! prints its report (visible with `--nocapture`).

use std::ffi::OsStr;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tenure");

/// Runs `tenure chaos --json ARGS`; returns the exit code and the report. Kills the run
/// if it overstays its duration by far (a hang is a failure, not a wait).
fn chaos(args: &[&str], limit: Duration) -> (i32, Value) {
    chaos_with(args, limit, &[])
}

/// [`chaos`] with more environment (`KUBECONFIG` for a caller's cluster).
fn chaos_with(args: &[&str], limit: Duration, env: &[(&str, &OsStr)]) -> (i32, Value) {
    let mut child = Command::new(BIN)
        .arg("chaos")
        .arg("--json")
        .args(args)
        .env_remove("TENURE_STORE")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
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

/// What a passing round must show beyond "no violation".
struct Expect<'a> {
    /// Worker processes.
    workers: &'a str,
    /// Fault kinds that must each have been injected.
    kinds: &'a [&'a str],
    /// How long the round runs.
    duration: &'a str,
    /// Faults injected, at least.
    faults: u64,
    /// Writes acknowledged, at least.
    admitted: u64,
}

/// Runs a round that must pass: TTL 1 s, plus `args`. No
/// violation (exit 0); enough faults of every expected kind; fenced writes flow and
/// leadership moves; every acknowledged write is in the log, which holds nothing else
/// but writes whose outcome their worker never learnt; and a write is admitted after
/// every fault. Returns the report for the round's own checks.
fn passing_round(args: &[&str], expect: Expect<'_>) -> Value {
    passing_round_with(args, expect, &[])
}

/// [`passing_round`] with more environment, as [`chaos_with`].
fn passing_round_with(args: &[&str], expect: Expect<'_>, env: &[(&str, &OsStr)]) -> Value {
    let mut all = vec![
        "--workers",
        expect.workers,
        "--duration",
        expect.duration,
        "--ttl",
        "1s",
    ];
    all.extend_from_slice(args);
    let (code, report) = chaos_with(&all, Duration::from_secs(180), env);
    assert_eq!(violations(&report), 0, "{:?}", violation_kinds(&report));
    assert_eq!(code, 0);
    assert!(
        report["faults_total"].as_u64().unwrap() >= expect.faults,
        "too few faults"
    );
    for kind in expect.kinds {
        assert!(
            report["faults"][kind].as_u64().unwrap_or(0) > 0,
            "no {kind} fault"
        );
    }
    assert!(report["writes"]["admitted"].as_u64().unwrap() >= expect.admitted);
    assert!(
        report["terms"].as_u64().unwrap() >= 3,
        "leadership never moved"
    );
    assert_eq!(
        report["writes"]["log_rows"].as_u64().unwrap(),
        report["writes"]["admitted"].as_u64().unwrap()
            + report["writes"]["unknown_committed"].as_u64().unwrap()
    );
    for (kind, recovery) in report["recovery"].as_object().unwrap() {
        assert_eq!(
            recovery["unrecovered"].as_u64(),
            Some(0),
            "after some {kind} faults no write was ever admitted again: {recovery}"
        );
    }
    report
}

/// Pauses only, one every 800 ms so most hit the current leader, on 4 workers for
/// `duration`: the stalled-leader plan of the negative controls.
fn pauses<'a>(store: &'a str, duration: &'a str, seed: &'a str) -> Vec<&'a str> {
    vec![
        "--store",
        store,
        "--workers",
        "4",
        "--duration",
        duration,
        "--ttl",
        "1s",
        "--fault-every",
        "800ms",
        "--faults",
        "pause",
        "--seed",
        seed,
    ]
}

/// A negative control: the pause plan with workers writing without the fence. The
/// stalled leaders' late writes land after their successors' and the run must fail
/// (exit 1) with log-order violations, naming the seed and keeping its histories.
fn unfenced_is_caught(mut args: Vec<&str>) {
    args.push("--unsafe-skip-fence");
    let (code, report) = chaos(&args, Duration::from_secs(60));
    assert_eq!(code, 1);
    assert!(violation_kinds(&report).contains(&"log_order".to_owned()));
    let seed = args[args.iter().position(|a| *a == "--seed").unwrap() + 1];
    assert_eq!(report["seed"].as_u64(), seed.parse().ok());
    assert!(
        report["run_dir"].is_string(),
        "a failed run keeps its histories"
    );
    let _ = std::fs::remove_dir_all(report["run_dir"].as_str().unwrap());
}

/// SQLite: pauses, kills, kills-mid-transaction, wall-clock steps of the workers
/// (libfaketime) and handoffs asked through the store, a fault every 140 ms, on the lease store as it is: an acquire the
/// elector abandons mid-`BEGIN IMMEDIATE` must not wedge the file (every fault recovers).
#[test]
fn sqlite_round_passes() {
    let report = passing_round(
        &[
            "--store",
            "sqlite:throwaway",
            "--fault-every",
            "140ms",
            "--faults",
            "pause,kill,restart,clock,handoff",
            "--seed",
            "11",
        ],
        Expect {
            workers: "5",
            kinds: &["pause", "kill", "restart", "clock", "handoff"],
            duration: "36s",
            faults: 200,
            admitted: 50,
        },
    );
    let recovery = report["recovery"].as_object().unwrap();
    for step in ["clock/forward", "clock/back"] {
        assert!(recovery.contains_key(step), "no {step} step: {recovery:?}");
    }
}

/// SQLite with wall-clock steps alone (2-4x the TTL, forward and back, every 300 ms)
/// and workers writing WITHOUT the fence: with no pause, nothing but a store clock
/// that follows the wall clock could let two leaders write at once, so the unfenced
/// log must come out in token order (store time is the host's monotonic clock).
#[test]
fn sqlite_clock_steps_need_no_fence() {
    let (code, report) = chaos(
        &[
            "--store",
            "sqlite:throwaway",
            "--workers",
            "4",
            "--duration",
            "15s",
            "--ttl",
            "1s",
            "--fault-every",
            "300ms",
            "--faults",
            "clock",
            "--seed",
            "19",
            "--unsafe-skip-fence",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(violations(&report), 0, "{:?}", violation_kinds(&report));
    assert_eq!(code, 0);
    assert!(report["faults"]["clock"].as_u64().unwrap() >= 30);
    assert!(report["writes"]["admitted"].as_u64().unwrap() >= 100);
}

/// The negative control on SQLite.
#[test]
fn sqlite_without_the_fence_is_caught() {
    unfenced_is_caught(pauses("sqlite:throwaway", "15s", "9"));
}

/// A throwaway PostgreSQL server owned by the run, with the default fault list: pauses,
/// kills, server restarts (clean and crashed), cuts (proxy resets, proxy blackholes, a worker
/// wedged, `pg_terminate_backend`) and handoffs asked through the store, a fault every 160 ms.
/// Restarts are spaced and handoffs need a leader, so most of either planned are
/// skipped; seed 37's plan (printed with `tenure_chaos::schedule::plan`) has 210
/// pauses, kills and cuts, which are not.
#[test]
fn postgres_round_passes() {
    let report = passing_round(
        &[
            "--store",
            "postgres:throwaway",
            "--fault-every",
            "160ms",
            "--seed",
            "37",
        ],
        Expect {
            workers: "5",
            kinds: &["pause", "kill", "restart", "cut", "handoff"],
            duration: "50s",
            faults: 200,
            admitted: 60,
        },
    );
    has_recovery_rows(&report, &["cut/drop", "cut/blackhole", "cut/wedge"]);
}

/// Asserts that the report has a recovery row for each of `rows` (each fault flavour
/// was injected).
fn has_recovery_rows(report: &Value, rows: &[&str]) {
    let recovery = report["recovery"].as_object().unwrap();
    for row in rows {
        assert!(recovery.contains_key(*row), "no {row}: {recovery:?}");
    }
}

/// The stalled-leader plan of a negative control, with the fence: paused leaders wake
/// and write with their old token, the fence refuses them, and the run passes.
fn paused_leaders_are_fenced_out(store: &str) {
    let (code, report) = chaos(&pauses(store, "12s", "5"), Duration::from_secs(60));
    assert_eq!(violations(&report), 0, "{:?}", violation_kinds(&report));
    assert_eq!(code, 0);
    assert!(
        report["writes"]["refused"].as_u64().unwrap() >= 1,
        "no stale write ever reached the fence"
    );
}

/// The stalled-leader plan of the PostgreSQL negative control, with the fence.
#[test]
fn postgres_paused_leaders_are_fenced_out() {
    paused_leaders_are_fenced_out("postgres:throwaway");
}

/// The negative control on PostgreSQL, where unfenced writers do not even serialise.
#[test]
fn postgres_without_the_fence_is_caught() {
    unfenced_is_caught(pauses("postgres:throwaway", "12s", "5"));
}

/// A throwaway etcd server owned by the run, with the default fault list: pauses, kills,
/// server restarts (clean and crashed), proxy cuts (resets, blackholes and one worker
/// wedged) and handoffs (each the two-transaction handover), a fault every 180 ms.
/// Leaders write through etcd fenced transactions. Seed 317's plan has 206 pauses, kills
/// and cuts, which are never skipped (seed 17 had 177 once handoffs joined the list, and
/// injected 199 faults).
#[cfg(feature = "etcd")]
#[test]
fn etcd_round_passes() {
    let report = passing_round(
        &[
            "--store",
            "etcd:throwaway",
            "--fault-every",
            "180ms",
            "--seed",
            "317",
        ],
        Expect {
            workers: "5",
            kinds: &["pause", "kill", "restart", "cut", "handoff"],
            duration: "55s",
            faults: 200,
            admitted: 60,
        },
    );
    has_recovery_rows(&report, &["cut/wedge"]);
}

/// The negative control on etcd: leaders put their log keys without the fenced
/// transaction.
#[cfg(feature = "etcd")]
#[test]
fn etcd_without_the_fence_is_caught() {
    unfenced_is_caught(pauses("etcd:throwaway", "12s", "5"));
}

/// A throwaway Kubernetes API server owned by the run, the workers running as a service
/// account allowed leases only: pauses, kills, restarts (of the API server and of its
/// etcd, clean and crashed, beside the other faults), proxy cuts (resets, blackholes and
/// wedges), steps of the workers' wall clock and handoffs, a fault every 170 ms.
/// Leaders write through one conditional write of a log object that holds the fence.
/// Seed 58's plan (printed with `tenure_chaos::schedule::plan`) begins its restarts with
/// one of etcd at 1.9 s, which nothing can skip (restarts are spaced, so which later
/// ones run depends on timing), and has apiserver restarts from 3.4 s on.
#[cfg(feature = "kube")]
#[test]
fn kube_round_passes() {
    let report = passing_round(
        &[
            "--store",
            "kube:throwaway",
            "--fault-every",
            "170ms",
            "--faults",
            "pause,kill,restart,cut,clock,handoff",
            "--seed",
            "58",
        ],
        Expect {
            workers: "5",
            kinds: &["pause", "kill", "restart", "cut", "clock", "handoff"],
            duration: "50s",
            faults: 200,
            admitted: 60,
        },
    );
    has_recovery_rows(&report, &["cut/drop", "cut/blackhole", "cut/wedge"]);
    let recovery = report["recovery"].as_object().unwrap();
    for server in ["restart/apiserver", "restart/etcd"] {
        assert!(
            recovery.keys().any(|row| row.starts_with(server)),
            "no {server} restart: {recovery:?}"
        );
    }
}

/// `kube:NAMESPACE`, a cluster the run does not own, found as kubectl finds it (here a
/// throwaway API server of the test's, through a tenant kubeconfig in `KUBECONFIG`):
/// pauses, kills, proxy cuts (the proxy's upstream read from the kubeconfig) and clock
/// steps; no restart.
#[cfg(feature = "kube")]
#[test]
fn kube_namespace_round_passes() {
    let server = tenure_testkit::kube::KubeServer::shared().expect("throwaway kube-apiserver");
    let namespace = server.new_namespace("chaos-caller").expect("a namespace");
    let kubeconfig = server.tenant_kubeconfig(&namespace).expect("a kubeconfig");
    let store = format!("kube:{namespace}");
    let report = passing_round_with(
        &[
            "--store",
            &store,
            "--fault-every",
            "250ms",
            "--faults",
            "pause,kill,cut,clock",
            "--seed",
            "43",
        ],
        Expect {
            workers: "4",
            kinds: &["pause", "kill", "cut", "clock"],
            duration: "10s",
            faults: 30,
            admitted: 30,
        },
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    assert_eq!(report["store"], "kubernetes");
    assert_eq!(report["unavailable"], serde_json::json!([]));
}

/// The stalled-leader plan of the Kubernetes negative control, with the fence: the
/// token check inside the log object's conditional write refuses the woken leaders.
#[cfg(feature = "kube")]
#[test]
fn kube_paused_leaders_are_fenced_out() {
    paused_leaders_are_fenced_out("kube:throwaway");
}

/// The negative control on Kubernetes: leaders append to the log object without the
/// token check (still one conditional write each, so they take turns).
#[cfg(feature = "kube")]
#[test]
fn kube_without_the_fence_is_caught() {
    unfenced_is_caught(pauses("kube:throwaway", "12s", "5"));
}

/// A re-own's bound after an isolated pause on a store with one writer at a time
/// (SQLite): a pause (1-3 TTLs) that strikes a member inside its write transaction
/// holds the file's write lock until it wakes, and no survivor writes meanwhile, so the
/// re-own takes up to the longest pause plus the takeover: 4 TTLs. Kills release the
/// lock with the process and keep the 3-TTL bound.
const ONE_WRITER_PAUSE_REOWN_MS: f64 = 4_000.0;

/// Checks a passing shard-mode round's own figures: the group is reported, shards
/// moved, killed and stopped members were judged leaving the live set, and every kill
/// and pause that struck a member holding shards was followed by
/// all of them being owned again: within 3 TTLs when no other fault struck meanwhile
/// (a pause on a one-writer store: [`ONE_WRITER_PAUSE_REOWN_MS`]) and, when the store
/// itself is not faulted (`quiet_store`), at the median too.
fn shard_round_checks(report: &Value, shards: u64, quiet_store: bool, one_writer: bool) {
    assert_eq!(report["shards"].as_u64(), Some(shards));
    let moves = &report["shard_moves"];
    assert!(moves["moved"].as_u64().unwrap() > 0, "no shard ever moved");
    wedged_members_shards_are_reowned(report);
    // Killed and stopped members left the live set (a ghost would be a violation).
    let membership = &report["membership"];
    assert!(
        membership["judged"].as_u64().unwrap_or(0) > 0,
        "no member's leaving was judged: {membership}"
    );
    for kind in ["pause", "kill"] {
        let reown = &moves["reown"][kind];
        assert!(
            reown["recovered"].as_u64().unwrap_or(0) > 0,
            "no {kind} re-own sample: {moves}"
        );
        assert_eq!(reown["unrecovered"].as_u64(), Some(0), "{kind}: {reown}");
        let mut bounded = vec!["isolated_p99_ms"];
        if quiet_store {
            bounded.push("p50_ms");
        }
        let isolated_bound = if one_writer && kind == "pause" {
            ONE_WRITER_PAUSE_REOWN_MS
        } else {
            3_000.0
        };
        for figure in bounded {
            let bound = if figure == "isolated_p99_ms" {
                isolated_bound
            } else {
                3_000.0
            };
            assert!(
                reown[figure].as_f64().unwrap_or(0.0) < bound,
                "{kind}: {figure} of a re-own is more than {bound} ms: {reown}"
            );
        }
    }
}

/// A wedged member's shards are owned again elsewhere (bounds as for kills), whether
/// its heartbeats stalled with its store calls (`cut/wedge`) or went on
/// (`cut/wedge-store`).
fn wedged_members_shards_are_reowned(report: &Value) {
    for row in ["cut/wedge", "cut/wedge-store"] {
        if let Some(wedge) = report["shard_moves"]["reown"].get(row) {
            assert_eq!(wedge["unrecovered"].as_u64(), Some(0), "{row}: {wedge}");
        }
    }
}

/// Shard mode on SQLite: 4 members of a group of 8 shards under pauses (past the TTL)
/// and kills, each shard's owner writing to that shard's fenced log: every shard's log
/// and terms check out, and the report gives the time to re-own a struck member's
/// shards.
#[test]
fn sqlite_shard_round_passes() {
    let report = passing_round(
        &[
            "--store",
            "sqlite:throwaway",
            "--shards",
            "8",
            "--fault-every",
            "400ms",
            "--faults",
            "pause,kill",
            "--write-every",
            "40ms",
            "--seed",
            "23",
        ],
        Expect {
            workers: "4",
            kinds: &["pause", "kill"],
            duration: "20s",
            faults: 30,
            admitted: 500,
        },
    );
    shard_round_checks(&report, 8, true, true);
}

/// The negative control in shard mode: paused members wake and write to their old
/// shards without the fence, after the shards' new owners, and the run must fail.
#[test]
fn sqlite_shards_without_the_fence_are_caught() {
    let mut args = pauses("sqlite:throwaway", "12s", "9");
    args.extend(["--shards", "8", "--write-every", "40ms"]);
    unfenced_is_caught(args);
}

/// A shard-mode round on a throwaway PostgreSQL server: 5 members, 16 shards, a fault of
/// `kinds` (comma-separated) every 400 ms for 20 s, each owner writing every 50 ms.
fn postgres_shard_round(kinds: &str, seed: &str) -> Value {
    let expected: Vec<&str> = kinds.split(',').collect();
    let report = passing_round(
        &[
            "--store",
            "postgres:throwaway",
            "--shards",
            "16",
            "--fault-every",
            "400ms",
            "--faults",
            kinds,
            "--write-every",
            "50ms",
            "--seed",
            seed,
        ],
        Expect {
            workers: "5",
            kinds: &expected,
            duration: "20s",
            faults: 30,
            admitted: 500,
        },
    );
    assert_eq!(report["shards"].as_u64(), Some(16));
    report
}

/// Shard mode on a throwaway PostgreSQL server: pauses, kills, server restarts and cuts
/// (a member wedged among them: its calls hang, the others' go through).
#[test]
fn postgres_shard_round_passes() {
    let report = postgres_shard_round("pause,kill,restart,cut", "29");
    shard_round_checks(&report, 16, false, false);
}

/// Shard mode on a throwaway PostgreSQL server under cuts alone: among them wedges of a
/// member whose heartbeats go straight to the server (its registry on a pool of its
/// own) while its session, terms and writes hang behind its wedged proxy. Such a member
/// keeps heartbeating until its session is lost locally, then leaves; writes resume
/// after each such wedge, its shards are owned again elsewhere when it held any, and
/// nobody writes with a stale token.
#[test]
fn postgres_shard_store_wedges_pass() {
    let report = postgres_shard_round("cut", "11");
    // Whether a store wedge struck a member while it held shards (a re-own sample)
    // depends on timing: the other cuts keep ending sessions.
    has_recovery_rows(&report, &["cut/wedge-store"]);
    wedged_members_shards_are_reowned(&report);
}

/// Locks held by a stalled transaction (`lock`: a lease's row on PostgreSQL, the file's
/// write lock on SQLite, on etcd the server's disk, 1-3 TTLs each) beside pauses and
/// kills: the calls that waited behind a lock and were given up by their callers, and
/// whatever still ran when it was freed, leave every invariant intact, and writes
/// resume after each lock.
fn lock_round_passes(store: &str, shards: Option<&str>, seed: &str) -> Value {
    lock_round_passes_with(store, shards, seed, &[])
}

/// [`lock_round_passes`] with more environment, as [`chaos_with`].
fn lock_round_passes_with(
    store: &str,
    shards: Option<&str>,
    seed: &str,
    env: &[(&str, &OsStr)],
) -> Value {
    let mut args = vec![
        "--store",
        store,
        "--faults",
        "lock,pause,kill",
        "--fault-every",
        "400ms",
        "--seed",
        seed,
    ];
    if let Some(shards) = shards {
        args.extend(["--shards", shards, "--write-every", "50ms"]);
    }
    passing_round_with(
        &args,
        Expect {
            workers: "4",
            kinds: &["lock", "pause", "kill"],
            duration: "15s",
            // About 37 planned; a lock planned while another is held is skipped.
            faults: 20,
            admitted: 60,
        },
        env,
    )
}

/// The etcd of `scripts/build-servers`, the one with failpoints, whatever `$ETCD_BIN`
/// says: the environment of a run whose `lock` stalls a throwaway etcd's disk.
#[cfg(feature = "etcd")]
fn etcd_with_failpoints() -> std::path::PathBuf {
    tenure_testkit::kube::etcd_binary().expect("target/servers/etcd: run scripts/build-servers")
}

/// [`lock_round_passes`] on a throwaway etcd, one role: every lock stalls the server's
/// WAL disk (`lock/wal-disk`, etcd's failpoint: writes and linearizable reads hang
/// inside the server, and what their callers gave up on lands when it answers).
#[cfg(feature = "etcd")]
#[test]
fn etcd_lock_round_passes() {
    let etcd = etcd_with_failpoints();
    let env = [("ETCD_BIN", etcd.as_os_str())];
    let report = lock_round_passes_with("etcd:throwaway", None, "61", &env);
    has_recovery_rows(&report, &["lock/wal-disk"]);
}

/// [`etcd_lock_round_passes`] with a group of 8 shards (a stalled disk holds every
/// member's writes, session keep-alives' transactions and heartbeats).
#[cfg(feature = "etcd")]
#[test]
fn etcd_shard_lock_round_passes() {
    let etcd = etcd_with_failpoints();
    let env = [("ETCD_BIN", etcd.as_os_str())];
    let report = lock_round_passes_with("etcd:throwaway", Some("8"), "62", &env);
    has_recovery_rows(&report, &["lock/wal-disk"]);
}

/// `lock` where nothing can make it is refused with a usage error that says why: on an
/// etcd the run does not own (no lock to hold, no disk to stall), and on a throwaway
/// etcd without failpoints (Debian's).
#[cfg(feature = "etcd")]
#[test]
fn lock_on_an_etcd_that_cannot_stall_is_refused() {
    let refused = |store: &str| {
        let output = Command::new(BIN)
            .args([
                "chaos",
                "--store",
                store,
                "--faults",
                "lock",
                "--duration",
                "2s",
            ])
            .env("ETCD_BIN", "/usr/bin/etcd")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        stderr
    };
    let stderr = refused("etcd://127.0.0.1:1/chaos");
    assert!(
        stderr.contains("lock: etcd and kubernetes have no lock to hold")
            && stderr.contains("--store etcd:throwaway or kube:throwaway"),
        "{stderr}"
    );
    let stderr = refused("etcd:throwaway");
    assert!(
        stderr.contains("lock: this etcd has no failpoints to stall its disk with"),
        "{stderr}"
    );
}

/// [`lock_round_passes`] on a throwaway Kubernetes API server: every lock stalls the
/// disk of the API server's etcd, so the API server's writes hang behind it.
#[cfg(feature = "kube")]
#[test]
fn kube_lock_round_passes() {
    let report = lock_round_passes("kube:throwaway", None, "61");
    has_recovery_rows(&report, &["lock/wal-disk"]);
}

/// [`lock_round_passes`] on a throwaway PostgreSQL server, one role: the row lock in
/// turn with the server's WAL disk stalled (`lock/wal-disk`: every commit hangs inside
/// the server and lands when the disk answers, after its caller gave up on it).
#[test]
fn postgres_lock_round_passes() {
    let report = lock_round_passes("postgres:throwaway", None, "61");
    has_recovery_rows(&report, &["lock", "lock/wal-disk"]);
}

/// [`lock_round_passes`] on a throwaway PostgreSQL server, a group of 8 shards (a row
/// lock holds one shard's row; a stalled WAL disk, every member's writes, session
/// keep-alives and heartbeats).
#[test]
fn postgres_shard_lock_round_passes() {
    let report = lock_round_passes("postgres:throwaway", Some("8"), "62");
    has_recovery_rows(&report, &["lock", "lock/wal-disk"]);
}

/// [`lock_round_passes`] on SQLite: a lock holds the whole file's write lock, taken by
/// the nemesis or by a leader whose disk stalls inside its commit (`lock/disk`: the
/// commit lands when the disk answers, after its caller gave up on it).
#[test]
fn sqlite_lock_round_passes() {
    let report = lock_round_passes("sqlite:throwaway", None, "63");
    has_recovery_rows(&report, &["lock", "lock/disk"]);
}

/// [`sqlite_lock_round_passes`] in a group of 8 shards: a member whose disk stalls
/// holds every other member's writes, session keep-alives and heartbeats behind its
/// commit; a member whose disk fails (`lock/disk-error`: every sync answers EIO) fails
/// its own writes and must write again once the disk heals.
#[test]
fn sqlite_shard_lock_round_passes() {
    let report = lock_round_passes("sqlite:throwaway", Some("8"), "64");
    has_recovery_rows(&report, &["lock", "lock/disk", "lock/disk-error"]);
}

/// Shard mode on a throwaway server (`store`) the run owns: 4 members of a group of 8
/// shards under pauses, kills, server restarts and cuts, each owner writing to its
/// shards' fenced logs every 50 ms; at least `admitted` writes go through.
#[cfg(any(feature = "etcd", feature = "kube"))]
fn server_shard_round_passes(store: &str, seed: &str, admitted: u64) {
    let report = passing_round(
        &[
            "--store",
            store,
            "--shards",
            "8",
            "--fault-every",
            "400ms",
            "--faults",
            "pause,kill,restart,cut",
            "--write-every",
            "50ms",
            "--seed",
            seed,
        ],
        Expect {
            workers: "4",
            kinds: &["pause", "kill", "restart", "cut"],
            duration: "20s",
            faults: 30,
            admitted,
        },
    );
    shard_round_checks(&report, 8, false, false);
}

/// Shard mode on a throwaway etcd server: members heartbeat through etcd leases and
/// hold their shards under one etcd lease each.
#[cfg(feature = "etcd")]
#[test]
fn etcd_shard_round_passes() {
    server_shard_round_passes("etcd:throwaway", "31", 500);
}

/// Shard mode on a throwaway Kubernetes API server: members heartbeat into member
/// Lease objects and hold their shards under a session Lease each; restarts stop or
/// kill the API server or its etcd. Fewer writes get through than on etcd, and how many
/// depends on which restarts the timing lets through (286 to 824 in six trials): the API
/// server is down for seconds per restart, and for up to its whole 15 s grace when
/// stopped gracefully with watches open.
#[cfg(feature = "kube")]
#[test]
fn kube_shard_round_passes() {
    server_shard_round_passes("kube:throwaway", "41", 150);
}

/// Stores and faults it cannot drive are usage errors (exit 2), before anything starts.
#[test]
fn bad_chaos_flags_are_usage_errors() {
    for args in [
        // Without the etcd feature, etcd stores are refused; with it, etcd TTLs are
        // whole seconds.
        #[cfg(not(feature = "etcd"))]
        &["--store", "etcd:throwaway"][..],
        #[cfg(feature = "etcd")]
        &["--store", "etcd:throwaway", "--ttl", "1500ms"][..],
        &["--store", "etcd://user:secret@127.0.0.1:2379"],
        // Kubernetes TTLs are whole seconds; a caller's cluster cannot be restarted.
        #[cfg(feature = "kube")]
        &["--store", "kube:throwaway", "--ttl", "1500ms"],
        #[cfg(feature = "kube")]
        &["--store", "kube:team-a", "--faults", "restart"],
        &["--store", "kube:Not_A_Namespace"],
        &["--store", "sqlite:throwaway", "--faults", "pause,bogus"],
        &["--store", "sqlite:throwaway", "--faults", "cut"],
        // Only the SQL stores have a lock to hold.
        #[cfg(feature = "etcd")]
        &["--store", "etcd:throwaway", "--faults", "lock"],
        &[
            "--store",
            "postgres://u@127.0.0.1:1/db",
            "--faults",
            "clock",
        ],
        &["--store", "sqlite:throwaway", "--workers", "1"],
        &["--store", "sqlite:throwaway", "--shards", "0"],
        &["--store", "sqlite:throwaway", "--shards", "100001"],
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
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.is_empty());
        assert!(!stderr.contains("secret"), "{stderr}");
        if cfg!(not(feature = "etcd")) && args[1].starts_with("etcd") {
            assert!(stderr.contains("--features etcd"), "{stderr}");
        }
        if args.contains(&"--shards") {
            assert!(stderr.contains("--shards"), "{stderr}");
        }
    }
}
