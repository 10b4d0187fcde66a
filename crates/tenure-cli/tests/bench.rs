//! `tenure bench`, run briefly on each store: the JSON report has every section with
//! sane values (no timing asserts beyond sanity: the machine is shared), throwaway
//! stores leave nothing behind, and bad input is a usage error that creates nothing.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{assert_bench_usage, json_report, output_within, tempdir, tenure, tree};
use serde_json::Value;

const OPS: [&str; 4] = ["acquire", "renew", "release", "heartbeat"];

/// `tenure bench --store STORE` with tiny settings, temporary files under `dir`.
fn bench_command(dir: &Path, store: &str, extra: &[&str]) -> Command {
    let mut command = tenure();
    command
        .args(["bench", "--store", store, "--json"])
        .args(["--duration", "100ms", "--trials", "5", "--clients", "1,3"])
        .args(extra)
        .current_dir(dir)
        .env("TMPDIR", dir);
    command
}

fn bench(dir: &Path, store: &str, extra: &[&str]) -> Output {
    output_within(
        &mut bench_command(dir, store, extra),
        Duration::from_secs(240),
    )
}

fn num(v: &Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

fn check_latency(v: &Value, what: &str) {
    let (count, p50, p99, max) = (
        num(v, "/count"),
        num(v, "/p50_us"),
        num(v, "/p99_us"),
        num(v, "/max_us"),
    );
    assert!(count > 0.0, "{what}: no samples: {v}");
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{what}: {v}");
}

/// Every section present and sane: both sides measured for every op and client
/// count, positive ratios, every failover trial completed, none early.
fn check_report(r: &Value, store: &str) {
    assert_eq!(r["store"], store);
    assert!(num(r, "/machine/nproc") >= 1.0);
    assert!(r["raw_baseline"].as_str().is_some_and(|s| !s.is_empty()));
    let rows = r["throughput"].as_array().expect("throughput rows");
    for clients in [1, 3] {
        for op in OPS {
            let row = rows
                .iter()
                .find(|row| row["op"] == op && row["clients"] == clients)
                .unwrap_or_else(|| panic!("no {op} row for {clients} clients"));
            for key in ["/store_ops_per_sec", "/raw_ops_per_sec", "/ratio"] {
                assert!(num(row, key) > 0.0, "{op}/{clients}{key}: {row}");
            }
            check_latency(&row["store"], op);
            check_latency(&row["raw"], op);
        }
    }
    let release = &r["failover"]["release"];
    assert_eq!(release["trials"], 5);
    assert_eq!(release["completed"], 5, "{release}");
    check_latency(&release["latency"], "release");
    let floor = &release["floor"];
    assert!(
        floor["latency"].is_object() || num(floor, "/bound_ms") > 0.0,
        "{floor}"
    );
    let stall = &r["failover"]["stall"];
    assert_eq!(stall["completed"], 5, "{stall}");
    assert_eq!(
        stall["early"], 0,
        "a successor ran before the stalled term ended: {stall}"
    );
    assert!(num(stall, "/bound_ms") > num(stall, "/ttl_ms"));
    assert_eq!(stall["excess_over_ttl"]["count"], 5);
}

/// The report's `round_trips` section, which must have been measured, and its
/// per-operation rows.
fn measured_round_trips(r: &Value) -> (&Value, &Vec<Value>) {
    let rt = &r["round_trips"];
    assert_eq!(rt["measured"], true, "{rt}");
    (rt, rt["ops"].as_array().unwrap())
}

#[test]
fn memory_report_has_every_section() {
    let dir = tempdir();
    let r = json_report(&bench(dir.path(), "memory:", &[]));
    check_report(&r, "memory (in-process)");
    assert_eq!(r["round_trips"]["measured"], false);
    assert!(r["failover"]["release"]["floor"]["latency"].is_object());
}

#[test]
fn sqlite_throwaway_report_and_nothing_left_behind() {
    let dir = tempdir();
    let r = json_report(&bench(dir.path(), "sqlite:throwaway", &["--roles", "1"]));
    check_report(&r, "sqlite (throwaway file)");
    let renew = r["throughput"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["op"] == "renew" && row["clients"] == 3)
        .unwrap()
        .clone();
    assert_eq!(
        renew["roles"], 1,
        "three clients renewing one role: {renew}"
    );
    assert!(
        tree(dir.path()).is_empty(),
        "left behind: {:?}",
        tree(dir.path())
    );
}

#[test]
fn postgres_throwaway_counts_one_statement_per_operation() {
    let dir = tempdir();
    let r = json_report(&bench(dir.path(), "postgres:throwaway", &[]));
    check_report(&r, "postgres (throwaway server)");
    let (_, ops) = measured_round_trips(&r);
    assert_eq!(ops.len(), 6);
    for op in ops {
        assert_eq!(num(op, "/per_op"), 1.0, "{op}");
    }
    assert!(r["failover"]["release"]["floor"]["latency"].is_object());
    assert!(tree(dir.path())
        .iter()
        .all(|p| !p.to_string_lossy().contains("tenure-pg-")));
}

/// etcd: every section; etcd's own counters give whole calls per operation (a
/// renewal is its transaction and the keep-alive sent beside it); the release floor is
/// etcd's election API measured in the same run; the stall trials use etcd's 1 s
/// minimum TTL.
#[cfg(feature = "etcd")]
#[test]
fn etcd_throwaway_counts_calls_and_measures_the_election_api() {
    let dir = tempdir();
    let (r, pid) = throwaway_bench(dir.path(), "etcd:throwaway", Duration::from_secs(240));
    check_report(&r, "etcd (throwaway member)");
    assert!(r["machine"]["backend_version"]
        .as_str()
        .is_some_and(|v| v.starts_with("etcd ")));
    let (_, ops) = measured_round_trips(&r);
    assert_eq!(ops.len(), 6);
    for op in ops {
        let per_op = num(op, "/per_op");
        assert!(
            (1.0..=4.0).contains(&per_op) && per_op.fract() == 0.0,
            "whole calls per op expected: {op}"
        );
    }
    // One round trip each: the transaction and the keep-alive sent together.
    for one_trip in ["renew", "heartbeat (live node)"] {
        let op = ops.iter().find(|op| op["op"] == one_trip).unwrap();
        assert_eq!(num(op, "/per_op"), 2.0, "txn + keep-alive: {op}");
    }
    let floor = &r["failover"]["release"]["floor"];
    assert!(floor["label"].as_str().unwrap().contains("election"));
    assert_eq!(floor["latency"]["count"], 5, "{floor}");
    assert_eq!(r["failover"]["stall"]["ttl_ms"], 1000.0);
    let left = left_behind(dir.path(), &["tenure-etcd-"], pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `tenure bench --store STORE` (a throwaway server) run to completion within `within`:
/// its report, and its pid, which the testkit names the server's data directory after
/// (see [`left_behind`]).
#[cfg(any(feature = "etcd", feature = "kube"))]
fn throwaway_bench(dir: &Path, store: &str, within: Duration) -> (Value, nix::unistd::Pid) {
    let proc = common::Proc::spawn(&mut bench_command(dir, store, &[]));
    let pid = proc.pid();
    (json_report(&proc.finish(within)), pid)
}

/// Throwaway-server directories named after the process `pid` that owns them (`PREFIX`
/// `PID-`), left in /dev/shm or `dir`.
#[cfg(any(feature = "etcd", feature = "kube"))]
fn left_behind(
    dir: &Path,
    prefixes: &[&str],
    pid: impl std::fmt::Display,
) -> Vec<std::path::PathBuf> {
    let owned: Vec<String> = prefixes.iter().map(|p| format!("{p}{pid}-")).collect();
    [Path::new("/dev/shm"), dir]
        .into_iter()
        .flat_map(|base| std::fs::read_dir(base).into_iter().flatten().flatten())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            owned.iter().any(|p| name.starts_with(p.as_str()))
        })
        .map(|e| e.path())
        .collect()
}

/// Kubernetes: every section; the API server's own counters give the requests of each
/// operation (an acquire that creates a role's object also takes an epoch from the
/// namespace's counter object; a renewal or release by the store that wrote the term is
/// one PUT with no read); the extra rows beside client-go's fast path and takeover; the
/// release floor is a raw watch-woken handover from the same run; the stall trials run at
/// the 1 s minimum TTL and report when the successor's store had sighted the term, which
/// the TTL counts from.
#[cfg(feature = "kube")]
#[test]
fn kube_throwaway_counts_requests_and_measures_raw_lease_updates() {
    let dir = tempdir();
    let (r, pid) = throwaway_bench(dir.path(), "kube:throwaway", Duration::from_secs(170));
    check_report(&r, "kubernetes (throwaway API server)");
    let version = r["machine"]["backend_version"].as_str().unwrap_or_default();
    assert!(
        version.starts_with("Kubernetes v") && version.contains(" on etcd 3."),
        "{version}"
    );
    let (rt, ops) = measured_round_trips(&r);
    let expected = [
        // GET (404), POST of the empty object, PUT of the epoch counter on the version
        // the store last wrote (a GET first only for the store's first epoch), PUT of the
        // first term (the epoch is taken after the object exists).
        ("acquire (new role)", 4.0),
        ("renew", 1.0),
        // A PUT; the first release also starts the store's namespace watch, to judge who
        // waits in the queue, and waits for its first list: 3 requests once per store
        // (measured), so 1.03 over these 100.
        ("release", 1.03),
        // One PUT on the watch's copy of the released role (the watch the first release
        // started), no read.
        ("acquire (after release)", 1.0),
        ("heartbeat (new node)", 2.0),
        // A PUT on the object the registry last wrote, no read.
        ("heartbeat (live node)", 1.0),
    ];
    assert_eq!(ops.len(), expected.len(), "{rt}");
    for (name, requests) in expected {
        let op = ops.iter().find(|op| op["op"] == name).unwrap();
        // The API server's own identity-lease PUT (one per 10 s) may fall into a count.
        assert!(
            (num(op, "/per_op") - requests).abs() <= 0.02,
            "{name}: {requests} requests expected: {op}"
        );
    }
    let rows = r["throughput"].as_array().unwrap();
    for clients in [1, 3] {
        for extra in ["renew-put", "takeover"] {
            let row = rows
                .iter()
                .find(|row| row["op"] == extra && row["clients"] == clients)
                .unwrap_or_else(|| panic!("no {extra} row for {clients} clients"));
            assert!(num(row, "/ratio") > 0.0, "{row}");
            assert!(row["baseline"].as_str().is_some_and(|b| b.contains("PUT")));
            check_latency(&row["store"], extra);
            check_latency(&row["raw"], extra);
        }
    }
    let floor = &r["failover"]["release"]["floor"];
    assert!(floor["label"].as_str().unwrap().contains("watch event"));
    assert_eq!(floor["latency"]["count"], 5, "{floor}");
    let stall = &r["failover"]["stall"];
    assert_eq!(stall["ttl_ms"], 1000.0);
    assert_eq!(stall["first_sighting"]["count"], 5, "{stall}");
    assert_eq!(stall["excess_over_sighting"]["count"], 5, "{stall}");
    // No successor started before the TTL had run from the stalled leader's acquire.
    // (The excess is not compared with the sighting: the read that times the sighting
    // returns after the store's own first sighting, sometimes by more than the excess's
    // spread; a CI run saw p50 45.6 ms excess beside a 47.3 ms sighting.)
    assert_eq!(stall["early"], 0, "{stall}");
    assert_eq!(stall["completed"], 5, "{stall}");
    let left = left_behind(dir.path(), &["tenure-kube-", "tenure-etcd-"], pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn bad_input_is_a_usage_error_and_creates_nothing() {
    let dir = tempdir();
    let d = dir.path();
    let store = ["--store", "sqlite:throwaway"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        store.iter().chain(extra).copied().collect()
    };
    assert_bench_usage(d, &["--store", "redis://u:hunter2@h"], "--store");
    assert_bench_usage(d, &["--store", "sqlite:"], "--store");
    assert_bench_usage(d, &with(&["--clients", "0"]), "--clients");
    assert_bench_usage(d, &with(&["--clients", "x"]), "--clients");
    assert_bench_usage(d, &with(&["--clients", "1,,4"]), "--clients");
    assert_bench_usage(d, &with(&["--duration", "0s"]), "--duration");
    assert_bench_usage(d, &with(&["--trials", "0"]), "--trials");
    assert_bench_usage(d, &with(&["--roles", "0"]), "--roles");
    assert_bench_usage(d, &with(&["--ttl", "100us"]), "--ttl");
    assert_bench_usage(d, &["--clients", "1"], "--store");
    assert_bench_usage(d, &with(&["--shards", "0"]), "--shards");
    assert_bench_usage(d, &with(&["--shards", "100001"]), "--shards");
    assert_bench_usage(d, &with(&["--shards", "4", "--members", "5"]), "--members");
    assert_bench_usage(d, &with(&["--shards", "4", "--members", "0"]), "--members");
    assert_bench_usage(
        d,
        &with(&["--shards", "4", "--window", "1s", "--renew-every", "2s"]),
        "--window",
    );
    assert_bench_usage(d, &with(&["--members", "2"]), "--shards");
    assert_bench_usage(d, &with(&["--wedged", "10s"]), "--shards");
    assert_bench_usage(
        d,
        &with(&["--shards", "4", "--wedged", "1s", "--renew-every", "2s"]),
        "--wedged",
    );
    assert_bench_usage(d, &with(&["--shards", "4", "--report", "out"]), "--report");
    #[cfg(not(feature = "etcd"))]
    assert_bench_usage(d, &["--store", "etcd:throwaway"], "--features etcd");
    #[cfg(feature = "kube")]
    {
        assert_bench_usage(d, &["--store", "kube:No_Such"], "--store");
        assert_bench_usage(
            d,
            &["--store", "kube:throwaway", "--ttl", "1500ms"],
            "--ttl",
        );
        assert_bench_usage(
            d,
            &[
                "--store",
                "kube:throwaway",
                "--shards",
                "4",
                "--renew-every",
                "500ms",
            ],
            "--renew-every",
        );
    }
    assert_bench_usage(d, &["--store", "kube:"], "kube:NAMESPACE");
    #[cfg(feature = "etcd")]
    {
        assert_bench_usage(d, &["--store", "etcd://h"], "--store");
        assert_bench_usage(d, &["--store", "etcd://u:hunter2@h:1"], "--store");
        assert_bench_usage(
            d,
            &["--store", "etcd:throwaway", "--ttl", "1500ms"],
            "--ttl",
        );
    }
    // The password of a mangled URL is never echoed.
    let mut command = tenure();
    command.args(["bench", "--store", "redis://u:hunter2@h"]);
    let output = output_within(&mut command, Duration::from_secs(60));
    assert!(!String::from_utf8_lossy(&output.stderr).contains("hunter2"));
}

/// `tenure bench --shards 200` briefly: 3 s windows, renew every 500 ms unless `extra`
/// says otherwise.
fn shard_bench(dir: &Path, store: &str, extra: &[&str]) -> Value {
    let mut command = tenure();
    command
        .args(["bench", "--store", store, "--json", "--shards", "200"])
        .args(["--window", "3s"]);
    if !extra.contains(&"--renew-every") {
        command.args(["--renew-every", "500ms"]);
    }
    command.args(extra).current_dir(dir).env("TMPDIR", dir);
    json_report(&output_within(&mut command, Duration::from_secs(300)))
}

fn hold_row<'a>(r: &'a Value, holder: &str) -> &'a Value {
    r["shards"]["hold"]
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["holder"] == holder))
        .unwrap_or_else(|| panic!("no {holder} row in {r}"))
}

/// Store calls of `method` per renew interval (0 when none were made).
fn calls(row: &Value, method: &str) -> f64 {
    row["calls_per_interval"][method].as_f64().unwrap_or(0.0)
}

/// A settled group made no call for one shard: no acquire, renewal or release of one.
fn assert_no_per_shard_calls(group: &Value) {
    for per_shard in [
        "acquire_in_session",
        "acquire_many_in_session",
        "try_acquire_or_renew",
        "release",
    ] {
        assert_eq!(calls(group, per_shard), 0.0, "{per_shard}: {group}");
    }
}

/// The shard group renews once per interval however many shards it holds, starts no
/// term while settled, and makes no per-shard call; the per-role electors renew each
/// role.
fn check_hold(r: &Value, baseline: bool) {
    let group = hold_row(r, "shard group");
    assert_eq!(group["terms_restarted"], 0, "{group}");
    let keep_alive = calls(group, "keep_alive_session");
    assert!((0.6..=1.4).contains(&keep_alive), "{group}");
    assert_no_per_shard_calls(group);
    if baseline {
        // The baseline renews each of its 200 roles per interval when it has the CPU; on
        // SQLite, one write transaction each, it falls behind on a loaded 2-core machine
        // (139 per interval seen while other tests ran beside it). That shortfall is the
        // point of the comparison, not a fault: the check is only that it did renew.
        let electors = hold_row(r, "per-role electors");
        assert!(
            calls(electors, "try_acquire_or_queue") >= 100.0,
            "{electors}"
        );
    }
}

/// 64 shards: 16 each from a cold start, a join moves only the newcomer's 12 or 13, a
/// killed member's shards are owned again, and a graceful leave moves only the leaver's
/// shards with at most two acquires each.
fn check_churn(r: &Value) {
    let churn = &r["shards"]["churn"];
    assert_eq!(
        churn["cold_shares"],
        serde_json::json!([16, 16, 16, 16]),
        "{churn}"
    );
    let moved = num(churn, "/join_moved");
    assert!((12.0..=13.0).contains(&moved), "{churn}");
    assert_eq!(
        churn["join_moved_to_newcomer"], churn["join_moved"],
        "{churn}"
    );
    check_latency(&churn["handover"], "join handover");
    assert!(num(churn, "/kill/shards") >= 12.0, "{churn}");
    // A loaded machine may add to the TTL; the figure itself is in BENCHMARKS.md.
    assert!(
        num(churn, "/kill/reowned_ms") < num(churn, "/ttl_ms") + 2000.0,
        "{churn}"
    );
    let leave = &r["shards"]["leave"];
    assert_eq!(leave["moved"], leave["leaver_shards"], "{leave}");
    assert!(num(leave, "/acquires_per_moved") <= 2.0, "{leave}");
    check_latency(&leave["handover"], "leave handover");
}

#[test]
fn shard_bench_on_memory_renews_once_per_interval_and_moves_little() {
    let dir = tempdir();
    let r = shard_bench(dir.path(), "memory:", &[]);
    check_hold(&r, true);
    check_churn(&r);
}

/// `--wedged`: a group of 3 members beside a wedged one (it heartbeats into the group,
/// never runs) on the wall clock, sampled and reported. The probe rule itself (a probe at
/// a time tries the wedged member, then less and less often) is checked on paused time
/// in `tenure`'s `tests/shards.rs`; here the report's figures are checked for sense
/// only. Measured here: with the probe rule a mean of 0.982-0.996 and 2-6 shards under
/// 99% (a CI run under load gave 0.982 and 6); with every member handing it its whole
/// share instead, 0.975 and 6: too close to tell apart on a loaded machine.
#[test]
fn shard_bench_with_a_wedged_member_keeps_the_shards_running() {
    let dir = tempdir();
    let mut command = tenure();
    command
        .args(["bench", "--store", "memory:", "--json", "--shards", "24"])
        .args(["--members", "3", "--window", "1s", "--renew-every", "500ms"])
        .args(["--no-baseline", "--no-churn", "--wedged", "20s"])
        .current_dir(dir.path());
    let r = json_report(&output_within(&mut command, Duration::from_secs(120)));
    let wedged = &r["shards"]["wedged"];
    assert!(num(wedged, "/samples") >= 150.0, "{wedged}");
    assert_eq!(num(wedged, "/shards"), 24.0, "{wedged}");
    assert_eq!(num(wedged, "/members"), 3.0, "{wedged}");
    let least = num(wedged, "/least_running_share");
    let mean = num(wedged, "/mean_running_share");
    assert!(0.5 < least && least <= mean && mean <= 1.0, "{wedged}");
    assert!(num(wedged, "/shards_under_99_percent") <= 24.0, "{wedged}");
    // Every working member's plan names the wedged member for its share.
    assert!(num(wedged, "/targeted_at_wedged_share") > 0.0, "{wedged}");
}

/// PostgreSQL: one session renewal a statement, so the group's statements and rows per
/// interval are a small constant while the electors' grow with the roles; the member's
/// membership comes from its session, so its heartbeats write nothing.
#[test]
fn shard_bench_on_postgres_counts_statements_and_rows() {
    let dir = tempdir();
    let r = shard_bench(dir.path(), "postgres:throwaway", &[]);
    check_hold(&r, true);
    check_churn(&r);
    let group = hold_row(&r, "shard group");
    let electors = hold_row(&r, "per-role electors");
    let statements = |row: &Value| num(row, "/statements_per_interval");
    let rows = |row: &Value| num(row, "/rows_written_per_interval");
    assert!(statements(group) < 10.0, "{group}");
    assert!(statements(electors) >= 150.0, "{electors}");
    assert!(rows(group) < 10.0, "{group}");
    assert!(rows(electors) >= 150.0, "{electors}");
    // One member, one write per interval: the session keep-alive is also its
    // heartbeat, and the registry skips its own (two rows a member before).
    assert!(rows(group) < 1.6, "{group}");
}

#[test]
fn shard_bench_on_sqlite_renews_once_per_interval() {
    let dir = tempdir();
    let r = shard_bench(dir.path(), "sqlite:throwaway", &["--no-churn"]);
    check_hold(&r, true);
    assert!(r["shards"]["churn"].is_null());
}

#[cfg(feature = "etcd")]
#[test]
fn shard_bench_on_etcd_keeps_every_shard_alive_with_one_keep_alive() {
    let dir = tempdir();
    // etcd grants whole seconds: the shortest TTL three renew intervals make is 3 s.
    let extra = ["--no-churn", "--no-baseline", "--renew-every", "1s"];
    let r = shard_bench(dir.path(), "etcd:throwaway", &extra);
    check_hold(&r, false);
}

/// Kubernetes, 3 members: the group's shards cost each member one session keep-alive
/// per renew interval however many it holds, and the API server counts, net of its own
/// traffic in the quiet window, at most two writes per member per interval (that
/// keep-alive and the membership heartbeat), none per shard; no term restarts.
#[cfg(feature = "kube")]
#[test]
fn shard_bench_on_kube_writes_per_member_not_per_shard() {
    let dir = tempdir();
    // Whole seconds: renew every 1 s makes the shortest TTL, 3 s.
    let extra = [
        "--no-churn",
        "--no-baseline",
        "--renew-every",
        "1s",
        "--members",
        "3",
    ];
    let r = shard_bench(dir.path(), "kube:throwaway", &extra);
    let group = hold_row(&r, "shard group");
    assert_eq!(group["terms_restarted"], 0, "{group}");
    assert_eq!(group["contenders"], 3, "{group}");
    let keep_alive = calls(group, "keep_alive_session");
    assert!((1.8..=4.2).contains(&keep_alive), "{group}");
    assert_no_per_shard_calls(group);
    let quiet = &r["shards"]["quiet"];
    let own = num(quiet, "/rows_written_per_interval");
    assert!(own < 1.0, "the API server's own writes: {quiet}");
    let writes = num(group, "/rows_written_per_interval") - own;
    // 200 shards written per interval would be 200; one keep-alive and one heartbeat a
    // member is 6.
    assert!(
        (1.8..=8.0).contains(&writes),
        "{writes} writes: {group} {quiet}"
    );
    // Reads are not per shard either, though each member's heartbeat wakes every member
    // into a look at the group (about 26 requests per interval seen, 200 shards).
    assert!(num(group, "/statements_per_interval") < 60.0, "{group}");
    // After the window the busiest member is killed; the others run its shards again
    // (within the TTL and a rescue look on a quiet machine; loosely bounded here).
    let kill = &group["kill"];
    assert!(num(kill, "/shards") >= 67.0, "{group}");
    assert!(
        num(kill, "/reowned_ms") < 3.0 * num(&r["shards"]["settings"], "/hold_ttl_ms"),
        "{group}"
    );
    // Started again with its objects in place, the group settles without creates.
    assert!(group["restart_settle_ms"].as_f64().is_some(), "{group}");
    assert!(r["shards"]["rows_counted"]
        .as_str()
        .is_some_and(|s| s.contains("Lease objects written")));
}
