//! `tenure run --group G --shards N` with real processes on one SQLite file: members
//! settle evenly with one command per owned shard, no shard ever has two commands at
//! once, a member that stops hands its shards over, and a shard's command sees its
//! shard, the shard count, its role and its token.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{lines, output_within, sqlite_url, tempdir, tenure, wait_until, Proc};
use nix::sys::signal::Signal;

const SHARDS: u32 = 6;

/// One member: records `start|stop SHARD TOKEN OWNER ROLE SHARDS` lines in `log`.
fn member(store: &str, node: &str, log: &Path) -> Proc {
    let script = format!(
        "echo \"start $TENURE_SHARD $TENURE_FENCING_TOKEN $TENURE_OWNER $TENURE_ROLE $TENURE_SHARDS\" >> {log}; \
         trap 'echo \"stop $TENURE_SHARD $TENURE_FENCING_TOKEN $TENURE_OWNER\" >> {log}; exit 0' TERM; \
         while :; do sleep 0.05; done",
        log = log.display()
    );
    Proc::spawn(tenure().args([
        "run",
        "--group",
        "jobs",
        "--shards",
        &SHARDS.to_string(),
        "--node-id",
        node,
        "--store",
        store,
        "--ttl",
        "2s",
        "--retry-every",
        "200ms",
        "--member-ttl",
        "2s",
        "--",
        "sh",
        "-c",
        &script,
    ]))
}

/// Which member runs each shard now, from the log; panics if a shard ever had two
/// commands at once (a start while its previous start has not stopped).
fn running(log: &Path) -> BTreeMap<u32, String> {
    let mut now: BTreeMap<u32, String> = BTreeMap::new();
    for line in lines(log) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let shard: u32 = fields[1].parse().unwrap();
        match fields[0] {
            "start" => {
                if let Some(other) = now.get(&shard) {
                    panic!(
                        "shard {shard}: {} started while {other} runs: {:?}",
                        fields[3],
                        lines(log)
                    );
                }
                now.insert(shard, fields[3].to_owned());
            }
            _ => {
                now.remove(&shard);
            }
        }
    }
    now
}

fn per_member(running: &BTreeMap<u32, String>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for node in running.values() {
        *counts.entry(node.clone()).or_default() += 1;
    }
    counts
}

#[test]
fn members_share_the_shards_and_hand_over_on_stop() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let log = dir.path().join("shards.log");
    std::fs::write(&log, "").unwrap();
    let mut members: BTreeMap<&str, Proc> = ["a", "b", "c"]
        .into_iter()
        .map(|node| (node, member(&store, node, &log)))
        .collect();

    let settled = |expect: usize| {
        let log = log.clone();
        move || {
            let now = running(&log);
            now.len() == SHARDS as usize
                && per_member(&now).len() == expect
                && per_member(&now)
                    .values()
                    .all(|&n| n == SHARDS as usize / expect)
        }
    };
    assert!(
        wait_until(Duration::from_secs(20), settled(3)),
        "3 members never ran 2 shards each: {:?}",
        lines(&log)
    );
    let start: Vec<String> = lines(&log)
        .into_iter()
        .filter(|l| l.starts_with("start"))
        .collect();
    let first: Vec<&str> = start[0].split_whitespace().collect();
    assert_eq!(
        first[4],
        format!("jobs/{}", first[1]),
        "TENURE_ROLE is GROUP/SHARD"
    );
    assert_eq!(first[5], SHARDS.to_string(), "TENURE_SHARDS");

    let status = output_within(
        tenure().args(["status", "--group", "jobs", "--json", "--store", &store]),
        Duration::from_secs(20),
    );
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(report["per_member"]["a"], 2, "{report}");
    assert_eq!(report["unowned"], 0, "{report}");

    // A stopping member hands its shards over at once (well inside the 2 s TTL).
    let b = members.remove("b").unwrap();
    b.signal(Signal::SIGTERM);
    let mut b = b;
    assert_eq!(b.code_within(Duration::from_secs(20)), 0, "{}", b.stderr());
    assert!(
        wait_until(Duration::from_millis(1500), settled(2)),
        "the others did not take b's shards at once: {:?}",
        lines(&log)
    );
    for (_, member) in members {
        member.signal(Signal::SIGTERM);
        let mut member = member;
        assert_eq!(
            member.code_within(Duration::from_secs(20)),
            0,
            "{}",
            member.stderr()
        );
    }
    assert!(
        running(&log).is_empty(),
        "every command stopped: {:?}",
        lines(&log)
    );
}
