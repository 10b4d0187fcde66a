//! `tenure drain`: a member of a `tenure run --group` group, asked from another process,
//! hands every shard over and its commands stop; each shard's command then runs on the
//! other member under a larger token. Cancelling the drain brings the member back to its
//! share. Bad input and a drain already in force each get their own answer.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{group_sh, lines, sqlite_url, tempdir, tenure, wait_until, Proc};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(30);

/// The group's member flags: short timings, membership as long as the session.
const TIMINGS: [&str; 8] = [
    "--ttl",
    "2s",
    "--kill-after",
    "300ms",
    "--retry-every",
    "100ms",
    "--member-ttl",
    "2s",
];

/// `tenure drain ARGS --store STORE --json`: (exit code, the JSON line, stderr).
fn drain(store: &str, args: &[&str]) -> (i32, Value, String) {
    common::json_line("drain", store, args)
}

/// Starts member `node` of group `jobs` (6 shards): each shard's command appends
/// `start NODE SHARD TOKEN` to `log`, and `stop NODE SHARD TOKEN` when it is stopped (the
/// trap comes first: a command stopped as it starts still says so).
fn member(store: &str, node: &str, log: &Path) -> Proc {
    let script = format!(
        "trap 'echo \"stop {node} $TENURE_SHARD $TENURE_FENCING_TOKEN\" >> {log}; exit 0' TERM; \
         echo \"start {node} $TENURE_SHARD $TENURE_FENCING_TOKEN\" >> {log}; \
         while :; do sleep 0.05; done",
        log = log.display()
    );
    Proc::spawn(&mut group_sh(store, "jobs", "6", node, &TIMINGS, &script))
}

/// Who runs each shard now, from the log: the last start not followed by its stop.
fn running(log: &Path) -> BTreeMap<String, (String, u64)> {
    let mut now = BTreeMap::new();
    for line in lines(log) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [event, node, shard, token] = fields[..] else {
            continue;
        };
        let token: u64 = token.parse().unwrap_or(0);
        match event {
            "start" => {
                now.insert(shard.to_owned(), (node.to_owned(), token));
            }
            "stop" if now.get(shard) == Some(&(node.to_owned(), token)) => {
                now.remove(shard);
            }
            _ => {}
        }
    }
    now
}

fn shares(log: &Path) -> BTreeMap<String, usize> {
    let mut per_node = BTreeMap::new();
    for (node, _) in running(log).values() {
        *per_node.entry(node.clone()).or_default() += 1;
    }
    per_node
}

#[test]
fn a_drained_member_hands_its_shards_over_and_rejoins_when_cancelled() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let log = dir.path().join("log");
    let a = member(&store, "a", &log);
    let b = member(&store, "b", &log);
    let even = |log: &Path| shares(log) == BTreeMap::from([("a".into(), 3), ("b".into(), 3)]);
    assert!(
        wait_until(LONG, || even(&log)),
        "never 3 each: {:?}\n{}",
        running(&log),
        a.stderr()
    );
    let before = running(&log);

    let (code, line, stderr) = drain(&store, &["--group", "jobs", "--node", "a"]);
    assert_eq!(code, 0, "{line} {stderr}");
    assert_eq!(line["outcome"], "drained", "{line}");
    assert_eq!(line["held"], 3, "{line}");
    // Every shard runs on b now; a's three moved under larger tokens, b's did not move.
    // `drained` means the store shows b's terms; each command logs its start a moment
    // after its term began.
    let mut after = running(&log);
    let all_on_b = wait_until(LONG, || {
        after = running(&log);
        after.len() == 6 && after.values().all(|(node, _)| node == "b")
    });
    assert!(all_on_b, "{after:?}");
    for (shard, (node, token)) in &after {
        assert_eq!(node, "b", "shard {shard}: {after:?}");
        let (was, old) = &before[shard];
        if was == "a" {
            assert!(
                token > old,
                "shard {shard} moved without a new token: {after:?}"
            );
        } else {
            assert_eq!(token, old, "shard {shard} of b moved: {after:?}");
        }
    }
    // A second drain while this one is in force asks nothing.
    let (code, line, _) = drain(&store, &["--group", "jobs", "--node", "a"]);
    assert_eq!(
        (code, &line["outcome"]),
        (75, &Value::from("already_asked"))
    );

    let (code, line, stderr) = drain(&store, &["--group", "jobs", "--node", "a", "--cancel"]);
    assert_eq!(
        (code, &line["outcome"]),
        (0, &Value::from("cancelled")),
        "{stderr}"
    );
    assert!(
        wait_until(LONG, || even(&log)),
        "a did not take its share back: {:?}",
        running(&log)
    );
    let (code, line, _) = drain(&store, &["--group", "jobs", "--node", "a", "--cancel"]);
    assert_eq!((code, &line["outcome"]), (1, &Value::from("not_draining")));
    drop((a, b));
}

#[test]
fn bad_drain_input_names_the_flag() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let long = "n".repeat(250);
    for (args, needle) in [
        (vec!["--group", "", "--node", "a"], "--group"),
        (vec!["--group", "jobs", "--node", long.as_str()], "--node"),
        (
            vec!["--group", "jobs", "--node", "a", "--timeout", "0s"],
            "--timeout",
        ),
        (
            vec![
                "--group",
                "jobs",
                "--node",
                "a",
                "--hold",
                "10s",
                "--timeout",
                "20s",
            ],
            "--hold",
        ),
        (
            vec!["--group", "jobs", "--node", "a", "--cancel", "--hold", "1m"],
            "--hold",
        ),
    ] {
        let mut command = tenure();
        command.args(["drain", "--store", &store]).args(&args);
        common::assert_usage_error(&mut command, &args, needle, Duration::from_secs(30));
    }
}
